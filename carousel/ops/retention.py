"""Retention: history older than CAROUSEL_RETENTION_DAYS is pruned by a beat task, a batch at a
time, each batch its own short transaction, so no lock is held long. What goes: finished
requests (with their transitions and memberships), transitions of any request, finished jobs and
submissions with no request left, which includes the Tape REST door's stage requests (they are
submissions); never a request whose pin has not ended. What stays: the rolled-up rows (UsageDay, UsageWait, CounterTotal, HourlyStats),
so usage reports and the metrics' counters do not change when their requests go."""
import logging
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from carousel.models import FINISHED_JOB_STATES, TERMINAL_STATES, Bulk, BulkItem, Job, RestoreRequest, Transition

log = logging.getLogger("carousel.retention")



@dataclass
class Pruned:
    requests: int = 0
    transitions: int = 0
    jobs: int = 0
    submissions: int = 0
    complete: bool = True  # False: the time budget ran out; the next run goes on


def _batches(queryset, *, batch, deadline, pruned):
    """Delete the rows of `queryset` (ordered, oldest first) `batch` ids at a time; yield each
    batch's count. Stops at `deadline` (time.monotonic)."""
    while True:
        if time.monotonic() > deadline:
            pruned.complete = False
            return
        ids = list(queryset.values_list("pk", flat=True)[:batch])
        if not ids:
            return
        # Autocommit: each batch is its own transaction, its locks held for one batch only.
        yield queryset.model.objects.filter(pk__in=ids).delete()[1]
        if len(ids) < batch:
            return


def prune(*, now, older_than=None, batch=None, budget_s=None):
    """Prune what finished before now - older_than (default: CAROUSEL_RETENTION_DAYS)."""
    older_than = older_than if older_than is not None else timedelta(days=settings.CAROUSEL_RETENTION_DAYS)
    batch = batch or settings.CAROUSEL_RETENTION_BATCH
    deadline = time.monotonic() + (budget_s if budget_s is not None else settings.CAROUSEL_RETENTION_BUDGET_S)
    cutoff = now - older_than
    pruned = Pruned()
    # Uses the partial index request_finished. A request whose pin has not ended (pin_until set:
    # running, or run out and not yet ended by the loop) stays: its release is still to be sent,
    # and other users' releases must still see that the copy is pinned.
    finished = RestoreRequest.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=cutoff,
                                             pin_until__isnull=True).order_by("finished_at")
    for counts in _batches(finished, batch=batch, deadline=deadline, pruned=pruned):
        pruned.requests += counts.get(RestoreRequest._meta.label, 0)
        pruned.transitions += counts.get(Transition._meta.label, 0)
    old_transitions = Transition.objects.filter(at__lt=cutoff).order_by("at")
    for counts in _batches(old_transitions, batch=batch, deadline=deadline, pruned=pruned):
        pruned.transitions += counts.get(Transition._meta.label, 0)
    # A finished job still named by a request (one kept for a reason of its own) stays, and so
    # does one whose copy a kept request was served from (copy_job): the release its pins' end
    # sends names that job.
    jobs = (Job.objects.filter(state__in=FINISHED_JOB_STATES, finished_at__lt=cutoff)
            .exclude(Exists(RestoreRequest.objects.filter(job=OuterRef("pk"))))
            .exclude(Exists(RestoreRequest.objects.filter(copy_job=OuterRef("pk")))).order_by("finished_at"))
    for counts in _batches(jobs, batch=batch, deadline=deadline, pruned=pruned):
        pruned.jobs += counts.get(Job._meta.label, 0)
    # A submission goes once none of its requests is left: those it created carry it on their row,
    # those it asked for again are BulkItems.
    bulks = (Bulk.objects.filter(created_at__lt=cutoff, pending=0)  # none still in the intake
             .exclude(Exists(RestoreRequest.objects.filter(bulk=OuterRef("pk"))))
             .exclude(Exists(BulkItem.objects.filter(bulk=OuterRef("pk")))).order_by("created_at"))
    for counts in _batches(bulks, batch=batch, deadline=deadline, pruned=pruned):
        pruned.submissions += counts.get(Bulk._meta.label, 0)
    if pruned.requests or pruned.transitions or pruned.jobs or pruned.submissions:
        log.info("pruned history older than %s", cutoff.isoformat(), extra={"pruned": asdict(pruned)})
    return pruned


@shared_task(name="carousel.retention.prune_history", ignore_result=True)
def prune_history():
    """Beat runs this every CAROUSEL_RETENTION_EVERY_S."""
    return asdict(prune(now=timezone.now()))
