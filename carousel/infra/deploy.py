"""What keeps a deployment honest on day one: production (PostgreSQL) does not start with the
published secret key, DEBUG on or no allowed hosts; the loop does not start on a stager that
fakes restores unless an operator said so; every page says when the tape library is simulated;
and the demo accounts stay on the embedded default."""
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


def production_problems(*, vendor, secret_key, embedded_secret_key, debug, allowed_hosts):
    """What a production start must not run with, each said with what to set. Production is a
    PostgreSQL database (DATABASE_URL); the embedded default (SQLite) may run as shipped."""
    if vendor != "postgresql":
        return []
    problems = []
    if secret_key == embedded_secret_key:
        problems.append("SECRET_KEY is the embedded default, published with the code: anyone can forge sessions "
                        "with it. Set SECRET_KEY to a long random string, e.g. the output of "
                        "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'.")
    if debug:
        problems.append("DEBUG is on: error pages would show settings and code to anyone. Unset DEBUG "
                        "(or set DEBUG=0).")
    if not allowed_hosts:
        problems.append("ALLOWED_HOSTS is empty: every request would be refused. Set ALLOWED_HOSTS to the host "
                        "names the site answers on, comma-separated (e.g. ALLOWED_HOSTS=carousel.example.org).")
    return problems


def configured_production_problems():
    """production_problems() for the settings and database of this process."""
    from django.db import connections

    return production_problems(vendor=connections["default"].vendor, secret_key=settings.SECRET_KEY,
                               embedded_secret_key=settings.EMBEDDED_SECRET_KEY, debug=settings.DEBUG,
                               allowed_hosts=settings.ALLOWED_HOSTS)


def refuse_unsafe_production():
    """Raise unless this process may start: for the processes Django's system checks do not run
    in (gunicorn's workers, Celery's worker and beat); manage.py commands get carousel.E006."""
    problems = configured_production_problems()
    if problems:
        raise ImproperlyConfigured("refusing to start on PostgreSQL: " + " ".join(problems))


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
