"""The selection step of the server loop: the ready work read from the database for the turn
policy (policies/turns.py), which decides whose tape is mounted next (the sharing policy's
weights, in drive time), each user's requests ordered by the sorting policy.

Nothing here reads a whole queue. Who has work and how much comes from the trigger-kept
counters (UserBacklog, TapeBacklog); the candidates come from per-user index scans bounded
by each user's allotment. A cycle therefore costs about (users with work + slots) index
probes, whatever the length of the queue."""
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timezone as dt_timezone
from itertools import groupby

from django.db.models import Count, Sum

from carousel.domain import activities
from carousel.domain.selectors import activities as activity_reads
from carousel.infra import db, plugins
from carousel.models import (
    IN_FLIGHT_STATES, Account, GroupShare, Job, JobState, RestoreRequest, Tape, TapeBacklog, UserBacklog,
)

from .sharing import GroupLimit, UserDemand
from .sorting import Candidate, Params, TapeInfo
from .turns import Lane, ReadyWork

_COLUMNS = "id, user_id, tape_id, position, size, priority, created_at, group_id, activity"
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


# A user's queue of one activity (a lane, policies/turns.py): the same reads, narrowed to it.
LANE_POOL_SQL = {name: sql.replace("user_id = {a}", "user_id = {a} AND activity = {b}")
                 for name, sql in POOL_SQL.items()}
LANE_ON_TAPE_SQL = ON_TAPE_SQL.replace("AND tape_id = {b}", "AND tape_id = {b} AND activity = {c}")
# The next activity (by name) a user has ready work of: one probe of request_ready_lane_age.
NEXT_ACTIVITY_SQL = ("SELECT user_id, activity FROM carousel_restorerequest WHERE user_id = {a} AND activity > {b} "
                     "AND state = 'queued' AND tape_id IS NOT NULL ORDER BY activity LIMIT {n}")
TEXT_KEY = ("bigint", "text", "bigint")


def sort_policy(name):
    return plugins.resolve("CAROUSEL_SORT_POLICIES", name)()


def share_policy(name):
    return plugins.resolve("CAROUSEL_SHARE_POLICIES", name)()


def params_from(control):
    return Params(max_wait_s=control.max_wait_s, mount_min_files=control.mount_min_files,
                  mount_min_bytes=control.mount_min_bytes, mount_max_wait_s=control.mount_max_wait_s,
                  extra=control.policy_params or {})


@dataclass
class Selection:
    chosen: list = field(default_factory=list)  # Candidates, in sending order
    tapes: dict = field(default_factory=dict)  # tape id -> TapeInfo


def turn_policy():
    """The configured turn-taking policy (CAROUSEL_TURN_POLICY), one instance per process."""
    return plugins.turn_policy()


def select(*, now, control, sort, share, slots, most_slots=None, mounts=None, turns=None):
    """Choose up to `slots` ready requests, a mount at a time: the turn policy (`turns`, by
    default the configured one: policies/turns.py) takes turns over the ready work read here,
    each user's queue ordered by the sorting policy `sort`, their claims on the drives' time
    given by the sharing policy `share`. `most_slots`: the most slots a cycle can have;
    `mounts`: the long mounts the drives' chains want, when bounded (TurnPolicy.take_turns)."""
    if slots <= 0:
        return Selection()
    work = ready_work(now=now, control=control, sort=sort, share=share)
    turns = turn_policy() if turns is None else turns
    chosen = turns.take_turns(work, slots=slots, most_slots=slots if most_slots is None else most_slots,
                              mounts=mounts)
    return Selection(chosen=chosen, tapes=work.tapes)


def ready_work(*, now, control, sort, share):
    """The ready work as the database holds it, for a turn policy (policies/turns.py): who has
    work and how much from the trigger-kept counters, their caps and what they have in flight;
    the queues themselves are read only as the policy asks (QueuedWork)."""
    backlog = dict(UserBacklog.objects.filter(files__gt=0).values_list("user_id", "files"))
    limits = _limits(backlog, control) if backlog else _Limits(group={}, user_room={}, group_limits={}, in_flight={})
    demands, groups = _demands(backlog, limits)
    return QueuedWork(demands=demands, groups=groups, in_flight=limits.in_flight, files_per_job=control.files_per_job,
                      share=share, whole_tapes=sort.whole_tapes, now=now, sort=sort, params=params_from(control),
                      lanes=_lanes(backlog, limits.group))


def _lanes(backlog, group_of):
    """{user: [Lane]}: the activities each user with a backlog has ready work of, with their
    weight and priority for the user's group. Read by skipping along request_ready_lane_age
    (one probe per user and activity, a round per activity), never by counting the queue."""
    found = defaultdict(list)
    last = dict.fromkeys(backlog, "")
    while last:
        rows = db.lateral(NEXT_ACTIVITY_SQL, [(user, name, 1) for user, name in sorted(last.items())], TEXT_KEY)
        last = {}
        for user, name in rows:
            found[user].append(name)
            last[user] = name
    if not found:
        return {}  # nobody has ready work: the activities' table is not needed
    table = activities.table()
    lanes = {}
    for user, names in found.items():
        settings = [activities.setting(table, group_of.get(user), name) for name in names]
        lanes[user] = [Lane(user, name, s.weight, s.priority) for name, s in zip(names, settings)]
    return lanes


class QueuedWork(ReadyWork):
    """ReadyWork whose readers query the database: per user, per tape index probes bounded by
    what the policy asks for, never a scan of a queue."""

    def __init__(self, *, now, sort, params, **work):
        super().__init__(**work)
        self.now, self.sort, self.params = now, sort, params
        self.complete = set()  # tapes whose user_files hold every user's count

    def held_drive_time(self, users):
        held = held_lane_time(users)
        return {user: sum(s for (u, _), s in held.items() if u == user) for user in users}

    def held_lane_time(self, keys):
        held = held_lane_time({user for user, _ in keys})
        return {key: held.get(key, 0.0) for key in keys}

    def runs(self, allotments):
        return {user: runs for (user, _), runs in
                self.lane_runs({(user, ""): n for user, n in allotments.items()}).items()}

    def lane_runs(self, allotments):
        """Per lane; activity "" (or a user's only lane): the user's whole queue."""
        several = {user for user, lanes in self.lanes.items() if len(lanes) > 1}
        pools = _gather({(u, a if u in several else ""): n for (u, a), n in allotments.items()},
                        self.sort, self.now, self.tapes)
        runs = {}
        for (user, activity), n in sorted(allotments.items()):
            pool = pools.get((user, activity if user in several else ""), [])
            chosen = self.sort.choose(pool, self.tapes, n, self.params)
            runs[(user, activity)] = [list(run) for _, run in groupby(chosen, key=lambda c: c.tape)]
        return runs

    def every_user_on(self, tape):
        _every_user(self.tapes[tape], self.complete)
        return self.tapes[tape].user_files

    def on_tape(self, tape, wanted):
        return _candidates(db.lateral(ON_TAPE_SQL, [(u, tape, n) for u, n in wanted.items()]), self.now)


def held_drive_time(users):
    """user id -> the estimated drive time of their requests planned or on the drives: each
    job's estimate, shared by its in-flight requests (a sent job counts only what it has left,
    a file two users asked for is charged to both). Aggregated in the database by (user, job)."""
    held = dict.fromkeys(users, 0.0)
    for (user, _), seconds in held_lane_time(users).items():
        held[user] += seconds
    return held


def held_lane_time(users):
    """(user, activity) -> held_drive_time's figure per activity, for the users `users` (the
    lanes with nothing planned or on the drives left out)."""
    return activity_reads.held_drive_time(users)


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
                      age_s=(now - _aware(r[6])).total_seconds(), group=r[7], activity=r[8]) for r in rows]


def _gather(allotments, sort, now, tapes):
    """Each lane's candidate pool, bounded by the allotment: the pools the policy asks for,
    then the lane's requests on the tapes those pools point at. `allotments`: {(user,
    activity): n}; activity "": the user's whole queue."""
    whole = sorted((user, n) for (user, activity), n in allotments.items() if not activity)
    narrow = sorted((user, activity, n) for (user, activity), n in allotments.items() if activity)

    def lane(c):
        return (c.user, c.activity) if (c.user, c.activity) in allotments else (c.user, "")

    pools = defaultdict(dict)
    for name in POOL_SQL:
        if name in sort.pools:
            for c in _candidates(db.lateral(POOL_SQL[name], whole) + db.lateral(LANE_POOL_SQL[name], narrow, TEXT_KEY),
                                 now):
                pools[lane(c)][c.id] = c
    wanted = defaultdict(list)  # lane -> tapes to read its requests from, in order
    if "open_tapes" in sort.pools:
        # The user's ready files on tapes whose mount is planned and not sent yet: bounded by
        # the pending jobs (the window, N x K files).
        users = {user for user, _ in allotments}
        for user, tape, files in (TapeBacklog.objects.filter(user_id__in=users, files__gt=0,
                                                             tape_id__in=open_tapes())
                                  .order_by("user_id", "tape_id").values_list("user_id", "tape_id", "files")):
            for key in allotments:
                if key[0] == user:
                    wanted[key].append((tape, files))
    if "top_tapes" in sort.pools:
        # The user's tapes with most files, whatever their activities: a lane reads its own on them.
        users = sorted({(user, n) for (user, _), n in allotments.items()})
        top = defaultdict(list)
        for user, tape, files in db.lateral(TOP_TAPES_SQL, users):
            top[user].append((tape, files))
        for key in allotments:
            wanted[key] += top[key[0]]
    if "oldest_tapes" in sort.pools:
        for key, pool in pools.items():
            for c in sorted(pool.values(), key=lambda c: -c.age_s):
                wanted[key].append((c.tape, None))
    triples, quads = [], []
    for (user, activity), n in sorted(allotments.items()):
        seen, covered = set(), 0
        for tape, files in wanted.get((user, activity), []):
            if tape in seen:
                continue
            seen.add(tape)
            if activity:
                quads.append((user, tape, activity, n))
            else:
                triples.append((user, tape, n))
            covered += files if files is not None else 1
            if covered >= n:
                break  # enough files on these tapes to fill the allotment
    for c in _candidates(db.lateral(ON_TAPE_SQL, triples)
                         + db.lateral(LANE_ON_TAPE_SQL, quads, ("bigint", "bigint", "text", "bigint")), now):
        pools[lane(c)][c.id] = c
    pairs = {(c.user, c.tape) for pool in pools.values() for c in pool.values()}
    _tape_info({t for _, t in pairs} - set(tapes), now, tapes, pairs)
    return {key: list(pool.values()) for key, pool in pools.items()}


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
    opened = set(open_tapes().filter(tape_id__in=new_tapes))
    for t in new_tapes:
        files, nbytes = totals.get(t, (0, 0))
        age = (now - _aware(oldest[t])).total_seconds() if t in oldest else 0.0
        tapes[t] = TapeInfo(id=t, media=media.get(t) or None, files=files, bytes=nbytes,
                            oldest_age_s=age, user_files=user_files[t], open=t in opened)


def open_tapes():
    """The tapes whose mount is planned and not sent yet (their pending jobs'). (Not those
    on a drive: their new files ride along when chosen anyway; putting them first too took
    turns from other tapes and cost overlap three more mounts, 9,642 s for 8,531 s.)"""
    return (Job.objects.filter(state=JobState.PENDING, tape__isnull=False).order_by()
            .values_list("tape_id", flat=True).distinct())


def _every_user(tape, complete):
    """Complete `tape`'s user_files with every user's ready requests on it (once per cycle)."""
    if tape.id in complete:
        return
    tape.user_files.update(TapeBacklog.objects.filter(tape_id=tape.id, files__gt=0).values_list("user_id", "files"))
    complete.add(tape.id)
