"""Asking the worker for work by the task's registered name.

carousel/tasks.py holds the Celery tasks and imports the loop and the domain they wrap; a lower
layer that needs one of them run (the intake, the loop's delivery step) names it here instead of
importing it, so that dependencies keep pointing down. Every process registers the tasks when
Django starts (CarouselConfig.ready imports carousel.tasks)."""
import logging

from celery import current_app
from django.db import transaction

log = logging.getLogger(__name__)


def send_on_commit(name, *args, robust=False, refused=None):
    """Send the task registered as `name` once the current transaction commits (at once outside
    one). robust: a broker that refuses the task is logged, not raised, for work whose
    fallback is the next cycle; `refused`, if given, is called then (to make that fallback
    come at once rather than after a lease)."""
    task = current_app.tasks[name]
    if refused is None:
        transaction.on_commit(lambda: task.delay(*args), robust=robust)
        return

    def send():
        try:
            task.delay(*args)
        except Exception:  # noqa: BLE001 - whatever the broker raised, the task is not queued
            log.exception("the broker refused %s; the next cycle does the work", name)
            refused()

    transaction.on_commit(send)
