"""Activities in the turns (policies/turns.py): a priority orders the lanes within a group, not
across groups, and a user's cap holds across their activities' lanes (a reviewer's findings:
each failed before its fix)."""
from datetime import timedelta

import pytest

from carousel.domain.services import restore_submit
from carousel.loop.cycle import run_cycle
from carousel.models import Activity, Control, RestoreRequest
from policies.sharing import GroupLimit, GroupWeighted, UserDemand
from policies.sorting import Candidate, TapeInfo
from policies.turns import FairTurns, Lane
from tests.site_plugins import MapStager
from tests.test_turns import InMemoryWork

GB = 10**9


class HeldWork(InMemoryWork):
    """InMemoryWork with drive time already held per user."""

    def __init__(self, queues, tapes, held, **work):
        super().__init__(queues, tapes, **work)
        self.held = held

    def held_drive_time(self, users):
        return {u: self.held.get(u, 0.0) for u in users}


def _work(priority):
    # users 1 (alice) and 2 (bob) in group 10, user 3 (charlie) in group 20; equal group weights.
    # Each user: 20 tapes of 10 files. Alice and bob already hold some drive time, charlie none.
    queues, counts = {}, {}
    for user in (1, 2, 3):
        queues[user] = []
        for t in range(20):
            tape = user * 100 + t
            counts[tape] = {user: 10}
            queues[user] += [Candidate(id=tape * 100 + i, user=user, tape=tape, position=i * GB, size=GB,
                                       priority=0, age_s=60.0, group=10 if user < 3 else 20,
                                       activity="Express" if user < 3 and priority else "default")
                             for i in range(10)]
    tapes = {t: TapeInfo(id=t, media="LTO-8", files=10, bytes=10 * GB, oldest_age_s=60.0, user_files=c)
             for t, c in counts.items()}
    lanes = {1: [Lane(1, "Express" if priority else "default", 1.0, priority)],
             2: [Lane(2, "Express" if priority else "default", 1.0, priority)],
             3: [Lane(3, "default", 1.0, 0)]}
    return HeldWork(queues, tapes, {1: 5000.0, 2: 5000.0, 3: 0.0},
                    demands=[UserDemand(1, 10, 200, 2500), UserDemand(2, 10, 200, 2500), UserDemand(3, 20, 200, 2500)],
                    groups={10: GroupLimit(weight=1.0, room=5000), 20: GroupLimit(weight=1.0, room=5000)},
                    in_flight={}, files_per_job=100, share=GroupWeighted(), whole_tapes=True, lanes=lanes)


def _chosen_by_user(priority):
    chosen = FairTurns().take_turns(_work(priority), slots=100, most_slots=100, mounts=None)
    by = {}
    for c in chosen:
        by[c.user] = by.get(c.user, 0) + 1
    return by


def test_without_priorities_the_group_with_least_drive_time_goes_first():
    assert _chosen_by_user(0).get(3, 0) > 0


def test_a_priority_activity_in_one_group_does_not_take_the_other_groups_turns():
    # README: "the activities of the highest priority with work to mount take the group's whole
    # share of drive time; the others wait ... (other groups keep their share)".
    assert _chosen_by_user(2).get(3, 0) > 0, _chosen_by_user(2)


@pytest.mark.parametrize("activities", [("",), ("Express", "Bulk")])
def test_a_users_cap_holds_whatever_their_activities(alice, charlie, now, activities):
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 10, "jobs_in_flight": 10})
    Activity.objects.create(group=None, name="Express", priority=0, weight=1)
    Activity.objects.create(group=None, name="Bulk", priority=0, weight=1)
    alice.account.inflight_cap = 20
    alice.account.save()
    where = {}
    for a, name in enumerate(activities):
        paths = [f"/alice/{a}/{i}" for i in range(40 // len(activities))]
        where.update({p: (f"T{a}{i // 10}", (i % 10) * GB) for i, p in enumerate(paths)})
        restore_submit(user=alice, paths=paths, now=now, activity=name)
    stager = MapStager(where)
    for k in range(3):
        run_cycle(now=now + timedelta(seconds=k), stager=stager)
        flying = RestoreRequest.objects.filter(user=alice, state__in=["submitted", "staging"]).count()
        assert flying <= 20, f"alice's cap is 20; {flying} in flight after cycle {k} (activities {activities})"
