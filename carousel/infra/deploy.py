"""What keeps a deployment honest on day one: the loop does not start on a stager that fakes
restores unless an operator said so, every page says when the tape library is simulated, and
the demo accounts stay on the embedded default."""
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

# Stagers that mark requests restored without reading a tape.
FAKING_STAGERS = {"immediate"}
# Stagers that read no real tape but model one; pages say so.
SIMULATED_STAGERS = {"simulated"}


def check_loop_stager():
    """Raise unless the configured stager may drive the loop: `immediate` marks every request
    restored without touching tape, so a worker or beat starts on it only with
    CAROUSEL_ALLOW_IMMEDIATE set."""
    if settings.CAROUSEL_STAGER in FAKING_STAGERS and not settings.CAROUSEL_ALLOW_IMMEDIATE:
        raise ImproperlyConfigured(
            f"CAROUSEL_STAGER={settings.CAROUSEL_STAGER!r} marks every request restored without reading a tape; "
            "the loop refuses to start on it. Configure the site's stager (CAROUSEL_STAGER, "
            "CAROUSEL_STAGER_OPTIONS), use 'simulated' to try the broker, or set CAROUSEL_ALLOW_IMMEDIATE=1 "
            "if faked restores are really what you want.")


def stager_notice():
    """A line for every page when the stager is not a real tape system, else ''."""
    name = settings.CAROUSEL_STAGER
    if name in SIMULATED_STAGERS:
        return "Simulated tape library: no real tape is read; restored files are not real."
    if name in FAKING_STAGERS:
        return f"Stager '{name}': every request is marked restored without reading a tape."
    return ""


def stager_context(request):
    """Template context processor: the notice above, for the base template's banner."""
    return {"stager_notice": stager_notice()}


def is_embedded_database():
    """True when the database is the embedded default (SQLite under CAROUSEL_VAR_DIR, no
    DATABASE_URL), where demo accounts with known passwords do no harm."""
    db = settings.DATABASES["default"]
    return db["ENGINE"] == "django.db.backends.sqlite3" and str(db["NAME"]) == str(settings.EMBEDDED_DATABASE_PATH)
