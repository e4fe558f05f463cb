from django.conf import settings
from django.core.checks import Error, register

from carousel.infra.plugins import PluginError, resolve, resolve_choice

REGISTRIES = ("CAROUSEL_STAGERS", "CAROUSEL_SORT_POLICIES", "CAROUSEL_SHARE_POLICIES", "CAROUSEL_DELIVERIES",
              "CAROUSEL_PATH_AUTHORIZATIONS", "CAROUSEL_TURN_POLICIES")
# Choices that may name a registry entry or a dotted path: choice setting -> its registry.
CHOICES = {"CAROUSEL_PATH_AUTHORIZATION": "CAROUSEL_PATH_AUTHORIZATIONS",
           "CAROUSEL_TURN_POLICY": "CAROUSEL_TURN_POLICIES"}


@register()
def plugins_resolve(app_configs, **kwargs):
    """Every registered plugin name must import, so a typo fails at start, not mid-cycle."""
    errors = []
    for registry in REGISTRIES:
        for name in getattr(settings, registry, {}):
            try:
                resolve(registry, name)
            except PluginError as exc:
                errors.append(Error(str(exc), id="carousel.E001"))
    if settings.CAROUSEL_STAGER not in settings.CAROUSEL_STAGERS:
        errors.append(Error(f"CAROUSEL_STAGER={settings.CAROUSEL_STAGER!r} is not in CAROUSEL_STAGERS",
                            id="carousel.E002"))
    if settings.CAROUSEL_DELIVERY not in settings.CAROUSEL_DELIVERIES:
        errors.append(Error(f"CAROUSEL_DELIVERY={settings.CAROUSEL_DELIVERY!r} is not in CAROUSEL_DELIVERIES",
                            id="carousel.E003"))
    for choice, registry in CHOICES.items():
        try:
            resolve_choice(registry, choice)
        except PluginError as exc:
            errors.append(Error(str(exc), id="carousel.E004"))
    return errors
