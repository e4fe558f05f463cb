"""Sorting policies: which of a user's ready requests go first. Pure: plain data in, an order
out. The selection step (policies/selection.py) gathers a bounded pool of candidates per user
from the database and calls choose() with it."""
from dataclasses import dataclass, field
from itertools import groupby, islice

from .order import read_order


@dataclass(frozen=True)
class Candidate:
    id: int
    user: int
    tape: int
    position: int
    size: int
    priority: int
    age_s: float  # how long it has been queued
    group: int | None = None  # the group whose share the request draws on
    activity: str = ""  # the activity whose share of the group it draws on (policies/turns.py, Lane)


@dataclass(frozen=True)
class TapeInfo:
    id: int
    media: str | None
    files: int  # ready requests on the tape, all users
    bytes: int
    oldest_age_s: float
    # user id -> that user's ready requests on it: the users whose candidates are on it (and
    # every user, once the turn policy chose the tape: policies/turns.py, the riders)
    user_files: dict = field(default_factory=dict)
    # A mount of it is planned and not sent yet (a pending job): ready files on it join it.
    open: bool = False
    # Read orders already worked out this cycle (in_read_order): the same tape's files are
    # ordered when a policy ranks a pool, when the turn policy charges a mount, and when claiming
    # makes the job; with scattered files the order takes milliseconds a tape.
    orders: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Params:
    max_wait_s: float
    mount_min_files: int = 1
    mount_min_bytes: int = 0
    mount_max_wait_s: float = 0.0
    extra: dict = field(default_factory=dict)  # the control row's policy_params


def worth_mounting(tape, params):
    """A tape goes out once enough is queued on it, or its oldest request waited long enough,
    so the broker does not mount a cartridge for one file while more are coming."""
    return (tape.files >= params.mount_min_files
            or (params.mount_min_bytes > 0 and tape.bytes >= params.mount_min_bytes)
            or tape.oldest_age_s >= params.mount_max_wait_s)


def in_read_order(candidates, tapes):
    """Candidates of one tape in the fastest read order (the same for every policy)."""
    if not candidates:
        return []
    tape = tapes[candidates[0].tape]
    by_id = {c.id: c for c in candidates}
    files = tuple(sorted((c.id, c.position, c.size) for c in candidates))
    order = tape.orders.get(files)
    if order is None:
        order = tape.orders[files] = read_order(tape.media, files)
    return [by_id[i] for i in order]


def by_tape(candidates):
    """{tape id: that tape's candidates}, in no particular order within a tape."""
    ordered = sorted(candidates, key=lambda c: c.tape)
    return {t: list(cs) for t, cs in groupby(ordered, key=lambda c: c.tape)}


def tapes_in_read_order(groups, tape_ids, tapes):
    """The candidates of `groups` ({tape: candidates}), tape after tape in the order of
    `tape_ids`, each tape's in read order, worked out only when it is reached."""
    for tape_id in tape_ids:
        yield from in_read_order(groups[tape_id], tapes)


class SortPolicy:
    """Base of sorting policies. A policy ranks one user's candidates; choose() applies the
    rules every policy shares."""

    name = ""
    # Which candidate pools the selection step gathers for this policy (policies/selection.py),
    # each bounded by the user's allotment: "oldest" and "priority" always (the shared rules
    # need them); "newest"; "top_tapes" (the user's tapes with most files), "oldest_tapes"
    # (the tapes of their oldest requests) and "open_tapes" (tapes whose mount is planned, not
    # sent yet) add the user's requests on those tapes.
    pools = frozenset({"oldest", "priority"})
    # Policies that send a user's files tape by tape keep each tape's files together.
    whole_tapes = False

    def rank(self, candidates, tapes, params):
        """Return the candidates (one user's, all ready) in the order they should go. A policy
        defines this or tape_order()."""
        order = self.tape_order(candidates, tapes, params)
        if order is None:
            raise NotImplementedError
        return list(tapes_in_read_order(by_tape(candidates), order, tapes))

    def tape_order(self, candidates, tapes, params):
        """For a policy that ranks tape by tape, each tape's files in read order: the tape ids
        of the candidates in rank order. Then rank() and choose() order a tape's files only when
        the allotment reaches it (a user's pool spans hundreds of tapes, of which a few go).
        None (the default): the policy ranks files, by rank()."""
        return None

    def ranked(self, candidates, tapes, params):
        """rank()'s order as an iterable, read only as far as choose() needs it."""
        order = self.tape_order(candidates, tapes, params)
        if order is None:
            return iter(self.rank(candidates, tapes, params))
        return tapes_in_read_order(by_tape(candidates), order, tapes)

    def choose(self, candidates, tapes, allotment, params):
        """Up to `allotment` of one user's candidates, in sending order:
        1. requests that waited max_wait_s go first, oldest first, whatever their tape;
        2. then higher priority first, and within a priority the policy's rank;
        tapes not yet worth mounting are held back, except for requests of rule 1."""
        if allotment <= 0:
            return []
        chosen = list(islice(self._overdue(candidates, tapes, params), allotment))
        if len(chosen) < allotment:
            taken = {c.id for c in chosen}
            rest = [c for c in candidates if c.id not in taken and worth_mounting(tapes[c.tape], params)]
            chosen += islice(self._by_priority(rest, tapes, params), allotment - len(chosen))
        if self.whole_tapes and chosen:
            chosen = _without_cut_tape(chosen, tapes)
        return chosen

    def _by_priority(self, candidates, tapes, params):
        """Higher priority first, and within a priority the policy's rank, as an iterable. With
        a tape order, a priority's pass visits only the tapes holding files of that priority
        (each tape's files in read order of all of them): a pool's few urgent files do not put
        every tape of it in read order."""
        levels = sorted({c.priority for c in candidates}, reverse=True)
        order = self.tape_order(candidates, tapes, params) if len(levels) > 1 else None
        if order is None:
            return (c for level in levels for c in self.ranked(candidates, tapes, params) if c.priority == level)
        groups = by_tape(candidates)
        held = {t: {c.priority for c in cs} for t, cs in groups.items()}
        return (c for level in levels for t in order if level in held[t]
                for c in in_read_order(groups[t], tapes) if c.priority == level)

    def _overdue(self, candidates, tapes, params):
        """Requests that waited max_wait_s, the tape of the oldest first, each tape's together
        in the policy's order: a backlog that is overdue as a whole (submitted at once, hours
        ago) still goes tape by tape, not file by file across all its tapes. Ties (a submission
        shares one time of entry) go in the policy's order of tapes. An iterable: a tape's files
        are put in read order only when they are reached."""
        overdue = [c for c in candidates if c.age_s >= params.max_wait_s]
        oldest = {}
        for c in overdue:
            oldest[c.tape] = max(oldest.get(c.tape, 0.0), c.age_s)
        order = self.tape_order(overdue, tapes, params)
        if order is not None:
            place = {t: i for i, t in enumerate(order)}
            return tapes_in_read_order(by_tape(overdue), sorted(order, key=lambda t: (-oldest[t], place[t])), tapes)
        ranked = self.rank(overdue, tapes, params)
        first = {}
        for i, c in enumerate(ranked):
            first.setdefault(c.tape, i)
        return iter(sorted(ranked, key=lambda c: (-oldest[c.tape], first[c.tape])))


def _without_cut_tape(picked, tapes):
    """Leave out the last tape when the allotment ends inside the user's files on it (unless it
    is the only one): its files go together at a later cycle, in one mount, instead of half now
    and half in a second mount."""
    last = picked[-1].tape
    on_last = sum(1 for c in picked if c.tape == last)
    if on_last >= tapes[last].user_files.get(picked[-1].user, 0):
        return picked
    kept = [c for c in picked if c.tape != last]
    return kept or picked


class Fifo(SortPolicy):
    """NONE: by entry time."""

    name = "NONE"

    def rank(self, candidates, tapes, params):
        return sorted(candidates, key=lambda c: (-c.age_s, c.id))


class TapeId(SortPolicy):
    """TAPEID: strictly by tape, the tape with the most of this user's pending files first
    (ties: more pending files of all users, then tape id); within a tape, read order. A tape
    whose mount is planned and not sent yet comes before them all: the rest of a tape cut by a cap
    or a cycle's slots joins that mount, instead of a second mount after every tape with more
    files (hours later on a long backlog)."""

    name = "TAPEID"
    pools = SortPolicy.pools | {"top_tapes", "open_tapes"}
    whole_tapes = True

    def tape_order(self, candidates, tapes, params):
        user = candidates[0].user if candidates else None

        def demand(tape_id):
            tape = tapes[tape_id]
            return (not tape.open, -tape.user_files.get(user, 0), -tape.files, tape_id)

        return sorted({c.tape for c in candidates}, key=demand)


class Slider(SortPolicy):
    """SLIDER: the oldest entry first, and the user's other requests on its tape come along.
    Tapes are scored by age_weight * age of the user's oldest request on it (over the oldest
    of all) plus (1 - age_weight) * the user's files on it (over the most on any tape):
    age_weight 1 is oldest-first, 0 is most-files-first. Parameter: policy_params
    {"slider_age_weight": 0.0 .. 1.0}, default 0.5."""

    name = "SLIDER"
    pools = SortPolicy.pools | {"oldest_tapes"}
    whole_tapes = True

    def tape_order(self, candidates, tapes, params):
        weight = float(params.extra.get("slider_age_weight", 0.5))
        groups = by_tape(candidates)
        if not groups:
            return []
        user = candidates[0].user
        files = {t: max(tapes[t].user_files.get(user, 0), len(cs)) for t, cs in groups.items()}
        most = max(files.values())
        oldest = {t: max(c.age_s for c in cs) for t, cs in groups.items()}
        eldest = max(max(oldest.values()), 1e-9)

        def score(t):
            return weight * oldest[t] / eldest + (1 - weight) * files[t] / most

        return sorted(groups, key=lambda t: (-score(t), t))
