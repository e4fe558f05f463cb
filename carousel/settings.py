"""Settings come from the environment; with nothing set, the embedded default runs:
SQLite in var/ and Celery on kombu's filesystem transport, so no server is needed."""
import json
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("CAROUSEL_VAR_DIR", BASE_DIR / "var"))


def env_bool(name, default=False):
    return os.environ.get(name, str(default)).lower() in ("1", "true", "yes", "on")


def env_list(name):
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


# Published with the code, so fit only for the embedded default: on PostgreSQL the system check
# carousel.E006 refuses to start with it, with DEBUG on or with no ALLOWED_HOSTS (carousel/infra/deploy.py).
EMBEDDED_SECRET_KEY = "carousel-embedded-insecure-key-set-SECRET_KEY-in-production"
SECRET_KEY = os.environ.get("SECRET_KEY") or EMBEDDED_SECRET_KEY
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS") if "ALLOWED_HOSTS" in os.environ else ["127.0.0.1", "localhost", "[::1]"]


def env_plugins(name, shipped):
    """A plugin registry, name -> dotted path: the shipped entries, with those of the environment
    variable `name` added or put in their place. The variable holds a JSON object, e.g.
    CAROUSEL_SORT_POLICIES='{"LIFO": "site_policies.Newest"}' (docs/plugins.md)."""
    try:
        named = json.loads(os.environ.get(name) or "{}")
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} is not JSON: {exc}") from exc
    if not isinstance(named, dict) or not all(isinstance(v, str) and v for v in named.values()):
        raise ImproperlyConfigured(f'{name} must be a JSON object of name -> dotted path, e.g. '
                                   f'{{"site": "site_plugins.Example"}}; got {os.environ[name]!r}')
    return {**shipped, **named}


# Behind a TLS-terminating proxy (docs/operations.md): the proxy's public origins, e.g.
# https://carousel.example.org, or every form POST fails Django's CSRF origin check; the header
# the proxy sets to say the client spoke HTTPS (it must overwrite any such header a client sent);
# cookies sent over HTTPS only.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
if os.environ.get("SECURE_PROXY_SSL_HEADER"):
    # "X-Forwarded-Proto: https" -> ("HTTP_X_FORWARDED_PROTO", "https")
    _header, _, _value = os.environ["SECURE_PROXY_SSL_HEADER"].partition(":")
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _header.strip().upper().replace("-", "_"), _value.strip() or "https")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)

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
    "axes",
    "carousel",
    "policies",
    "api",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's and the pages' static files without a separate web server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # 400 for a NUL in a query parameter, before any view filters a list by it.
    "carousel.infra.querynul.QueryNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Answers a locked-out login with the lockout page (django-axes, AUTHENTICATION_BACKENDS).
    "axes.middleware.AxesMiddleware",
    # Last, so that it sees what escapes the views: an outage answers 503 with Retry-After.
    "carousel.infra.outages.OutageMiddleware",
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
                "carousel.infra.deploy.stager_context",
            ],
        },
    },
]

# The embedded default; demo accounts are created only there (carousel/infra/deploy.py).
EMBEDDED_DATABASE_PATH = VAR_DIR / "carousel.sqlite3"
_DATABASE_URL = os.environ.get("DATABASE_URL", f"sqlite:///{EMBEDDED_DATABASE_PATH}")
# Persistent connections: opening a PostgreSQL connection (a backend forked, authenticated,
# its caches cold) cost more server CPU than the poll it served; opening the embedded SQLite
# file is not cheap either (the file opened, WAL set, Django's functions registered: 22% of a
# gunicorn worker's CPU under schemathesis, py-spy; 814 requests took 11 s of its CPU with a
# connection each, 7-8 s with one kept). A process keeps its connection for CONN_MAX_AGE
# seconds (60 by default; 0: a connection per request), and checks it before reusing it, so a
# database restart costs one reconnect, not an error. The development server closes its
# connections at the end of each request's thread, whatever this says.
DATABASES = {
    "default": dj_database_url.parse(
        _DATABASE_URL,
        conn_max_age=int(os.environ.get("CONN_MAX_AGE", "60")),
        conn_health_checks=True,
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
# Limits of one submission: its paths; a cancel or a release takes as many in one call.
CAROUSEL_MAX_PATHS_PER_SUBMISSION = int(os.environ.get("CAROUSEL_MAX_PATHS_PER_SUBMISSION", "100000"))
# The largest body the API and the pages read (past it: 413 in the API's error format). The
# submit endpoint takes a whole submission in one body: 64 MiB is 671 bytes for each of 100,000
# paths (a path of 600 bytes, its JSON quotes and comma), and a site's larger limit gets as much
# a path; never less than 64 MiB, which the Tape REST door's 100,000 files need too (archive
# paths are 60-200 bytes; a path may be up to 4096 bytes, but 100,000 of those would be 410 MB
# held in a web worker's memory: split such a list into several submissions).
DATA_UPLOAD_MAX_MEMORY_SIZE = max(64 * 1024 * 1024, 671 * CAROUSEL_MAX_PATHS_PER_SUBMISSION)

AUTH_PASSWORD_VALIDATORS = []
# Failed logins are limited (django-axes): after AXES_FAILURE_LIMIT failures for one user name from
# one client address, that pair is refused, even with the right password, until the cool-off has
# passed. Locking by the pair, not by the name alone, keeps a stranger from locking a user out from
# afar, as long as the address is the client's: behind a proxy REMOTE_ADDR is the proxy's, so set
# CAROUSEL_TRUSTED_PROXIES (below), or every client shares the proxy's lockouts.
# The admin's and the pages' login forms go through authenticate(), so through axes; the API's
# tokens and WLCG JWTs never do, and are not counted.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = 5
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_USERNAME_CALLABLE = "carousel.infra.logins.attempt_username"
# The client address axes counts by (through django-ipware). With N trusted proxies in front, each
# appending the address it was reached from to X-Forwarded-For (nginx's $proxy_add_x_forwarded_for),
# the client is the N-th entry from the right (ipware's proxy count is the N-1 entries after it);
# what a client wrote into the header itself stays on the left and changes nothing, hence the
# non-strict reading that counts from the right. The header alone is read: with REMOTE_ADDR as a
# second choice, ipware would prefer a proxy's public address to an intranet client's private one.
# 0, the default: REMOTE_ADDR only, the header is ignored.
try:
    CAROUSEL_TRUSTED_PROXIES = int(os.environ.get("CAROUSEL_TRUSTED_PROXIES") or 0)
except ValueError:
    CAROUSEL_TRUSTED_PROXIES = -1
if CAROUSEL_TRUSTED_PROXIES < 0:
    raise ImproperlyConfigured("CAROUSEL_TRUSTED_PROXIES must be the number of proxies in front of Carousel "
                               f"(0, 1, ...); got {os.environ['CAROUSEL_TRUSTED_PROXIES']!r}")
if CAROUSEL_TRUSTED_PROXIES:
    AXES_IPWARE_PROXY_COUNT = CAROUSEL_TRUSTED_PROXIES - 1
    AXES_IPWARE_META_PRECEDENCE_ORDER = ("HTTP_X_FORWARDED_FOR",)
    IPWARE_STRICT = False
else:
    AXES_IPWARE_PROXY_COUNT = None
    AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The image collects them outside var/ (a volume that outlives upgrades).
STATIC_ROOT = Path(os.environ.get("CAROUSEL_STATIC_ROOT", VAR_DIR / "static"))
# Without collectstatic (make run, tests) WhiteNoise finds files where the apps keep them.
WHITENOISE_USE_FINDERS = True
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

# Completion notices: sent by SMTP once EMAIL_HOST is set, else written to the log (the console
# backend), so the embedded default needs no mail server.
EMAIL_HOST = os.environ.get("EMAIL_HOST") or "localhost"
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND") or (
    "django.core.mail.backends.smtp.EmailBackend" if os.environ.get("EMAIL_HOST")
    else "django.core.mail.backends.console.EmailBackend")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT") or "25")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS")  # STARTTLS, usually on port 587
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL")  # TLS from the first byte, usually on port 465
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL are exclusive: set one (STARTTLS on port 587, or "
                               "TLS from the start on port 465)")
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL") or "carousel@localhost"
# Notices go out from the cycle: a mail server that hangs must not hold the loop for long.
EMAIL_TIMEOUT = 10
# The broker's public address, for links in notices (e.g. https://carousel.example.org).
CAROUSEL_SITE_URL = os.environ.get("CAROUSEL_SITE_URL", "")
# How long an API token's look-up (its user and permissions) is kept in the shared cache; 0: read
# the database on every request (api/authentication.py).
CAROUSEL_TOKEN_CACHE_SECONDS = int(os.environ.get("CAROUSEL_TOKEN_CACHE_SECONDS", "30"))

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # "Authorization: Bearer <WLCG JWT or API token>" (gfal2 sends BEARER_TOKEN so), and
        # "Token <key>": API tokens with the token's user (and permissions) kept a short while
        # in the shared cache, so a poll costs no authentication query (api/authentication.py).
        "api.auth.BearerAuthentication",
        "api.authentication.CachedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Logged in, and a WLCG token only with a scope that allows something here (storage.stage
    # or storage.poll): carousel/domain/policy.py.
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated", "api.auth.HasStorageScope"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    # JSON only, with a body limit, a depth limit and text that is text (api/parsers.py).
    "DEFAULT_PARSER_CLASSES": ["api.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": None,
    # Per account, counted in the shared cache (api/throttles.py); past the rate: 429 with
    # Retry-After. A rate is "<count>/<second|minute|hour|day>".
    "DEFAULT_THROTTLE_CLASSES": ["api.throttles.AccountRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"account": os.environ.get("CAROUSEL_THROTTLE_RATE", "1200/minute")},
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Carousel API",
    "DESCRIPTION": "Tape-restore request broker: submit, follow and cancel restore requests.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Every operation's error answers, with the error body (api/schema.py); then the WLCG Tape
    # REST door, described as its v1 document shapes it (api/tape_rest/schema.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "api.schema.add_error_responses",
                             "api.tape_rest.schema.add_tape_rest_door"],
    # The views' own description for the native API only: the door's is written out whole.
    "PREPROCESSING_HOOKS": ["api.schema.native_api_only"],
}

# Celery: Redis when REDIS_URL is set, else kombu's filesystem transport under var/.
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT = None
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
else:
    _queue_dir = VAR_DIR / "celery-queue"
    # The fanout exchanges' tables (the worker's remote control); kombu's default is control/
    # in the working directory.
    _control_dir = VAR_DIR / "celery-control"
    for _dir in (_queue_dir, _control_dir):
        _dir.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    # kombu's filesystem transport, with each message visible only once written whole (a worker
    # could take one half written, lose it and stop: carousel/infra/fsbroker.py).
    CELERY_BROKER_TRANSPORT = "carousel.infra.fsbroker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "control_folder": str(_control_dir),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True

# One cache shared by every process (web workers, Celery): the API's throttles count in it and
# the Tape REST door keeps the issuers' keys in it. Redis when REDIS_URL is set (django-redis:
# one client per process, and its client for the throttles' pipeline); else files under var/,
# which every process of the embedded default sees (a per-process memory cache would let each
# gunicorn worker count its own throttle).
# While Redis is down the cache misses instead of failing (IGNORE_EXCEPTIONS, logged): the
# API-token look-up falls back to the database and the throttles let calls through, so an
# outage of the cache alone does not stop the doors (carousel/infra/outages.py).
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL,
                          "KEY_PREFIX": "carousel",
                          "OPTIONS": {"IGNORE_EXCEPTIONS": True, "SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 2}}}
    DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                          "LOCATION": str((VAR_DIR / "cache").resolve())}}
# Cancels and releases never wait behind a cycle, and copies to users' file systems (which can
# take minutes) never hold a cycle back: each kind has its queue, and production gives each a
# worker of its own (docker-compose.yml). `make run`'s single worker consumes all three.
CELERY_TASK_ROUTES = {
    "carousel.tasks.withdraw": {"queue": "control"},
    "carousel.tasks.deliver": {"queue": "delivery"},
    "carousel.tasks.send_notices": {"queue": "delivery"},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Beat ticks often and the cycle task decides from the control table whether a cycle is due,
# so an operator's change of the cycle period applies without a restart.
CAROUSEL_TICK_S = float(os.environ.get("CAROUSEL_TICK_S", "2"))

# Plugins (docs/plugins.md): each family is a registry, name -> dotted path, resolved lazily with
# import_string (carousel/infra/plugins.py). A site adds entries, or puts its own in place of
# shipped ones, with the environment variable of the same name (a JSON object: env_plugins).
CAROUSEL_STAGERS = env_plugins("CAROUSEL_STAGERS", {
    "immediate": "carousel.stagers.immediate.ImmediateStager",
    "hpss": "carousel.stagers.hpss.HpssStager",
    "tape-rest": "carousel.stagers.tape_rest.TapeRestStager",
    "command": "carousel.stagers.command.CommandStager",
    "simulated": "carousel.stagers.simulated.SimulatedStager",
})
# The simulated tape library is the embedded default: `make run` shows tapes mounting and
# files staging with no tape system behind it (options: speedup, drives, media, tapes).
CAROUSEL_STAGER = os.environ.get("CAROUSEL_STAGER", "simulated")
# The sorting and sharing policies are chosen by name in the control row (the admin lists every
# name registered here).
CAROUSEL_SORT_POLICIES = env_plugins("CAROUSEL_SORT_POLICIES", {
    "NONE": "policies.sorting.Fifo",
    "TAPEID": "policies.sorting.TapeId",
    "SLIDER": "policies.sorting.Slider",
})
CAROUSEL_SHARE_POLICIES = env_plugins("CAROUSEL_SHARE_POLICIES", {
    "EQUAL": "policies.sharing.Equal",
    "GROUP": "policies.sharing.Group",
    "GRPW": "policies.sharing.GroupWeighted",
})
# Who gets the next mount (policies/turns.py): a name in the registry, or a dotted path.
CAROUSEL_TURN_POLICIES = env_plugins("CAROUSEL_TURN_POLICIES", {
    "fair": "policies.turns.FairTurns",
})
CAROUSEL_TURN_POLICY = os.environ.get("CAROUSEL_TURN_POLICY", "fair")
# `immediate` marks requests restored without reading a tape: the worker and beat refuse to
# start on it unless this is set (carousel/infra/deploy.py).
CAROUSEL_ALLOW_IMMEDIATE = env_bool("CAROUSEL_ALLOW_IMMEDIATE", False)
# Keyword arguments of the stager's class, as JSON (e.g. {"url": ..., "token_file": ...}).
CAROUSEL_STAGER_OPTIONS = json.loads(os.environ.get("CAROUSEL_STAGER_OPTIONS") or "{}")
CAROUSEL_DELIVERIES = env_plugins("CAROUSEL_DELIVERIES", {
    "none": "carousel.loop.delivery.InPlace",
    "copy": "carousel.loop.delivery.LocalCopy",
    "command": "carousel.loop.delivery.SiteCommand",
})
CAROUSEL_DELIVERY = os.environ.get("CAROUSEL_DELIVERY", "none")
CAROUSEL_DELIVERY_OPTIONS = json.loads(os.environ.get("CAROUSEL_DELIVERY_OPTIONS") or "{}")

# Who may restore what (carousel/domain/authz.py): "allow-all", "group-prefixes" (a group's path
# prefixes, edited in the admin), or a site's class as a dotted path.
CAROUSEL_PATH_AUTHORIZATIONS = env_plugins("CAROUSEL_PATH_AUTHORIZATIONS", {
    "allow-all": "carousel.domain.authz.AllowAll",
    "group-prefixes": "carousel.domain.authz.GroupPrefixes",
})
CAROUSEL_PATH_AUTHORIZATION = os.environ.get("CAROUSEL_PATH_AUTHORIZATION", "allow-all")
# Where restored files may be delivered, for everyone (colon-separated absolute paths); groups
# get more in the admin. Empty, and no group roots: destinations are refused.
CAROUSEL_DESTINATION_ROOTS = [p for p in os.environ.get("CAROUSEL_DESTINATION_ROOTS", "").split(":") if p]
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

# A submission of more new files than this is answered once they are durable in the intake and
# queued moments later (carousel/domain/intake.py). Storing a request directly costs about 60 us
# (docs/benchmarks.md, "Ingest against a bare COPY"), so up to 1,000 files are queued within the
# answer's ~60 ms, as an XRootD hook's one-file prepare is; bigger ones would wait seconds.
CAROUSEL_INTAKE_ABOVE = int(os.environ.get("CAROUSEL_INTAKE_ABOVE", "1000"))
CAROUSEL_MAX_PATH_BYTES = 4096

# Who may scrape /metrics (carousel/ops/metrics.py): clients from these networks (CIDR,
# comma-separated), or with `Authorization: Bearer <CAROUSEL_METRICS_TOKEN>`. Open on the
# embedded default; loopback only when DATABASE_URL is set and nothing is said.
_EMBEDDED = "DATABASE_URL" not in os.environ
CAROUSEL_METRICS_ALLOW = env_list("CAROUSEL_METRICS_ALLOW") or (
    ["0.0.0.0/0", "::/0"] if _EMBEDDED else ["127.0.0.1/32", "::1/128"])
CAROUSEL_METRICS_TOKEN = os.environ.get("CAROUSEL_METRICS_TOKEN", "")

# Retention (carousel/ops/retention.py): finished requests, transitions, jobs and submissions
# (the Tape REST door's stage requests among them) older than this are pruned; the rolled-up
# usage rows and the metrics' counters stay.
CAROUSEL_RETENTION_DAYS = float(os.environ.get("CAROUSEL_RETENTION_DAYS", "14"))
CAROUSEL_RETENTION_EVERY_S = float(os.environ.get("CAROUSEL_RETENTION_EVERY_S", "3600"))
CAROUSEL_RETENTION_BATCH = int(os.environ.get("CAROUSEL_RETENTION_BATCH", "2000"))
CAROUSEL_RETENTION_BUDGET_S = float(os.environ.get("CAROUSEL_RETENTION_BUDGET_S", "300"))

# Structured logs (carousel/ops/logs.py): CAROUSEL_LOG_FORMAT=json (one object per line, with the
# cycle, job and request ids where they exist) or text; by default text in a terminal, JSON
# elsewhere. The Celery processes use this configuration too (carousel/celery.py).
from carousel.ops.logs import logging_config  # noqa: E402

LOGGING = logging_config(level=os.environ.get("CAROUSEL_LOG_LEVEL", "INFO"))
