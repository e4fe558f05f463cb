"""Failures, retries and quarantine: what happens to a request the stager could not stage
or a delivery could not copy."""
import logging
import re
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import F, Q

from carousel.models import IN_FLIGHT_STATES, ErrorClass, RequestState as S, RestoreRequest, Tape
from carousel.domain.services import request_transition

log = logging.getLogger("carousel.loop")


@dataclass(frozen=True)
class Failure:
    message: str
    error_class: str


@dataclass
class FailureCount:
    retrying: int = 0
    failed: int = 0


# Failures that name the file, not the cartridge: a path the tape system does not have, a file
# withdrawn from a job (by someone at the tape system: the broker's own withdrawals are not
# polled). Counting these would quarantine a good tape for a user's typos.
NOT_ABOUT_THE_TAPE = re.compile(r"no such file|file not found|does not exist|enoent|withdrawn|cancell?ed",
                                re.IGNORECASE)


def says_about_tape(failure):
    """Whether a failed file's status is evidence against its tape (counted for quarantine)."""
    return (failure.error_class in (ErrorClass.TRANSIENT, ErrorClass.PERMANENT)
            and not NOT_ABOUT_THE_TAPE.search(failure.message or ""))


def due_retries(now):
    """The requests whose time to be tried again has come."""
    return RestoreRequest.objects.filter(state=S.RETRY, retry_at__lte=now)


def requeue_due_retries(*, now):
    # Run by the cycle only when some are due (carousel/loop/due.py asks the partial index,
    # request_retry_due): the guarded UPDATE costs several times more to build than to run.
    return request_transition(due_retries(now), S.QUEUED, now=now)


def count_tape_failures(failures, *, now, control):
    """Failures that cluster on one tape quarantine it: its requests wait instead of being
    retried against a bad cartridge, and the operator sees why. Conditional updates, so an
    operator lifting a quarantine meanwhile is never overwritten."""
    window_start = now - timedelta(seconds=control.quarantine_window_s)
    for tape_id, messages in failures.items():
        tapes = Tape.objects.filter(id=tape_id)
        tapes.filter(Q(failures_since__isnull=True) | Q(failures_since__lt=window_start)).update(
            recent_failures=0, failures_since=now)
        tapes.update(recent_failures=F("recent_failures") + len(messages))
        count = tapes.values_list("recent_failures", flat=True).first() or 0
        reason = f"{count} failures within {control.quarantine_window_s:.0f} s; last: {messages[-1]}"
        if count >= control.quarantine_failures and tapes.filter(quarantined_at__isnull=True).update(
                quarantined_at=now, quarantine_reason=reason):
            log.warning("tape %s quarantined: %s", tape_id, reason)


def fail_requests(queryset, status, *, now, control, report=None):
    """Transient and delivery failures wait for the next retry cycle until their attempts
    run out; permanent and user errors fail at once. `report` (a CycleReport, or anything
    with `retrying` and `failed`) gains the counts; they are also returned as a FailureCount."""
    report = report if report is not None else FailureCount()
    queryset = queryset.filter(state__in=(*IN_FLIGHT_STATES, S.DELIVERING))
    n = 0
    message = status.message
    # Tape attempts count submissions; delivery attempts count copies.
    counter, limit = {ErrorClass.TRANSIENT: ("attempts", control.max_attempts),
                      ErrorClass.DELIVERY: ("delivery_attempts", control.max_delivery_attempts)}.get(
        status.error_class, ("", 0))
    if limit:
        n = request_transition(queryset.filter(**{f"{counter}__lt": limit}), S.RETRY, now=now,
                               retry_at=now + timedelta(seconds=control.retry_cycle_s),
                               error_class=status.error_class, last_error=message)
        report.retrying += n
        message = f"{message} (gave up after {limit} attempts)"
    m = request_transition(queryset, S.FAILED, now=now, error_class=status.error_class or ErrorClass.PERMANENT,
                           last_error=message)
    report.failed += m
    return report
