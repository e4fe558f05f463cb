"""The selection step of the server loop: how many requests each user may send this cycle
(the sharing policy) and which ones (the sorting policy).

Nothing here reads a whole queue. Who has work and how much comes from the trigger-kept
counters (UserBacklog, TapeBacklog); the candidates come from per-user index scans bounded
by each user's allotment. A cycle therefore costs about (users with work + slots) index
probes, whatever the length of the queue."""
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timezone as dt_timezone

from django.db.models import Count, Min, Sum

from carousel import db
from carousel.models import (
    IN_FLIGHT_STATES, READY, Account, GroupShare, RestoreRequest, Tape, TapeBacklog, UserBacklog,
)
from carousel.plugins import resolve

from .sharing import GroupLimit, UserDemand
from .sorting import Candidate, Params, TapeInfo

ROUNDS = 3
_COLUMNS = "id, user_id, tape_id, position, size, priority, created_at"
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
    allotments: dict = field(default_factory=dict)  # user id -> slots granted, summed over rounds
    rounds: int = 0


def select(*, now, control, sort, share, slots):
    """Choose up to `slots` ready requests. Unused share is offered again (up to ROUNDS times)
    to the users who used all of theirs, so no slot stays empty while someone has work."""
    result = Selection()
    if slots <= 0:
        return result
    backlog = dict(UserBacklog.objects.filter(files__gt=0).values_list("user_id", "files"))
    if not backlog:
        return result
    limits = _limits(backlog, control)
    params = params_from(control)
    taken = defaultdict(list)
    exhausted = set()
    remaining = slots
    while remaining > 0 and result.rounds < ROUNDS:
        result.rounds += 1
        demands, groups = _demands(backlog, limits, taken, exhausted)
        allotments = {u: n for u, n in share.allocate(demands, groups, remaining).items() if n > 0}
        if not allotments:
            break
        pools = _gather(allotments, taken, sort, now, result.tapes)
        got = 0
        for user, allotment in sorted(allotments.items()):
            seen = {c.id for c in taken[user]}
            fresh = [c for c in pools.get(user, []) if c.id not in seen]
            chosen = sort.choose(fresh, result.tapes, allotment, params)
            taken[user].extend(chosen)
            result.chosen.extend(chosen)
            result.allotments[user] = result.allotments.get(user, 0) + allotment
            got += len(chosen)
            if len(chosen) < allotment:
                exhausted.add(user)  # nothing more it can send this cycle
        remaining -= got
        if got == 0:
            break
    return result


@dataclass
class _Limits:
    group: dict  # user -> group id or None
    user_room: dict  # user -> cap minus in flight
    group_limits: dict  # group -> (weight, cap minus in flight)


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
    return _Limits(group=group_of, user_room=user_room, group_limits=group_limits)


def _demands(backlog, limits, taken, exhausted):
    demands = []
    group_taken = defaultdict(int)
    for user, chosen in taken.items():
        group_taken[limits.group[user]] += len(chosen)
    for user, files in backlog.items():
        if user in exhausted:
            continue
        n = len(taken[user])
        demands.append(UserDemand(user=user, group=limits.group[user], pending=max(0, files - n),
                                  room=max(0, limits.user_room[user] - n)))
    groups = {g: GroupLimit(weight=w, room=max(0, room - group_taken[g]))
              for g, (w, room) in limits.group_limits.items()}
    return demands, groups


def _aware(moment):
    # Raw SQL on SQLite gives naive datetimes; Django stores them in UTC there.
    return moment if moment.tzinfo else moment.replace(tzinfo=dt_timezone.utc)


def _candidates(rows, now):
    return [Candidate(id=r[0], user=r[1], tape=r[2], position=r[3] or 0, size=r[4] or 0, priority=r[5],
                      age_s=(now - _aware(r[6])).total_seconds()) for r in rows]


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
    _tape_info({c.tape for pool in pools.values() for c in pool.values()} - set(tapes), set(pools), now, tapes)
    return {user: list(pool.values()) for user, pool in pools.items()}


def _tape_info(new_tapes, users, now, tapes):
    """Fill `tapes` with what the policies need to know of each tape."""
    if not new_tapes:
        return
    media = dict(Tape.objects.filter(id__in=new_tapes).values_list("id", "media"))
    totals = {t: (f, b) for t, f, b in TapeBacklog.objects.filter(tape_id__in=new_tapes).order_by()
              .values_list("tape_id").annotate(f=Sum("files"), b=Sum("bytes")).values_list("tape_id", "f", "b")}
    oldest = dict(RestoreRequest.objects.filter(READY, tape_id__in=new_tapes).order_by()
                  .values_list("tape_id").annotate(m=Min("created_at")).values_list("tape_id", "m"))
    user_files = defaultdict(dict)
    for u, t, f in TapeBacklog.objects.filter(tape_id__in=new_tapes, user_id__in=users, files__gt=0).values_list(
            "user_id", "tape_id", "files"):
        user_files[t][u] = f
    for t in new_tapes:
        files, nbytes = totals.get(t, (0, 0))
        age = (now - oldest[t]).total_seconds() if t in oldest else 0.0
        tapes[t] = TapeInfo(id=t, media=media.get(t) or None, files=files or 0, bytes=nbytes or 0,
                            oldest_age_s=age, user_files=user_files[t])
