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


@signals.worker_init.connect
@signals.beat_init.connect
def refuse_faking_stager(**kwargs):
    """The loop's processes do not start on a stager that fakes restores unless told to."""
    from django.core.exceptions import ImproperlyConfigured

    from .deploy import check_loop_stager

    try:
        check_loop_stager()
    except ImproperlyConfigured as exc:
        # Celery logs and swallows a handler's exception; SystemExit stops the process.
        print(f"carousel: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from exc
