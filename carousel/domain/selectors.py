"""Reads of the core domain. Counting and sorting happen in the database."""
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, Max, Min, Q, Sum

from carousel.domain.intake import settle_if_pending
from carousel.models import (
    ACTIVE_STATES, IN_FLIGHT_STATES, READY, Account, Bulk, Control, GroupShare, HealthState, Job, JobState, RequestState,
    RestoreRequest, StagerHealth, TapeBacklog, Transition, UserBacklog, UserStateCount,
)

S = RequestState


# Operators' powers follow Django's permissions, never is_staff alone (a staff account may
# hold no permission at all): the view permission on a model shows everyone's rows, the
# change permission on restore requests lets one cancel anyone's.
def may_view_all(user, model="restorerequest"):
    return user.has_perm(f"carousel.view_{model}") or user.has_perm(f"carousel.change_{model}")


def may_change_all(user):
    return user.has_perm("carousel.change_restorerequest")


def acts_for_others(user, *, cached=True):
    """Whether the user is a service account (it may submit on behalf of others). The API's
    token cache keeps the answer on the user it caches (api.authentication)."""
    known = getattr(user, "carousel_acts_for_others", None) if cached else None
    if known is not None:
        return known
    return Account.objects.filter(user=user, acts_for_others=True).exists()


def _own(user):
    """A user's requests; for a service account, also those it submitted for others (the
    XRootD hooks find and cancel what they asked for on a person's behalf)."""
    if acts_for_others(user):
        return Q(user=user) | Q(bulk__submitter=user)
    return Q(user=user)


def visible_requests(user):
    """The requests a user may see: their own; with the view permission, everyone's."""
    qs = RestoreRequest.objects.all()
    return qs if may_view_all(user) else qs.filter(_own(user))


def cancellable_requests(user):
    """The requests a user may cancel: their own; with the change permission, everyone's."""
    qs = RestoreRequest.objects.all()
    return qs if may_change_all(user) else qs.filter(_own(user))


def visible_bulks(user):
    """A user's submissions (a service account's: also those it made for others); with the view
    permission, everyone's."""
    qs = Bulk.objects.all()
    if may_view_all(user, "bulk"):
        return qs
    return qs.filter(Q(user=user) | Q(submitter=user)) if acts_for_others(user) else qs.filter(user=user)


def request_list(*, user, **filters):
    # The serializer shows each request's user and tape: joined, not a query per row.
    return filter_requests(visible_requests(user).select_related("tape", "user"), **filters)


def filter_requests(qs, *, state=None, bulk=None, tape=None, since=None, until=None, path=None):
    """The filters of the API's list and the web page's, in one place."""
    if state:
        qs = qs.filter(state__in=state)
    if bulk:
        settle_if_pending(bulk)  # the list of a submission shows all of it
        qs = qs.filter(in_bulk(bulk))
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
    """What a user's queue looks like now: counts per state, bytes, the oldest active request.
    Reads the trigger-kept UserStateCount rows and one index probe per active state
    (request_user_state_age): its cost does not grow with the user's queue."""
    counts = dict.fromkeys(RequestState.values, 0)
    nbytes = dict.fromkeys(RequestState.values, 0)
    for state, files, b in UserStateCount.objects.filter(user=user).values_list("state", "files", "bytes"):
        counts[state], nbytes[state] = files, b
    return {"states": counts, "active": sum(counts[s] for s in ACTIVE_STATES),
            "bytes_done": nbytes[S.DONE], "bytes_active_known": sum(nbytes[s] for s in ACTIVE_STATES),
            "oldest_active_at": oldest_active(user)}


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


def in_bulk(bulk):
    """The requests of a submission: those it created (RestoreRequest.bulk, indexed) and those
    it asked for again (BulkItem). A subquery, not a join: no request appears twice."""
    from carousel.models import BulkItem

    bulk_id = getattr(bulk, "pk", bulk)
    return Q(bulk_id=bulk_id) | Q(id__in=BulkItem.objects.filter(bulk_id=bulk_id).values("request_id"))


def bulk_requests(bulk):
    """A submission's requests, every file of it: files still waiting in the intake are queued
    first (carousel/domain/intake.py; no query when none waits)."""
    settle_if_pending(bulk)
    return RestoreRequest.objects.filter(in_bulk(bulk))


def stager_health():
    """The stager as the loop judged it at its last cycle, with the queues that depend on it."""
    from carousel.models import Control, Job, JobState, StagerHealth, Tape

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


# --- Where a request stands: queue position, estimate, why not yet (the "my requests" page) ---
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
# allocate() deals whole slots; scaled up, a user's share is not rounded away among many users.
SHARE_SCALE = 1000


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


def drive_allocation():
    """{group id: (reserved drives, most drives or None)} for the groups an operator gave a
    drive allocation (GroupShare); a most below 1 counts as 1."""
    return {g: (reserved, None if most is None else max(1, most)) for g, reserved, most in
            GroupShare.objects.filter(Q(reserved_drives__gt=0) | Q(max_drives__isnull=False))
            .values_list("group_id", "reserved_drives", "max_drives")}


def drives_in_use():
    """{group id: the drives' chains reading its mounts now (jobs sent)}."""
    used = {}
    for group, chain in (Job.objects.filter(state=JobState.SENT).exclude(chain="").order_by()
                         .values_list("group_id", "chain").distinct()):
        used.setdefault(group, set()).add(chain)
    return used


def _limits(control, user_ids):
    """({user: (group, in-flight cap)}, {group: (weight, in-flight cap)}) with the defaults
    applied, as the selection step reads them."""
    found = {u: (g, cap) for u, g, cap in
             Account.objects.filter(user_id__in=user_ids).values_list("user_id", "group_id", "inflight_cap")}
    users = {}
    for u in user_ids:
        group, cap = found.get(u, (None, None))
        users[u] = (group, control.default_user_cap if cap is None else cap)
    found = {g: (w, cap) for g, w, cap in GroupShare.objects.filter(
        group_id__in={g for g, _ in users.values() if g is not None}).values_list("group_id", "weight", "inflight_cap")}
    groups = {}
    for group in {g for g, _ in users.values() if g is not None}:
        weight, cap = found.get(group, (1.0, None))
        groups[group] = (weight, control.default_group_cap if cap is None else cap)
    return users, groups


@dataclass(frozen=True)
class Shares:
    """How the active sharing policy splits the stager's slots between the users with work."""

    users: dict  # user id -> fraction of what is handed out
    groups: dict  # group id (None: ungrouped) -> fraction of what is handed out
    group_slots: dict  # group id -> slots (files in flight) the group is given
    group_of: dict  # user id -> group id


def throughput_shares(*, control, eager=None):
    """Each user's and group's part of the stager's slots under the active sharing policy,
    for the users with located queued requests; the user `eager`, if given, counted as
    wanting all it may take. The policy's own allocate() on the trigger-kept backlog
    counters: no queue is read."""
    from policies.selection import share_policy
    from policies.sharing import GroupLimit, UserDemand

    backlog = dict(UserBacklog.objects.filter(files__gt=0).values_list("user_id", "files"))
    if eager is not None:
        backlog.setdefault(eager, 0)
    users, groups = _limits(control, list(backlog))
    demands = [UserDemand(user=u, group=users[u][0], room=users[u][1] * SHARE_SCALE,
                          pending=(users[u][1] if u == eager else files) * SHARE_SCALE)
               for u, files in backlog.items()]
    limits = {g: GroupLimit(weight=w, room=cap * SHARE_SCALE) for g, (w, cap) in groups.items()}
    slots = control.files_per_job * control.jobs_in_flight * SHARE_SCALE
    grants = share_policy(control.share_policy).allocate(demands, limits, slots) if demands else {}
    total = sum(grants.values())
    group_grants = {}
    for u, n in grants.items():
        group_grants[users[u][0]] = group_grants.get(users[u][0], 0) + n
    return Shares(users={u: n / total for u, n in grants.items() if n},
                  groups={g: n / total for g, n in group_grants.items() if n},
                  group_slots={g: n / SHARE_SCALE for g, n in group_grants.items()},
                  group_of={u: g for u, (g, _) in users.items()})


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
    from django.contrib.auth.models import Group

    from carousel.loop.health import projected_disk_use

    control, health = Control.get(), StagerHealth.get()
    slots = control.files_per_job * jobs_limit(control, health.jobs_limit)
    in_flight = RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES)
    agg = in_flight.aggregate(n=Count("id"), mine=Count("id", filter=Q(user=user)), b=Sum("size"))
    shares = throughput_shares(control=control, eager=user.id)
    users, groups = _limits(control, [user.id])
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


def jobs_limit(control, adaptive):
    """Jobs the stager may have in flight now: the loop's adaptive limit, within K."""
    return min(adaptive or control.jobs_in_flight, control.jobs_in_flight)


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
    from django.db import connection

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
    from policies.selection import params_from
    from policies.sorting import TapeInfo, worth_mounting

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
            out[r.id] = Outlook(reasons=(f"restored, being delivered to {r.destination}",))
        else:
            out[r.id] = Outlook()
    return out


def request_page(*, user, state=None, path=None, bulk=None, after=None, size=50):
    """One page of the user's own requests, newest first, keyset-paginated on id: (rows, the
    `after` of the next page or None). Never counts the matches."""
    qs = filter_requests(RestoreRequest.objects.filter(user=user).select_related("tape"), state=state, path=path,
                         bulk=bulk)
    if after:
        qs = qs.filter(id__lt=after)
    rows = list(qs.order_by("-id")[:size + 1])
    return rows[:size], (rows[size - 1].id if len(rows) > size else None)


# --- The live staging page: bounded reads only (it is polled every few seconds by everyone) ---

LIVE_HOURS = 12
TOP_USERS = 20
JOBS_SHOWN = 50
COUNT_CAP = 10_000


def capped_count(queryset, cap=COUNT_CAP):
    """(count, whether it reached `cap`): stops counting at `cap`."""
    n = queryset.order_by()[:cap].count()
    return n, n >= cap


def hourly_series(*, now, hours=LIVE_HOURS):
    """One dict per hour of the last `hours` (the current one last): files and bytes restored,
    errors (requests failed or sent to retry), from the trigger-kept HourlyStats; and mounts
    (distinct tapes of the jobs sent that hour: consecutive jobs on one tape count once)."""
    from django.db.models.functions import TruncHour

    from carousel.models import HourlyStats, Job

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
    from carousel.models import StagerHealth

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
    users: list  # dicts: username, group, files, bytes, in_flight, share; most files first
    users_with_work: int
    groups: list  # dicts: group, users, files, bytes, in_flight, share, drives, reserved_drives, max_drives
    unlocated: tuple  # capped_count
    delivering: tuple  # capped_count
    series: list  # hourly_series


def live_figures(*, now):
    from django.contrib.auth.models import Group

    from carousel.models import Job, JobState

    control = Control.get()
    health = stager_health()
    in_flight_by_user = dict(RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).order_by()
                             .values_list("user_id").annotate(n=Count("id")).values_list("user_id", "n"))
    shares = throughput_shares(control=control)
    backlog = UserBacklog.objects.filter(files__gt=0)
    users = [{"username": name, "group": group or "", "files": files, "bytes": nbytes,
              "in_flight": in_flight_by_user.get(user_id, 0), "share": shares.users.get(user_id, 0.0)}
             for user_id, name, group, files, nbytes in backlog.order_by("-files", "user_id").values_list(
                 "user_id", "user__username", "user__account__group__name", "files", "bytes")[:TOP_USERS]]
    in_flight_groups, _ = _limits(control, list(in_flight_by_user))
    groups = {}
    for group_id, name, n_users, files, nbytes in (
            backlog.order_by().values_list("user__account__group_id")
            .annotate(u=Count("user_id"), f=Sum("files"), b=Sum("bytes"))
            .values_list("user__account__group_id", "user__account__group__name", "u", "f", "b")):
        groups[group_id] = {"group": name or "", "users": n_users, "files": files, "bytes": nbytes, "in_flight": 0,
                            "share": shares.groups.get(group_id, 0.0)}
    for user_id, n in in_flight_by_user.items():
        group_id = in_flight_groups[user_id][0]
        if group_id not in groups:
            groups[group_id] = {"group": "", "users": 0, "files": 0, "bytes": 0, "in_flight": 0, "share": 0.0}
        groups[group_id]["in_flight"] += n
    # Drive allocation: what each group reads on now, against what an operator gave it.
    allocation, using = drive_allocation(), drives_in_use()
    for group_id in set(allocation) | set(using):
        if group_id not in groups:
            groups[group_id] = {"group": "", "users": 0, "files": 0, "bytes": 0, "in_flight": 0, "share": 0.0}
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
        users=users, users_with_work=len(shares.group_of), groups=groups,
        unlocated=capped_count(queued), delivering=capped_count(RestoreRequest.objects.filter(state=S.DELIVERING)),
        series=hourly_series(now=now))
