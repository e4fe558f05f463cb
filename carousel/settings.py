"""Settings come from the environment; with nothing set, the embedded default runs:
SQLite in var/ and Celery on kombu's filesystem transport, so no server is needed."""
import json
import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("CAROUSEL_VAR_DIR", BASE_DIR / "var"))


def env_bool(name, default=False):
    return os.environ.get(name, str(default)).lower() in ("1", "true", "yes", "on")


SECRET_KEY = os.environ.get("SECRET_KEY", "carousel-embedded-insecure-key-set-SECRET_KEY-in-production")
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "carousel",
    "policies",
    "api",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's and the pages' static files without a separate web server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "carousel.urls"
WSGI_APPLICATION = "carousel.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'carousel.sqlite3'}"),
        conn_max_age=int(os.environ.get("CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # WAL and a busy timeout let the web server and the worker share the file.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The submit endpoint takes 100,000 paths in one body (about 10 MB of JSON).
DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024 * 1024

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# Without collectstatic (make run, tests) WhiteNoise finds files where the apps keep them.
WHITENOISE_USE_FINDERS = True
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "carousel@localhost")
# Notices go out from the cycle: a mail server that hangs must not hold the loop for long.
EMAIL_TIMEOUT = 10
# The broker's public address, for links in notices (e.g. https://carousel.example.org).
CAROUSEL_SITE_URL = os.environ.get("CAROUSEL_SITE_URL", "")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # "Authorization: Bearer <WLCG JWT or API token>" (gfal2 sends BEARER_TOKEN so).
        "api.auth.BearerAuthentication",
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    "DEFAULT_PAGINATION_CLASS": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Carousel API",
    "DESCRIPTION": "Tape-restore request broker: submit, follow and cancel restore requests.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Celery: Redis when REDIS_URL is set, else kombu's filesystem transport under var/.
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
else:
    _queue_dir = VAR_DIR / "celery-queue"
    _queue_dir.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
# Cancels and releases never wait behind a cycle, and copies to users' file systems (which can
# take minutes) never hold a cycle back: each kind has its queue, and production gives each a
# worker of its own (docker-compose.yml). `make run`'s single worker consumes all three.
CELERY_TASK_ROUTES = {
    "carousel.tasks.withdraw": {"queue": "control"},
    "carousel.tasks.deliver": {"queue": "delivery"},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Beat ticks often and the cycle task decides from the control table whether a cycle is due,
# so an operator's change of the cycle period applies without a restart.
CAROUSEL_TICK_S = float(os.environ.get("CAROUSEL_TICK_S", "2"))

# Plugins: name -> dotted path, resolved lazily with import_string (see carousel/plugins.py).
CAROUSEL_STAGERS = {
    "immediate": "carousel.stagers.immediate.ImmediateStager",
    "hpss": "carousel.stagers.hpss.HpssStager",
    "tape-rest": "carousel.stagers.tape_rest.TapeRestStager",
    "command": "carousel.stagers.command.CommandStager",
    "simulated": "carousel.stagers.simulated.SimulatedStager",
}
# The simulated tape library is the embedded default: `make run` shows tapes mounting and
# files staging with no tape system behind it (options: speedup, drives, media, tapes).
CAROUSEL_STAGER = os.environ.get("CAROUSEL_STAGER", "simulated")
CAROUSEL_SORT_POLICIES = {
    "NONE": "policies.sorting.Fifo",
    "TAPEID": "policies.sorting.TapeId",
    "SLIDER": "policies.sorting.Slider",
}
CAROUSEL_SHARE_POLICIES = {
    "EQUAL": "policies.sharing.Equal",
    "GROUP": "policies.sharing.Group",
    "GRPW": "policies.sharing.GroupWeighted",
}
# Keyword arguments of the stager's class, as JSON (e.g. {"url": ..., "token_file": ...}).
CAROUSEL_STAGER_OPTIONS = json.loads(os.environ.get("CAROUSEL_STAGER_OPTIONS") or "{}")
CAROUSEL_DELIVERIES = {
    "none": "carousel.delivery.InPlace",
    "copy": "carousel.delivery.LocalCopy",
    "command": "carousel.delivery.SiteCommand",
}
CAROUSEL_DELIVERY = os.environ.get("CAROUSEL_DELIVERY", "none")
CAROUSEL_DELIVERY_OPTIONS = json.loads(os.environ.get("CAROUSEL_DELIVERY_OPTIONS") or "{}")

# The WLCG Tape REST API door (api/tape_rest/): what discovery says, and its limits. Its
# discovery `uri` and the Location of a new stage request start with CAROUSEL_SITE_URL when set.
CAROUSEL_TAPE_REST_SITENAME = os.environ.get("CAROUSEL_TAPE_REST_SITENAME", "carousel")
CAROUSEL_TAPE_REST_DESCRIPTION = os.environ.get("CAROUSEL_TAPE_REST_DESCRIPTION",
                                                "Carousel tape-restore broker (WLCG Tape REST API v1)")
# How long a restored copy stays pinned when a stage request gives no diskLifetime (gfal2 never
# does), in seconds.
CAROUSEL_TAPE_REST_DISK_LIFETIME_S = int(os.environ.get("CAROUSEL_TAPE_REST_DISK_LIFETIME_S", "86400"))
# A stage request's status is rendered once per this many seconds however many clients poll it.
CAROUSEL_TAPE_REST_POLL_CACHE_S = float(os.environ.get("CAROUSEL_TAPE_REST_POLL_CACHE_S", "2"))
CAROUSEL_TAPE_REST_MAX_FILES = int(os.environ.get("CAROUSEL_TAPE_REST_MAX_FILES", "100000"))  # else 413
CAROUSEL_TAPE_REST_MAX_UNFINISHED = int(os.environ.get("CAROUSEL_TAPE_REST_MAX_UNFINISHED", "5000"))  # else 429

# WLCG JWT issuers trusted here, as JSON: [{"issuer": "https://wlcg.example.org/",
# "audiences": ["https://carousel.example.org"], "base_path": "/atlas", "name": "atlas"}].
# Scopes are relative to base_path; name prefixes the user names made for its subjects.
CAROUSEL_WLCG_ISSUERS = json.loads(os.environ.get("CAROUSEL_WLCG_ISSUERS") or "[]")
CAROUSEL_WLCG_KEYS_REFRESH_S = float(os.environ.get("CAROUSEL_WLCG_KEYS_REFRESH_S", str(6 * 3600)))
CAROUSEL_WLCG_KEYS_KEEP_S = float(os.environ.get("CAROUSEL_WLCG_KEYS_KEEP_S", str(2 * 86400)))
CAROUSEL_WLCG_FETCH_GAP_S = float(os.environ.get("CAROUSEL_WLCG_FETCH_GAP_S", "60"))
CAROUSEL_WLCG_FETCH_TIMEOUT_S = 10.0

# Limits of one submission.
CAROUSEL_MAX_PATHS_PER_SUBMISSION = int(os.environ.get("CAROUSEL_MAX_PATHS_PER_SUBMISSION", "100000"))
CAROUSEL_MAX_PATH_BYTES = 4096

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"carousel": {"handlers": ["console"], "level": os.environ.get("CAROUSEL_LOG_LEVEL", "INFO")}},
}
