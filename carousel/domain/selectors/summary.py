"""A user's queue and the stager in figures: read from the trigger-kept counters, bounded."""
from django.db import connection
from django.db.models import Count, Sum

from carousel.models import (
    ACTIVE_STATES, Control, Job, JobState, RequestState, RestoreRequest, StagerHealth, Tape, UserStateCount,
)

S = RequestState


def state_counts(queryset):
    """{state: count} for every state, zeros included."""
    counts = dict.fromkeys(RequestState.values, 0)
    counts.update(queryset.order_by().values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    return counts


def queue_summary(*, user, requests=None):
    """What a user's queue looks like now: counts per state, bytes, the oldest active request.
    Reads the trigger-kept UserStateCount rows and one index probe per active state
    (request_user_state_age): its cost does not grow with the user's queue. `requests`: only
    these of the user's (a WLCG token's, those its scopes let it read: policy.visible_requests),
    counted from the requests themselves."""
    counts = dict.fromkeys(RequestState.values, 0)
    nbytes = dict.fromkeys(RequestState.values, 0)
    if requests is None:
        rows = UserStateCount.objects.filter(user=user).values_list("state", "files", "bytes")
    else:
        rows = requests.order_by().values_list("state").annotate(n=Count("id"), b=Sum("size")).values_list(
            "state", "n", "b")
    for state, files, b in rows:
        counts[state], nbytes[state] = files, b or 0
    if requests is None:
        oldest = oldest_active(user)
    else:
        oldest = requests.filter(state__in=ACTIVE_STATES).order_by("created_at").values_list(
            "created_at", flat=True).first()
    return {"states": counts, "active": sum(counts[s] for s in ACTIVE_STATES),
            "bytes_done": nbytes[S.DONE], "bytes_active_known": sum(nbytes[s] for s in ACTIVE_STATES),
            "oldest_active_at": oldest}


def active_count(user):
    """The user's active requests, from the trigger-kept counters."""
    return UserStateCount.objects.filter(user=user, state__in=ACTIVE_STATES).aggregate(n=Sum("files"))["n"] or 0


def oldest_active(user):
    """When the user's oldest active request was created: the oldest of each active state,
    each one probe of the (user, state, created_at) index."""
    if connection.vendor == "postgresql":
        # One statement, one probe per state; written out because the ORM's UNION of six
        # sliced querysets cost more to compile on every poll than to run.
        table = RestoreRequest._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT min((SELECT created_at FROM {table} WHERE user_id = %s AND state = s "
                f"ORDER BY created_at LIMIT 1)) FROM unnest(%s::varchar[]) AS s", [user.pk, [str(s.value) for s in ACTIVE_STATES]])
            return cursor.fetchone()[0]
    firsts = [RestoreRequest.objects.filter(user=user, state=state).order_by("created_at")
              .values_list("created_at", flat=True)[:1] for state in ACTIVE_STATES]
    return min((t for q in firsts for t in q), default=None)


def stager_health():
    """The stager as the loop judged it at its last cycle, with the queues that depend on it."""
    row = StagerHealth.get()
    control = Control.get()
    return {
        "state": row.state, "reason": row.reason, "since": row.since, "checked_at": row.checked_at,
        "jobs_limit": row.jobs_limit or control.jobs_in_flight, "healthy_limit": row.healthy_limit,
        "jobs_in_flight_max": control.jobs_in_flight,
        "jobs_open": Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT)).count(),
        "last_progress_at": row.last_progress_at,
        "disk_free_bytes": row.disk_free_bytes, "disk_total_bytes": row.disk_total_bytes,
        "paused": control.paused,
        "last_cycle_at": control.last_cycle_at, "last_cycle_error": control.last_cycle_error,
        "retry_queue": RestoreRequest.objects.filter(state=RequestState.RETRY).count(),
        "quarantined_tapes": list(Tape.objects.filter(quarantined_at__isnull=False).order_by("label")
                                  .values("label", "quarantined_at", "quarantine_reason")[:100]),
    }


def jobs_limit(control, adaptive):
    """Jobs the stager may have in flight now: the loop's adaptive limit, within K."""
    return min(adaptive or control.jobs_in_flight, control.jobs_in_flight)
