"""Celery tasks: thin wrappers around the loop and the services."""
from celery import shared_task
from django.db import transaction
from django.utils import timezone

from . import delivery, loop, plugins, withdrawals
from .models import Control


@shared_task(name="carousel.tasks.cycle_tick", ignore_result=True)
def cycle_tick():
    """Beat fires this every tick; a cycle runs when the control row's period has passed."""
    now = timezone.now()
    control = Control.get()
    if control.last_cycle_at and (now - control.last_cycle_at).total_seconds() < control.cycle_s * 0.95:
        return "not due"
    report = loop.run_cycle(now=now)
    return "skipped" if report.skipped else "ran"


@shared_task(name="carousel.tasks.withdraw", ignore_result=True)
def withdraw(pairs):
    """Take cancelled files back from the stager (pairs of job id and path)."""
    withdrawals.withdraw(plugins.stager(), [(job, path) for job, path in pairs])


def withdraw_on_commit(pairs):
    """Once a cancel commits, have the worker take the files back from the stager: the
    caller (an HTTP request, an admin action) does not wait on the stager."""
    if pairs:
        payload = [(str(job), path) for job, path in pairs]
        transaction.on_commit(lambda: withdraw.delay(payload))


@shared_task(name="carousel.tasks.deliver", ignore_result=True)
def deliver(ids):
    """Put staged files where their users asked (dispatched by the loop, throttled per file system)."""
    delivery.deliver_requests(ids, now=timezone.now())

