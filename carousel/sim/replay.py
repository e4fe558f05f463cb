"""Replay a workload (carousel/sim/workload.py) against the simulated library (carousel/sim/library.py).

- replay_broker(): the real broker. Users, groups and caps from the workload; requests enter
  through services.restore_submit at their arrival time; carousel.loop.cycle.run_cycle runs with the
  simulated stager on a simulated clock, every cycle_s. It runs in the current database, which
  must hold no requests (a throwaway one: the `simulate` command makes it). To be fast, the clock
  skips ahead to the next cycle at which something can change: an arrival, a file's state in the
  library, a time limit of the loop (retry, deadline, maximum wait, stall), or work the last
  cycle left for the next one.
- replay_baseline(): `direct`, `eradat` and `eradat-rao` of workloads/README.md, driving the
  same library without the broker (no database).

replay_broker() may also run against the `hsm-fifo` backend (carousel/sim/hsm.py): a tape system
that hides its tapes from the broker, with or without the workload's tapes loaded as the
site's tape map.

Either may run on a library that departs from the broker's model (library.Mismatch): the broker
and its lower bound keep the nominal model, the baselines meet the same departed library.

Both return an Outcome; report() turns one into the JSON of workloads/README.md and checks the
makespan against the lower bound, loudly.
"""
import functools
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from policies.order import read_order

from carousel.sim.library import BUSY_PHASES, FETCH, Library
from carousel.sim.lowerbound import lower_bound

DEFAULT_ACTIVITY = "default"  # carousel.models.DEFAULT_ACTIVITY (not imported at module level: no Django here)

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
BASELINES = ("direct", "eradat", "eradat-rao")
BACKENDS = ("simulated", "hsm-fifo")
# Control fields a replay may set (the rest keep their shipped defaults).
CONTROL_FIELDS = ("sort_policy", "share_policy", "files_per_job", "jobs_in_flight", "cycle_s", "default_user_cap",
                  "default_group_cap", "max_wait_s", "mount_min_files", "mount_min_bytes", "mount_max_wait_s",
                  "min_mount_files", "min_mount_bytes", "remount_delay_s", "policy_params")
MAX_SIMULATED_S = 60 * 86400.0


class ReplayError(RuntimeError):
    pass


@dataclass
class Outcome:
    library: Library
    start: float  # the first arrival, simulated seconds
    requests: list  # (user, arrival s, restored s or None, path), one per request
    policy: dict
    baseline: str | None = None
    cycles: int = 0
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)


def new_library(workload, mismatch=None, kind=Library):
    """The workload's library; `mismatch` a library.Mismatch, or None for the nominal one."""
    return kind(drives=workload.drives, read_rate_mb_s=workload.read_rate_mb_s, robots=workload.robots,
                   exchange_s=workload.exchange_s, now=workload.requests[0].t, mismatch=mismatch)


def _mismatch_extra(mismatch):
    return {"mismatch": mismatch.fraction if mismatch else 0, "mismatch_seed": mismatch.seed if mismatch else None}


def _arrivals(workload):
    """[(t, user, activity, [paths])] in arrival order: one submission per user, activity and instant."""
    batches = {}
    for r in workload.requests:
        batches.setdefault((r.t, r.user, r.activity), []).append(r.path)
    return [(t, user, activity, paths) for (t, user, activity), paths in batches.items()]


# Baselines ----------------------------------------------------------------------------------

def replay_baseline(workload, kind, *, mismatch=None):
    """`direct`: every request a one-file job the moment it arrives. `eradat`: at the start one
    job per tape, its files by offset, longest tape (bytes) first; later requests as one-file
    jobs at once. `eradat-rao`: eradat with each tape's files in the broker's read order
    (policies/order.py, on the nominal model as the broker has it)."""
    if kind not in BASELINES:
        raise ReplayError(f"unknown baseline {kind!r}; known: {', '.join(BASELINES)}")
    began = time.perf_counter()
    library = new_library(workload, mismatch)
    start = workload.requests[0].t
    job_of = []  # per request, in workload.requests order
    sends = []  # (t, job id, [File])
    if kind == "direct":
        for i, r in enumerate(workload.requests):
            sends.append((r.t, f"r{i}", [workload.files[r.path]]))
            job_of.append(f"r{i}")
    else:
        per_tape, later = {}, []
        for i, r in enumerate(workload.requests):
            if r.t == start:
                file = workload.files[r.path]
                per_tape.setdefault(file.tape, {})[r.path] = file
                job_of.append(f"tape-{file.tape}")
            else:
                sends_at = f"r{i}"
                later.append((r.t, sends_at, [workload.files[r.path]]))
                job_of.append(sends_at)
        tapes = sorted(per_tape.items(), key=lambda kv: (-sum(f.size for f in kv[1].values()), kv[0]))
        for tape, files in tapes:
            if kind == "eradat-rao":
                ordered = [files[p] for p in read_order(workload.tape_media[tape],
                                                        [(f.path, f.offset, f.size) for f in files.values()])]
            else:
                ordered = sorted(files.values(), key=lambda f: f.offset)
            sends.append((start, f"tape-{tape}", ordered))
        sends.extend(later)
    for t, job, files in sends:
        library.advance(t)
        library.submit(job, files)
    drain(library)
    read_at = {(job, path): t for t, job, path, _ in library.reads}
    requests = [(r.user, r.t, read_at.get((job, r.path)), r.path) for r, job in zip(workload.requests, job_of)]
    return Outcome(library=library, start=start, requests=requests, policy=dict.fromkeys(
        ("sort", "share", "files_per_job", "jobs_in_flight", "cycle_s")), baseline=kind,
        wall_s=time.perf_counter() - began, extra=_mismatch_extra(mismatch))


def drain(library):
    while (moment := library.next_event()) is not None:
        library.advance(moment)


# The broker ---------------------------------------------------------------------------------

def setup_database(workload, control):
    """Users, groups, shares and caps of the workload, and the control row; returns
    {username: User}."""
    from django.contrib.auth.models import Group, User

    from carousel.models import Account, Activity, Control, GroupShare

    unknown = sorted(set(control) - set(CONTROL_FIELDS))
    if unknown:
        raise ReplayError(f"unknown control fields {unknown}; known: {', '.join(CONTROL_FIELDS)}")
    row = Control.get()
    for name, value in control.items():
        setattr(row, name, value)
    row.save()
    groups = {}
    for name, weight in workload.groups.items():
        groups[name], _ = Group.objects.get_or_create(name=name)
        GroupShare.objects.update_or_create(group=groups[name], defaults={"weight": weight})
    users = {}
    for name, spec in workload.users.items():
        users[name], _ = User.objects.get_or_create(username=name)
        group = groups.get(spec.group)
        if group:
            users[name].groups.add(group)
        Account.objects.update_or_create(user=users[name], defaults={"group": group, "inflight_cap": spec.cap})
    for activity in workload.activities:
        Activity.objects.update_or_create(group=groups.get(activity.group), name=activity.name,
                                          defaults={"priority": activity.priority, "weight": activity.weight})
    return users


def load_workload_map(workload):
    """The workload's own tapes as the site's tape map (the `--tape-map` of an hsm-fifo replay):
    every file of the catalogue, each tape's files in position order."""
    from django.utils import timezone

    from carousel.domain.tapemap import MapLine, tape_map_load

    files = sorted(workload.files.values(), key=lambda f: (f.tape, f.offset))
    lines = ((i, MapLine(f.path, f.tape, f.media, f.offset, f.size)) for i, f in enumerate(files, 1))
    return tape_map_load(lines=lines, now=timezone.now())


def replay_broker(workload, *, control=None, progress=None, mismatch=None, backend="simulated", tape_map=False,
                  estimates=True):
    """Run the real loop over the workload in the current (empty) database; `mismatch`: a
    library.Mismatch for a library departing from the model the broker plans with. `backend`
    "hsm-fifo": a tape system that hides its tapes (carousel/sim/hsm.py), the control row's drives
    to plan for set to the library's; `tape_map`: the workload's tapes loaded as the site's map;
    `estimates`: record the range each request is shown when it is located and when it is
    planned (EstimateRecorder; it only reads, so the broker decides the same either way)."""
    from carousel.domain import intake
    from carousel.loop.cycle import run_cycle
    from carousel.models import ACTIVE_STATES, Control, RestoreRequest
    from carousel.domain.services import restore_submit
    from carousel.sim.hsm import FifoLibrary, HiddenTapesStager
    from carousel.stagers.simulated import SimulatedStager

    began = time.perf_counter()
    if backend not in BACKENDS:
        raise ReplayError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if tape_map and backend != "hsm-fifo":
        raise ReplayError("a tape map is for a backend that hides its tapes: --backend hsm-fifo")
    if RestoreRequest.objects.exists():
        raise ReplayError("the database already holds requests: a replay needs an empty, throwaway database")
    users = setup_database(workload, control or {})
    row = Control.get()
    if backend == "hsm-fifo":
        # It shows no drives: the operator gives the count to plan for, as for tape-rest.
        row.drives = sum(workload.drives.values())
        row.save()
    if tape_map:
        load_workload_map(workload)
    period = row.cycle_s
    hidden = backend == "hsm-fifo"
    library = new_library(workload, mismatch, kind=FifoLibrary if hidden else Library)
    start = workload.requests[0].t
    clock = [start]
    stager = (HiddenTapesStager if hidden else SimulatedStager)(library=library, files=workload.files,
                                                                 clock=lambda: clock[0])
    arrivals = _arrivals(workload)
    next_arrival = 0
    cycle = cycles = 0
    recorder = EstimateRecorder() if estimates else None
    while True:
        now = start + cycle * period
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= now:
            t, user, activity, paths = arrivals[next_arrival]
            with intake.direct():  # no worker here to run the intake's task
                restore_submit(user=users[user], paths=paths, now=EPOCH + timedelta(seconds=t), activity=activity)
            next_arrival += 1
        clock[0] = now
        report = run_cycle(now=EPOCH + timedelta(seconds=now), stager=stager)
        cycles += 1
        if report.skipped:
            raise ReplayError("the cycle was skipped: another process holds the loop's lock on this database")
        if progress:
            progress(now, report)
        if recorder is not None:
            recorder.observe(EPOCH + timedelta(seconds=now))
        pending_arrivals = next_arrival < len(arrivals)
        if not pending_arrivals and not RestoreRequest.objects.filter(state__in=ACTIVE_STATES).exists():
            break
        wake = next_wake(report, library, control=row, now=now, period=period,
                         arrival=arrivals[next_arrival][0] if pending_arrivals else None)
        if wake is None:
            active = RestoreRequest.objects.filter(state__in=ACTIVE_STATES).count()
            raise ReplayError(f"the replay is stuck at {now:.0f} s: {active} requests are active, the library "
                              "is idle and nothing the loop waits for is due (paused? held back for good?)")
        cycle = max(cycle + 1, math.ceil((wake - start) / period - 1e-9))
        if cycle * period > MAX_SIMULATED_S:
            raise ReplayError(f"the replay passed {MAX_SIMULATED_S / 86400:.0f} simulated days; giving up")
    drain(library)
    requests = []
    for username, created, finished, state, path in RestoreRequest.objects.values_list(
            "user__username", "created_at", "finished_at", "state", "path").order_by("id"):
        restored = (finished - EPOCH).total_seconds() if state == "done" else None
        requests.append((username, (created - EPOCH).total_seconds(), restored, path))
    policy = {"sort": row.sort_policy, "share": row.share_policy, "files_per_job": row.files_per_job,
              "jobs_in_flight": row.jobs_in_flight, "cycle_s": row.cycle_s}
    extra = _mismatch_extra(mismatch)
    if hidden:
        extra.update(backend=backend, tape_map=tape_map)
    if recorder is not None:
        extra.update(recorder.scores())
    return Outcome(library=library, start=start, requests=requests, policy=policy, cycles=cycles,
                   wall_s=time.perf_counter() - began, extra=extra)


class EstimateRecorder:
    """The ranges the pages show (carousel.outlook.estimates), recorded per request after each
    cycle: the first one shown once the request is located, and the first shown once it is
    planned on a chain (a request never planned: the one shown at the step it reaches next).
    scores() compares them with when each restored request was done."""

    def __init__(self):
        self.located = {}  # request id -> (earliest, latest) as datetimes, latest None: unknown
        self.planned = {}
        self.submitted = {}  # request id -> created_at
        self.step = {}  # request id -> its state when first seen located
        self.counts = None

    def observe(self, now):
        from django.contrib.auth.models import User
        from django.db.models import Count, Q

        from carousel.models import ACTIVE_STATES, RequestState, RestoreRequest
        from carousel.outlook import estimates

        # Only a cycle that located, planned or sent requests, or put some back to retry,
        # changes a step whose range is recorded: the counts say whether one did.
        # (A request that joined another user's stage at submission is in a job before its own
        # locate: it is seen from there.)
        seen = Q(state__in=ACTIVE_STATES) & (Q(tape__isnull=False) | Q(job__isnull=False))
        counts = RestoreRequest.objects.aggregate(
            queued=Count("id", filter=Q(state=RequestState.QUEUED, tape__isnull=False)),
            retry=Count("id", filter=Q(state=RequestState.RETRY)), total=Count("id", filter=seen))
        if counts == self.counts:
            return
        self.counts = counts
        rows = RestoreRequest.objects.filter(seen).values_list("id", "state")
        wanted = [i for i, state in rows
                  if i not in self.located or (state != RequestState.QUEUED and i not in self.planned)]
        if not wanted:
            return
        projection = estimates.project(now=now)
        by_user = {}
        for i in range(0, len(wanted), 500):
            for r in RestoreRequest.objects.filter(id__in=wanted[i:i + 500]).select_related("tape"):
                by_user.setdefault(r.user_id, []).append(r)
        for user_id, requests in by_user.items():
            user = User.objects.get(id=user_id)
            ctx = estimates.queue_context(user=user, now=now, projection=projection)
            for i in range(0, len(requests), estimates.RANK_SLICE):
                part = requests[i:i + estimates.RANK_SLICE]
                outlooks = estimates.request_outlooks(part, user=user, ctx=ctx)
                for r in part:
                    eta = outlooks[r.id].eta
                    shown = None if eta is None else (
                        now + timedelta(seconds=eta[0]), None if eta[1] is None else now + timedelta(seconds=eta[1]))
                    self.submitted.setdefault(r.id, r.created_at)
                    self.located.setdefault(r.id, shown)
                    self.step.setdefault(r.id, r.state)
                    if r.state != RequestState.QUEUED:
                        self.planned.setdefault(r.id, shown)

    def scores(self):
        """estimate_coverage_located, estimate_coverage_planned: the fraction of the restored
        requests done inside the range shown when located, when planned (a request never seen
        planned: the range it was shown located); estimate_width_ratio: the median width of
        the range shown when located over the median wait (done - submitted)."""
        from carousel.models import RequestState, RestoreRequest

        done = dict(RestoreRequest.objects.filter(state=RequestState.DONE).values_list("id", "finished_at"))

        def inside(shown, at):
            return shown is not None and shown[1] is not None and shown[0] <= at <= shown[1]

        scored = [i for i in done if i in self.located]
        widths = [(s[1] - s[0]).total_seconds() if s and s[1] is not None else math.inf
                  for s in (self.located[i] for i in scored)]
        waits = [(done[i] - self.submitted[i]).total_seconds() for i in scored]
        median_wait = percentile(waits, 0.5)
        median_width = percentile(widths, 0.5) if scored else None
        return {
            "estimate_coverage_located": (sum(inside(self.located[i], done[i]) for i in scored) / len(scored)
                                          if scored else None),
            "estimate_coverage_planned": (sum(inside(self.planned.get(i, self.located[i]), done[i]) for i in scored)
                                          / len(scored) if scored else None),
            # None when most ranges had no upper bound (an infinite width).
            "estimate_width_ratio": (median_width / median_wait
                                     if median_wait and median_width is not None and math.isfinite(median_width)
                                     else None),
            "estimate_files_scored": len(scored),
            # Where the misses are: per state when first seen located, done before, inside, after.
            "estimate_detail": {state: {"early": sum(1 for i in scored if self.step[i] == state and self.located[i]
                                                     and done[i] < self.located[i][0]),
                                        "late": sum(1 for i in scored if self.step[i] == state
                                                    and not inside(self.located[i], done[i])
                                                    and not (self.located[i] and done[i] < self.located[i][0])),
                                        "files": sum(1 for i in scored if self.step[i] == state)}
                                for state in sorted({self.step[i] for i in scored})},
        }


def next_change(library, *, horizon):
    """Run the library on to its next event that changes a file's state (the loop would see it),
    up to `horizon`; return that event's time, or None. Nothing is sent to the library between
    two cycles, so running it ahead of the clock changes nothing it does."""
    seen = library.changes
    while (moment := library.next_event()) is not None and moment <= horizon:
        library.advance(moment)
        if library.changes != seen:
            return moment
    return None


def next_wake(report, library, *, control, now, period, arrival=None, epoch=EPOCH):
    """After the cycle at `now` (library seconds since `epoch`) that gave `report`: the next
    moment a cycle may find something to do, or None if nothing is ever due (stuck). The next
    period if the cycle acted (there may be more: locate batches, slots) or a file changes state
    before then; else the first of the loop's time limits, the next arrival and the library's
    next change: the idle stretch between is skipped, as nothing can happen in it."""
    if report.located or report.submitted or report.requeued or report.expired or report.preempted:
        return now + period
    if next_change(library, horizon=now + period) is not None:
        return now + period
    candidates = [c for c in (_loop_deadline(control, now, epoch=epoch), arrival) if c is not None]
    candidates.append(next_change(library, horizon=min(candidates, default=math.inf)))
    return min((c for c in candidates if c is not None), default=None)


def _loop_deadline(row, now, *, epoch=EPOCH):
    """The next moment a time limit of the loop may change what it does, or None: a retry
    coming due, a deadline, a queued request reaching the maximum wait (or the worth-mounting
    wait), jobs in flight reaching the stall time, a short mount's wait that lets it cut a long
    one (carousel.loop.mounts.preempt)."""
    from django.db import connection

    from carousel.infra.db import read_moment
    from carousel.models import StagerHealth

    at = epoch + timedelta(seconds=now)
    # One statement, one pass over the requests and one over the jobs (a replay's SQLite scans
    # for each). The fault simulator asks after most idle cycles: built by the ORM as four
    # aggregates, the question took a tenth of a seed's CPU in a profile of seeds 0-29, most
    # of it building the queries, not running them.
    ops = connection.ops
    with connection.cursor() as cursor:
        cursor.execute(_loop_deadline_sql(), [
            ops.adapt_datetimefield_value(at - timedelta(seconds=row.mount_max_wait_s)),
            ops.adapt_datetimefield_value(at - timedelta(seconds=row.remount_delay_s))])
        retry, deadline, oldest, held, progress, remount, waiting = map(read_moment, cursor.fetchone())
    moments = [m for m in (retry, deadline) if m]
    if oldest:
        for wait in (row.max_wait_s, row.mount_max_wait_s):
            if wait > 0:
                moments.append(oldest + timedelta(seconds=wait))
        # The wear rules (carousel/loop/wear.py) free a held run when its oldest request has
        # waited mount_max_wait_s, or its tape's remount delay ends: the next of each.
        if row.mount_max_wait_s > 0 and held:
            moments.append(held + timedelta(seconds=row.mount_max_wait_s))
        if row.remount_delay_s > 0 and remount:
            moments.append(remount + timedelta(seconds=row.remount_delay_s))
    if progress:
        moments.append(progress + timedelta(seconds=row.stall_after_s))
    if row.preempt_after_s > 0 and waiting:  # a short mount waiting behind a long one may cut it
        last = StagerHealth.get().preempted_at
        moments.append(max(waiting + timedelta(seconds=row.preempt_after_s),
                           last + timedelta(seconds=row.preempt_gap_s) if last else waiting))
    seconds = [(m - epoch).total_seconds() for m in moments]
    later = [s for s in seconds if s > now]
    return min(later, default=None)


@functools.cache
def _loop_deadline_sql():
    """_loop_deadline's statement (built once: the models are not importable before Django is set up)."""
    from carousel.loop.due import SHORT_MOUNTS_WAITING
    from carousel.models import ACTIVE_STATES, Job, JobState, RequestState as S, RestoreRequest, sql_values

    requests, jobs = RestoreRequest._meta.db_table, Job._meta.db_table
    return f"""SELECT r.retry, r.deadline, r.oldest, r.held, j.progress, j.remount,
        (SELECT MIN(w.created_at) {SHORT_MOUNTS_WAITING})
    FROM (SELECT MIN(retry_at) FILTER (WHERE state = '{S.RETRY.value}') AS retry,
                 MIN(deadline) FILTER (WHERE state IN ({sql_values(ACTIVE_STATES)}) AND deadline IS NOT NULL)
                     AS deadline,
                 MIN(created_at) FILTER (WHERE state = '{S.QUEUED.value}') AS oldest,
                 MIN(created_at) FILTER (WHERE state = '{S.QUEUED.value}' AND created_at > %s) AS held
          FROM {requests}) r,
         (SELECT MAX(progress_at) FILTER (WHERE state = '{JobState.SENT.value}') AS progress,
                 MIN(finished_at) FILTER (WHERE sent_at IS NOT NULL AND finished_at > %s) AS remount
          FROM {jobs}) j"""


# The report ---------------------------------------------------------------------------------

def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def group_shares(workload, requests):
    """group -> fraction of the files restored while every group still had work pending."""
    group_of = {name: spec.group for name, spec in workload.users.items()}
    groups = sorted({group_of[u] for u, _, _, _ in requests}, key=str)
    events = []
    for user, arrived, restored, _ in requests:
        events.append((arrived, 0, group_of[user]))
        if restored is not None:
            events.append((restored, 1, group_of[user]))
    pending = dict.fromkeys(groups, 0)
    counted = dict.fromkeys(groups, 0)
    for _, kind, group in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == 0:
            pending[group] += 1
        else:
            if all(pending[g] > 0 for g in groups):
                counted[group] += 1
            pending[group] -= 1
    total = sum(counted.values())
    return {g: (counted[g] / total if total else None) for g in groups}


def activity_shares(workload, outcome):
    """activity -> {"requests", "drive_s", "share"} when the workload names two activities or
    more: the drive time of the mounts made while every activity still had work pending (from
    the last one's first arrival to the first one's last file restored), each mount's busy time
    split between the activities by the files it read; `share`: of that drive time."""
    named = {(r.user, r.path): r.activity or DEFAULT_ACTIVITY for r in workload.requests}
    if len(set(named.values())) < 2:
        return {}
    activity_of = {}
    first, last, count = {}, {}, {}
    for user, arrived, restored, path in outcome.requests:
        activity = named.get((user, path), DEFAULT_ACTIVITY)
        activity_of.setdefault(path, activity)
        count[activity] = count.get(activity, 0) + 1
        first[activity] = min(first.get(activity, math.inf), arrived)
        last[activity] = max(last.get(activity, -math.inf), math.inf if restored is None else restored)
    begin, end = max(first.values()), min(last.values())
    mounts, current = [], {}
    for seg in sorted(outcome.library.segments, key=lambda s: (s.drive, s.start)):
        if seg.phase not in BUSY_PHASES:
            continue
        mount = current.get(seg.drive)
        if mount is None or mount[2] != seg.tape or seg.phase == FETCH:
            mount = current[seg.drive] = [seg.start, seg.end, seg.tape, 0.0]
            mounts.append(mount)
        mount[1] = seg.end
        mount[3] += seg.end - seg.start
    reads = {}
    for moment, _, path, _ in outcome.library.reads:
        reads.setdefault(workload.files[path].tape, []).append((moment, path))
    drive_s = dict.fromkeys(count, 0.0)
    for start, stop, tape, busy in mounts:
        if start < begin or stop > end:
            continue
        files = [activity_of.get(p, DEFAULT_ACTIVITY) for t, p in reads.get(tape, []) if start <= t <= stop]
        for activity in files:
            drive_s[activity] += busy / len(files)
    total = sum(drive_s.values())
    return {a: {"requests": count[a], "drive_s": drive_s[a], "share": drive_s[a] / total if total else None}
            for a in sorted(count)}


DAY_S = 86400.0


def max_mounts_per_day(mount_log):
    """The most mounts of one tape in any sliding 24-hour window of simulated time (a
    cartridge's wear: LTO media are rated for about 20,000 loads): `mount_log` is the library's
    (time, tape) of every mount. 0 when nothing was mounted."""
    times = {}
    for at, tape in mount_log:
        times.setdefault(tape, []).append(at)
    most = 0
    for moments in times.values():
        moments.sort()
        first = 0
        for last, at in enumerate(moments):
            while at - moments[first] >= DAY_S:
                first += 1
            most = max(most, last - first + 1)
    return most


def report(workload, outcome, bound=None):
    """The report of workloads/README.md (plus extras). Raises ReplayError when the makespan
    lies below the lower bound: the model or the bound is wrong. On a departed library (a
    mismatch) the bound is the nominal model's, which a faster library may beat: the report
    then says so (`beats_nominal_bound`) instead."""
    bound = bound or lower_bound(workload)
    library = outcome.library
    start = outcome.start
    last_read = max((t for t, _, _, _ in library.reads), default=start)
    makespan = last_read - start
    done = [r for r in outcome.requests if r[2] is not None]
    restored_paths = {r[3] for r in done}
    restored_bytes = sum(workload.files[p].size for p in restored_paths)
    drives = sum(workload.drives.values())
    departed = bool(outcome.extra.get("mismatch"))
    beats_bound = makespan < bound.seconds * (1 - 1e-9)
    if beats_bound and not departed:
        raise ReplayError(f"{workload.name}: makespan {makespan:.1f} s is below the lower bound {bound.seconds:.1f} s "
                          f"({bound.binding}): the simulator or the bound is wrong")
    users = {}
    for name in workload.users:
        mine = [r for r in outcome.requests if r[0] == name]
        if not mine:
            continue
        waits = [r[2] - r[1] for r in mine if r[2] is not None]
        users[name] = {"requests": len(mine), "wait_p50_s": percentile(waits, 0.5),
                       "wait_p95_s": percentile(waits, 0.95), "wait_max_s": max(waits, default=None)}
    group_of = {name: spec.group for name, spec in workload.users.items()}
    shares = group_shares(workload, outcome.requests)
    groups = {}
    for group in shares:
        mine = [r for r in outcome.requests if group_of[r[0]] == group]
        paths = {r[3] for r in mine if r[2] is not None}
        groups[group] = {"requests": len(mine), "bytes": sum(workload.files[p].size for p in paths),
                         "share": shares[group]}
    group_waits = {}
    for group in shares:
        maxima = [u["wait_max_s"] for name, u in users.items() if group_of[name] == group]
        done_maxima = [m for m in maxima if m is not None]
        group_waits[group] = {"users": len(maxima), "users_wait_max_p95_s": percentile(done_maxima, 0.95),
                              "wait_max_s": max(done_maxima, default=None),
                              "users_within_1800_s": sum(1 for m in done_maxima if m <= 1800)}
    tapes = len(workload.requested_files())
    return {
        "workload": workload.name,
        "policy": outcome.policy,
        "baseline": outcome.baseline,
        "makespan_s": makespan,
        "lower_bound_s": bound.seconds,
        "mounts": library.mounts,
        "tapes": tapes,
        "bytes": restored_bytes,
        "files_done": len(done),
        "files_failed": sum(1 for r in outcome.requests if r[2] is None),
        "throughput_mb_s": restored_bytes / makespan / 1e6 if makespan > 0 else None,
        "drive_busy_fraction": library.busy_seconds(until=last_read) / (drives * makespan) if makespan > 0 else None,
        "users": users,
        "groups": groups,
        "wall_s": outcome.wall_s,
        "bytes_read": library.bytes_read,
        "mismatch": 0,
        "mismatch_seed": None,
        # Extras.
        "beats_nominal_bound": beats_bound,
        **({"note": f"the departed library beat the nominal lower bound ({makespan:.1f} s < {bound.seconds:.1f} s): "
                    "the bound is the nominal model's, not this library's"} if beats_bound else {}),
        "ratio_to_bound": makespan / bound.seconds if bound.seconds else None,
        "lower_bound_parts": bound.parts,
        "mounts_per_tape": library.mounts / tapes if tapes else None,
        "max_mounts_per_tape_day": max_mounts_per_day(library.mount_log),
        "cycles": outcome.cycles,
        # Per activity, when the workload names several: drive time while all had work.
        **({"activities": shares} if (shares := activity_shares(workload, outcome)) else {}),
        # Per group: how the users' longest waits spread (the storm target reads these).
        "group_waits": group_waits,
        **outcome.extra,
    }
