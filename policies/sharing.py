"""Sharing policies: each user's claim on the drives' time (drive_weights(), which decides whose
tape is mounted next), and how many of a cycle's free slots each user with pending work may
fill (allocate(), which bounds how far into each user's queue a cycle looks). Pure: plain data
in, plain data out. The selection step (policies/selection.py) builds the demands from the
backlog counters.

Every policy water-fills: a user never gets more than min(pending, room), a group's users never
more than the group's room, and what a capped user or group cannot take goes to the others, so
no slot stays empty while someone could still take one.

Users whose group is None draw on one shared "ungrouped" group of weight 1 and unlimited room
(each user's own room still applies); a group missing from `groups` is treated the same way.

Whole slots cannot always be split exactly; an odd slot goes to the lowest user id (or, between
groups, the ungrouped group first, then the lowest group id). The same input always gives the
same output, whatever the order of the demands."""
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction
from itertools import accumulate
from math import lcm


@dataclass(frozen=True)
class UserDemand:
    user: int  # user id
    group: int | None  # the group whose share this user draws on (None: ungrouped)
    pending: int  # eligible queued requests
    room: int  # how many more requests the user may have in flight (cap minus in flight)


@dataclass(frozen=True)
class GroupLimit:
    weight: float  # > 0, used by GRPW
    room: int  # how many more requests the group may have in flight (cap minus in flight)


class SharePolicy:
    """Base of sharing policies.

    A share is a fraction of the drives' time. The shipped turn policy hands out whole tapes (one
    mount each) in turn, to the user whose drive time held (planned or on the drives), with
    that mount added, is the smallest for their weight (policies/turns.py); drive_weights() gives those weights. A
    site's policy need only write allocate(): its weights are then the split allocate() makes
    of a large number of slots between users who could each take them all."""

    name = ""
    # Slots handed to allocate() to read a policy's proportions from it: large enough that
    # rounding to whole slots moves no weight by more than a millionth.
    WEIGHT_SLOTS = 10**6

    def allocate(self, demands: list[UserDemand], groups: dict[int, GroupLimit], slots: int) -> dict[int, int]:
        """user id -> slots granted this cycle (users granted 0 may be omitted)."""
        raise NotImplementedError

    def drive_weights(self, demands: list[UserDemand], groups: dict[int, GroupLimit]) -> dict[int, float]:
        """user id -> the weight of the user's claim on drive time, for the users of `demands`
        (only their relative sizes matter; a user missing or at 0 gets turns only when nobody
        else can take one). Caps do not enter: they bound what is in flight elsewhere."""
        unbounded = [UserDemand(d.user, d.group, self.WEIGHT_SLOTS, self.WEIGHT_SLOTS) for d in demands]
        open_groups = {g: GroupLimit(weight=limit.weight, room=self.WEIGHT_SLOTS * max(1, len(demands)))
                       for g, limit in groups.items()}
        granted = self.allocate(unbounded, open_groups, self.WEIGHT_SLOTS)
        return {d.user: float(granted.get(d.user, 0)) for d in demands}


class _ByGroup(SharePolicy):
    """Split the slots between groups by the subclass's rule, then equally between the users
    of each group."""

    def allocate(self, demands, groups, slots):
        teams = _teams(demands, groups)
        granted = {}
        for team, grant in zip(teams, self.group_grants(teams, max(0, slots))):
            for user, n in zip(team.users, water_fill(team.caps, grant)):
                if n:
                    granted[user] = n
        return granted

    def group_grants(self, teams, slots):
        """Slots per team (list of _Team, in tie-break order), none above its capacity."""
        raise NotImplementedError


class Equal(_ByGroup):
    """Every user with pending work gets the same share; groups only cap it with their room."""

    name = "EQUAL"

    def group_grants(self, teams, slots):
        capacities = [team.capacity for team in teams]
        if sum(capacities) <= slots:
            return capacities
        # The highest level L at which every user may take min(its cap, L) within its group's room.
        low, high = 0, max(max(team.caps) for team in teams)
        while low < high:
            level = (low + high + 1) // 2
            if sum(team.at_level(level) for team in teams) <= slots:
                low = level
            else:
                high = level - 1
        grants = [team.at_level(low) for team in teams]
        left = slots - sum(grants)
        # The rest, one more each to the users above the level, lowest id first; fewer than
        # them remain, or L + 1 would have fitted.
        above = sorted((user, i) for i, team in enumerate(teams) for user, cap in zip(team.users, team.caps)
                       if cap > low)
        for _, i in above:
            if left == 0:
                break
            if grants[i] < capacities[i]:
                grants[i] += 1
                left -= 1
        return grants


class Group(_ByGroup):
    """Equal between groups, then equal between the users of a group."""

    name = "GROUP"

    def group_grants(self, teams, slots):
        return water_fill([team.capacity for team in teams], slots)


class GroupWeighted(_ByGroup):
    """Groups in proportion to their weight, then equal between the users of a group."""

    name = "GRPW"

    def group_grants(self, teams, slots):
        return water_fill([team.capacity for team in teams], slots, [team.weight for team in teams])


def water_fill(capacities, slots, weights=None):
    """Split `slots` whole units in proportion to `weights` (equal if None), none above its
    capacity, what a capped one cannot take going to the others. Each gets its exact share
    min(capacity, level * weight) rounded down or up by largest remainder, ties to the earlier
    in the list. Exact arithmetic, so float weights cannot tip a rounding."""
    if sum(capacities) <= slots:
        return list(capacities)
    n = len(capacities)
    if weights is None:
        weights = [1] * n
        order = sorted(range(n), key=capacities.__getitem__)
    else:
        exact = [Fraction(w) for w in weights]
        scale = lcm(*(w.denominator for w in exact))
        weights = [int(w * scale) for w in exact]
        order = sorted(range(n), key=lambda i: Fraction(capacities[i], weights[i]))
    grants = [0] * n
    left, weight_left = slots, sum(weights)
    # Fill the smallest capacities (per weight) while they fit under the current level,
    # left / weight_left; filling one only raises the level for the rest.
    for k, i in enumerate(order):
        if capacities[i] * weight_left > left * weights[i]:
            break
        grants[i] = capacities[i]
        left -= capacities[i]
        weight_left -= weights[i]
    open_ = order[k:]  # not empty: the capacities add up to more than the slots
    remainders = {}
    for i in open_:
        grants[i], remainders[i] = divmod(left * weights[i], weight_left)
    extra = left - sum(grants[i] for i in open_)
    for i in sorted(open_, key=lambda i: (-remainders[i], i))[:extra]:
        grants[i] += 1
    return grants


class _Team:
    """The users drawing on one group's share, lowest id first."""

    def __init__(self, users, caps, room, weight):
        self.users = users
        self.caps = caps  # min(pending, room) per user
        self.weight = weight
        self.capacity = sum(caps) if room is None else min(room, sum(caps))
        self._sorted = sorted(caps)
        self._sums = list(accumulate(self._sorted, initial=0))

    def at_level(self, level):
        """What the users take when each may have up to `level`, within the group's room."""
        below = bisect_right(self._sorted, level)
        return min(self.capacity, self._sums[below] + level * (len(self._sorted) - below))


def _teams(demands, groups):
    members = {}
    for d in sorted(demands, key=lambda d: d.user):
        members.setdefault(d.group, []).append(d)
    teams = []
    for group in sorted(members, key=lambda g: (g is not None, g)):
        limit = groups.get(group) if group is not None else None
        users = members[group]
        teams.append(_Team(users=[d.user for d in users], caps=[max(0, min(d.pending, d.room)) for d in users],
                           room=None if limit is None else max(0, limit.room),
                           weight=1 if limit is None else limit.weight))
    return teams
