"""Celery tasks: thin wrappers around the loop and the services."""
import contextlib
import logging

from celery import shared_task
from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from carousel.loop import delivery
from carousel.domain import intake, services
from carousel.loop import cycle as loop
from carousel.infra import plugins
from carousel.loop import withdrawals
from carousel.models import Control

log = logging.getLogger("carousel.loop")
_database_down = False  # this worker process has logged that the database is unreachable


@shared_task(name="carousel.tasks.cycle_tick", ignore_result=True)
def cycle_tick():
    """Beat fires this every tick; a cycle runs when the control row's period has passed. While
    the database is unreachable each tick is skipped; the outage is logged once, when it begins,
    and once more when it ends, rather than a traceback per tick."""
    global _database_down
    try:
        now = timezone.now()
        control = Control.get()
        if control.last_cycle_at and (now - control.last_cycle_at).total_seconds() < control.cycle_s * 0.95:
            result = "not due"
        else:
            result = "skipped" if loop.run_cycle(now=now).skipped else "ran"
    except (OperationalError, InterfaceError) as exc:
        with contextlib.suppress(Exception):
            connection.close()  # a new connection at the next tick
        if not _database_down:
            log.error("database unreachable, cycles wait until it is back: %s", str(exc).strip())
        _database_down = True
        return "database down"
    if _database_down:
        log.warning("database back: cycles run again")
        _database_down = False
    return result


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
        # robust: the calls are recorded and the cycle sends them; a broker that cannot take
        # the task must not turn the committed cancel's answer into an error.
        transaction.on_commit(lambda: withdraw.delay(), robust=True)


@shared_task(name="carousel.tasks.deliver", ignore_result=True)
def deliver(ids):
    """Put staged files where their users asked (dispatched by the loop, throttled per file system)."""
    delivery.deliver_requests(ids, now=timezone.now())


@shared_task(name="carousel.tasks.send_notices", ignore_result=True)
def send_notices():
    """Mail the notices of finished submissions (sent by the cycle when some are due)."""
    services.bulk_notify_complete(now=timezone.now())


@shared_task(name="carousel.tasks.settle_intake", ignore_result=True)
def settle_intake(bulk_id):
    """Queue a big submission's files from the intake, right after its answer (carousel/domain/intake.py);
    what this does not do, the next cycle does."""
    intake.settle(bulk_id, now=timezone.now())
    # Then, queued and committed, their paths join the path filter's index.
    intake.index_paths(bulk_id)
