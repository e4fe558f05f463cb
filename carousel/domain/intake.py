"""The intake: how a big submission is answered as soon as its files are durable.

Storing a new RestoreRequest costs far more than writing its row: it enters the scheduler's
indexes (the trigram index of the path among them), the counters' triggers and three foreign
key checks. For 100,000 files that was about 6 s of the POST, eight times a bare COPY of the
same rows. So restore_submit validates the whole submission and checks it against the user's
active requests and ceiling (all or nothing, as before), and then writes a submission of more
than CAROUSEL_INTAKE_ABOVE new files as narrow Intake rows (one COPY, one index) and answers.
`settle` moves them into the queue, with the submission's options kept on its Bulk row, as the
direct path would have stored them (queue_new serves both):

- at once after the commit, in a Celery task (tasks.settle_intake);
- at the start of every cycle, for whatever is still waiting (the worker was down);
- before a write acts on the submission or on the user's queue: the user's next submission
  (its duplicates must be seen), a cancel, a release. Reads never settle (a GET writes nothing).

Until then the Tape REST door shows the waiting files as SUBMITTED (grid.stage_status) and the
submission's counts show them as queued."""
import contextvars
import logging
from contextlib import contextmanager

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from carousel.infra import db, queue
from carousel.models import ACTIVE_STATES, IN_FLIGHT_STATES, Bulk, BulkItem, Intake, RequestState, RestoreRequest

log = logging.getLogger(__name__)

COLUMNS = ("user_id", "group_id", "bulk_id", "path", "path_key", "priority", "destination", "destination_layout",
           "deadline", "pin_lifetime", "state", "attempts", "error_class", "last_error", "job_id", "job_rank",
           "created_at", "updated_at", "submitted_at", "started_at")


_direct = contextvars.ContextVar("carousel_intake_direct", default=False)


@contextmanager
def direct():
    """Within it, every submission is queued within its call, however big. For the replays
    (carousel/sim): they drive the loop in-process on simulated time, with no worker to run the
    task a commit sends; the requests are the same either way (queue_new serves both)."""
    token = _direct.set(True)
    try:
        yield
    finally:
        _direct.reset(token)


def goes_through(new_files):
    """Whether a submission of this many new files is answered from the intake."""
    return new_files > settings.CAROUSEL_INTAKE_ABOVE and not _direct.get()


def in_flight(keys):
    """{path_key: (state, job, rank, submitted_at, started_at)} of files some user is already
    staging: a new request for one joins that stage rather than reading the tape again."""
    rows = (RestoreRequest.objects.filter(db.in_keys("path_key", keys), state__in=IN_FLIGHT_STATES)
            .values_list("path_key", "state", "job_id", "job_rank", "submitted_at", "started_at"))
    return {key: rest for key, *rest in rows}


def queue_new(bulk, pairs, shared, now):
    """Store new requests of `bulk` for (path, path_key) pairs; `shared`: in_flight() of them."""
    common = (bulk.user_id, bulk.group_id, bulk.id)
    options = (bulk.priority, bulk.destination or "", bulk.destination_layout, bulk.deadline, bulk.pin_lifetime)

    def row(path, key):
        joined = shared.get(key)
        if joined:
            state, job_id, job_rank, submitted_at, started_at = joined
            return (*common, path, key, *options, state, 0, "", "", job_id, job_rank, bulk.created_at, now,
                    submitted_at, started_at)
        return (*common, path, key, *options, RequestState.QUEUED, 0, "", "", None, 0, bulk.created_at, now,
                None, None)

    # New requests carry their submission on the row (no ids needed back).
    db.insert_rows(RestoreRequest, COLUMNS, (row(p, k) for p, k in pairs), ids=False)


def write(bulk, pairs):
    """The POST's side: the new files as intake rows, moved once the transaction commits."""
    db.insert_rows(Intake, ("bulk_id", "n", "path", "path_key"),
                   ((bulk.id, n, p, k) for n, (p, k) in enumerate(pairs)), ids=False)
    # robust: a broker that cannot take the task must not turn the stored submission's answer
    # into an error; the next cycle queues the files.
    queue.send_on_commit("carousel.tasks.settle_intake", str(bulk.id), robust=True)


def settle(bulk_id, *, now=None, wait=True):
    """Move a submission's intake rows into the queue, in one transaction; a no-op if another
    process already did (the Bulk row is locked: two settlers of one submission take turns).
    wait=False: leave a submission another process is moving to it. Returns how many files
    were moved."""
    now = now or timezone.now()
    with transaction.atomic():
        bulk = Bulk.objects.select_for_update(skip_locked=not wait).filter(pk=bulk_id, pending__gt=0).first()
        if bulk is None:
            return 0
        pairs = list(Intake.objects.filter(bulk_id=bulk.id).order_by("n").values_list("path", "path_key"))
        keys = [k for _, k in pairs]
        # The user's own requests for these files that became active since the answer (the
        # answer's check ran under the account lock; this keeps "one active request per user
        # and file" whatever happened in between): the submission lists them, as a duplicate.
        own = dict(RestoreRequest.objects.filter(db.in_keys("path_key", keys), user_id=bulk.user_id,
                                                 state__in=ACTIVE_STATES).values_list("path_key", "id"))
        new = [(p, k) for p, k in pairs if k not in own] if own else pairs
        queue_new(bulk, new, in_flight([k for _, k in new]), now)
        db.insert_rows(BulkItem, ("bulk_id", "request_id"), ((bulk.id, i) for i in own.values()), ids=False)
        Intake.objects.filter(bulk_id=bulk.id).delete()
        Bulk.objects.filter(pk=bulk.id).update(pending=0, created=bulk.created - len(own))
    if own:
        log.info("intake of %s: %d files had become active requests of the user before the move", bulk_id, len(own))
    return len(pairs)


def settle_user(user):
    """Move every submission of `user` still waiting (before their next one is checked)."""
    for bulk_id in Bulk.objects.filter(user=user, pending__gt=0).order_by("created_at").values_list("pk", flat=True):
        settle(bulk_id)


def settle_if_pending(bulk):
    """Before acting on a submission: its waiting files become requests first. `bulk`: a Bulk
    (its pending count read with it: no query when nothing waits) or a submission id."""
    if isinstance(bulk, Bulk):
        if bulk.pending:
            settle(bulk.pk)
            bulk.pending = 0
    elif Bulk.objects.filter(pk=bulk, pending__gt=0).exists():
        settle(bulk)


def settle_pending(*, now, most=None):
    """The cycle's share: waiting submissions, oldest first, up to about `most` files (default
    CAROUSEL_MAX_PATHS_PER_SUBMISSION, one biggest submission). Returns the files moved."""
    most = most or settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION
    moved = 0
    for bulk_id in Bulk.objects.filter(pending__gt=0).order_by("created_at").values_list("pk", flat=True):
        if moved >= most:
            break
        moved += settle(bulk_id, now=now, wait=False)  # the task moving one now is not waited for
    return moved
