import pytest
from django.core.checks import run_checks

from carousel.infra import plugins
from carousel.stagers.immediate import ImmediateStager


def test_the_configured_stager_is_resolved_once_and_cached(settings):
    assert isinstance(plugins.stager(), ImmediateStager)
    assert plugins.stager() is plugins.stager()


def test_a_site_stager_named_in_settings_is_picked_up(settings):
    settings.CAROUSEL_STAGERS = {**settings.CAROUSEL_STAGERS, "site": "tests.site_plugins.SiteStager"}
    settings.CAROUSEL_STAGER = "site"
    assert type(plugins.stager()).__name__ == "SiteStager"


def test_a_name_that_does_not_resolve_is_a_clear_error(settings):
    settings.CAROUSEL_STAGERS = {"broken": "nowhere.Stager"}
    settings.CAROUSEL_STAGER = "broken"
    with pytest.raises(plugins.PluginError, match=r"CAROUSEL_STAGERS\['broken'\] = 'nowhere.Stager' does not import"):
        plugins.stager()
    ids = {e.id for e in run_checks()}
    assert "carousel.E001" in ids


def test_an_unknown_stager_name_fails_the_system_check(settings):
    settings.CAROUSEL_STAGER = "tape-robot-9000"
    assert "carousel.E002" in {e.id for e in run_checks()}
