import os
import sys

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")

app = Celery("carousel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def schedule_cycle(sender, **kwargs):
    from django.conf import settings

    tick = settings.CAROUSEL_TICK_S
    # expires < tick: a tick that waited in the queue past the next one is dropped, not stacked.
    sender.add_periodic_task(tick, sender.signature("carousel.tasks.cycle_tick"), name="cycle tick",
                             expires=tick * 0.9)
    every = settings.CAROUSEL_RETENTION_EVERY_S
    sender.add_periodic_task(every, sender.signature("carousel.retention.prune_history"), name="prune history",
                             expires=every * 0.9)
    if settings.CAROUSEL_WLCG_ISSUERS:
        # WLCG issuers' keys: the task refetches only sets older than CAROUSEL_WLCG_KEYS_REFRESH_S.
        # Imported only when issuers are trusted, so a worker without them starts no slower.
        import carousel.grid.tokens  # noqa: F401 - registers the task

        sender.add_periodic_task(600.0, sender.signature("carousel.wlcg.refresh_all_keys"), name="wlcg keys",
                                 expires=540.0)


@signals.setup_logging.connect
@signals.celeryd_init.connect  # earlier: before the worker's privilege check warns
def use_django_logging(**kwargs):
    """Celery leaves logging to Django's LOGGING (carousel/ops/logs.py): one format for every process,
    applied now, before the worker's first warnings (which go through logging too)."""
    import logging.config

    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    logging.captureWarnings(True)


@signals.task_prerun.connect
def bind_cycle_id(task_id=None, task=None, **kwargs):
    """Every log line of a cycle carries its id (the cycle task's id); other tasks their own."""
    from carousel.ops.logs import bind

    key = "cycle" if task is not None and task.name == "carousel.tasks.cycle_tick" else "task"
    task.request.carousel_log_token = bind(**{key: task_id})


@signals.task_postrun.connect
def unbind_cycle_id(task=None, **kwargs):
    from carousel.ops.logs import unbind

    token = getattr(task.request, "carousel_log_token", None)
    if token is not None:
        unbind(token)
        task.request.carousel_log_token = None


@signals.worker_init.connect
@signals.beat_init.connect
def refuse_faking_stager(**kwargs):
    """The loop's processes do not start on a stager that fakes restores unless told to, nor on
    PostgreSQL with the published secret key, DEBUG on or no allowed hosts (carousel.E006)."""
    from django.core.exceptions import ImproperlyConfigured

    from carousel.infra.deploy import check_loop_stager, refuse_unsafe_production

    try:
        refuse_unsafe_production()
        check_loop_stager()
    except ImproperlyConfigured as exc:
        # Celery logs and swallows a handler's exception; SystemExit stops the process.
        print(f"carousel: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from exc
