"""Plugins named in settings, resolved like Django's pluggable backends: a setting maps a name
to a dotted path, import_string resolves it once, and the cache resets when a test overrides
the setting. Each family's registry is filled from the environment by settings.env_plugins;
how to write each kind is in docs/plugins.md."""
import functools

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string


class PluginError(Exception):
    pass


@functools.cache
def resolve(registry_setting, name):
    """The class registered as `name` in the dict setting `registry_setting`."""
    from django.conf import settings

    registry = getattr(settings, registry_setting)
    if name not in registry:
        raise PluginError(f"{name!r} is not in {registry_setting}; known: {', '.join(sorted(registry))}")
    try:
        return import_string(registry[name])
    except ImportError as exc:
        raise PluginError(f"{registry_setting}[{name!r}] = {registry[name]!r} does not import: {exc}") from exc


def resolve_choice(registry_setting, choice_setting):
    """The class the setting `choice_setting` names: an entry of the registry `registry_setting`,
    or a dotted path of its own (as CAROUSEL_PATH_AUTHORIZATION has always allowed)."""
    from django.conf import settings

    name = getattr(settings, choice_setting)
    if name not in getattr(settings, registry_setting) and "." in name:
        try:
            return import_string(name)
        except ImportError as exc:
            raise PluginError(f"{choice_setting} = {name!r} does not import: {exc}") from exc
    return resolve(registry_setting, name)


def build(registry_setting, choice_setting, options_setting):
    """A new instance of the plugin `choice_setting` names, built from the options (a dict of
    keyword arguments) in `options_setting`. Options its class refuses (one missing, one unknown,
    a value its constructor rejects) raise PluginError saying which plugin and why; the option
    values are not repeated, as they may hold secrets."""
    from django.conf import settings

    name, options = getattr(settings, choice_setting), getattr(settings, options_setting)
    cls = resolve(registry_setting, name)
    if not isinstance(options, dict):
        raise PluginError(f"{options_setting} must be a JSON object of option -> value, got {type(options).__name__}")
    try:
        return cls(**options)
    except Exception as exc:  # noqa: BLE001 - a site's constructor may refuse its options with any exception
        given = ", ".join(sorted(options)) or "none"
        raise PluginError(f"{choice_setting}={name!r} cannot be built from {options_setting} (options given: "
                          f"{given}): {type(exc).__name__}: {exc}") from exc


def build_stager():
    """A new instance of the configured stager: carousel.E007 builds one at start."""
    return build("CAROUSEL_STAGERS", "CAROUSEL_STAGER", "CAROUSEL_STAGER_OPTIONS")


@functools.cache
def stager():
    """The configured stager, one instance per process."""
    return build_stager()


@functools.cache
def delivery():
    """The configured delivery step, one instance per process."""
    return build("CAROUSEL_DELIVERIES", "CAROUSEL_DELIVERY", "CAROUSEL_DELIVERY_OPTIONS")


@functools.cache
def path_authorization():
    """The configured path authorisation (carousel/domain/authz.py): a name in the registry, or a
    dotted path."""
    return resolve_choice("CAROUSEL_PATH_AUTHORIZATIONS", "CAROUSEL_PATH_AUTHORIZATION")()


@functools.cache
def turn_policy():
    """The configured turn-taking policy (policies/turns.py): a name in the registry, or a dotted
    path; one instance per process."""
    return resolve_choice("CAROUSEL_TURN_POLICIES", "CAROUSEL_TURN_POLICY")()


@receiver(setting_changed)
def _reset(setting, **kwargs):
    if setting.startswith("CAROUSEL_"):
        resolve.cache_clear()
        stager.cache_clear()
        delivery.cache_clear()
        path_authorization.cache_clear()
        turn_policy.cache_clear()
