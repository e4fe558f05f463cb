import inspect

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from carousel.infra.deploy import configured_production_problems
from carousel.infra.plugins import PluginError, build_stager, resolve, resolve_choice

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
            errors.append(Error(str(exc), id="carousel.E005"))
    return errors


@register()
def stager_builds(app_configs, **kwargs):
    """The configured stager is built from its options, so a missing or refused option (tape-rest
    without its `url`) fails at start, not at every cycle. Its constructor only checks and keeps
    its options (docs/plugins.md): nothing is asked of the tape system here."""
    try:
        resolve("CAROUSEL_STAGERS", settings.CAROUSEL_STAGER)
    except PluginError:
        return []  # carousel.E001 or E002 says so
    try:
        build_stager()
    except PluginError as exc:
        return [Error(str(exc), hint="Set CAROUSEL_STAGER_OPTIONS to the options the stager's class takes "
                                     "(carousel/stagers/, docs/plugins.md).", id="carousel.E007")]
    return []


@register(Tags.security)
def production_settings(app_configs, **kwargs):
    """On PostgreSQL (production), `migrate`, `runserver` and every command that checks refuse the
    published secret key, DEBUG on and an empty ALLOWED_HOSTS; gunicorn and Celery refuse the
    same (carousel/wsgi.py, carousel/celery.py: deploy.refuse_unsafe_production)."""
    return [Error(problem, hint="DATABASE_URL names PostgreSQL, so this is a production start (docs/operations.md).",
                  id="carousel.E006") for problem in configured_production_problems()]


@register()
def delivery_takes_a_root(app_configs, **kwargs):
    """The delivery is called deliver(source, target, root=...): each file's own place and the
    root it must stay under (docs/plugins.md). A site's plugin written for the earlier
    deliver(source, destination) would fail every delivery: refused at start instead."""
    try:
        cls = resolve("CAROUSEL_DELIVERIES", settings.CAROUSEL_DELIVERY)
    except PluginError:
        return []  # said by plugins_resolve
    parameters = inspect.signature(cls.deliver).parameters.values()
    if any(p.name == "root" or p.kind is p.VAR_KEYWORD for p in parameters):
        return []
    return [Error(f"CAROUSEL_DELIVERY={settings.CAROUSEL_DELIVERY!r}: {cls.__name__}.deliver takes no root: a "
                  "delivery is called deliver(source, target, *, root) and must write nothing outside root nor "
                  "through a symbolic link below it (docs/plugins.md, carousel/infra/nofollow.py)",
                  id="carousel.E008")]


# The rows the database keeps by trigger (carousel/migrations/0002_triggers.py) and, for each,
# the triggers that keep them, on PostgreSQL and on SQLite. The code reads these rows as the
# truth (the summary, the scheduler's backlog, the live page, usage, /metrics): without one of
# its triggers, a kind of row silently stops following the requests.
TRIGGERS = {
    "the request history (Transition)": {
        "postgresql": ["carousel_request_transitions"],
        "sqlite": ["carousel_request_transitions"],
    },
    "the hourly stats (HourlyStats)": {
        "postgresql": ["carousel_hourly_stats"],
        "sqlite": ["carousel_hourly_stats"],
    },
    "the scheduler's backlog (UserBacklog, TapeBacklog)": {
        "postgresql": ["carousel_backlog_insert", "carousel_backlog_update", "carousel_backlog_delete"],
        "sqlite": ["carousel_backlog_insert_new", "carousel_backlog_update_old", "carousel_backlog_update_new",
                   "carousel_backlog_delete_old"],
    },
    "the per-user state counts (UserStateCount)": {
        "postgresql": ["carousel_state_counts_insert", "carousel_state_counts_update",
                       "carousel_state_counts_delete"],
        "sqlite": ["carousel_state_counts_insert_new", "carousel_state_counts_update_old",
                   "carousel_state_counts_update_new", "carousel_state_counts_delete_old"],
    },
    "usage, active counts and totals (UsageDay, UsageWait, StateCount, CounterTotal)": {
        "postgresql": ["carousel_usage_insert", "carousel_usage_update", "carousel_usage_delete",
                       "carousel_usage_job"],
        "sqlite": ["carousel_usage_insert", "carousel_usage_insert_active", "carousel_usage_update_old",
                   "carousel_usage_update_new", "carousel_usage_update_state", "carousel_usage_update_size",
                   "carousel_usage_delete", "carousel_usage_job_sent", "carousel_usage_job_finished"],
    },
    "the path filter's index (PathSearch)": {
        "postgresql": ["carousel_path_search_insert", "carousel_path_search_delete"],
        "sqlite": [],
        # Made by a migration after the squashed set: checked where that migration is applied.
        "migration": ("carousel", "0009_path_search"),
    },
    "a request's references to its user, group and submission (constraints before)": {
        "postgresql": ["carousel_request_refs_insert", "carousel_request_refs_update",
                       "carousel_request_refs_auth_user_delete", "carousel_request_refs_auth_group_delete",
                       "carousel_request_refs_carousel_bulk_delete"],
        "sqlite": [],  # its table keeps the constraints (0014_request_refs)
        "migration": ("carousel", "0014_request_refs"),
    },
}


def installed_triggers(connection):
    """The names of the enabled triggers in the connection's database."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgenabled <> 'D'")
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        return {name for (name,) in cursor.fetchall()}


@register(Tags.database)
def triggers_exist(app_configs, databases=None, **kwargs):
    """Every trigger the code relies on exists, once the migrations are applied (before, as when
    `migrate` runs its checks, they are not there yet and migrate will create them)."""
    errors = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor not in ("postgresql", "sqlite"):
            continue
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            continue
        installed = installed_triggers(connection)
        for kept, names in TRIGGERS.items():
            if "migration" in names and names["migration"] not in executor.loader.applied_migrations:
                continue
            missing = [name for name in names[connection.vendor] if name not in installed]
            if missing:
                errors.append(Error(
                    f"database {alias!r}: trigger {', '.join(missing)} missing or disabled, so {kept} "
                    "no longer follows the requests",
                    hint="Create it again as carousel/migrations/0002_triggers.py does (a migration that "
                         "rebuilt the table on SQLite drops its triggers).",
                    id="carousel.E004"))
    return errors
