"""Asking the worker for work by the task's registered name.

carousel/tasks.py holds the Celery tasks and imports the loop and the domain they wrap; a lower
layer that needs one of them run (the intake, the loop's delivery step) names it here instead of
importing it, so that dependencies keep pointing down. Every process registers the tasks when
Django starts (CarouselConfig.ready imports carousel.tasks)."""
from celery import current_app
from django.db import transaction


def send_on_commit(name, *args, robust=False):
    """Send the task registered as `name` once the current transaction commits (at once outside
    one). robust: a broker that refuses the task is logged, not raised, for work whose
    fallback is the next cycle."""
    task = current_app.tasks[name]
    transaction.on_commit(lambda: task.delay(*args), robust=robust)
