"""A site's own plugins, living outside the core, named in settings by the tests."""
from carousel.stagers.immediate import ImmediateStager


class SiteStager(ImmediateStager):
    pass
