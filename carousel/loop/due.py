"""What a cycle's steps have to do, asked of the database in one statement, twice a cycle.

Most cycles most steps find nothing to do. Asked one by one, each asked a query the ORM built
anew: about 0.9 ms of CPU a query, several times what the database spends on the indexed look
itself, and an idle cycle asked some twenty. Here each step's condition is one EXISTS over the
partial index its own query uses, and a cycle asks them together: before its steps, and again
after its work (what progress, claiming and sending may have changed: files to deliver, pins,
stager calls, notices). A step whose condition is false is not run; one whose condition is true
runs as before, its own query deciding what it does.

Each condition is written twice, as the SQL here and as the step's own queryset (named in
CONDITIONS): tests/test_due.py checks, row by row on generated tables, that they agree."""
from django.db import connection

from carousel.domain import counters, intake, pins
from carousel.domain.services import notices_waiting
from carousel.loop import deadlines, delivery, failures, mounts, progress, withdrawals
from carousel.models import (ACTIVE_STATES, IN_FLIGHT_STATES, Bulk, Job, JobState, RequestState as S, RestoreRequest,
                             StagerCall, sql_values)

_REQUESTS, _BULKS = RestoreRequest._meta.db_table, Bulk._meta.db_table


# mounts.short_mounts_waiting() as SQL (jobs `w`, each following job `a`), for the question and
# for the replay's next wake-up (carousel/sim/replay.py).
SHORT_MOUNTS_WAITING = (f"FROM {Job._meta.db_table} w JOIN {Job._meta.db_table} a ON a.id = w.after_id "
                        f"WHERE w.state = '{JobState.PENDING.value}' AND w.jumps_queue AND a.state = '{JobState.SENT.value}'")


# name: (EXISTS ..., whether its one parameter is the cycle's time, the step's queryset of now)
CONDITIONS = {
    # intake.settle_pending, intake.index_pending
    "waiting": (f"EXISTS (SELECT 1 FROM {_BULKS} WHERE pending > 0)", False, lambda now: intake.waiting()),
    "unindexed": (f"EXISTS (SELECT 1 FROM {_BULKS} WHERE NOT paths_searchable AND pending = 0)", False,
                  lambda now: intake.unindexed()),
    # withdrawals.expire_requests
    "expiring": (f"EXISTS (SELECT 1 FROM {_REQUESTS} WHERE deadline < %s AND state IN ({sql_values(ACTIVE_STATES)}))",
                 True, withdrawals.expiring),
    # failures.requeue_due_retries
    "retries": (f"EXISTS (SELECT 1 FROM {_REQUESTS} WHERE state = '{S.RETRY.value}' AND retry_at <= %s)", True,
                failures.due_retries),
    # progress.requeue_orphans: an orphan is a request in flight
    "in_flight": (f"EXISTS (SELECT 1 FROM {_REQUESTS} WHERE state IN ({sql_values(IN_FLIGHT_STATES)}))", False,
                  lambda now: progress.in_flight()),
    # deadlines.end_overdue_jobs (progress only ends jobs, so none is sent between the two)
    "sent": (f"EXISTS (SELECT 1 FROM {Job._meta.db_table} WHERE state = '{JobState.SENT.value}')", False,
             lambda now: deadlines.sent()),
    # mounts.preempt, asked before the work. The steps before preempt only end sent jobs and
    # make new ones, which have not waited; a short mount the plan links behind a sent one in
    # the same cycle (MountPlanner._take_back) waits for the next cycle's question: one cycle
    # late against a wait of preempt_after_s.
    "short_waiting": (f"EXISTS (SELECT 1 {SHORT_MOUNTS_WAITING})", False, lambda now: mounts.short_mounts_waiting()),
    # After the work ------------------------------------------------------------------------
    # pins.end_expired_pins
    "pins": (f"EXISTS (SELECT 1 FROM {_REQUESTS} WHERE pin_until <= %s)", True, pins.ran_out),
    # withdrawals.send_stager_calls (and the releases end_expired_pins records as it runs)
    "calls": (f"EXISTS (SELECT 1 FROM {StagerCall._meta.db_table} WHERE next_at <= %s)", True, withdrawals.calls_due),
    # delivery.dispatch_deliveries
    "delivering": (f"EXISTS (SELECT 1 FROM {_REQUESTS} WHERE state = '{S.DELIVERING.value}')", False,
                   lambda now: delivery.delivering()),
    # services.notices_due
    "notices": (f"EXISTS (SELECT 1 FROM {_BULKS} WHERE notify AND notified_at IS NULL AND pending = 0)", False,
                lambda now: notices_waiting()),
}
BEFORE = ("waiting", "unindexed", "expiring", "retries", "in_flight", "sent", "short_waiting")
AFTER = ("pins", "calls", "delivering", "notices")


class Due(dict):
    """{condition name: whether its step has something to do}; `deltas`: the counters with
    deltas to fold (asked with the first)."""

    deltas = None


def ask(names, *, now, with_deltas=False):
    """The conditions `names` at `now`, in one statement (with_deltas: the counters' too)."""
    parts, params = [], []
    if with_deltas:
        parts += counters.NEW
    for name in names:
        sql, uses_now, _ = CONDITIONS[name]
        parts.append(sql)
        if uses_now:
            params.append(connection.ops.adapt_datetimefield_value(now))
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        row = [bool(value) for value in cursor.fetchone()]
    due = Due()
    if with_deltas:
        due.deltas = [model for model, new in zip(counters.DELTAS, row) if new]
        row = row[len(counters.DELTAS):]
    due.update(zip(names, row))
    return due
