"""Reads per activity for the pages and /metrics: bounded by the work in flight (N x K requests)
and by an hour's restores, never by the queue."""
from collections import defaultdict
from datetime import timedelta

from django.db.models import Count

from carousel.models import IN_FLIGHT_STATES, Job, RequestState, RestoreRequest


def held_drive_time(users=None):
    """{(user, activity): the estimated drive time (s) of their requests planned or on the
    drives}: each job's estimate, shared by its in-flight requests (a sent job counts only what
    it has left, a file two users asked for is charged to both). Aggregated in the database by
    (user, activity, job); `users`: only theirs (None: everyone's)."""
    held = defaultdict(float)
    requests = RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES, job__isnull=False)
    if users is not None:
        requests = requests.filter(user_id__in=list(users))
    rows = list(requests.order_by().values_list("user_id", "activity", "job_id").annotate(n=Count("id")))
    estimates = dict((j, (e, f)) for j, e, f in Job.objects.filter(id__in={j for _, _, j, _ in rows})
                     .values_list("id", "estimate_s", "files"))
    for user, activity, job, n in rows:
        estimate, files = estimates.get(job, (0.0, 0))
        if files:
            held[(user, activity)] += estimate * min(1.0, n / files)
    return held


def activity_figures(*, now):
    """One dict per activity with work in flight or restored in the last hour: its requests in
    flight, the drive time they hold (planned or on the drives, estimated) and the files
    restored in the last hour. Most drive time first. (Their share of drive time over a period
    is the one share of carousel/outlook/shares.py, not a share of the time held now.)"""
    figures = defaultdict(lambda: {"in_flight": 0, "drive_s": 0.0, "restored_last_hour": 0})
    for activity, n in (RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).order_by()
                        .values_list("activity").annotate(n=Count("id"))):
        figures[activity]["in_flight"] = n
    for (_, activity), seconds in held_drive_time().items():
        figures[activity]["drive_s"] += seconds
    for activity, n in (RestoreRequest.objects.filter(state=RequestState.DONE, finished_at__gte=now - timedelta(hours=1))
                        .order_by().values_list("activity").annotate(n=Count("id"))):
        figures[activity]["restored_last_hour"] = n
    rows = [{"activity": name, **f} for name, f in figures.items()]
    rows.sort(key=lambda r: (-r["drive_s"], r["activity"]))
    return rows
