"""Where a request stands: queue position, estimate, why not yet (the "my requests" page)."""
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.contrib.auth.models import Group
from django.db import connection
from django.db.models import Count, Min, Q, Sum

from carousel.domain.paths import delivery_target
from carousel.domain.selectors.summary import jobs_limit
from carousel.loop.health import projected_disk_use
from carousel.models import (
    IN_FLIGHT_STATES, READY, Control, HealthState, Job, JobState, RequestState, RestoreRequest, StagerHealth,
    TapeBacklog, Transition,
)
from carousel.outlook.shares import caps_and_weights, throughput_shares
from policies.selection import params_from
from policies.sorting import TapeInfo, worth_mounting

S = RequestState

#
# Approximate by design, and cheap: a page of requests costs a handful of bounded index scans
# and one call of the sharing policy over the users with work, whatever the queue's length.
#
# The model. Each cycle hands the slots freed at the stager to users by the sharing policy,
# and each user's slots to that user's requests by the sorting policy. A ready request leaves
# once the requests of its own user that the sorting policy puts first have left; meanwhile
# the other users take their shares too. So:
#
#   own_ahead  the user's ready requests ahead of it under the sorting policy (below);
#   share      the user's part of what the sharing policy hands out when it has work to spare:
#              the policy's own allocate(), run on the backlog counters, this user's demand
#              unbounded (a user alone gets 1; its cap bounds what it takes, not its part);
#   ahead      ~ own_ahead / share: the requests of all users expected to leave before it;
#   estimate   (ahead + what is in flight now + 1) / the observed restore rate, as a range
#              from the slowest and the fastest ten minutes of the last hour.
#
# own_ahead follows SortPolicy.choose, simplified:
#   - requests that waited max_wait go first, oldest first: an overdue request counts the
#     user's older requests; any other counts all the user's overdue requests first;
#   - then higher priority first: the user's requests of a higher priority count;
#   - then the policy. NONE: the user's older requests (created_at, id). TAPEID: the user's
#     files on the tapes holding more of them (ties: lower tape id; the all-users tie-break is
#     left out), plus the user's files on the same tape at a smaller position (position order
#     stands for read order). SLIDER: as NONE when its age weight is 0.5 or more, else TAPEID.
# Overlaps (an overdue request of higher priority) may count twice. Each count stops at
# POSITION_CAP; a figure that reached it is shown as a lower bound, with no upper estimate.

POSITION_CAP = 100_000
RATE_WINDOW = timedelta(hours=1)
RATE_BUCKETS = 6
# Margins of the estimate for what the rate does not show (a mount, a slow file).
ESTIMATE_LOW, ESTIMATE_HIGH = 0.8, 1.25


@dataclass(frozen=True)
class Rate:
    """Requests finished per second: the window's mean, its slowest and its fastest bucket."""

    mean: float
    low: float
    high: float


def restore_rate(*, now):
    """The observed restore rate over the last hour, from Transition rows to done counted in
    ten-minute buckets (from the hour's first one); None when nothing finished."""
    start = now - RATE_WINDOW
    step = RATE_WINDOW / RATE_BUCKETS
    edges = [start + step * i for i in range(RATE_BUCKETS)] + [now]
    buckets = {f"b{i}": Count("id", filter=Q(at__gte=edges[i], at__lt=edges[i + 1])) for i in range(RATE_BUCKETS)}
    agg = Transition.objects.filter(at__gte=start, at__lt=now, to_state=S.DONE).aggregate(first=Min("at"), **buckets)
    if agg["first"] is None:
        return None
    rates = []
    for i in range(RATE_BUCKETS):
        begin = max(edges[i], agg["first"])
        if begin < edges[i + 1]:
            rates.append(agg[f"b{i}"] / max(60.0, (edges[i + 1] - begin).total_seconds()))
    mean = sum(agg[k] for k in buckets) / max(60.0, (now - agg["first"]).total_seconds())
    return Rate(mean=mean, low=max(min(rates), mean / 4), high=max(max(rates), mean))


def eta_range(*, ahead, in_flight, rate, cycle_s):
    """Seconds (low, high) until a request with `ahead` requests before it, and `in_flight` at
    the stager, is done at the observed `rate`; None without a rate."""
    if rate is None or rate.mean <= 0:
        return None
    work = ahead + in_flight + 1
    return ESTIMATE_LOW * work / rate.high, ESTIMATE_HIGH * work / rate.low + cycle_s


@dataclass(frozen=True)
class Outlook:
    """Where one request stands. Counts are approximate (see above); `capped`: they reached
    POSITION_CAP. eta: seconds from now, (low, high), high None when unknown; or None."""

    own_ahead: int | None = None
    ahead: int | None = None
    capped: bool = False
    eta: tuple | None = None
    reasons: tuple = ()


@dataclass(frozen=True)
class QueueContext:
    """What is the same for every request of one user's page."""

    now: datetime
    control: Control
    health: StagerHealth
    rate: Rate | None
    share: float  # the user's part of what the sharing policy hands out
    in_flight: int  # files at the stager, all users
    slots: int  # files the stager may have in flight now: N x the jobs limit
    disk_use: float | None  # projected use of the stager's disk buffer
    user_in_flight: int
    user_cap: int
    group_name: str = ""
    group_in_flight: int = 0
    group_cap: int | None = None
    group_slots: float = 0.0  # the slots the user's group gets under the sharing policy


def queue_context(*, user, now):

    control, health = Control.get(), StagerHealth.get()
    slots = control.files_per_job * jobs_limit(control, health.jobs_limit)
    in_flight = RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES)
    agg = in_flight.aggregate(n=Count("id"), mine=Count("id", filter=Q(user=user)), b=Sum("size"))
    shares = throughput_shares(control=control, eager=user.id)
    users, groups = caps_and_weights(control, [user.id])
    group_id, user_cap = users[user.id]
    ctx = QueueContext(now=now, control=control, health=health, rate=restore_rate(now=now),
                       share=shares.users.get(user.id, 0.0), in_flight=agg["n"], slots=slots,
                       disk_use=projected_disk_use(free=health.disk_free_bytes, total=health.disk_total_bytes,
                                                   incoming=agg["b"] or 0),
                       user_in_flight=agg["mine"], user_cap=user_cap)
    if group_id is None:
        return ctx
    return replace(ctx, group_name=Group.objects.get(id=group_id).name, group_cap=groups[group_id][1],
                   group_in_flight=in_flight.filter(user__account__group_id=group_id).count(),
                   group_slots=shares.group_slots.get(group_id, 0.0))


def _capped(n):
    return min(n, POSITION_CAP), n >= POSITION_CAP


def _fifo(control):
    if control.sort_policy == "SLIDER":
        return float((control.policy_params or {}).get("slider_age_weight", 0.5)) >= 0.5
    return control.sort_policy == "NONE"


# The user's ready requests in age order, numbered, up to the cap: one index scan (the
# request_ready_user_age index) numbers every row of the page at once.
RANKS_BY_AGE_SQL = """
SELECT id, rank FROM (
    SELECT id, row_number() OVER (ORDER BY created_at, id) - 1 AS rank FROM (
        SELECT id, created_at FROM carousel_restorerequest
        WHERE user_id = %s AND state = 'queued' AND tape_id IS NOT NULL
          AND (created_at < %s OR (created_at = %s AND id <= %s))
        ORDER BY created_at, id LIMIT %s) AS oldest) AS ranked
WHERE id IN ({ids})"""


def _ranks_by_age(user, rows):
    """{request id: the user's ready requests older than it} for `rows`; a row left out has
    POSITION_CAP or more before it."""
    last = max(rows, key=lambda r: (r.created_at, r.id))
    at = connection.ops.adapt_datetimefield_value(last.created_at)
    with connection.cursor() as cursor:
        cursor.execute(RANKS_BY_AGE_SQL.format(ids=", ".join(["%s"] * len(rows))),
                       [user.id, at, at, last.id, POSITION_CAP, *(r.id for r in rows)])
        return dict(cursor.fetchall())


def _own_ahead(user, ready, ctx):
    """{request id: (count, capped)}: the user's ready requests ahead of each of `ready`."""
    if not ready:
        return {}
    mine = RestoreRequest.objects.filter(READY, user=user)
    overdue_at = ctx.now - timedelta(seconds=ctx.control.max_wait_s)
    by_age = [r for r in ready if _fifo(ctx.control) or r.created_at <= overdue_at]
    by_tape = [r for r in ready if r not in by_age]
    counts = {r.id: 0 for r in ready}
    if by_age:
        older = _ranks_by_age(user, by_age)
        for r in by_age:
            counts[r.id] += older.get(r.id, POSITION_CAP)
    if by_tape:
        tapes = {r.tape_id for r in by_tape}
        files = dict(TapeBacklog.objects.filter(user=user, tape_id__in=tapes).values_list("tape_id", "files"))
        on_tapes_ahead = TapeBacklog.objects.filter(user=user, files__gt=0).aggregate(**{
            f"t{t}": Sum("files", filter=Q(files__gt=files.get(t, 0)) | Q(files=files.get(t, 0), tape_id__lt=t))
            for t in tapes})
        on_same_tape = mine.filter(tape_id__in=tapes).aggregate(**{
            f"r{r.id}": Count("id", filter=Q(tape_id=r.tape_id, position__lt=r.position or 0)) for r in by_tape})
        overdue = mine.filter(created_at__lte=overdue_at).order_by("created_at", "id")[:POSITION_CAP].count()
        for r in by_tape:
            counts[r.id] += (on_tapes_ahead[f"t{r.tape_id}"] or 0) + on_same_tape[f"r{r.id}"] + overdue
    levels = {r.priority for r in ready if r.created_at > overdue_at}
    if levels and min(levels) < 3:
        higher = mine.filter(priority__gt=min(levels)).aggregate(**{
            f"p{p}": Count("id", filter=Q(priority__gt=p)) for p in levels})
        for r in ready:
            if r.created_at > overdue_at:
                counts[r.id] += higher.get(f"p{r.priority}") or 0
    return {i: _capped(n) for i, n in counts.items()}


def _tapes_waiting(ready, ctx):
    """{tape id: why it is not worth mounting yet}, for the tapes of `ready` that are not."""
    params = params_from(ctx.control)
    if params.mount_min_files <= 1:
        return {}  # a tape with one request is worth mounting
    tapes = {r.tape_id for r in ready}
    totals = {t: (f, b) for t, f, b in TapeBacklog.objects.filter(tape_id__in=tapes).order_by()
              .values_list("tape_id").annotate(f=Sum("files"), b=Sum("bytes")).values_list("tape_id", "f", "b")}
    oldest = dict(RestoreRequest.objects.filter(READY, tape_id__in=tapes).order_by().values_list("tape_id")
                  .annotate(m=Min("created_at")).values_list("tape_id", "m"))
    waiting = {}
    for t in tapes:
        files, nbytes = totals.get(t, (0, 0))
        age = (ctx.now - oldest[t]).total_seconds() if t in oldest else 0.0
        if worth_mounting(TapeInfo(id=t, media=None, files=files, bytes=nbytes, oldest_age_s=age), params):
            continue
        needs = f"{files} of the {params.mount_min_files} files"
        if params.mount_min_bytes:
            needs += f" or {nbytes:,} of the {params.mount_min_bytes:,} bytes"
        goes = ctx.now + timedelta(seconds=params.mount_max_wait_s - age)
        waiting[t] = (f"the tape waits to be worth mounting: it has {needs} a mount needs; "
                      f"it goes anyway by {goes:%Y-%m-%d %H:%M} UTC")
    return waiting


def _common_reasons(ctx):
    """Why not yet, for every ready request of the user: most decisive first."""
    c, h, reasons = ctx.control, ctx.health, []
    if c.paused:
        reasons.append("submission to the stager is paused by the operators")
    if h.state != HealthState.HEALTHY:
        reasons.append(f"the stager is {h.state}{': ' + h.reason if h.reason else ''}; "
                       "nothing new is sent until it recovers")
    if ctx.disk_use is not None and ctx.disk_use >= c.disk_threshold:
        reasons.append(f"the stager's disk buffer is {ctx.disk_use:.0%} used with what is on its way "
                       f"(threshold {c.disk_threshold:.0%})")
    if ctx.user_in_flight >= ctx.user_cap:
        reasons.append(f"your cap is reached: {ctx.user_in_flight} of your requests are in flight, "
                       f"your cap is {ctx.user_cap}")
    if ctx.group_cap is not None and ctx.group_in_flight >= ctx.group_cap:
        reasons.append(f"your group's cap is reached: {ctx.group_name} has {ctx.group_in_flight} requests "
                       f"in flight, its cap is {ctx.group_cap}")
    elif ctx.group_slots and ctx.group_in_flight >= ctx.group_slots:
        reasons.append(f"your group's share is in use: {ctx.group_name} has {ctx.group_in_flight} requests "
                       f"in flight, its share under {c.share_policy} is about {ctx.group_slots:.0f}")
    if ctx.in_flight >= ctx.slots:
        reasons.append(f"the stager has all it may take in flight ({ctx.in_flight} files); more go as those finish")
    return reasons


def _plus(n, capped):
    return f"{n:,}{'+' if capped else ''}"


def request_outlooks(requests, *, user, ctx):
    """{request id: Outlook} for a page of one user's requests (their tapes selected), given
    the user's queue_context()."""
    now = ctx.now
    ready = [r for r in requests if r.state == S.QUEUED and r.tape_id is not None]
    own = _own_ahead(user, ready, ctx)
    waiting = _tapes_waiting(ready, ctx)
    common = _common_reasons(ctx)
    no_rate = () if ctx.rate else ("no request finished in the last hour, so there is no estimate yet",)
    at_stager = eta_range(ahead=0, in_flight=ctx.in_flight, rate=ctx.rate, cycle_s=ctx.control.cycle_s)
    # Jobs of the mount plan not sent yet: the request waits here for its drive, not at the stager.
    planned = dict(Job.objects.filter(id__in={r.job_id for r in requests if r.state == S.SUBMITTED and r.job_id},
                                      state=JobState.PENDING).values_list("id", "chain"))
    out = {}
    for r in requests:
        if r.state == S.QUEUED and r.tape_id is None:
            out[r.id] = Outlook(reasons=("not located yet: the broker asks the stager which tape holds it",))
        elif r.state == S.QUEUED:
            own_ahead, capped = own[r.id]
            ahead = round(own_ahead / ctx.share) if ctx.share else None
            reasons = list(common)
            if r.tape.quarantined_at:
                why = f" ({r.tape.quarantine_reason})" if r.tape.quarantine_reason else ""
                reasons.insert(0, f"tape {r.tape.label} is quarantined{why}; its requests wait for an operator")
            if r.tape_id in waiting:
                reasons.append(waiting[r.tape_id])
            if ahead:
                are = "requests are" if ahead > 1 or capped else "request is"
                reasons.append(f"about {_plus(ahead, capped)} {are} ahead of it ({_plus(own_ahead, capped)} "
                               f"of yours) under {ctx.control.sort_policy} / {ctx.control.share_policy}")
            eta = eta_range(ahead=ahead or 0, in_flight=ctx.in_flight, rate=ctx.rate, cycle_s=ctx.control.cycle_s)
            if eta and (capped or ahead is None):
                eta = (eta[0], None)
            out[r.id] = Outlook(own_ahead=own_ahead, ahead=ahead, capped=capped, eta=eta,
                                reasons=tuple(reasons) + no_rate)
        elif r.state == S.SUBMITTED and r.job_id in planned:
            out[r.id] = Outlook(own_ahead=0, ahead=0, eta=at_stager and (0.0, None), reasons=(
                f"planned on drive {planned[r.job_id] or '?'}: sent to the stager once the mount before it there "
                "is done",))
        elif r.state in IN_FLIGHT_STATES:
            doing = "being read from tape" if r.state == S.STAGING else "at the stager, waiting for tape"
            out[r.id] = Outlook(own_ahead=0, ahead=0, eta=at_stager and (0.0, at_stager[1]),
                                reasons=(f"{doing} {r.tape.label if r.tape_id else ''}".strip(),))
        elif r.state == S.RETRY:
            wait = max(0.0, (r.retry_at - now).total_seconds())
            out[r.id] = Outlook(eta=(wait, None), reasons=(
                f"failed for now ({r.last_error or 'a transient error'}); "
                f"tried again from {r.retry_at:%Y-%m-%d %H:%M} UTC",))
        elif r.state == S.DELIVERING:
            target = delivery_target(r.destination, r.destination_layout, r.path)
            out[r.id] = Outlook(reasons=(f"restored, being delivered to {target}",))
        else:
            out[r.id] = Outlook()
    return out
