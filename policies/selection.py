"""The selection step of the server loop: whose tape is mounted next (the sharing policy's
weights, in drive time) and which of each user's requests go (the sorting policy).

Nothing here reads a whole queue. Who has work and how much comes from the trigger-kept
counters (UserBacklog, TapeBacklog); the candidates come from per-user index scans bounded
by each user's allotment. A cycle therefore costs about (users with work + slots) index
probes, whatever the length of the queue."""
import heapq
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import timezone as dt_timezone
from itertools import groupby

from django.db.models import Count, Sum

from carousel.infra import db
from carousel.models import (
    IN_FLIGHT_STATES, Account, GroupShare, Job, RestoreRequest, Tape, TapeBacklog, UserBacklog,
)
from carousel.infra.plugins import resolve
from carousel.tape import MEDIA, mount_profile

from .sharing import GroupLimit, UserDemand
from .sorting import Candidate, Params, TapeInfo, in_read_order

_COLUMNS = "id, user_id, tape_id, position, size, priority, created_at, group_id"
# Requests on a quarantined tape wait: no retries against a bad cartridge (few tapes are).
_NOT_QUARANTINED = "tape_id NOT IN (SELECT id FROM carousel_tape WHERE quarantined_at IS NOT NULL)"
_READY = f"state = 'queued' AND tape_id IS NOT NULL AND {_NOT_QUARANTINED}"
POOL_SQL = {
    # The user's oldest ready requests: FIFO, the max-wait rule, SLIDER's anchors.
    "oldest": f"SELECT {_COLUMNS} FROM carousel_restorerequest WHERE user_id = {{a}} AND {_READY} "
              "ORDER BY created_at, id LIMIT {n}",
    "newest": f"SELECT {_COLUMNS} FROM carousel_restorerequest WHERE user_id = {{a}} AND {_READY} "
              "ORDER BY created_at DESC, id DESC LIMIT {n}",
    "priority": f"SELECT {_COLUMNS} FROM carousel_restorerequest WHERE user_id = {{a}} AND {_READY} "
                "AND priority > 0 ORDER BY priority DESC, created_at LIMIT {n}",
}
TOP_TAPES_SQL = ("SELECT user_id, tape_id, files FROM carousel_tapebacklog WHERE user_id = {a} AND files > 0 "
                 f"AND {_NOT_QUARANTINED} ORDER BY files DESC, tape_id LIMIT {{n}}")
OLDEST_ON_TAPE_SQL = (f"SELECT tape_id, created_at FROM carousel_restorerequest WHERE tape_id = {{a}} AND {_READY} "
                      "ORDER BY created_at LIMIT {n}")
USER_ON_TAPE_SQL = ("SELECT user_id, tape_id, files FROM carousel_tapebacklog WHERE user_id = {a} AND tape_id = {b} "
                    "AND files > 0 LIMIT {n}")
ON_TAPE_SQL = (f"SELECT {_COLUMNS} FROM carousel_restorerequest WHERE user_id = {{a}} AND tape_id = {{b}} "
               f"AND {_READY} ORDER BY position LIMIT {{n}}")


def sort_policy(name):
    return resolve("CAROUSEL_SORT_POLICIES", name)()


def share_policy(name):
    return resolve("CAROUSEL_SHARE_POLICIES", name)()


def params_from(control):
    return Params(max_wait_s=control.max_wait_s, mount_min_files=control.mount_min_files,
                  mount_min_bytes=control.mount_min_bytes, mount_max_wait_s=control.mount_max_wait_s,
                  extra=control.policy_params or {})


@dataclass
class Selection:
    chosen: list = field(default_factory=list)  # Candidates, in sending order
    tapes: dict = field(default_factory=dict)  # tape id -> TapeInfo
    allotments: dict = field(default_factory=dict)  # user id -> files chosen
    held_s: dict = field(default_factory=dict)  # user id -> drive time held after this cycle (estimated)
    rounds: int = 0


def select(*, now, control, sort, share, slots, most_slots=None, mounts=None):
    """Choose up to `slots` ready requests, a mount at a time, in turns of drive time.

    Each user's own queue comes from the sorting policy (how far it looks: see below), in
    runs of one tape (a run is one mount). Then, as in weighted fair queueing, the next run
    goes to the user whose drive time held (the estimated drive time of their work planned or
    on the drives, plus the runs given this cycle), with that run added, is the smallest for
    their weight (share.drive_weights); the run's estimated mount
    time (carousel.tape.mount_profile) is charged to them. So the drives' time, not a cycle's
    file slots, is shared, and tapes stay whole: when the run whose turn it is does not fit in
    the slots left, the cycle stops there and the run goes whole at a later cycle (unless the
    cycle has chosen nothing and the tape's run is bigger than `most_slots`, the most slots a
    cycle can have: waiting would not help, so it goes in part). Caps bound each user and group
    as before; priorities and the maximum wait order each user's own queue. `mounts`, when
    given, bounds the runs chosen for users with work in flight (N files or more, counting
    this cycle's): a user with little in flight (an analyst's few files) still goes, as the
    plan puts such short mounts first anyway."""
    most_slots = slots if most_slots is None else most_slots
    result = Selection()
    if slots <= 0:
        return result
    backlog = dict(UserBacklog.objects.filter(files__gt=0).values_list("user_id", "files"))
    if not backlog:
        return result
    limits = _limits(backlog, control)
    params = params_from(control)
    demands, groups = _demands(backlog, limits)
    # How far into each user's queue to look: twice the file slots the sharing policy would
    # grant them, and at least a job's worth (N files, so a whole tape of up to N files fits);
    # and only for the users whose turn comes first (smallest drive time held for their
    # weight), until their pools hold twice the slots. This keeps the pools, and the cycle's
    # cost, in proportion to the slots, not to the users or their backlogs.
    grants = share.allocate(demands, groups, slots)
    able = [d for d in demands if min(d.pending, d.room) > 0]
    if mounts is not None and mounts <= 0:
        # No drive wants another long mount: only users with little in flight can have a turn
        # (most cycles of a long backlog; without this they would each gather and order pools
        # for nothing).
        able = [d for d in able if limits.in_flight.get(d.user, 0) < control.files_per_job]
        if not able:
            return result
    weights = share.drive_weights(able, groups)
    held = held_drive_time([d.user for d in able])
    wanted, total = {}, 0
    for d in sorted(able, key=lambda d: (_virtual(held[d.user], weights.get(d.user, 0.0)), d.user)):
        if total >= 2 * slots:
            break
        wanted[d.user] = min(d.pending, d.room, slots, max(2 * grants.get(d.user, 0), control.files_per_job))
        total += wanted[d.user]
    result.rounds = 1
    pools = _gather(wanted, defaultdict(list), sort, now, result.tapes)
    queues = {}
    for user, n in sorted(wanted.items()):
        chosen = sort.choose(pools.get(user, []), result.tapes, n, params)
        runs = [list(run) for _, run in groupby(chosen, key=lambda c: c.tape)]
        if runs:
            queues[user] = deque(runs)
    held = {u: held[u] for u in queues}
    group_room = {g: room for g, (_, room) in limits.group_limits.items()}
    def turn(user):
        # Weighted fair queueing: the next mount goes to the user whose drive time held would
        # be the smallest for their weight once it is read (the finish tag), not before (the
        # start tag). With mounts hours long, starting from the tags before would hand every
        # user a drive in the first round, whatever their weight, and that first round is a
        # large part of a campaign.
        return _virtual(held[user] + run_seconds(queues[user][0], result.tapes), weights.get(user, 0.0)), user

    complete = set()  # tapes whose user_files hold every user's count (see _tape_info)
    heap = [turn(u) for u in queues]
    heapq.heapify(heap)
    remaining = slots
    taken = set()  # requests chosen already (as another user's riders)
    while heap and remaining > 0:
        _, user = heapq.heappop(heap)
        run = [c for c in queues[user].popleft() if c.id not in taken]
        if not run:
            if queues[user]:
                heapq.heappush(heap, turn(user))
            continue
        busy = limits.in_flight.get(user, 0) + result.allotments.get(user, 0) + len(run) >= control.files_per_job
        if mounts is not None and busy and mounts <= 0:
            continue  # no drive needs another long mount yet: this user's turn waits
        group = limits.group[user]
        fit = min(remaining, group_room.get(group, remaining))
        # A policy that keeps tapes whole needs room for all the user's ready files on the
        # tape, not only those its pool held (the pool may have been cut by the slots), as far
        # as the user's and group's caps would ever let them go together; and for the other
        # users' ready files on it, which ride along in the same mount (a tape two users want
        # is mounted once, not once per user's turn, hours apart).
        need = len(run)
        if sort.whole_tapes:
            most = min(result.tapes[run[0].tape].user_files.get(user, 0), limits.user_room[user],
                       limits.group_limits.get(group, (None, need))[1])
            need = max(need, most)
        riders = {}
        if need > fit:
            if fit <= 0:
                continue  # this user's group is full: the others go on
            if result.chosen or need <= most_slots:
                break  # a whole tape waits for its turn at a later cycle, when slots free up
            run = run[:fit]
        elif sort.whole_tapes:
            _every_user(result.tapes[run[0].tape], complete)
            riders = _riders(result.tapes[run[0].tape], user, group, len(run), limits, result.allotments,
                             group_room, remaining - len(run))
        along = [c for c in _candidates(db.lateral(ON_TAPE_SQL, [(u, run[0].tape, n) for u, n in riders.items()]),
                                        now) if c.id not in taken] if riders else []
        seconds = run_seconds(in_read_order([*run, *along], result.tapes) if along else run, result.tapes)
        for who, theirs in [(user, run), *((u, [c for c in along if c.user == u]) for u in riders)]:
            if not theirs:
                continue
            result.chosen.extend(theirs)
            taken.update(c.id for c in theirs)
            result.allotments[who] = result.allotments.get(who, 0) + len(theirs)
            remaining -= len(theirs)
            who_group = limits.group[who]
            if who_group in group_room:
                group_room[who_group] -= len(theirs)
            # The mount's drive time is charged to its users by their files on it.
            held[who] = held.get(who, 0.0) + seconds * len(theirs) / (len(run) + len(along))
        if mounts is not None and busy:
            mounts -= 1
        if queues[user]:
            heapq.heappush(heap, turn(user))
    result.held_s = held
    return result


def _riders(tape, user, group, own, limits, allotments, group_room, room):
    """{other user: how many of their ready requests on `tape` go in `user`'s mount of it (`own`
    of theirs), within each one's cap, their group's room and the `room` left in the cycle."""
    riders = {}
    left = dict(group_room)
    if group in left:
        left[group] -= own
    for other, files in sorted(tape.user_files.items()):
        if other == user or other not in limits.user_room:
            continue
        n = min(files, limits.user_room[other] - allotments.get(other, 0), room)
        other_group = limits.group[other]
        if other_group in left:
            n = min(n, left[other_group])
        if n > 0:
            riders[other] = n
            room -= n
            if other_group in left:
                left[other_group] -= n
    return riders


def _virtual(held_s, weight):
    # A user of weight 0 comes after every weighted one, by their own drive time.
    return (0, held_s / weight) if weight > 0 else (1, held_s)


# A tape of a technology the model does not know is charged as if it were LTO-8 (the newest
# technology in the shipped workloads): only the relative drive time of users' runs matters.
FALLBACK_MEDIA = "LTO-8"


def run_seconds(run, tapes):
    """The estimated drive time of the mount reading `run` (one tape's candidates, in read
    order): robot exchange, load, locates, reads, rewind and unload."""
    media = tapes[run[0].tape].media
    pre, _ = mount_profile(media if media in MEDIA else FALLBACK_MEDIA, [(c.position, c.size) for c in run],
                           exchange_s=EXCHANGE_S)
    return pre[-1]


# The robot's cartridge move, fetch and put-back, as the simulated library's default (workloads/README.md).
EXCHANGE_S = 11.0


def held_drive_time(users):
    """user id -> the estimated drive time of their requests planned or on the drives: each
    job's estimate, shared by its in-flight requests (a sent job counts only what it has left,
    a file two users asked for is charged to both). Aggregated in the database by (user, job)."""
    held = dict.fromkeys(users, 0.0)
    rows = list(RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES, job__isnull=False, user_id__in=list(users))
                .order_by().values_list("user_id", "job_id").annotate(n=Count("id")))
    estimates = dict((j, (e, f)) for j, e, f in Job.objects.filter(id__in={j for _, j, _ in rows})
                     .values_list("id", "estimate_s", "files"))
    for user, job, n in rows:
        estimate, files = estimates.get(job, (0.0, 0))
        if files:
            held[user] += estimate * min(1.0, n / files)
    return held


@dataclass
class _Limits:
    group: dict  # user -> group id or None
    user_room: dict  # user -> cap minus in flight
    group_limits: dict  # group -> (weight, cap minus in flight)
    in_flight: dict  # user -> requests in flight


def _limits(backlog, control):
    in_flight = defaultdict(int)
    for user_id, n in (RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).order_by()
                       .values_list("user_id").annotate(n=Count("id"))):
        in_flight[user_id] = n
    accounts = {u: (g, cap) for u, g, cap in
                Account.objects.filter(user_id__in=set(backlog) | set(in_flight))
                .values_list("user_id", "group_id", "inflight_cap")}
    group_of = {u: accounts.get(u, (None, None))[0] for u in set(backlog) | set(in_flight)}
    user_room = {}
    for user in backlog:
        cap = accounts.get(user, (None, None))[1]
        cap = control.default_user_cap if cap is None else cap
        room = max(0, cap - in_flight[user])
        # A user at their cap refills by whole jobs (N files, or all they have left), not a
        # file at a time as files finish: fewer, fuller jobs, and fewer cycles with work.
        user_room[user] = room if room >= min(control.files_per_job, backlog[user], cap) else 0
    group_in_flight = defaultdict(int)
    for user, n in in_flight.items():
        group_in_flight[group_of[user]] += n
    group_limits = {}
    shares = {g: (w, cap) for g, w, cap in GroupShare.objects.filter(
        group_id__in={g for g in group_of.values() if g is not None}).values_list("group_id", "weight", "inflight_cap")}
    for group in {g for g in group_of.values() if g is not None}:
        weight, cap = shares.get(group, (1.0, None))
        cap = control.default_group_cap if cap is None else cap
        group_limits[group] = (weight, max(0, cap - group_in_flight[group]))
    return _Limits(group=group_of, user_room=user_room, group_limits=group_limits, in_flight=in_flight)


def _demands(backlog, limits):
    demands = [UserDemand(user=user, group=limits.group[user], pending=files, room=limits.user_room[user])
               for user, files in backlog.items()]
    groups = {g: GroupLimit(weight=w, room=room) for g, (w, room) in limits.group_limits.items()}
    return demands, groups


def _aware(moment):
    # Raw SQL on SQLite gives naive datetimes; Django stores them in UTC there.
    return moment if moment.tzinfo else moment.replace(tzinfo=dt_timezone.utc)


def _candidates(rows, now):
    return [Candidate(id=r[0], user=r[1], tape=r[2], position=r[3] or 0, size=r[4] or 0, priority=r[5],
                      age_s=(now - _aware(r[6])).total_seconds(), group=r[7]) for r in rows]


def _gather(allotments, taken, sort, now, tapes):
    """Each user's candidate pool, bounded by the allotment: the pools the policy asks for,
    then the user's requests on the tapes those pools point at."""
    keys = [(u, n + len(taken[u])) for u, n in sorted(allotments.items())]
    pools = defaultdict(dict)
    for name in POOL_SQL:
        if name in sort.pools:
            for c in _candidates(db.lateral(POOL_SQL[name], keys), now):
                pools[c.user][c.id] = c
    wanted = defaultdict(list)  # user -> tapes to read their requests from, in order
    if "top_tapes" in sort.pools:
        for user, tape, files in db.lateral(TOP_TAPES_SQL, keys):
            wanted[user].append((tape, files))
    if "oldest_tapes" in sort.pools:
        for user, pool in pools.items():
            for c in sorted(pool.values(), key=lambda c: -c.age_s):
                wanted[user].append((c.tape, None))
    triples = []
    for user, n in keys:
        seen, covered = set(), 0
        for tape, files in wanted.get(user, []):
            if tape in seen:
                continue
            seen.add(tape)
            triples.append((user, tape, n))
            covered += files if files is not None else 1
            if covered >= n:
                break  # enough files on these tapes to fill the allotment
    for c in _candidates(db.lateral(ON_TAPE_SQL, triples), now):
        pools[c.user][c.id] = c
    pairs = {(c.user, c.tape) for pool in pools.values() for c in pool.values()}
    _tape_info({t for _, t in pairs} - set(tapes), now, tapes, pairs)
    return {user: list(pool.values()) for user, pool in pools.items()}


def _tape_info(new_tapes, now, tapes, pairs):
    """Fill `tapes` with what the policies need to know of each tape: per tape a few index
    probes (its backlog counters summed by the database, its oldest ready request), not a scan
    of its queue. user_files holds the counts of the users whose pools hold the tape (`pairs`:
    (user, tape)); every user's is read once the tape is chosen (_every_user, for the riders).
    A pool spans thousands of tapes with dozens of users each: reading every user's counter of
    every one was the cycle's costliest step at a million queued requests."""
    if not new_tapes:
        return
    media = dict(Tape.objects.filter(id__in=new_tapes).values_list("id", "media"))
    totals = {t: (f, b or 0) for t, f, b in TapeBacklog.objects.filter(tape_id__in=new_tapes, files__gt=0)
              .order_by().values("tape_id").annotate(f=Sum("files"), b=Sum("bytes")).values_list("tape_id", "f", "b")}
    user_files = defaultdict(dict)
    for u, t, f in db.lateral(USER_ON_TAPE_SQL, [(u, t, 1) for u, t in sorted(pairs) if t in new_tapes]):
        user_files[t][u] = f
    oldest = {t: at for t, at in db.lateral(OLDEST_ON_TAPE_SQL, [(t, 1) for t in sorted(new_tapes)])}
    for t in new_tapes:
        files, nbytes = totals.get(t, (0, 0))
        age = (now - _aware(oldest[t])).total_seconds() if t in oldest else 0.0
        tapes[t] = TapeInfo(id=t, media=media.get(t) or None, files=files, bytes=nbytes,
                            oldest_age_s=age, user_files=user_files[t])


def _every_user(tape, complete):
    """Complete `tape`'s user_files with every user's ready requests on it (once per cycle)."""
    if tape.id in complete:
        return
    tape.user_files.update(TapeBacklog.objects.filter(tape_id=tape.id, files__gt=0).values_list("user_id", "files"))
    complete.add(tape.id)
