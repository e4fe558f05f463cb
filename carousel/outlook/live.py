"""The live staging page: bounded reads only (it is polled every few seconds by everyone)."""
from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth.models import Group
from django.db.models import Count, Max, Min, Q, Sum
from django.db.models.functions import TruncHour

from carousel.domain.selectors.activities import activity_figures
from carousel.domain.selectors.drives import drive_allocation, drives_in_use
from carousel.domain.selectors.lists import capped_count
from carousel.domain.selectors.summary import jobs_limit, stager_health
from carousel.models import (
    IN_FLIGHT_STATES, Control, HourlyStats, Job, JobState, RequestState, RestoreRequest, StagerHealth, UserBacklog,
)
from carousel.outlook.shares import activity_shares, caps_and_weights, drive_time_shares, throughput_shares

S = RequestState

LIVE_HOURS = 12
TOP_USERS = 20
JOBS_SHOWN = 50


def hourly_series(*, now, hours=LIVE_HOURS):
    """One dict per hour of the last `hours` (the current one last): files and bytes restored,
    errors (requests failed or sent to retry), from the trigger-kept HourlyStats; and mounts
    (distinct tapes of the jobs sent that hour: consecutive jobs on one tape count once)."""

    start = (now - timedelta(hours=hours - 1)).replace(minute=0, second=0, microsecond=0)
    stats = {s.hour: s for s in HourlyStats.objects.filter(hour__gte=start)}
    mounts = dict(Job.objects.filter(sent_at__gte=start).annotate(hour=TruncHour("sent_at")).values("hour")
                  .order_by().annotate(n=Count("tape_id", distinct=True)).values_list("hour", "n"))
    series = []
    for i in range(hours):
        hour = start + timedelta(hours=i)
        row = stats.get(hour)
        series.append({"hour": hour, "files": row.files_done if row else 0, "bytes": row.bytes_done if row else 0,
                       "errors": row.errors if row else 0, "mounts": mounts.get(hour, 0)})
    return series


def stager_report():
    """What the stager itself reported (drives, queues, disk) at the loop's last cycle that
    reached it, {} when nothing; never a call to the stager (a web request must not wait on it).
    While the loop judges it down, "error" says why."""
    row = StagerHealth.get()
    status = dict(row.status or {})
    if row.state == "down":
        status["error"] = row.reason or "unreachable"
    clock = status.get("clock_s")
    # How long each drive has been at what it does, when the backend gives its clock.
    status["drives"] = [{**d, "for_s": clock - d["since_s"]} if clock is not None and d.get("since_s") is not None
                        else d for d in status.get("drives") or []]
    status["reported_at"] = row.status_at
    return status


@dataclass(frozen=True)
class LiveFigures:
    control: Control
    health: dict  # stager_health()
    stager: dict  # stager_report()
    jobs: list  # open jobs per tape (dicts), the longest waiting first, at most JOBS_SHOWN tapes
    in_flight: int
    slots: int
    users: list  # dicts: username, group, files, bytes, in_flight, share (of drive time); most files first
    users_with_work: int
    groups: list  # dicts: group, users, files, bytes, in_flight, share, drives, reserved_drives, max_drives
    activities: list  # dicts: activity, in_flight, drive_s, restored_last_hour (activity_figures), drive_share
    unlocated: tuple  # capped_count
    delivering: tuple  # capped_count
    series: list  # hourly_series
    share_period: str = ""  # the period of every share figure (outlook.shares.drive_time_shares)


def _activities(now):
    """The activities with work in flight, restored in the last hour or with drive time today:
    what they hold now (activity_figures) and their share of drive time over the period the
    page names (the one share, outlook/shares.py), not a share of the time held now."""
    rows = {row["activity"]: row for row in activity_figures(now=now)}
    share = activity_shares(now=now)
    for name in set(share) - set(rows):
        rows[name] = {"activity": name, "in_flight": 0, "drive_s": 0.0, "restored_last_hour": 0}
    for name, row in rows.items():
        row["drive_share"] = share.get(name, 0.0)
    return sorted(rows.values(), key=lambda r: (-r["drive_share"], -r["drive_s"], r["activity"]))


def live_figures(*, now):

    control = Control.get()
    health = stager_health()
    in_flight_by_user = dict(RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).order_by()
                             .values_list("user_id").annotate(n=Count("id")).values_list("user_id", "n"))
    shares = throughput_shares(control=control)  # who waits (users_with_work)
    drive = drive_time_shares(now=now)
    backlog = UserBacklog.objects.filter(files__gt=0)
    users = [{"username": name, "group": group or "", "files": files, "bytes": nbytes,
              "in_flight": in_flight_by_user.get(user_id, 0), "share": drive.of_user(user_id)}
             for user_id, name, group, files, nbytes in backlog.order_by("-files", "user_id").values_list(
                 "user_id", "user__username", "user__account__group__name", "files", "bytes")[:TOP_USERS]]
    in_flight_groups, _ = caps_and_weights(control, list(in_flight_by_user))
    groups = {}
    for group_id, name, n_users, files, nbytes in (
            backlog.order_by().values_list("user__account__group_id")
            .annotate(u=Count("user_id"), f=Sum("files"), b=Sum("bytes"))
            .values_list("user__account__group_id", "user__account__group__name", "u", "f", "b")):
        groups[group_id] = {"group": name or "", "users": n_users, "files": files, "bytes": nbytes, "in_flight": 0,
                            "share": drive.of_group(group_id)}
    for user_id, n in in_flight_by_user.items():
        group_id = in_flight_groups[user_id][0]
        if group_id not in groups:
            groups[group_id] = {"group": "", "users": 0, "files": 0, "bytes": 0, "in_flight": 0,
                                "share": drive.of_group(group_id)}
        groups[group_id]["in_flight"] += n
    # Drive allocation: what each group reads on now, against what an operator gave it.
    allocation, using = drive_allocation(), drives_in_use()
    for group_id in set(allocation) | set(using):
        if group_id not in groups:
            groups[group_id] = {"group": "", "users": 0, "files": 0, "bytes": 0, "in_flight": 0,
                                "share": drive.of_group(group_id)}
    for group_id, row in groups.items():
        reserved, most = allocation.get(group_id, (0, None))
        row.update(drives=len(using.get(group_id, ())), reserved_drives=reserved, max_drives=most)
    missing = [g for g, row in groups.items() if g is not None and not row["group"]]
    for group_id, name in Group.objects.filter(id__in=missing).values_list("id", "name"):
        groups[group_id]["group"] = name
    groups = list(groups.values())
    groups.sort(key=lambda g: (-g["files"], g["group"]))
    queued = RestoreRequest.objects.filter(state=S.QUEUED, tape__isnull=True)
    return LiveFigures(
        control=control, health=health, stager=stager_report(),
        jobs=list(Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT)).order_by()
                  .values("tape__label").annotate(jobs=Count("id"), files=Sum("files"), sent=Min("sent_at"),
                                                  pending=Count("id", filter=Q(state=JobState.PENDING)),
                                                  progress=Max("progress_at"))
                  .order_by("sent", "tape__label")[:JOBS_SHOWN]),
        in_flight=sum(in_flight_by_user.values()),
        slots=control.files_per_job * jobs_limit(control, health["jobs_limit"]),
        users=users, users_with_work=len(shares.group_of), groups=groups, activities=_activities(now),
        unlocated=capped_count(queued), delivering=capped_count(RestoreRequest.objects.filter(state=S.DELIVERING)),
        series=hourly_series(now=now), share_period=drive.period)
