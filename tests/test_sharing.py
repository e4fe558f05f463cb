"""The sharing policies, on plain data: hand-worked examples, then the rules every policy keeps,
checked by hypothesis on random cycles (up to 60 users in up to 8 groups, up to 2,000 slots)."""
import math
import random
from collections import defaultdict
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.sharing import Equal, Group, GroupLimit, GroupWeighted, SharePolicy, UserDemand, water_fill

POLICIES = [Equal(), Group(), GroupWeighted()]
ALICE, BOB, CHARLIE = 1, 2, 3
MISSING = 99  # a group id the cycles below leave out of `groups`
UNLIMITED = GroupLimit(weight=1, room=math.inf)

examples = settings(max_examples=80, deadline=None)


def demands(**by_user):
    """demands(alice=dict(...), ...) with the three named users."""
    ids = {"alice": ALICE, "bob": BOB, "charlie": CHARLIE}
    return [UserDemand(user=ids[name], group=d.get("group"), pending=d.get("pending", 100), room=d.get("room", 100))
            for name, d in by_user.items()]


def test_every_policy_has_its_settings_name():
    assert [p.name for p in POLICIES] == ["EQUAL", "GROUP", "GRPW"]
    with pytest.raises(NotImplementedError):
        SharePolicy().allocate([], {}, 10)


def test_equal_gives_the_odd_slot_to_the_lowest_id():
    users = demands(alice={"pending": 1}, bob={"pending": 20}, charlie={"pending": 20})
    assert Equal().allocate(users, {}, 10) == {ALICE: 1, BOB: 5, CHARLIE: 4}


def test_equal_respects_the_users_room():
    users = demands(alice={"room": 0}, bob={"room": 2}, charlie={})
    assert Equal().allocate(users, {}, 10) == {BOB: 2, CHARLIE: 8}


def test_equal_gives_what_a_full_group_cannot_take_to_the_others():
    users = demands(alice={"group": 7}, bob={"group": 7}, charlie={})
    assert Equal().allocate(users, {7: GroupLimit(weight=1, room=3)}, 10) == {ALICE: 2, BOB: 1, CHARLIE: 7}


def test_group_is_equal_between_groups_then_between_users():
    users = demands(alice={"group": 7}, bob={"group": 7}, charlie={"group": 8})
    limits = {7: GroupLimit(weight=1, room=100), 8: GroupLimit(weight=1, room=100)}
    assert Group().allocate(users, limits, 10) == {ALICE: 3, BOB: 2, CHARLIE: 5}


def test_ungrouped_users_share_one_group():
    users = demands(alice={}, bob={}, charlie={"group": 8})
    assert Group().allocate(users, {8: GroupLimit(weight=1, room=100)}, 10) == {ALICE: 3, BOB: 2, CHARLIE: 5}


def test_a_group_missing_from_the_limits_has_weight_one_and_no_room_limit():
    users = demands(alice={"group": 7}, charlie={"group": 8})
    assert GroupWeighted().allocate(users, {8: GroupLimit(weight=3, room=100)}, 40) == {ALICE: 10, CHARLIE: 30}


def test_grpw_splits_by_weight_with_largest_remainder():
    users = demands(alice={"group": 7}, bob={"group": 7}, charlie={"group": 8})
    limits = {7: GroupLimit(weight=2, room=100), 8: GroupLimit(weight=1, room=100)}
    # 20/3 and 10/3: the larger remainder (2/3) takes the odd slot.
    assert GroupWeighted().allocate(users, limits, 10) == {ALICE: 4, BOB: 3, CHARLIE: 3}


def test_grpw_gives_what_a_capped_group_cannot_take_to_the_others():
    users = demands(alice={"group": 7, "pending": 2}, charlie={"group": 8})
    limits = {7: GroupLimit(weight=9, room=100), 8: GroupLimit(weight=1, room=100)}
    assert GroupWeighted().allocate(users, limits, 10) == {ALICE: 2, CHARLIE: 8}


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_nothing_to_share_gives_nothing(policy):
    assert policy.allocate([], {}, 10) == {}
    assert policy.allocate(demands(alice={}), {}, 0) == {}
    assert policy.allocate(demands(alice={"pending": 0}, bob={"room": 0}), {}, 10) == {}


def test_water_fill_rounds_weighted_shares_exactly():
    # 0.1 and 0.2 are not exact in binary; the shares must still come out 1:2.
    assert water_fill([100, 100], 30, [0.1, 0.2]) == [10, 20]
    assert water_fill([100, 100, 100], 10, [1, 1, 1]) == [4, 3, 3]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_a_thousand_users_in_ten_groups_get_what_fits(policy):
    """A cycle's size at a busy site: every slot is given while someone can take it, and nobody
    gets more than they asked or have room for. (How long it takes is benchmarks/allocate.py's.)"""
    rng = random.Random(1)
    users = [UserDemand(user=u, group=u % 10, pending=rng.randint(0, 3000), room=rng.randint(0, 500))
             for u in range(1000)]
    limits = {g: GroupLimit(weight=rng.uniform(0.5, 4), room=rng.randint(0, 2000)) for g in range(10)}
    given_out = policy.allocate(users, limits, 750)
    assert sum(given_out.values()) == 750
    for d in users:
        assert 0 <= given_out.get(d.user, 0) <= min(d.pending, d.room)
    per_group = defaultdict(int)
    for d in users:
        per_group[d.group] += given_out.get(d.user, 0)
    assert all(per_group[g] <= limits[g].room for g in limits)


# Random cycles and what the rules say about them.

@st.composite
def cycles(draw):
    # Sizes drawn first: plain lists would stay short, and the interesting cycles are busy ones.
    n_groups, n_users = draw(st.integers(0, 8)), draw(st.integers(0, 60))
    group_ids = draw(st.lists(st.integers(1, 50), unique=True, min_size=n_groups, max_size=n_groups))
    ids = draw(st.randoms(use_true_random=False)).sample(range(1, 10**6), n_users)  # order of ids != order of list
    counts = st.integers(0, 120)
    wants = draw(st.lists(st.tuples(st.sampled_from([None, MISSING, *group_ids]), counts, counts),
                          min_size=n_users, max_size=n_users))
    users = [UserDemand(user=u, group=g, pending=p, room=r) for u, (g, p, r) in zip(ids, wants)]
    limits = {g: GroupLimit(weight=draw(st.floats(0.05, 20)), room=draw(st.integers(0, 400))) for g in group_ids}
    return users, limits, draw(st.integers(0, 2000))


def limit_of(limits, group):
    return limits.get(group, UNLIMITED) if group is not None else UNLIMITED


def cap(user):
    return min(user.pending, user.room)


class Outcome:
    """One allocation and the words the rules use about it."""

    def __init__(self, users, limits, slots, granted):
        self.users, self.limits, self.slots, self.granted = users, limits, slots, granted
        self.members = defaultdict(list)
        for user in users:
            self.members[user.group].append(user)
        self.total = {g: sum(self.got(u) for u in us) for g, us in self.members.items()}

    def got(self, user):
        return self.granted.get(user.user, 0)

    def room(self, group):
        return limit_of(self.limits, group).room

    def capacity(self, group):
        return min(self.room(group), sum(cap(u) for u in self.members[group]))

    def group_saturated(self, group):
        """All its users saturated, or its room used."""
        return self.total[group] == self.capacity(group)

    def user_saturated(self, user):
        return self.got(user) == cap(user)


def assert_equal_among(users, got, saturated):
    """EQUAL: the unsaturated users' grants differ by at most one, and nobody is more than one
    above an unsaturated user."""
    open_ = [got(u) for u in users if not saturated(u)]
    if open_:
        assert max(open_) - min(open_) <= 1
        assert max(got(u) for u in users) <= min(open_) + 1


def handed_out_one_at_a_time(outcome, by_group):
    """The reference for EQUAL (by_group False) and GROUP (by_group True): hand out one slot at a
    time to whoever has least (a user, or for GROUP first a group), ties to the lowest id and the
    ungrouped group first, skipping those that cannot take more."""
    got = defaultdict(int)
    total = defaultdict(int)

    def can_take(user):
        return got[user.user] < cap(user) and total[user.group] < outcome.room(user.group)

    def group_key(g):
        return (g is not None, g or 0)

    for _ in range(outcome.slots):
        candidates = [u for u in outcome.users if can_take(u)]
        if not candidates:
            break
        if by_group:
            group = min({u.group for u in candidates}, key=lambda g: (total[g], group_key(g)))
            candidates = [u for u in candidates if u.group == group]
        user = min(candidates, key=lambda u: (got[u.user], u.user))
        got[user.user] += 1
        total[user.group] += 1
    return {u: n for u, n in got.items() if n}


def weighted_level(outcome):
    """The exact level of GRPW water-filling: each group gets min(capacity, level * weight).
    Found by saturating groups until none more fits; None when every group is saturated."""
    weight = {g: Fraction(limit_of(outcome.limits, g).weight) for g in outcome.members}
    saturated = set()
    while True:
        open_ = [g for g in outcome.members if g not in saturated]
        if not open_:
            return None, weight
        level = Fraction(outcome.slots - sum(outcome.capacity(g) for g in saturated), sum(weight[g] for g in open_))
        newly = {g for g in open_ if outcome.capacity(g) <= level * weight[g]}
        if not newly:
            return level, weight
        saturated |= newly


@given(cycle=cycles())
@examples
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_no_user_or_group_gets_more_than_its_room(policy, cycle):
    users, limits, slots = cycle
    granted = policy.allocate(users, limits, slots)
    outcome = Outcome(users, limits, slots, granted)
    assert set(granted) <= {u.user for u in users}
    assert all(0 <= outcome.got(u) <= cap(u) for u in users)
    assert all(outcome.total[g] <= outcome.room(g) for g in outcome.members)
    assert sum(granted.values()) <= slots


@given(cycle=cycles())
@examples
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_no_slot_stays_empty_while_someone_could_take_it(policy, cycle):
    users, limits, slots = cycle
    outcome = Outcome(users, limits, slots, policy.allocate(users, limits, slots))
    given_out = sum(outcome.granted.values())
    if given_out < slots:
        assert all(outcome.user_saturated(u) or outcome.total[u.group] == outcome.room(u.group) for u in users)
    assert given_out == min(slots, sum(outcome.capacity(g) for g in outcome.members))


@given(cycle=cycles(), seed=st.integers())
@examples
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_the_order_of_demands_does_not_matter(policy, cycle, seed):
    users, limits, slots = cycle
    shuffled = list(users)
    random.Random(seed).shuffle(shuffled)
    assert policy.allocate(shuffled, limits, slots) == policy.allocate(users, limits, slots)


@given(cycle=cycles())
@examples
def test_equal_grants_differ_by_at_most_one(cycle):
    users, limits, slots = cycle
    outcome = Outcome(users, limits, slots, Equal().allocate(users, limits, slots))
    assert_equal_among(users, outcome.got,
                       lambda u: outcome.user_saturated(u) or outcome.total[u.group] == outcome.room(u.group))


@given(cycle=cycles())
@examples
def test_equal_matches_handing_out_one_slot_at_a_time(cycle):
    users, limits, slots = cycle
    outcome = Outcome(users, limits, slots, Equal().allocate(users, limits, slots))
    assert outcome.granted == handed_out_one_at_a_time(outcome, by_group=False)


@given(cycle=cycles())
@examples
def test_group_totals_differ_by_at_most_one(cycle):
    users, limits, slots = cycle
    outcome = Outcome(users, limits, slots, Group().allocate(users, limits, slots))
    open_ = [outcome.total[g] for g in outcome.members if not outcome.group_saturated(g)]
    if open_:
        assert max(open_) - min(open_) <= 1
        assert max(outcome.total.values()) <= min(open_) + 1


@given(cycle=cycles())
@examples
def test_group_matches_handing_out_one_slot_at_a_time(cycle):
    users, limits, slots = cycle
    outcome = Outcome(users, limits, slots, Group().allocate(users, limits, slots))
    assert outcome.granted == handed_out_one_at_a_time(outcome, by_group=True)


@given(cycle=cycles())
@examples
@pytest.mark.parametrize("policy", [Group(), GroupWeighted()], ids=lambda p: p.name)
def test_group_policies_split_equally_between_a_groups_users(policy, cycle):
    users, limits, slots = cycle
    outcome = Outcome(users, limits, slots, policy.allocate(users, limits, slots))
    for members in outcome.members.values():
        assert_equal_among(members, outcome.got, outcome.user_saturated)


@given(cycle=cycles())
@examples
def test_grpw_totals_are_the_weighted_level_rounded_down_or_up(cycle):
    users, limits, slots = cycle
    outcome = Outcome(users, limits, slots, GroupWeighted().allocate(users, limits, slots))
    level, weight = weighted_level(outcome)
    rounded_up, rounded_down = [], []
    for g in outcome.members:
        exact = outcome.capacity(g) if level is None else min(outcome.capacity(g), level * weight[g])
        assert math.floor(exact) <= outcome.total[g] <= math.ceil(exact)
        if outcome.total[g] != exact:
            (rounded_up if outcome.total[g] > exact else rounded_down).append(exact - math.floor(exact))
    # Largest remainder: no share rounded down had a larger fraction than one rounded up.
    if rounded_up and rounded_down:
        assert min(rounded_up) >= max(rounded_down)


@given(cycle=cycles(), weight=st.floats(0.05, 20))
@examples
def test_grpw_with_equal_weights_is_group(cycle, weight):
    users, limits, slots = cycle
    same = {g: GroupLimit(weight=weight, room=limit.room) for g, limit in limits.items()}
    # Ungrouped and missing groups weigh 1, so give everyone a group that is in the limits.
    if not same:
        same = {1: GroupLimit(weight=weight, room=1000)}
    users = [u if u.group in same else UserDemand(user=u.user, group=min(same), pending=u.pending, room=u.room)
             for u in users]
    assert GroupWeighted().allocate(users, same, slots) == Group().allocate(users, same, slots)


# Drive-time weights: the turns of whole mounts (policies/selection.py) follow them.

def relative(weights, users):
    total = sum(weights[u.user] for u in users)
    return {u.user: Fraction(weights[u.user]).limit_denominator(10**7) / total for u in users} if total else {}


@given(cycle=cycles())
@examples
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_drive_weights_are_the_policys_proportions_whatever_the_caps(policy, cycle):
    users, limits, _ = cycle
    weights = policy.drive_weights(users, limits)
    assert set(weights) == {u.user for u in users}
    if not users:
        return
    assert all(w > 0 for w in weights.values())  # caps and empty rooms take no one's turn away
    members = defaultdict(list)
    for u in users:
        members[u.group].append(u)  # a group missing from the limits is a team of weight 1
    share = relative(weights, users)
    groups = {g: sum(share[u.user] for u in us) for g, us in members.items()}
    tolerance = Fraction(1, 10**4)
    for g, us in members.items():
        if policy.name != "EQUAL":  # equal between a group's users
            assert max(share[u.user] for u in us) - min(share[u.user] for u in us) <= tolerance
    if policy.name == "EQUAL":
        assert max(share.values()) - min(share.values()) <= tolerance
    elif policy.name == "GROUP":
        assert max(groups.values()) - min(groups.values()) <= tolerance
    else:
        weight = {g: Fraction(limit_of(limits, g).weight) for g in members}
        total = sum(weight.values())
        for g in members:
            assert abs(groups[g] - weight[g] / total) <= tolerance


def test_a_site_policy_that_only_allocates_gets_drive_weights_from_it():
    from tests.site_plugins import Seniority

    users = [UserDemand(user=u, group=None, pending=p, room=r) for u, p, r in [(1, 5, 0), (2, 500, 500), (3, 9, 9)]]
    weights = Seniority().drive_weights(users, {})
    assert weights[1] == pytest.approx(weights[3], rel=1e-5) and weights[1] == pytest.approx(3 * weights[2], rel=1e-5)
