"""Usage reports, as ERADAT and DataCarousel kept them: per user or per group over a period,
read from the rolled-up rows (UsageDay, UsageWait) that triggers keep and retention leaves, so
a year's report reads days x users rows, never the requests.

Waits (submission to restored) are counted in the fixed buckets of WAIT_BUCKETS_S: a percentile
is given as the upper bound of the bucket it falls in (never above the longest wait, which is
exact), so it is within its bucket of the true value. Mounts and drive seconds are the jobs'
that carried the user's files, shared among the users by their files in each job; the drive
share is the line's drive seconds over the period's. This drive share is the one share every
page shows (carousel/outlook/shares.py names its period): drive_seconds() computes it, and,
given `now`, it also counts the time the mounts on the drives have held them so far."""
import csv
import io
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone as dt_timezone

from django.contrib.auth.models import Group, User
from django.db import connection
from django.db.models import Count, Max, Q, Sum

from carousel.domain import policy
from carousel.models import (IN_FLIGHT_STATES, WAIT_BUCKETS_S, Job, JobState, RequestState, RestoreRequest, UsageDay,
                             UsageWait)

BY = ("user", "group", "activity")
# The dates a report may name: the epoch to a year short of datetime's end, so that the
# arithmetic on a period (a default week before, a day after) stays within datetime's range.
FIRST_MOMENT = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
LAST_MOMENT = datetime(9999, 1, 1, tzinfo=dt_timezone.utc)
FAILURE_CLASSES = ("transient", "permanent", "user", "delivery", "other")
SUMMED = ("requested_files", "requested_bytes", "restored_files", "restored_bytes",
          *(f"failed_{c}" for c in FAILURE_CLASSES), "retries", "cancelled", "expired", "wait_sum_s", "mounts",
          "drive_s")
CSV_COLUMNS = ("name", "requested_files", "requested_bytes", "restored_files", "restored_bytes",
               *(f"failed_{c}" for c in FAILURE_CLASSES), "retries", "cancelled", "expired",
               "wait_p50_s", "wait_p95_s", "wait_max_s", "mounts", "drive_s", "drive_share")


@dataclass
class UsageLine:
    key: int  # user id or group id (0: requests of no group)
    name: str
    requested_files: int = 0
    requested_bytes: int = 0
    restored_files: int = 0
    restored_bytes: int = 0
    failed: dict = field(default_factory=dict)  # class -> requests failed for good
    retries: int = 0
    cancelled: int = 0
    expired: int = 0
    wait_p50_s: float | None = None
    wait_p95_s: float | None = None
    wait_max_s: float | None = None
    wait_buckets: list = field(default_factory=list)  # restored requests per bucket of WAIT_BUCKETS_S (+ beyond)
    mounts: float = 0.0
    drive_s: float = 0.0
    drive_share: float = 0.0

    def as_row(self):
        data = asdict(self)
        data.update({f"failed_{c}": self.failed.get(c, 0) for c in FAILURE_CLASSES})
        return [data[c] if not isinstance(data[c], float) else round(data[c], 3) for c in CSV_COLUMNS]


@dataclass
class UsageReport:
    since: object
    until: object
    by: str
    lines: list
    total_drive_s: float


def out_of_range(moment):
    """The message refusing a period's end (an aware datetime) outside the dates a report may
    name, or None: the one rule of the usage API and the usage page."""
    if FIRST_MOMENT <= moment <= LAST_MOMENT:
        return None
    return f"out of range: between {FIRST_MOMENT:%Y-%m-%d} and {LAST_MOMENT:%Y-%m-%d}"


DEFAULT_DAYS = 7


def default_since(until):
    """Where a report starts when not told: the DEFAULT_DAYS whole UTC days that end with
    until's (the rows' grain). The page and the API take this one default; the API's own
    (7 days before until) widened to whole days covered 8."""
    return day_ceil(until) - timedelta(days=DEFAULT_DAYS)


def day_floor(t):
    return t.astimezone(dt_timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)


def day_ceil(t):
    floor = day_floor(t)
    return floor if floor == t else floor + timedelta(days=1)


def percentile_from_buckets(counts, q, longest):
    """The upper bound of the bucket holding the q-quantile (nearest rank), capped by the
    longest wait; None when nothing is counted."""
    total = sum(counts)
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank:
            bound = WAIT_BUCKETS_S[i] if i < len(WAIT_BUCKETS_S) else math.inf
            return min(float(bound), longest)
    return longest


def drive_seconds(*, since, until, by="user", now=None, of=None):
    """({user or group key: drive seconds}, total) over the whole UTC days from since to until
    (until excluded): the jobs that finished then, each job's time at the stager shared among
    the users by their files in it (UsageDay, kept by triggers); given `now`, plus the time so
    far within the period of the jobs on the drives now (bounded by the jobs in flight), shared
    among their requests in flight, as the sharing policy holds them. A key is a user id or a
    group id (0: requests of no group), or by="activity" an activity's name. Given `of` (a user
    id, by="user"): that user's seconds only, ({of: seconds}, total), summed by the database
    whatever the number of users (the summary shows the caller's share on every poll)."""
    since, until = day_floor(since), day_ceil(until)
    if by == "activity":  # the rolled-up rows carry no activity: read from the jobs and requests
        _, seconds, total = _activity_drive(since, until, now)
        return seconds, total
    if of is not None and by != "user":
        raise ValueError("of= names a user: by must be user")
    key = "user_id" if by == "user" else "group_key"
    days = UsageDay.objects.filter(day__gte=since, day__lt=until)
    others = 0.0  # everyone else's seconds, given `of`
    if of is None:
        seconds = {k: s for k, s in days.values(key).annotate(s=Sum("drive_s")).order_by().values_list(key, "s") if s}
    else:
        # Every poll of the summary asks: one statement written out. Built by the ORM (a filtered
        # aggregate) the summary cost 6.36 ms of CPU an answer in-process, 5.50 written out; the
        # statement runs in 0.05 ms (1,000 queued).
        adapt = connection.ops.adapt_datetimefield_value
        with connection.cursor() as cursor:
            cursor.execute(_OF_ONE_USER, [of, adapt(since), adapt(until)])
            everyone, mine = cursor.fetchone()
        seconds = {of: mine or 0.0}
        others = (everyone or 0.0) - seconds[of]
    held = _held_so_far(since, until, now)
    if held:
        column = "user_id" if by == "user" else "group_id"
        # Their requests in flight by the jobs' ids: one statement joining jobs and requests
        # took 64-89 ms against 27-32 ms for the two (5,000 files in 50 jobs, 1,000,000 queued:
        # PostgreSQL intersected the job and in-flight indexes once a job).
        on_drives = RestoreRequest.objects.filter(job_id__in=list(held), state__in=IN_FLIGHT_STATES).order_by()
        if of is None:
            rows = list(on_drives.values_list("job_id", column).annotate(n=Count("id")).values_list(
                "job_id", column, "n"))
            totals = {}
            for job, _, n in rows:
                totals[job] = totals.get(job, 0) + n
            for job, k, n in rows:
                k = k if by == "user" else (k or 0)
                seconds[k] = seconds.get(k, 0.0) + held[job] * n / totals[job]
        else:
            for job, n, mine in (on_drives.values_list("job_id")
                                 .annotate(n=Count("id"), mine=Count("id", filter=Q(user_id=of)))
                                 .values_list("job_id", "n", "mine")):
                seconds[of] += held[job] * mine / n
                others += held[job] * (n - mine) / n
    return seconds, sum(seconds.values()) + others


# drive_seconds(of=user): everyone's drive seconds over [since, until) and the user's.
_OF_ONE_USER = (f"SELECT SUM(drive_s), SUM(CASE WHEN user_id = %s THEN drive_s END) FROM {UsageDay._meta.db_table} "
                "WHERE day >= %s AND day < %s")


def _held_so_far(since, until, now):
    """{job id: seconds of [since, min(until, now)) it has held its drive} for the jobs on the
    drives now (bounded by the jobs in flight); {} without `now` or for a period not begun."""
    if now is None or since >= now:
        return {}
    end = min(until, now)
    return {job: (end - max(since, sent_at)).total_seconds() for job, sent_at in
            Job.objects.filter(state=JobState.SENT, sent_at__lt=end).values_list("id", "sent_at")}


def usage_report(*, since, until, by="user", viewer=None, now=None):
    """Lines per user or per group for the whole days (UTC) from since to until (until excluded;
    a period is widened to whole days, the rows' grain). Drive time and its share as
    drive_seconds() counts them (given `now`, the mounts on the drives so far too).
    A viewer without the view permission on usage (policy.may_see_all_usage) sees their own line (by user) or their groups' (by group)."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}")
    since, until = day_floor(since), day_ceil(until)
    if by == "activity":
        return _by_activity(since, until, viewer, now)
    key = "user_id" if by == "user" else "group_key"
    days = UsageDay.objects.filter(day__gte=since, day__lt=until)
    waits = UsageWait.objects.filter(day__gte=since, day__lt=until)
    drive, total_drive = drive_seconds(since=since, until=until, by=by, now=now)
    if viewer is not None and not policy.may_see_all_usage(viewer):
        if by == "user":
            days, waits = days.filter(user_id=viewer.id), waits.filter(user_id=viewer.id)
        else:
            mine = list(viewer.groups.values_list("id", flat=True))
            days, waits = days.filter(group_key__in=mine), waits.filter(group_key__in=mine)
    rows = {r[key]: r for r in days.values(key).annotate(**{f: Sum(f) for f in SUMMED}, wait_max=Max("wait_max_s"))
            .order_by(key)}
    buckets = {}
    for k, bucket, files in waits.values_list(key, "bucket").annotate(n=Sum("files")).order_by():
        buckets.setdefault(k, [0] * (len(WAIT_BUCKETS_S) + 1))[bucket] += files
    model = User if by == "user" else Group
    field_name = "username" if by == "user" else "name"
    names = dict(model.objects.filter(id__in=rows).values_list("id", field_name))
    lines = []
    for k, r in rows.items():
        counts = buckets.get(k, [0] * (len(WAIT_BUCKETS_S) + 1))
        longest = r["wait_max"] if r["restored_files"] else None
        lines.append(UsageLine(
            key=k, name=names.get(k, "(no group)" if by == "group" and k == 0 else f"#{k}"),
            requested_files=r["requested_files"], requested_bytes=r["requested_bytes"],
            restored_files=r["restored_files"], restored_bytes=r["restored_bytes"],
            failed={c: r[f"failed_{c}"] for c in FAILURE_CLASSES}, retries=r["retries"], cancelled=r["cancelled"],
            expired=r["expired"], wait_buckets=counts,
            wait_p50_s=percentile_from_buckets(counts, 0.5, longest) if longest is not None else None,
            wait_p95_s=percentile_from_buckets(counts, 0.95, longest) if longest is not None else None,
            wait_max_s=longest, mounts=r["mounts"], drive_s=drive.get(k, 0.0),
            drive_share=share_of(drive.get(k, 0.0), total_drive)))
    lines.sort(key=lambda line: (-line.restored_bytes, line.name))
    return UsageReport(since=since, until=until, by=by, lines=lines, total_drive_s=total_drive)


def share_of(seconds, total):
    """A share of drive time: the one rule every page uses."""
    return seconds / total if total else 0.0


def usage_csv(report):
    """The report as CSV text: a header, one line per user or group."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for line in report.lines:
        writer.writerow(["" if v is None else v for v in line.as_row()])
    return out.getvalue()


def _activity_drive(since, until, now=None, user=None):
    """({activity: mounts}, {activity: drive seconds}, everyone's drive seconds) over [since,
    until): the jobs that finished then, each one's time at the stager and its mount shared by
    its files, as the rolled-up rows share them between users; given `now`, plus the time so far
    within the period of the jobs on the drives now, shared among their requests in flight (as
    drive_seconds does for users and groups). Given `user` (an id): that user's part of each
    activity only; a job is still shared by all its files, whoever asked for them, and the
    total is everyone's, so that a share means what it means on every other page."""
    count = {"n": Count("id")}
    if user is not None:
        count["mine"] = Count("id", filter=Q(user_id=user))
    shares = list(RestoreRequest.objects.filter(job__finished_at__gte=since, job__finished_at__lt=until,
                                                job__sent_at__isnull=False)
                  .values_list("job_id", "activity").annotate(**count).order_by())
    spans = {j: max(0.0, (finished - sent).total_seconds()) for j, sent, finished in
             Job.objects.filter(id__in={row[0] for row in shares}).values_list("id", "sent_at", "finished_at")}
    held = _held_so_far(since, until, now)
    on_drives = list(RestoreRequest.objects.filter(job_id__in=list(held), state__in=IN_FLIGHT_STATES).order_by()
                     .values_list("job_id", "activity").annotate(**count)) if held else []
    files = {}
    for job, _, n, *_ in shares + on_drives:
        files[job] = files.get(job, 0) + n
    mounts, drive = {}, {}
    total = sum(spans.get(job, 0.0) for job in {row[0] for row in shares}) + sum(
        held[job] for job in {row[0] for row in on_drives})
    for job, activity, n, *mine in shares:
        part = (mine[0] if mine else n) / files[job]
        if part:
            mounts[activity] = mounts.get(activity, 0.0) + part
            drive[activity] = drive.get(activity, 0.0) + spans.get(job, 0.0) * part
    for job, activity, n, *mine in on_drives:
        part = (mine[0] if mine else n) / files[job]
        if part:
            drive[activity] = drive.get(activity, 0.0) + held[job] * part
    return mounts, drive, total


def _by_activity(since, until, viewer, now=None):
    """Lines per activity, read from the requests and jobs of the period (the rolled-up rows do
    not carry activities): what retention has pruned is not counted. Counted by the database,
    per activity; mounts and drive seconds per (job, activity), the jobs that finished in the
    period, shared by their files as the rolled-up rows share them between users. A viewer
    without the view permission on usage sees their own requests' (their part of each mount,
    its share of everyone's drive time)."""
    mine = viewer is not None and not policy.may_see_all_usage(viewer)
    requests = RestoreRequest.objects.filter(user_id=viewer.id) if mine else RestoreRequest.objects.all()
    asked = {r["activity"]: r for r in requests.filter(created_at__gte=since, created_at__lt=until)
             .values("activity").annotate(files=Count("id"), bytes=Sum("size")).order_by()}
    done = Q(state=RequestState.DONE)
    failed = Q(state=RequestState.FAILED)
    classes = {"transient": "transient", "permanent": "permanent", "user": "user", "delivery": "delivery",
               "other": ""}
    ended = {r["activity"]: r for r in requests.filter(finished_at__gte=since, finished_at__lt=until)
             .values("activity").annotate(
                 restored_files=Count("id", filter=done), restored_bytes=Sum("size", filter=done),
                 cancelled=Count("id", filter=Q(state=RequestState.CANCELLED)),
                 expired=Count("id", filter=Q(state=RequestState.EXPIRED)),
                 **{f"failed_{c}": Count("id", filter=failed & Q(error_class=e)) for c, e in classes.items()}
             ).order_by()}
    mounts, drive, total_drive = _activity_drive(since, until, now, user=viewer.id if mine else None)
    lines = []
    for name in sorted(set(asked) | set(ended) | set(drive)):
        a, e = asked.get(name, {}), ended.get(name, {})
        lines.append(UsageLine(
            key=0, name=name, requested_files=a.get("files", 0), requested_bytes=a.get("bytes") or 0,
            restored_files=e.get("restored_files", 0), restored_bytes=e.get("restored_bytes") or 0,
            failed={c: e.get(f"failed_{c}", 0) for c in FAILURE_CLASSES}, cancelled=e.get("cancelled", 0),
            expired=e.get("expired", 0), mounts=mounts.get(name, 0.0), drive_s=drive.get(name, 0.0),
            drive_share=share_of(drive.get(name, 0.0), total_drive)))
    lines.sort(key=lambda line: (-line.restored_bytes, line.name))
    return UsageReport(since=since, until=until, by="activity", lines=lines, total_drive_s=total_drive)
