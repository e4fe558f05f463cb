"""Where a request stands: queue position, estimate, why not yet (the "my requests" page, the
API's request detail and submissions).

Which function gives what:
  - queue_context(user=, now=) then request_outlooks(requests, user=, ctx=): each request's
    Outlook; Outlook.eta is the request's range, (earliest, latest) seconds from now (wall
    clock), latest None when unknown; None when there is no basis (and a reason says why);
  - a submission's range is combined from its files' ranges by carousel/outlook/submissions.py
    (the pages, the API, the CLI: one computation);
  - project(now=): the projection both read, for callers that ask many times at one moment
    (the replay) and pass it on as queue_context(..., projection=).
"""
import heapq
import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from functools import lru_cache
from datetime import datetime, timedelta

from django.contrib.auth.models import Group
from django.db import connection
from django.db.models import Count, F, Max, Min, Q, Sum

from carousel.domain.paths import delivery_target
from carousel.domain.selectors.summary import jobs_limit
from carousel.domain.selectors.drives import last_unmounts
from carousel.loop import wear
from carousel.loop.health import projected_disk_use
from carousel.loop.mounts import MountPlanner, chain_ends, last_of_backlog, open_chain_jobs
from carousel.loop.wear import WearRules
from carousel.models import (
    IN_FLIGHT_STATES, READY, Control, HealthState, Job, JobState, RequestState, RestoreRequest, StagerHealth,
    TapeBacklog, Transition,
)
from carousel.outlook.shares import caps_and_weights, drive_time_share_of, throughput_shares
from carousel.tape import MB, MEDIA, mount_lead_tail_s, mount_profile
from policies.order import position_order, read_order
from policies.selection import held_drive_time, open_tapes, params_from, share_policy
from policies.sharing import GroupLimit, UserDemand
from policies.sorting import TapeInfo, worth_mounting

S = RequestState

#
# Two models, both approximate by design and cheap (a page costs a handful of bounded index
# scans, whatever the queue's length):
#
# With a mount plan (the stager reports its drives, or Control.drives is set): the plan's own
# model, on the library's clock. project() lays out, in library seconds from now,
#   - the open jobs as the library runs them (_project_jobs): the mounts on the drives now,
#     with what their unfinished files take left; the other sent jobs in the library's queue,
#     oldest first, each taken by the drive that frees first; a pending job sent once the one
#     it follows is done, joining its tape's mount when that tape is still in a drive. (The
#     plan's chains say which job waits for which; which drive reads it is the library's.)
#   - then the located queue, from the trigger-kept counters (TapeBacklog: files and bytes per
#     user and tape), as the turn policy hands it out: each user's tapes in the TAPEID order
#     (a tape whose mount is planned, not sent yet, then most of their files first), turns
#     to the user whose drive time held (their planned and sent work, then the turns given)
#     with the run added is the smallest for their weight (the sharing policy's
#     drive_weights), each tape's mount (spread_mount_s: the plan's
#     model over as many files spread along the tape; their places are not read) to the drive
#     of its technology that frees first.
#     A tape several users want is one mount, taken at the first of their turns.
# A file's time inside its mount is its place in read order (its rank in the job, or its rank
# by position among the tape's queued files) between the mount's lead and tail. A planned
# file's range reaches earlier when its mount is one the loop may still move: while more work
# waits, the last long mount on each chain is laid out again for the final round once the
# queue runs dry, and may then start when the first drive frees (_movable). A planned file's
# range reaches later while requests still arrive for its tape (its job takes them) or the
# ones before it on its drive (their mounts take them), a sent file's for the ones before it
# (its own files were sent as they were): the latest end allows for the new files the
# arrivals are expected to bring, at most as many again (_growth, _new_files);
# a queued file's too, by as much as its drive's planned and sent mounts may grow. Times are
# divided by the library's speed-up (a simulated library running N times faster than life:
# its status() gives `speedup`) and widened by margins measured on the replays
# (docs/benchmarks.md: estimate_coverage_*), plus a cycle: the loop sees a file done at its
# next cycle.
#
# Without a plan (a stager that keeps its own queue: tape-rest, hpss) the observed rate.
# Each cycle hands the slots freed at the stager to users by the sharing policy,
# and each user's slots to that user's requests by the sorting policy. A ready request leaves
# once the requests of its own user that the sorting policy puts first have left; meanwhile
# the other users take their shares too. So:
#
#   own_ahead  the user's ready requests ahead of it under the sorting policy (below);
#   share      the user's part of what the sharing policy hands out when it has work to spare:
#              the policy's own allocate(), run on the backlog counters, this user's demand
#              unbounded (a user alone gets 1; its cap bounds what it takes, not its part);
#   ahead      ~ own_ahead / share: the requests of all users expected to leave before it
#              (shown with either model);
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


# The projection: the plan's model -----------------------------------------------------------

# The most (user, tape) counters a projection reads: a queue longer than this in tapes is
# projected in part, the rest shown with no upper bound.
PROJECTION_PAIRS = 20_000
# Margins of a range around the model's time t (library seconds from now): (low, high) factors
# and the seconds taken from the low side and added to the high one, by the step a request is
# at. Measured on the nominal replays (docs/benchmarks.md): what the model does not know is the
# queue's future (arrivals that take turns, the final round cut across drives, a short mount
# jumping ahead, a retry).
# queued: the shared workloads whose files are first seen queued, groups and storm, finish at
# 0.81 and 0.96 of the model's time (10th percentile) and at 1.13 and 1.11 (90th); (0.8, 1.2)
# holds the middle 80% of each with room at the top, and the width goal (0.5 of the median
# wait) allows no more: 1.25 puts groups' width ratio at 0.505. (Before storm's cut tapes kept
# their turn, its files finished at 0.65 to 2.3 of the model's time and no margin held them.)
MARGINS = {
    "queued": (0.8, 1.2, 300.0),
    "planned": (0.85, 1.15, 150.0),
    "sent": (0.85, 1.15, 120.0),
}
FALLBACK_MEDIA = "LTO-8"


def library_speedup(health):
    """Library seconds per wall second: a simulated library says how much faster than life it
    runs (status()'s `speedup`); a real one runs at 1."""
    try:
        speedup = float((health.status or {}).get("speedup") or 1.0)
    except (TypeError, ValueError):
        return 1.0
    return speedup if speedup > 0 else 1.0


@dataclass(frozen=True)
class Mount:
    """One mount of the projection, or a job's part of one: its tape and, in library seconds
    from now, when it starts and ends (a sent one may have started before now: start < 0)."""

    tape: str
    start: float
    end: float
    media: str
    chain: str = ""
    lead: float = 0.0  # before its first file is read: the robot, the load, the first locate
    tail: float = 0.0  # after its last: the rewind, the unload, the robot
    # a queued tape's mount: how much later (library seconds) it may start, its drive's planned
    # and sent mounts grown by the files still arriving for them (Projection.grown)
    later: float = 0.0
    # a queued tape's mount held back by a wear rule (carousel/loop/wear.py) while other work
    # can use the drives: the rule's name; its start is then no earlier than the hold's end
    held: str = ""


@dataclass(frozen=True)
class Projection:
    """The plan's model laid out from now (see the comment at the top)."""

    now: datetime
    speedup: float
    exchange_s: float
    jobs: dict  # job id -> Mount of its part of the mount (its own start and end)
    chains: dict  # chain -> [job id], in the order the drive reads them
    runs: dict  # (user id, tape id) -> Mount
    tape_files: dict  # tape id -> located queued files on it, all users
    turns: dict  # (user id, tape id) -> (the user's own runs before it, all runs before it)
    end_s: float  # when the projected work is done
    capped: bool  # the queue had more (user, tape) pairs than PROJECTION_PAIRS
    # job id -> how much earlier (library seconds) it may start: a chain's last long mount,
    # while more work waits, may yet be laid out again for the final round (_movable)
    movable: dict = field(default_factory=dict)
    # job id -> Mount of its part of the mount had the tapes' requests gone on arriving
    # (_growth), for the jobs that makes later: the latest ends of their files' ranges
    grown: dict = field(default_factory=dict)

    def wall(self, seconds):
        return seconds / self.speedup

    def latest(self, job_id):
        """The job's Mount as the latest ends read it: grown, when arrivals may still grow the
        mounts up to and including its own."""
        return self.grown.get(job_id) or self.jobs[job_id]


def _media(name):
    return name if name in MEDIA else FALLBACK_MEDIA


def project(*, now, control=None, health=None):
    """The projection at `now`; None without a mount plan (no drive count known)."""
    control = control or Control.get()
    health = health or StagerHealth.get()
    planner = MountPlanner.from_status(health.status or {}, control)
    if planner is None:
        return None
    speedup = library_speedup(health)
    rows, requests = _open_jobs()
    jobs, chains, drive_free, drive_of = _project_jobs(planner, health.status or {}, rows, requests)
    movable = _movable(jobs, drive_free, drive_of)
    growth = _growth(now, rows, requests, jobs, speedup)
    grown, grown_free = _project_jobs(planner, health.status or {}, rows, requests, growth=growth)[0:3:2] \
        if growth else ({}, drive_free)
    # Only the jobs it makes later by a minute or more (the pages show minutes): the others'
    # ranges and reasons stay as they are; the same for the queue after each drive's.
    shown = GROWN_SHOWN_S * speedup
    grown = {job: m for job, m in grown.items() if job in jobs and m.end - jobs[job].end >= shown}
    later = {name: grown_free[name] - at for name, at in drive_free.items() if grown_free.get(name, at) - at >= shown}
    free = {}
    for name, at in drive_free.items():
        free.setdefault(name.rsplit("/", 1)[0], []).append((max(0.0, at), name))
    for heap in free.values():
        heapq.heapify(heap)
    rows = list(TapeBacklog.objects.filter(files__gt=0, tape__quarantined_at__isnull=True)
                .order_by("-files", "user_id", "tape_id")
                .values_list("user_id", "tape_id", "files", "bytes", "tape__label", "tape__media")[:PROJECTION_PAIRS + 1])
    capped = len(rows) > PROJECTION_PAIRS
    rows = rows[:PROJECTION_PAIRS]
    tape_files, tape_bytes, label, media_of, queues = {}, {}, {}, {}, {}
    for user, tape, files, nbytes, name, media in rows:
        tape_files[tape] = tape_files.get(tape, 0) + files
        tape_bytes[tape] = tape_bytes.get(tape, 0) + (nbytes or 0)
        label[tape], media_of[tape] = name, media or ""
        queues.setdefault(user, []).append(tape)  # most of the user's files first (TAPEID)
    # A tape whose mount is planned and not sent yet first (TAPEID: the rest of a tape cut by a
    # cap joins that mount), as the selection step reads them.
    opened = set(open_tapes()) & set(tape_files)
    if opened:
        queues = {user: sorted(tapes, key=lambda t: t not in opened) for user, tapes in queues.items()}
    users, groups = caps_and_weights(control, list(queues))
    demands = [UserDemand(user=u, group=users[u][0], pending=len(t), room=users[u][1]) for u, t in queues.items()]
    limits = {g: GroupLimit(weight=w, room=cap) for g, (w, cap) in groups.items()}
    weights = share_policy(control.share_policy).drive_weights(demands, limits) if demands else {}
    held = held_drive_time(list(queues))  # as the turn policy counts it
    # The drives' groups as the mount planner names them: a technology with drives of its own,
    # else the drives of any ("" when the stager shows none); None: no drive, or no model for
    # the technology (such a tape is sent at once, never held).
    group_of = {t: (media_of[t] if media_of[t] in free else "" if "" in free else None) if media_of[t] in MEDIA
                else None for t in tape_files}
    holds = _wear_holds(now, control, planner, tape_files, tape_bytes, group_of, speedup)
    if holds:
        # As the planner does (mounts.lay_out): the drives idle now that the other tapes leave
        # take the held ones, in turn, at once; only the rest are held.
        idle = Counter(group for group, heap in free.items() for at, _ in heap if at <= 0)
        idle.subtract(Counter(group_of[t] for t in tape_files if t not in holds and group_of[t] is not None))
        for tape in [t for t in tape_files if t in holds]:  # most files first, as the turns mostly go
            if idle[group_of[tape]] > 0:
                idle[group_of[tape]] -= 1
                del holds[tape]
    seconds = {t: spread_mount_s(_media(media_of[t]), tape_files[t], tape_bytes[t],
                                 read_rate_mb_s=planner.read_rate_mb_s, exchange_s=planner.exchange_s,
                                 by_position=not planner.shown)
               for t in tape_files}

    def tag(user):
        weight = weights.get(user, 0.0)
        run = held.get(user, 0.0) + seconds[queues[user][0]]
        return ((0, run / weight) if weight > 0 else (1, run)), user

    for user in queues:
        queues[user] = deque(queues[user])
    heap = [tag(u) for u in queues]
    heapq.heapify(heap)
    runs, turns, mounted, given, own = {}, {}, {}, 0, {}
    end_s = max([0.0, *(m.end for m in jobs.values())])
    while heap:
        _, user = heapq.heappop(heap)
        tape = queues[user].popleft()
        if tape not in mounted:
            media = media_of[tape]
            drives = free.get(media) or free.get("")
            if drives is None:  # no drive of its technology: sent at once, the stager's queue
                start, name = 0.0, None
            else:
                start, name = heapq.heappop(drives)
                heapq.heappush(drives, (start + seconds[tape], name))
            rule, until = holds.get(tape, ("", 0.0))
            # Held, it starts no earlier than the hold's end; the drive meanwhile reads other work
            # (the rule holds a run only while there is some), so it is not kept for it.
            rule = rule if until > start else ""
            start = max(start, until)
            lead, tail = mount_lead_tail_s(_media(media), exchange_s=planner.exchange_s)
            mounted[tape] = Mount(label[tape], start, start + seconds[tape], media, lead=lead, tail=tail,
                                  later=later.get(name, 0.0), held=rule)
            held[user] = held.get(user, 0.0) + seconds[tape]
            end_s = max(end_s, start + seconds[tape])
        runs[(user, tape)] = mounted[tape]
        turns[(user, tape)] = (own.get(user, 0), given)
        own[user] = own.get(user, 0) + 1
        given += 1
        if queues[user]:
            heapq.heappush(heap, tag(user))
    return Projection(now=now, speedup=speedup, exchange_s=planner.exchange_s, jobs=jobs, chains=chains, runs=runs,
                      tape_files=tape_files, turns=turns, end_s=end_s, capped=capped, movable=movable,
                      grown=grown)


def _wear_holds(now, control, planner, tape_files, tape_bytes, group_of, speedup):
    """{tape id: (rule, library seconds from now)} for the queued tapes whose mount a wear rule
    holds back (carousel/loop/wear.py, as the mount planner applies it): min_mount while a run
    big enough for it waits for the drives of its technology (queued, or on their chains),
    remount_delay while other work does; until the moment wear.mountable_at gives, on the
    library's clock. One grouped query over the queued requests of the tapes a rule may hold
    (small ones, or unmounted lately). `group_of`: tape id -> its drives' group (None: never held)."""
    rules = WearRules.of(control)
    mountable = [t for t in tape_files if group_of[t] is not None]
    small = set()
    if rules.min_mount_files > 0 or rules.min_mount_bytes > 0:
        small = {t for t in mountable if not rules.big_enough(tape_files[t], tape_bytes[t])}
        if small:
            big = {group_of[t] for t in mountable if t not in small} | planner.big_on_chains(rules)
            small = {t for t in small if group_of[t] in big}
    unmounted = {}
    if rules.remount_delay_s > 0 and len(tape_files) > 1:  # only while other work waits
        unmounted = last_unmounts(mountable, since=now - timedelta(seconds=rules.remount_delay_s))
    tapes = small | set(unmounted)
    if not tapes or rules.mount_max_wait_s <= 0:
        return {}
    holds = {}
    for tape, oldest, top in (RestoreRequest.objects.filter(tape_id__in=list(tapes), state=RequestState.QUEUED)
                              .order_by().values("tape_id").annotate(oldest=Min("created_at"), top=Max("priority"))
                              .values_list("tape_id", "oldest", "top")):
        files, nbytes = (tape_files[tape], tape_bytes[tape]) if tape in small else (0, 0)
        if tape not in small:  # only the remount delay can hold it: as if big enough for min_mount
            files, nbytes = max(rules.min_mount_files, 1), rules.min_mount_bytes
        at = wear.mountable_at(now=now, files=files, nbytes=nbytes, oldest_at=oldest, priority=top,
                               last_unmount_at=unmounted.get(tape), rules=rules)
        if at > now:
            rule = wear.hold(files=files, nbytes=nbytes, oldest_age_s=(now - oldest).total_seconds(),
                             priority=top, unmounted_s_ago=None if tape not in unmounted else
                             (now - unmounted[tape]).total_seconds(), rules=rules)
            holds[tape] = (rule, (at - now).total_seconds() * speedup)
    return holds


def _growth(now, rows, requests, jobs, speedup):
    """{tape id: the part its open jobs' files may still grow by before its mount ends} for
    the tapes whose requests are still arriving. A planned mount takes the files that arrive
    for its tape (claiming: they join the tape's job), a sent one reads them after its own
    (a job of their own), and every mount after it on its drive waits for them (overlap:
    about 900 of 3,000 requests known 10 s into a 30 s burst, the mounts twice as long as
    planned by the end). What is still to come is not known; the latest end assumes
      - the requests for the tape go on at their rate (its open jobs' requests, over the time
        from the first file's arrival to the last's) for as long again as they have gone on
        (of a process seen only this far, what is left is as likely to be longer as shorter:
        the Copernican, or Lindy, argument), less the silence since the last file's arrival,
        and no longer than until the mount ends;
      - a request for a file already asked for joins it and adds nothing to read; of the
        requests to come, as many ask for a new file as the requests so far predict by how
        often they asked for a file again (_new_files); while no file was asked for exactly
        twice, each with the chance once / asks (with every file asked for once: every one,
        the files' own rate, at most as many again, the rule before requests were counted).
        A campaign whose analysts ask for the same files (overlap: each file twice) is seen
        running out of new ones as its files are asked again.
    A file's arrival is its first request's: one submission (its files arrive at one moment),
    however many join it later, or arrivals that stopped for longer than they went on, add
    nothing. `rows` and `requests`: _open_jobs()."""
    # tape id -> [first arrival, last arrival, when its last job ends, files, requests, files asked once, twice]
    seen = {}
    for row in rows:
        job, tape = row[0], row[7]
        if tape is None or job not in requests or job not in jobs:
            continue
        files, first, last, asks, once, twice = requests[job]
        mine = seen.setdefault(tape, [first, last, 0.0, 0, 0, 0, 0])
        mine[0], mine[1], mine[2] = min(mine[0], first), max(mine[1], last), max(mine[2], jobs[job].end)
        mine[3], mine[4], mine[5], mine[6] = mine[3] + files, mine[4] + asks, mine[5] + once, mine[6] + twice
    growth = {}
    for tape, (first, last, end, files, asks, once, twice) in seen.items():
        went_on = (last - first).total_seconds()
        silence = (now - last).total_seconds()
        still = min(went_on - silence, end / speedup)
        if went_on > 0 and still > 0 and once > 0:
            if twice == 0:  # no file asked for exactly twice: the Good-Turing chance alone
                growth[tape] = still / went_on * (once / files)
            else:
                growth[tape] = _new_files(asks, once, twice, asks * still / went_on) / files
    return growth


def _new_files(asks, once, twice, more):
    """How many files not asked for yet `more` further requests are expected to bring, given
    `asks` requests so far, `once` files asked for once and `twice` asked for exactly twice
    (twice > 0): the estimator of new species in further sampling of Shen, Chao and Lin
    (2003, Ecology 84:798). The files not asked for yet number about once^2 / (2 twice)
    (Chao1, from how many were seen once against twice); the next request is for one of them
    with the chance once / asks (Good-Turing: the requests for what was seen once stand for
    what was not seen), a chance that shrinks as they are found. So a few more requests bring
    about once / asks new files each, and however many come, no more than Chao1 in all.
    No constant is fitted: both are the standard estimators of what a sample has not seen."""
    unseen = once * once / (2.0 * twice)
    return unseen * (1.0 - max(0.0, 1.0 - once / (asks * unseen)) ** more)


def _movable(jobs, drive_free, drive_of):
    """{job id: library seconds it may start earlier than projected} for the mounts the loop
    may still move. While more work waits to be chosen or located, the final round is not laid
    out yet: when the queue runs dry, the last long mount planned on each chain (the jobs
    mounts.chain_ends names, the set the loop takes back) is laid out again across the
    drives, and may then start as soon as the first drive frees of all but such mounts
    (storm: its production stops while its last tapes wait behind two mounts each, and the
    drives that free first take some of them half an hour before their chains would have).
    Each tape's jobs move together, and only among the drives of its technology (the
    layout is one per technology). Empty once the final round is laid out."""
    if not jobs or last_of_backlog():
        return {}
    rows = open_chain_jobs()
    taken = chain_ends(rows)
    ends = [(job, tape) for job, tape, *_ in rows if job in taken and job in jobs]
    if not ends:
        return {}
    moved = {job for job, _ in ends}
    frees = dict.fromkeys(drive_free, 0.0)  # each drive's end of the work that stays
    for job, drive in drive_of.items():
        if job not in moved:
            frees[drive] = max(frees[drive], jobs[job].end)
    earliest = {}  # technology ("": the drives of any) -> when its first drive is free
    for drive, at in frees.items():
        group = drive.rsplit("/", 1)[0]
        earliest[group] = min(earliest.get(group, math.inf), at)
    first = {}
    for job, tape in ends:
        first[tape] = min(first.get(tape, math.inf), jobs[job].start)
    shift = {}
    for job, tape in ends:
        media = jobs[job].media
        group = media if media in earliest else ("" if "" in earliest else None)
        if group is not None:
            shift[job] = max(0.0, first[tape] - max(0.0, earliest[group]))
    return shift


# A queued tape's mount from its counters (files and bytes; their places are not read): the
# plan's model (carousel.tape.mount_profile of policies.order.read_order) over as many files of
# the mean size at random places on the tape, one in each of as many equal stretches of it (a
# fixed seed: the same answer every time). The positioning (locates, the first one and the
# rewind) is computed once per technology, count and how full the files make the tape, and
# cached; counts above SPREAD_EXACT_UP_TO are rounded to SPREAD_STEPS, beyond SPREAD_MOST the
# positioning per file of SPREAD_MOST (denser files cost less each: an overestimate).
SPREAD_EXACT_UP_TO = 12
SPREAD_STEP = 1.25
SPREAD_MOST = 400
SPREAD_FILL_STEPS = 10
SPREAD_SAMPLED_FILES = 24  # placements are averaged until they hold this many files


def spread_mount_s(media, files, nbytes, *, read_rate_mb_s=None, exchange_s=0.0, by_position=False):
    """Drive time of one mount reading `files` files of `nbytes` bytes in all, their places on
    the tape unknown: the robot's exchanges, the load and unload, the reads and the positioning
    the plan's read order would take over files spread along the tape (`by_position`: position
    order, as a stager that hides its drives reads, MountPlanner.order)."""
    if files <= 0:
        return 0.0
    m = MEDIA[media]
    rate = read_rate_mb_s or m.read_rate_mb_s
    n = files if files <= SPREAD_EXACT_UP_TO else min(SPREAD_MOST, _spread_count(files))
    fill = min(SPREAD_FILL_STEPS, round(nbytes / m.capacity_bytes * SPREAD_FILL_STEPS))
    positioning = _positioning_s(media, n, fill, by_position) * files / n
    reads = nbytes / (rate * MB) + files * m.file_overhead_s
    return 2 * exchange_s + m.load_s + m.unload_s + reads + positioning


def _spread_count(files):
    """`files` rounded to the nearest of SPREAD_EXACT_UP_TO x SPREAD_STEP^k."""
    k = round(math.log(files / SPREAD_EXACT_UP_TO, SPREAD_STEP))
    return max(SPREAD_EXACT_UP_TO, round(SPREAD_EXACT_UP_TO * SPREAD_STEP ** k))


@lru_cache(maxsize=4096)
def _positioning_s(media, n, fill, by_position=False):
    """The seconds of a mount of `n` files spread along a `media` tape, filling `fill` tenths
    of it, that are neither reading nor the robot's, load or unload: locates and the rewind (the
    mean over a few placements when they are few: one file's place is anywhere)."""
    m = MEDIA[media]
    size = int(fill / SPREAD_FILL_STEPS * m.capacity_bytes / n)
    stretch = m.capacity_bytes / n
    samples = max(1, SPREAD_SAMPLED_FILES // n)
    rnd = random.Random(n)
    total = 0.0
    for _ in range(samples):
        places = [(i, int(i * stretch + rnd.random() * max(0.0, stretch - size)), size) for i in range(n)]
        order = position_order(places) if by_position else read_order(media, places)
        pre, _ = mount_profile(media, [(places[k][1], places[k][2]) for k in order])
        total += pre[-1]
    reads = n * (size / (m.read_rate_mb_s * MB) + m.file_overhead_s)
    return max(0.0, total / samples - m.load_s - m.unload_s - reads)


class _Open:
    """A mount of the job projection while it is laid out: its tape, drive, the jobs it reads
    (their cycle: a job planned in another cycle than the mount's first was planned as a mount
    of its own) and when its work ends."""

    def __init__(self, tape, media, drive, created, end):
        self.tape, self.media, self.drive, self.created, self.end = tape, media, drive, created, end


def _open_jobs():
    """The open jobs (pending and sent: bounded by the window, N x K) as _project_jobs reads
    them, and {job id: [its files not done, the first and the last arrival of one, the
    requests for them, the files asked for once, the files asked for twice]}. A file's arrival
    is its first request's: another user's request for a file the job already reads joins it
    (intake.queue_new) and adds nothing to read, only to the counts of asks. One query each,
    the second one row per file of the window."""
    rows = list(Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT))
                .order_by(F("sent_at").asc(nulls_last=True), "created_at", "rank")
                .values_list("id", "chain", "state", "after_id", "estimate_s", "files", "created_at", "tape_id",
                             "tape__label", "tape__media"))
    requests = {}
    if rows:
        files = (RestoreRequest.objects.filter(job_id__in=[r[0] for r in rows], state__in=IN_FLIGHT_STATES)
                 .order_by().values_list("job_id", "path_key").annotate(at=Min("created_at"), asks=Count("id")))
        for job, at, asks in files.values_list("job_id", "at", "asks"):
            mine = requests.get(job)
            if mine is None:
                requests[job] = [1, at, at, asks, int(asks == 1), int(asks == 2)]
            else:
                mine[0] += 1
                mine[1], mine[2] = min(mine[1], at), max(mine[2], at)
                mine[3] += asks
                mine[4] += asks == 1
                mine[5] += asks == 2
    return rows, requests


def _project_jobs(planner, status, rows, requests, growth=None):
    """({job id: Mount of its part of its mount}, {chain: [job id] in the projection's order},
    {drive: when it frees}, {job id: the drive that reads it}) for the open jobs (`rows` and
    `requests`: _open_jobs()), in library
    seconds from now, laid out as the library runs them (carousel/sim/library.py): a job for a
    tape in a drive joins that drive's work, after what it has; any other waits in the
    library's queue, and a drive that frees takes the oldest there (with every queued job of
    that tape). A sent job is on a drive when the stager's status names its tape in one (a
    status without tapes: the first mounts sent, as many as there are drives), else in the
    queue since it was sent; a pending one is sent once the job it follows is done. A mount on
    a drive has left what its unfinished files take (each job's estimate times the part of its
    files not done). The chains are the plan's: they only order what "ahead of it on that
    drive" lists; a drive is whichever frees first, as in a library. `growth` ({tape id:
    part}, _growth): each job of such a tape reads that part more, besides its lead and tail."""
    growth = growth or {}
    exchange_s = planner.exchange_s
    left = {job: counts[0] for job, counts in requests.items()}
    pools = {media: [f"{media}/{i}" for i in range(n)] for media, n in planner.drives.items()}
    free = {name: 0.0 for names in pools.values() for name in names}
    taken = set()  # drives holding a mount now
    mounts = {}  # tape id -> its _Open mount, the last projected
    jobs, drive_of = {}, {}

    def pool(media):
        return pools.get(media) if media in pools else pools.get("", [])

    def tape_of(row):  # a job with no tape is a mount of its own
        return row[7] if row[7] is not None else row[0]

    def append(row, mount, at):
        """Job `row` read in `mount` from `at` (library seconds); returns when it is done."""
        job, chain, state, _, estimate, files, created, tape, label, media = row
        lead, tail = mount_lead_tail_s(_media(media), exchange_s=exchange_s)
        first = mount.end is None
        if first:
            mount.created = created
        elif created != mount.created:
            # Planned as a mount of its own: the robot, the load, the unload and the rewind
            # are not repeated; its first locate is.
            estimate = max(0.0, estimate - (lead + tail - MEDIA[_media(media)].avg_access_s))
            lead, tail = MEDIA[_media(media)].avg_access_s, 0.0
        else:  # a part of the same piece of work (cut at N files): read straight on
            lead = tail = 0.0
        done = estimate * (1.0 - left.get(job, 0) / files) if state == JobState.SENT and files else 0.0
        start = at - min(done, estimate)
        # What arrives grows the part not read yet (the files the rate was taken over). A
        # pending job takes the new files into its one pass along the tape (claiming merges
        # them), so its own files wait for them. A sent job's files went to the stager as they
        # were: what arrives for its tape is read after them (a job of its own that joins the
        # mount, or the tape's next mount), so the drive takes longer, not the job.
        unread = min(1.0, left.get(job, 0) / files) if files else 1.0
        extra = max(0.0, estimate - lead - tail) * unread * growth.get(tape, 0.0)
        end = start + estimate + (0.0 if state == JobState.SENT else extra)
        jobs[job] = Mount(label or "", start, end, media or "", chain, lead=min(lead, estimate),
                          tail=min(tail, max(0.0, estimate - lead)))
        mount.end = max(start + estimate + extra, at)
        if mount.drive is not None:
            free[mount.drive] = mount.end
            drive_of[job] = mount.drive
        return mount.end

    # The mounts on the drives now; the other sent jobs wait in the library's queue, oldest first.
    named = [d.get("tape") for d in status.get("drives") or [] if "tape" in d]
    on_drive = set(filter(None, named)) if named else None
    events, seq = [], 0  # (when, seq, row): a job sent to the library
    for row in rows:
        if row[2] != JobState.SENT:
            continue
        mount = mounts.get(tape_of(row))
        if mount is None:
            names = [n for n in pool(row[9] or "") if n not in taken]
            if names and (row[8] in on_drive if on_drive is not None else True):
                drive = row[1] if row[1] in names else names[0]
                mount = mounts[tape_of(row)] = _Open(row[8] or "", row[9] or "", drive, None, None)
                taken.add(drive)
        if mount is not None:
            append(row, mount, mount.end if mount.end is not None else 0.0)
        else:
            events.append((0.0, seq, row))
            seq += 1
    followers, open_ids = {}, {r[0] for r in rows}
    for row in rows:
        if row[2] == JobState.PENDING:
            followers.setdefault(row[3] if row[3] in open_ids else None, []).append(row)
    for row in followers.pop(None, []):
        events.append((0.0, seq, row))
        seq += 1

    def release(job_id, at):
        nonlocal seq
        for row in followers.pop(job_id, []):
            heapq.heappush(events, (at, seq, row))
            seq += 1

    for job_id in list(jobs):
        release(job_id, jobs[job_id].end)
    heapq.heapify(events)
    waiting = []  # the library's queue up to the moment the loop has come to: [(sent at, row)]
    while events or waiting:
        # The next thing that happens: a job sent, or a drive that frees taking the oldest
        # queued job of its technology.
        sent_at = events[0][0] if events else math.inf
        best = None
        for i, (at, row) in enumerate(waiting):
            names = pool(row[9] or "")
            drive = min(names, key=lambda n: (free[n], n)) if names else None
            start = max(at, free[drive]) if drive is not None else at
            if best is None or start < best[0]:
                best = (start, i, drive)
            if drive is None or free[drive] <= at:
                break  # none older waits for this one's drives
        if best is not None and best[0] <= sent_at:
            start, i, drive = best
            _, row = waiting.pop(i)
            mount = mounts[tape_of(row)] = _Open(row[8] or "", row[9] or "", drive, None, None)
            release(row[0], append(row, mount, start))
            for other in [w for w in waiting if tape_of(w[1]) == tape_of(row)]:
                waiting.remove(other)
                release(other[1][0], append(other[1], mount, mount.end))
            continue
        at, _, row = heapq.heappop(events)
        mount = mounts.get(tape_of(row))
        if mount is not None and mount.end is not None and mount.end > at:
            release(row[0], append(row, mount, mount.end))  # its tape is in a drive: it joins
        else:
            waiting.append((at, row))
    chains = {}
    for job_id, mount in sorted(jobs.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        if mount.chain:
            chains.setdefault(mount.chain, []).append(job_id)
    return jobs, chains, free, drive_of


def _file_time(mount, rank, files):
    """Library seconds from now until the file at `rank` of `files` in `mount`'s read order is
    read: its place between the mount's lead and tail."""
    length = mount.end - mount.start
    lead = min(mount.lead, length)
    body = max(0.0, length - lead - mount.tail)
    return mount.start + lead + body * (rank + 1) / max(1, files)


def _range(projection, t, step, cycle_s):
    """(earliest, latest) wall seconds from now around the model's time `t` (library seconds)."""
    low, high, slack = MARGINS[step]
    t = max(0.0, t)
    # The slack both ways: a mount's first files are read within minutes, where the robot,
    # the load and the first locate count more than the factors.
    return projection.wall(max(0.0, low * t - slack)), projection.wall(high * t + slack) + cycle_s


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
    share: float  # the user's part of what the sharing policy hands out (for queue positions, not shown)
    in_flight: int  # files at the stager, all users
    slots: int  # files the stager may have in flight now: N x the jobs limit
    disk_use: float | None  # projected use of the stager's disk buffer
    user_in_flight: int
    user_cap: int
    group_name: str = ""
    group_in_flight: int = 0
    group_cap: int | None = None
    group_slots: float = 0.0  # the slots the user's group gets under the sharing policy
    projection: Projection | None = None  # the plan's model (None: no plan, the observed rate)
    drive_share: float = 0.0  # the user's share of drive time over share_period (outlook.shares)
    share_period: str = ""


def queue_context(*, user, now, projection=None):
    """What every request of `user`'s page shares; `projection`: project(now=now) when the
    caller has it already (it is the same for every user at one moment)."""

    control, health = Control.get(), StagerHealth.get()
    slots = control.files_per_job * jobs_limit(control, health.jobs_limit)
    in_flight = RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES)
    agg = in_flight.aggregate(n=Count("id"), mine=Count("id", filter=Q(user=user)), b=Sum("size"))
    shares = throughput_shares(control=control, eager=user.id)
    drive = drive_time_share_of(user.id, now=now)
    users, groups = caps_and_weights(control, [user.id])
    group_id, user_cap = users[user.id]
    ctx = QueueContext(now=now, control=control, health=health, rate=restore_rate(now=now),
                       share=shares.users.get(user.id, 0.0), in_flight=agg["n"], slots=slots,
                       disk_use=projected_disk_use(free=health.disk_free_bytes, total=health.disk_total_bytes,
                                                   incoming=agg["b"] or 0),
                       user_in_flight=agg["mine"], user_cap=user_cap, drive_share=drive.of_user(user.id),
                       share_period=drive.period,
                       projection=projection if projection is not None else project(now=now, control=control,
                                                                                    health=health))
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


def _held_until(ctx):
    """Why nothing of the user's not yet sent can go until an operator acts (paused; a cap of 0
    for the user or the group), or "". Until then the range has no end: the estimate slid
    forward a cycle at a time, each read saying "about" a minute from now (found by a probe)."""
    if ctx.control.paused:
        return "no estimate of when: nothing is sent until the operators lift the pause"
    if ctx.user_cap == 0 or ctx.group_cap == 0:
        whose = "your" if ctx.user_cap == 0 else f"your group {ctx.group_name}'s"
        return f"no estimate of when: nothing of yours is sent while {whose} cap is 0 (an operator sets it)"
    return ""


def _held(eta):
    """A range held by _held_until: its start stands, it has no end."""
    return (eta[0], None) if eta else None


def _plus(n, capped):
    return f"{n:,}{'+' if capped else ''}"


def request_outlooks(requests, *, user, ctx):
    """{request id: Outlook} for a page of one user's requests (their tapes selected), given
    the user's queue_context(). Outlook.eta is each request's range (see the module's doc)."""
    now = ctx.now
    ready = [r for r in requests if r.state == S.QUEUED and r.tape_id is not None]
    own = _own_ahead(user, ready, ctx)
    waiting = _tapes_waiting(ready, ctx)
    common = _common_reasons(ctx)
    proj = ctx.projection
    if proj is None:
        no_rate = () if ctx.rate else ("no request finished in the last hour, so there is no estimate yet",)
        at_stager = eta_range(ahead=0, in_flight=ctx.in_flight, rate=ctx.rate, cycle_s=ctx.control.cycle_s)
    else:
        no_rate, at_stager = (), None
    ranks = _ranks_on_tape([r for r in ready if proj is not None and (user.id, r.tape_id) in proj.runs])
    jobs = {j: rest for j, *rest in Job.objects.filter(
        id__in={r.job_id for r in requests if r.state in IN_FLIGHT_STATES and r.job_id})
        .values_list("id", "state", "chain", "files")}
    cycle_s = ctx.control.cycle_s
    held = _held_until(ctx)
    # A planned mount is sent when the one before it ends, whatever the caps (they apply when
    # work is chosen): only the pause holds it.
    held_planned = held if ctx.control.paused else ""  # _held_until names the pause first
    out = {}
    for r in requests:
        job_state, chain, job_files = jobs.get(r.job_id, (None, "", 0))
        if r.state == S.QUEUED and r.tape_id is None:
            out[r.id] = Outlook(reasons=(
                "not located yet, so there is no estimate: the broker asks the stager which tape holds it "
                f"(at its next cycle, every {cycle_s:g} s while the stager is healthy)",))
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
            if proj is None:
                eta = eta_range(ahead=ahead or 0, in_flight=ctx.in_flight, rate=ctx.rate, cycle_s=cycle_s)
                if eta and (capped or ahead is None):
                    eta = (eta[0], None)
            elif (user.id, r.tape_id) in proj.runs and not r.tape.quarantined_at:
                mount = proj.runs[(user.id, r.tape_id)]
                mine, before = proj.turns[(user.id, r.tape_id)]
                t = _file_time(mount, ranks.get(r.id, 0), proj.tape_files.get(r.tape_id, 1))
                eta = _range(proj, t, "queued", cycle_s)
                reasons.append(f"its tape {r.tape.label} is your turn {mine + 1} and turn {before + 1} of all "
                               f"under the sharing policy {ctx.control.share_policy}: its mount about "
                               f"{_clock(proj, mount.start)}-{_clock(proj, mount.end)}")
                if mount.later:
                    eta = (eta[0], _range(proj, t + mount.later, "queued", cycle_s)[1])
                    reasons.append(ARRIVING)
                if mount.held:
                    reasons.append(WEAR_HELD[mount.held].format(until=_clock(proj, mount.start)))
            else:
                eta = (_range(proj, proj.end_s, "queued", cycle_s)[0], None)
            if held:
                eta, reasons = _held(eta), [*reasons, held]
            out[r.id] = Outlook(own_ahead=own_ahead, ahead=ahead, capped=capped, eta=eta,
                                reasons=tuple(reasons) + no_rate)
        elif r.state == S.SUBMITTED and job_state == JobState.PENDING:
            eta, ahead_of_it, notes = None, "", ()
            if proj is not None and r.job_id in proj.jobs:
                mount = proj.jobs[r.job_id]
                t = _file_time(mount, r.job_rank, job_files)
                eta = _latest(proj, r, job_files, _range(proj, t, "planned", cycle_s), "planned", cycle_s)
                if proj.movable.get(r.job_id):
                    eta = (_range(proj, t - proj.movable[r.job_id], "planned", cycle_s)[0], eta[1])
                    notes = ("it may go sooner, on the drive that frees first, when the last of the queue "
                              "is planned (the final round is laid out again then)",)
                if r.job_id in proj.grown:
                    notes += (ARRIVING,)
                ahead_of_it = _mounts_ahead(proj, chain, r.job_id)
            elif at_stager:
                eta = (0.0, None)
            if held_planned:
                eta, notes = _held(eta), (*notes, held_planned)
            out[r.id] = Outlook(own_ahead=0, ahead=0, eta=eta, reasons=(
                f"planned on drive {chain or '?'}: sent to the stager once the mount before it there "
                f"is done{ahead_of_it}", *notes))
        elif r.state in IN_FLIGHT_STATES:
            doing = "being read from tape" if r.state == S.STAGING else "at the stager, waiting for tape"
            if proj is not None and r.job_id in proj.jobs:
                mount = proj.jobs[r.job_id]
                eta = _latest(proj, r, job_files, _range(proj, _file_time(mount, r.job_rank, job_files), "sent", cycle_s),
                              "sent", cycle_s)
            else:
                eta = at_stager and (0.0, at_stager[1])
            arriving = (ARRIVING,) if proj is not None and r.job_id in proj.grown else ()
            out[r.id] = Outlook(own_ahead=0, ahead=0, eta=eta,
                                reasons=(f"{doing} {r.tape.label if r.tape_id else ''}".strip(), *arriving))
        elif r.state == S.RETRY:
            wait = max(0.0, (r.retry_at - now).total_seconds())
            # Back in the queue at its retry time, behind what is projected by then at worst.
            high = wait + _range(proj, proj.end_s, "queued", cycle_s)[1] if proj is not None else None
            out[r.id] = Outlook(eta=(wait, high), reasons=(
                f"failed for now ({r.last_error or 'a transient error'}); "
                f"tried again from {r.retry_at:%Y-%m-%d %H:%M} UTC",))
        elif r.state == S.DELIVERING:
            target = delivery_target(r.destination, r.destination_layout, r.path)
            out[r.id] = Outlook(reasons=(f"restored, being delivered to {target}",))
        else:
            out[r.id] = Outlook()
    return out


WEAR_HELD = {
    wear.MIN_MOUNT: "its tape's run is smaller than a mount is worth (min_mount) while a larger run can use the "
                    "drives: its mount waits until about {until}, when its oldest request has waited "
                    "mount_max_wait_s, or until a drive has nothing else to do",
    wear.REMOUNT_DELAY: "its tape was mounted lately (remount_delay): its mount waits until about {until}, or "
                        "until a drive has nothing else to do",
}
ARRIVING = ("requests are still arriving for its tape or the ones read before it: the latest time allows for "
            "those mounts to take more files while they do")
# A grown mount shows when it moves a latest time by this much (wall seconds: the pages show minutes).
GROWN_SHOWN_S = 60.0


def _latest(proj, r, job_files, eta, step, cycle_s):
    """`eta` with its latest end from the grown layout (Projection.grown) when there is one."""
    if r.job_id not in proj.grown:
        return eta
    t = _file_time(proj.latest(r.job_id), r.job_rank, job_files)
    return eta[0], max(eta[1], _range(proj, t, step, cycle_s)[1])


# Ranks are counted in slices: one aggregate column per request.
RANK_SLICE = 200
MOUNTS_LISTED = 5


def _ranks_on_tape(ready):
    """{request id: the located queued requests of its tape, all users', at a smaller
    position}: its place in the mount's read order (position order stands for it)."""
    ranks = {}
    for i in range(0, len(ready), RANK_SLICE):
        part = ready[i:i + RANK_SLICE]
        agg = RestoreRequest.objects.filter(READY, tape_id__in={r.tape_id for r in part}).aggregate(**{
            f"r{r.id}": Count("id", filter=Q(tape_id=r.tape_id, position__lt=r.position or 0)) for r in part})
        ranks.update((r.id, agg[f"r{r.id}"] or 0) for r in part)
    return ranks


def _clock(proj, seconds):
    """The wall-clock time (UTC, hours and minutes) `seconds` of the library from the projection's now."""
    return f"{proj.now + timedelta(seconds=proj.wall(max(0.0, seconds))):%H:%M}"


def _mounts_ahead(proj, chain, job_id):
    """"; ahead of it on that drive: tape X (...)" for the mounts before `job_id`'s on `chain`."""
    mine = proj.jobs[job_id]
    mounts = []  # [tape, start, end]: a mount's jobs (a tape's, one after another) as one
    for j in proj.chains.get(chain, []):
        m = proj.jobs[j]
        if m.end > mine.start + 1e-6 or j == job_id:
            continue
        if mounts and mounts[-1][0] == m.tape and abs(mounts[-1][2] - m.start) < 1e-6:
            mounts[-1][2] = m.end
        else:
            mounts.append([m.tape, m.start, m.end])
    if mounts and mounts[-1][0] == mine.tape and abs(mounts[-1][2] - mine.start) < 1e-6:
        mounts.pop()  # the same mount's earlier jobs
    if not mounts:
        return "; nothing else is ahead of it on that drive"
    listed = [f"tape {tape or '?'} ({'on the drive now, ' if start <= 0 else ''}about "
              f"{_clock(proj, start)}-{_clock(proj, end)})" for tape, start, end in mounts[:MOUNTS_LISTED]]
    more = f" and {len(mounts) - MOUNTS_LISTED} more" if len(mounts) > MOUNTS_LISTED else ""
    return f"; ahead of it on that drive (UTC): {', '.join(listed)}{more}"
