"""Reads of the core domain. Counting and sorting happen in the database."""
from django.db.models import Count, Min, Q, Sum

from .models import ACTIVE_STATES, Bulk, RequestState, RestoreRequest


def visible_requests(user):
    """The requests a user may see and act on: their own; staff see all."""
    qs = RestoreRequest.objects.all()
    return qs if user.is_staff else qs.filter(user=user)


def visible_bulks(user):
    qs = Bulk.objects.all()
    return qs if user.is_staff else qs.filter(user=user)


def request_list(*, user, state=None, bulk=None, tape=None, since=None, until=None, path=None):
    qs = visible_requests(user).select_related("tape")
    if state:
        qs = qs.filter(state__in=state)
    if bulk:
        qs = qs.filter(bulk_items__bulk_id=bulk)
    if tape:
        qs = qs.filter(tape__label=tape)
    if since:
        qs = qs.filter(created_at__gte=since)
    if until:
        qs = qs.filter(created_at__lt=until)
    if path:
        qs = qs.filter(path__contains=path)
    return qs


def state_counts(queryset):
    """{state: count} for every state, zeros included."""
    counts = dict.fromkeys(RequestState.values, 0)
    counts.update(queryset.order_by().values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    return counts


def queue_summary(*, user):
    """What a user's queue looks like now: counts per state, bytes, the oldest active request."""
    qs = RestoreRequest.objects.filter(user=user)
    agg = qs.aggregate(
        bytes_done=Sum("size", filter=Q(state=RequestState.DONE)),
        bytes_active=Sum("size", filter=Q(state__in=ACTIVE_STATES)),
        oldest_active=Min("created_at", filter=Q(state__in=ACTIVE_STATES)),
    )
    return {"states": state_counts(qs), "active": qs.filter(state__in=ACTIVE_STATES).count(),
            "bytes_done": agg["bytes_done"] or 0, "bytes_active_known": agg["bytes_active"] or 0,
            "oldest_active_at": agg["oldest_active"]}


def bulk_requests(bulk):
    return RestoreRequest.objects.filter(bulk_items__bulk=bulk)


def stager_health():
    """The stager as the loop judged it at its last cycle, with the queues that depend on it."""
    from .models import Control, Job, JobState, StagerHealth, Tape

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
        "retry_queue": RestoreRequest.objects.filter(state=RequestState.RETRY).count(),
        "quarantined_tapes": list(Tape.objects.filter(quarantined_at__isnull=False).order_by("label")
                                  .values("label", "quarantined_at", "quarantine_reason")[:100]),
    }
