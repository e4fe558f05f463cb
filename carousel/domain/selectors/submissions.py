"""A submission in figures: its files per step, grouped in the database, and where its restored
files are. The counts are grouped counts read by index (the request_bulk index and BulkItem's
(bulk, request) key): a page of submissions costs the same few queries whatever their sizes,
and no file is brought into Python to be counted."""
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, F, Max, Min, Q, Sum, Window
from django.db.models.functions import FirstValue

from carousel.domain.paths import delivery_target
from carousel.infra import db
from carousel.models import (
    ACTIVE_STATES, TERMINAL_STATES, Bulk, JobState, RequestState, RestoreRequest,
)

S = RequestState

# The steps a person follows a file through, in the order the page's bar shows them. Every
# file of a submission is in exactly one.
STEPS = ("restored", "delivering", "being_read", "planned", "queued", "waiting_to_retry", "failed", "cancelled",
         "expired")
_TERMINAL_STEP = {S.DONE: "restored", S.FAILED: "failed", S.CANCELLED: "cancelled", S.EXPIRED: "expired"}


def step_of(state, job_state):
    """The step of a file in `state` whose job (if any) is in `job_state`: a submitted file whose
    job the mount plan has not sent yet is planned; once sent, it is on its drive."""
    if state in _TERMINAL_STEP:
        return _TERMINAL_STEP[state]
    if state == S.SUBMITTED:
        return "planned" if job_state == JobState.PENDING else "being_read"
    return {S.QUEUED: "queued", S.STAGING: "being_read", S.RETRY: "waiting_to_retry",
            S.DELIVERING: "delivering"}[state]


@dataclass(frozen=True)
class ActiveGroup:
    """Files of a submission at one step, on one tape and drive chain: (a "why not yet" line)."""

    step: str
    state: str
    tape: str | None  # its label; None: not located yet
    chain: str
    files: int
    first_id: int | None  # the group's file read first (its chain's order, then its mount's), and last
    last_id: int | None
    retry_at: datetime | None


@dataclass
class SubmissionFigures:
    counts: dict = field(default_factory=lambda: dict.fromkeys(STEPS, 0))
    not_located: int = 0
    bytes_known: int = 0  # of the files whose size the stager told
    bytes_restored: int = 0
    first_done_at: datetime | None = None
    last_done_at: datetime | None = None
    last_finished_at: datetime | None = None
    active: list = field(default_factory=list)  # ActiveGroup, the largest first


def _membership(bulk_ids):
    """The two ways a request belongs to a submission (RestoreRequest.bulk; BulkItem), each a
    queryset and the field naming the submission: grouped apart, each by its own index (their
    OR would scan the table)."""
    return ((RestoreRequest.objects.filter(bulk_id__in=bulk_ids), "bulk_id"),
            (RestoreRequest.objects.filter(bulk_items__bulk_id__in=bulk_ids), "bulk_items__bulk_id"))


# The order a group's files are read in: their jobs' order on the chain, their rank in the job,
# and, not in a job yet, their place on the tape.
_READ_ORDER = ("job__created_at", "job__rank", "job_rank", "position", "id")


def _ends(qs, group):
    """{group's values: (id of its file read first, of its file read last)} of the active requests
    of `qs` grouped by `group` (fields): one query, in the database. The estimates of these two
    files bound the group's (by id, the first and last were any of its files)."""
    part = [F(name) for name in group]
    first = [F(name).asc(nulls_last=True) for name in _READ_ORDER]
    last = [F(name).desc(nulls_first=True) for name in _READ_ORDER]
    rows = (qs.filter(state__in=ACTIVE_STATES).order_by()
            .annotate(first_read=Window(FirstValue("id"), partition_by=part, order_by=first),
                      last_read=Window(FirstValue("id"), partition_by=part, order_by=last))
            .values_list(*group, "first_read", "last_read").distinct())
    return {tuple(row[:-2]): tuple(row[-2:]) for row in rows}


def submission_figures(bulks):
    """{bulk id: SubmissionFigures} for `bulks` (Bulk rows): four grouped queries for them all."""
    bulks = list(bulks)
    out = {b.pk: SubmissionFigures() for b in bulks}
    if not bulks:
        return out
    with db.one_snapshot():
        return _figures(bulks, out)


def _figures(bulks, out):
    ids = list(out)
    # What the intake still holds, read again in this snapshot: the rows `bulks` came from
    # were read before it, and the intake moves files from there into the queue.
    pending = dict(Bulk.objects.filter(pk__in=ids).values_list("pk", "pending"))
    for qs, by in _membership(ids):
        rows = (qs.filter(state__in=TERMINAL_STATES).order_by().values_list(by, "state")
                .annotate(n=Count("id"), b=Sum("size"), first=Min("finished_at"), last=Max("finished_at")))
        for bulk_id, state, n, nbytes, first, last in rows:
            fig = out[bulk_id]
            fig.counts[_TERMINAL_STEP[state]] += n
            fig.bytes_known += nbytes or 0
            fig.last_finished_at = _later(fig.last_finished_at, last)
            if state == S.DONE:
                fig.bytes_restored += nbytes or 0
                fig.first_done_at = _earlier(fig.first_done_at, first)
                fig.last_done_at = _later(fig.last_done_at, last)
        group = (by, "state", "job__state", "job__chain", "tape__label")
        rows = (qs.filter(state__in=ACTIVE_STATES).order_by().values_list(*group)
                .annotate(n=Count("id"), b=Sum("size"), retry=Min("retry_at")))
        ends = _ends(qs, group)
        for bulk_id, state, job_state, chain, tape, n, nbytes, retry in rows:
            lo, hi = ends.get((bulk_id, state, job_state, chain, tape), (None, None))
            fig = out[bulk_id]
            step = step_of(state, job_state)
            fig.counts[step] += n
            fig.bytes_known += nbytes or 0
            if state == S.QUEUED and tape is None:
                fig.not_located += n
            fig.active.append(ActiveGroup(step=step, state=state, tape=tape, chain=chain or "", files=n,
                                          first_id=lo, last_id=hi, retry_at=retry))
    for bulk in bulks:
        fig = out[bulk.pk]
        if pending.get(bulk.pk):  # still in the intake: queued, not located (carousel/domain/intake.py)
            fig.counts["queued"] += pending[bulk.pk]
            fig.not_located += pending[bulk.pk]
            fig.active.append(ActiveGroup(step="queued", state=S.QUEUED, tape=None, chain="", files=pending[bulk.pk],
                                          first_id=None, last_id=None, retry_at=None))
        fig.active.sort(key=lambda g: -g.files)
    return out


def _earlier(a, b):
    return b if a is None or (b is not None and b < a) else a


def _later(a, b):
    return b if a is None or (b is not None and b > a) else a


def newest_bulks(user, *, size=10, before=None):
    """One page of the user's submissions, newest first (the (user, -created_at) index):
    (bulks, the `before` of the next page or None). `before`: (created_at, id) of the last one
    shown, or (created_at, None): submissions made at one moment (an API client's, a script's)
    straddling a page's end are each listed once (by created_at alone, the rest were skipped)."""
    qs = Bulk.objects.filter(user=user).order_by("-created_at", "-id")
    if before is not None:
        moment, last_id = before
        qs = qs.filter(Q(created_at__lt=moment) | Q(created_at=moment, id__lt=last_id) if last_id is not None
                       else Q(created_at__lt=moment))
    rows = list(qs[:size + 1])
    return rows[:size], ((rows[size - 1].created_at, rows[size - 1].id) if len(rows) > size else None)


def own_bulk(user, bulk_id):
    """The user's own submission `bulk_id`, or None."""
    return Bulk.objects.filter(user=user, pk=bulk_id).first()


# Where a restored file is -----------------------------------------------------------------

WHERE_DISK, WHERE_DELIVERED, WHERE_IN_PLACE = "disk", "delivered", "in_place"


def restored_where(*, path, staged_path, destination, destination_layout, delivery_fs):
    """(kind, place) of a restored file: delivered to its destination, when it was (it went
    through the delivery step: `delivery_fs` names the file system it was delivered on; a site
    whose delivery moves no files, the default, leaves the file where the stager put it, even
    for a request that named a destination); else on the stager's disk at the path it told;
    else used in place, at its own path (a stager that restores a file where it is named, such
    as a disk cache in front of the tape)."""
    if destination and delivery_fs:
        return WHERE_DELIVERED, delivery_target(destination, destination_layout, path)
    if staged_path:
        return WHERE_DISK, staged_path
    return WHERE_IN_PLACE, path


_WHERE_TEXT = {WHERE_DISK: "on disk at", WHERE_DELIVERED: "delivered to", WHERE_IN_PLACE: "used in place at"}


def where_text(kind, place):
    """"on disk at /x", "delivered to /y", "used in place at /z"."""
    return f"{_WHERE_TEXT[kind]} {place}"


RESTORED_COLUMNS = ("id", "path", "staged_path", "destination", "destination_layout", "delivery_fs", "pin_until", "finished_at",
                    "size")
FAILED_COLUMNS = ("id", "path", "state", "error_class", "last_error", "attempts", "finished_at")


def bulk_files(bulk, states, columns, *, chunk=2000):
    """values() rows of a submission's files in `states`, oldest first, read a chunk at a time
    by id (each part of the membership by its own index), for a download of any length."""
    for qs, _ in _membership([bulk.pk]):
        after = 0
        while True:
            rows = list(qs.filter(state__in=states, id__gt=after).order_by("id").values(*columns)[:chunk])
            yield from rows
            if len(rows) < chunk:
                break
            after = rows[-1]["id"]
