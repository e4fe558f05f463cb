"""The intake: how a big submission is answered as soon as its files are durable.

Storing a new RestoreRequest costs far more than writing its row: it enters the scheduler's
indexes, the counters' triggers and the foreign key checks. For 100,000 files that was about 6 s of the POST, eight times a bare COPY of the
same rows. So restore_submit validates the whole submission and checks it against the user's
active requests and ceiling (all or nothing, as before), and then writes a submission of more
than CAROUSEL_INTAKE_ABOVE new files as narrow Intake rows (one COPY, one index) and answers.
`settle` moves them into the queue, with the submission's options kept on its Bulk row, as the
direct path would have stored them (queue_new's rows, written by INSERT ... SELECT in the
database):

- at once after the commit, in a Celery task (tasks.settle_intake);
- at the start of every cycle, for whatever is still waiting (the worker was down);
- before a write acts on the submission or on the user's queue: the user's next submission
  (its duplicates must be seen), a cancel, a release. Reads never settle (a GET writes nothing).

The path filter's trigram index (PathSearch) gets the moved requests afterwards, in a
transaction of its own (`index_paths`: the task, then the cycle for what it missed), so the
move does not pay for it; until then the filter reads their paths from the request table.

Until then the Tape REST door shows the waiting files as SUBMITTED (grid.stage_status) and the
submission's counts show them as queued."""
import contextvars
import logging
from contextlib import contextmanager

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from carousel.domain import ondisk
from carousel.infra import db, queue
from carousel.models import (ACTIVE_STATES, IN_FLIGHT_STATES, Bulk, BulkItem, Intake, PathSearch, RequestState,
                             RestoreRequest)

log = logging.getLogger(__name__)

COLUMNS = ("user_id", "group_id", "bulk_id", "path", "path_key", "priority", "activity", "destination",
           "destination_layout",
           "deadline", "pin_lifetime", "state", "attempts", "error_class", "last_error", "job_id", "job_rank",
           "created_at", "updated_at", "submitted_at", "started_at",
           # A file already on disk (ondisk.py): the pinned copy's place, and the request done or delivering.
           "size", "tape_id", "position", "finished_at", "pin_until", "staged_path", "delivery_fs", "copy_job")


_direct = contextvars.ContextVar("carousel_intake_direct", default=False)


@contextmanager
def direct():
    """Within it, every submission is queued within its call, however big. For the replays
    (carousel/sim): they drive the loop in-process on simulated time, with no worker to run the
    task a commit sends; the requests are the same either way (test_intake compares them)."""
    token = _direct.set(True)
    try:
        yield
    finally:
        _direct.reset(token)


def goes_through(new_files):
    """Whether a submission of this many new files is answered from the intake."""
    return new_files > settings.CAROUSEL_INTAKE_ABOVE and not _direct.get()


def queue_new(bulk, pairs, shared, now):
    """Store new requests of `bulk` for (path, path_key) pairs; `shared`: {path_key: (state,
    job, rank, submitted_at, started_at, size, tape, position)} of those some user is already staging (a new request
    joins that stage rather than reading the tape again). A file whose restored copy a request
    still pins is not read again: its request is done, or delivering, at once (ondisk.py). The
    direct path's writer; the move from the intake writes the same rows in SQL (_QUEUE_REST).
    Returns how many were served from a copy on disk."""
    common = (bulk.user_id, bulk.group_id, bulk.id)
    options = (bulk.priority, bulk.resolved_activity, bulk.destination or "", bulk.destination_layout, bulk.deadline, bulk.pin_lifetime)
    pinned = ondisk.pinned_copies([k for _, k in pairs], now=now)
    if pinned:
        disk_state, disk_fs, finished, pin_until = _from_disk(bulk, now)

    def row(path, key):
        copy = pinned.get(key) if pinned else None
        if copy:
            job_id, staged_path, size, tape_id, position, copy_pin = copy
            if disk_state == RequestState.DELIVERING:
                staged_path = staged_path or path  # the copy lies at the file's own path
            pin = pin_until or (copy_pin if finished else None)
            return (*common, path, key, *options, disk_state, 0, "", "", None, 0, bulk.created_at, now,
                    now, now, size, tape_id, position, finished, pin, staged_path, disk_fs, job_id)
        joined = shared.get(key)
        if joined:
            # Where the file is and its size, as the request it joins knows them (never located
            # itself: without them it counted no bytes and showed no tape).
            state, job_id, job_rank, submitted_at, started_at, size, tape_id, position = joined
            return (*common, path, key, *options, state, 0, "", "", job_id, job_rank, bulk.created_at, now,
                    submitted_at, started_at, size, tape_id, position, *_NOT_ON_DISK[3:])
        return (*common, path, key, *options, RequestState.QUEUED, 0, "", "", None, 0, bulk.created_at, now,
                None, None, *_NOT_ON_DISK)

    # New requests carry their submission on the row (no ids needed back).
    db.insert_rows(RestoreRequest, COLUMNS, (row(p, k) for p, k in pairs), ids=False)
    return len(pinned)


_NOT_ON_DISK = (None, None, None, None, None, "", "", None)


def _from_disk(bulk, now):
    """(state, delivery file system, finished_at, pin_until) of `bulk`'s new requests served
    from a copy already on disk: done with their own pin from now, or to the delivery step."""
    state, fs = ondisk.arrival(bulk.destination)
    done = state == RequestState.DONE
    return (state, fs, now if done else None,
            now + bulk.pin_lifetime if done and bulk.pin_lifetime is not None else None)


def write(bulk, pairs):
    """The POST's side: the new files as intake rows, moved once the transaction commits."""
    bulk_id = bulk.id.hex  # one text for every row, rather than a UUID dumped per row
    db.insert_rows(Intake, ("bulk_id", "n", "path", "path_key"),
                   ((bulk_id, n, p, k) for n, (p, k) in enumerate(pairs)), ids=False)
    # robust: a broker that cannot take the task must not turn the stored submission's answer
    # into an error; the next cycle queues the files.
    queue.send_on_commit("carousel.tasks.settle_intake", str(bulk.id), robust=True)


def _states(states):
    return ", ".join("'%s'" % state for state in states)  # the model's own constants, not input


# Both statements below are driven by the intake's rows, one at a time: every look-up in the
# request table is a subquery of one file (path_key), so it is an index probe whatever the
# planner believes of the table's size (db.index_probes keeps it from scanning or hashing).
REQUESTS = RestoreRequest._meta.db_table

# The submission's own requests for its waiting files that became active since the answer (the
# answer's check ran under the account lock; this keeps "one active request per user and file"
# whatever happened in between): the submission lists them, as a duplicate, with a BulkItem.
# At most one per file (the constraint one_active_request_per_user_and_file).
_LIST_OWN = f"""
    INSERT INTO {BulkItem._meta.db_table} (bulk_id, request_id)
    SELECT bulk_id, own FROM (
        SELECT i.bulk_id, (SELECT r.id FROM {REQUESTS} r WHERE r.path_key = i.path_key AND r.user_id = %s
                           AND r.state IN ({_states(ACTIVE_STATES)})) AS own
        FROM {Intake._meta.db_table} i WHERE i.bulk_id = %s) AS files
    WHERE own IS NOT NULL"""

# The others become requests carrying the submission's options, as queue_new writes them. A file
# whose restored copy a request still pins (p: the one pinned longest, locked FOR SHARE on
# PostgreSQL, ondisk.py) is done or delivering at once from that copy; else a file some user is
# already staging joins that stage (its state, job, rank and times), rather than reading the tape
# again. In the submission's order. (f: the file's active request found first in flight, by its
# id; the states are tested in the columns, not in the look-up: a condition on the in-flight
# states there lets the planner walk every request in flight for each file.) The parameters, in
# order (queue_rest): the state of a file served from disk, now (updated_at), now (its
# submitted_at and started_at), the flag and time of its finished_at, the flag of its pin_until
# and its own (none: until the copy's pin would have ended), whether it is delivered, its file
# system, the pins' cut-off (now), the submission.
_STAGED = f"f.state IN ({_states(IN_FLIGHT_STATES)})"
_JOINED = f"p.id IS NULL AND {_STAGED}"
_QUEUE_REST = f"""
    INSERT INTO {REQUESTS} ({", ".join(RestoreRequest._meta.get_field(c).column for c in COLUMNS)})
    SELECT b.user_id, b.group_id, b.id, i.path, i.path_key, b.priority, b.resolved_activity,
           COALESCE(b.destination, ''),
           b.destination_layout, b.deadline, b.pin_lifetime,
           CASE WHEN p.id IS NOT NULL THEN %s WHEN {_STAGED} THEN f.state ELSE '{RequestState.QUEUED}' END, 0, '', '',
           CASE WHEN {_JOINED} THEN f.job_id END,
           CASE WHEN {_JOINED} THEN f.job_rank ELSE 0 END,
           b.created_at, %s, CASE WHEN p.id IS NOT NULL THEN %s WHEN {_JOINED} THEN f.submitted_at END,
           CASE WHEN p.id IS NOT NULL THEN %s WHEN {_JOINED} THEN f.started_at END,
           CASE WHEN p.id IS NOT NULL THEN p.size WHEN {_JOINED} THEN f.size END,
           CASE WHEN p.id IS NOT NULL THEN p.tape_id WHEN {_JOINED} THEN f.tape_id END,
           CASE WHEN p.id IS NOT NULL THEN p.position WHEN {_JOINED} THEN f.position END,
           CASE WHEN p.id IS NOT NULL AND %s THEN %s END, CASE WHEN p.id IS NOT NULL AND %s THEN COALESCE(%s, p.pin_until) END,
           CASE WHEN p.id IS NULL THEN '' WHEN %s THEN COALESCE(NULLIF(p.staged_path, ''), i.path)
                ELSE p.staged_path END,
           CASE WHEN p.id IS NOT NULL THEN %s ELSE '' END, COALESCE(p.copy_job, p.job_id)
    FROM {Intake._meta.db_table} i
    JOIN {Bulk._meta.db_table} b ON b.id = i.bulk_id
    LEFT JOIN {REQUESTS} p ON p.id = (
        SELECT c.id FROM {REQUESTS} c WHERE c.path_key = i.path_key AND c.state = '{RequestState.DONE}'
        AND c.pin_until > %s ORDER BY c.pin_until DESC LIMIT 1 /*lock*/)
    LEFT JOIN {REQUESTS} f ON f.id = (
        SELECT s.id FROM {REQUESTS} s WHERE s.path_key = i.path_key AND s.state IN ({_states(ACTIVE_STATES)})
        ORDER BY s.state IN ({_states(IN_FLIGHT_STATES)}) DESC LIMIT 1 /*join-lock*/)
    WHERE i.bulk_id = %s AND NOT EXISTS (
        SELECT 1 FROM {REQUESTS} o
        WHERE o.path_key = i.path_key AND o.user_id = b.user_id AND o.state IN ({_states(ACTIVE_STATES)}))
    ORDER BY i.n"""


# Another user's request a new one joins at the stager (the same job, the same state) is locked
# FOR SHARE until the submission commits: a cancel of it then waits, and sees the new request
# when it asks whether anyone still wants the file, so it does not withdraw the file from the
# stager under the joiner (it did, when it committed first: the joiner's request failed as
# withdrawn). SKIP LOCKED: a request being changed now (cancelled, or moved by the loop) is not
# joined, the file is queued anew; nothing waits, so no lock order can deadlock.
JOIN_LOCK = "FOR SHARE SKIP LOCKED"


def lock_joinable(keys, user_id):
    """The ids of the other users' requests in flight for `keys` (hex digests) that a new
    request of `user_id` may join, locked as JOIN_LOCK says; None on SQLite (one writer at a
    time: any may be joined). By the index on path_key."""
    if not db.is_postgres():
        return None
    keys = list(keys)
    if not keys:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {REQUESTS} WHERE path_key = ANY(%s::uuid[]) AND state IN "
                       f"({_states(IN_FLIGHT_STATES)}) AND user_id <> %s ORDER BY id {JOIN_LOCK}",
                       ["{" + ",".join(map(str, keys)) + "}", user_id])
        return {row[0] for row in cursor.fetchall()}


# Before the move, on PostgreSQL: the pinned copies of the submission's files locked FOR SHARE in
# id order, as pins._end_pins locks the pins it ends, so that a release and a move sharing
# several copies take them in one order and never deadlock (the move's own look-up locks them in
# the submission's order, once they are held already). By the index request_pinned_path.
_LOCK_PINNED = f"""
    SELECT c.id FROM {REQUESTS} c JOIN {Intake._meta.db_table} i ON c.path_key = i.path_key
    WHERE i.bulk_id = %s AND c.state = '{RequestState.DONE}' AND c.pin_until > %s
    ORDER BY c.id FOR SHARE OF c"""


def queue_rest(bulk, now):
    """(_QUEUE_REST, its parameters) for moving `bulk`'s files."""
    at = connection.ops.adapt_datetimefield_value(now)
    state, fs, finished, pin_until = _from_disk(bulk, now)
    # The pinned copies read are locked until the move commits (ondisk.py); SQLite has one writer.
    sql = _QUEUE_REST.replace("/*lock*/", "FOR SHARE" if db.is_postgres() else "")
    sql = sql.replace("/*join-lock*/", JOIN_LOCK if db.is_postgres() else "")
    return sql, [state, at, at, at, finished is not None, at, finished is not None,
                 connection.ops.adapt_datetimefield_value(pin_until) if pin_until else None,
                 state == RequestState.DELIVERING, fs, at, Bulk._meta.pk.get_db_prep_value(bulk.id, connection)]


def settle(bulk_id, *, now=None, wait=True):
    """Move a submission's intake rows into the queue, in one transaction; a no-op if another
    process already did (the Bulk row is locked: two settlers of one submission take turns).
    wait=False: leave a submission another process is moving to it. Returns how many files
    were moved.

    The move is two INSERT ... SELECT statements in the database (the files never travel to
    Python and back: for 100,000 files that round trip was most of the move)."""
    now = now or timezone.now()
    db.fresh_statistics(REQUESTS)
    with transaction.atomic():
        bulk = Bulk.objects.select_for_update(skip_locked=not wait).filter(pk=bulk_id, pending__gt=0).first()
        if bulk is None:
            return 0
        with db.index_probes(), connection.cursor() as cursor:
            bulk_key = Bulk._meta.pk.get_db_prep_value(bulk.id, connection)  # SQLite keeps UUIDs as text
            cursor.execute(_LIST_OWN, [bulk.user_id, bulk_key])
            own = cursor.rowcount
            if db.is_postgres():
                cursor.execute(_LOCK_PINNED, [bulk_key, connection.ops.adapt_datetimefield_value(now)])
            cursor.execute(*queue_rest(bulk, now))
        moved, _ = Intake.objects.filter(bulk_id=bulk.id).delete()
        Bulk.objects.filter(pk=bulk.id).update(pending=0, created=bulk.created - own)
    if own:
        log.info("intake of %s: %d files had become active requests of the user before the move", bulk_id, own)
    return moved


def index_paths(bulk_id):
    """After its move: add a submission's requests to the path filter's index (PathSearch), in a
    transaction of its own, so the move that queues the files does not pay for it (a trigram
    index costs about a second per 100,000 paths). Until then the filter reads these paths from
    the request table (db.path_contains). Returns how many paths were added."""
    with transaction.atomic():
        bulk = (Bulk.objects.select_for_update().filter(pk=bulk_id, pending=0, paths_searchable=False)
                .only("pk").first())
        if bulk is None:
            return 0
        added = 0
        if db.is_postgres():  # SQLite has no trigram index: its filter reads the request table
            with connection.cursor() as cursor:
                cursor.execute(f"INSERT INTO {PathSearch._meta.db_table} (request_id, path) "
                               f"SELECT id, path FROM {REQUESTS} WHERE bulk_id = %s ON CONFLICT DO NOTHING",
                               [Bulk._meta.pk.get_db_prep_value(bulk.pk, connection)])
                added = cursor.rowcount
        Bulk.objects.filter(pk=bulk.pk).update(paths_searchable=True)
    return added


def waiting():
    """Submissions with files still in the intake."""
    return Bulk.objects.filter(pending__gt=0)


def unindexed():
    """Submissions moved into the queue whose paths the path filter's index has not yet got."""
    return Bulk.objects.filter(paths_searchable=False, pending=0)


def index_pending(*, most=None):
    """The cycle's share of index_paths: submissions moved and not yet indexed (the task that
    indexes them right after their move did not run), oldest first, up to about `most` paths."""
    most = most or settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION
    added = 0
    for bulk_id in unindexed().order_by("created_at").values_list("pk", flat=True):
        if added >= most:
            break
        added += index_paths(bulk_id)
    return added


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
    for bulk_id in waiting().order_by("created_at").values_list("pk", flat=True):
        if moved >= most:
            break
        moved += settle(bulk_id, now=now, wait=False)  # the task moving one now is not waited for
    return moved
