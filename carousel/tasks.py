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
def withdraw(pairs=None):
    """Send the recorded stager calls now rather than at the next cycle (a user's cancel). The
    calls were stored with the cancel; what this does not confirm, the cycle sends later.
    (`pairs`: ignored, accepted from messages queued by earlier versions.)"""
    withdrawals.send_stager_calls(now=timezone.now(), stager=plugins.stager())


def withdraw_on_commit(pairs):
    """Once a cancel that withdraws files commits, have the control queue send its stager calls:
    the caller (an HTTP request, an admin action) does not wait on the stager."""
    if pairs:
        transaction.on_commit(lambda: withdraw.delay())


@shared_task(name="carousel.tasks.deliver", ignore_result=True)
def deliver(ids):
    """Put staged files where their users asked (dispatched by the loop, throttled per file system)."""
    delivery.deliver_requests(ids, now=timezone.now())

