import json
from datetime import timedelta

import pytest
from django.core.checks import run_checks

from carousel.domain.services import restore_submit
from carousel.infra import plugins
from carousel.loop.cycle import run_cycle
from carousel.models import Control
from policies.sharing import Equal, UserDemand
from policies.sorting import Candidate, TapeInfo
from policies.turns import FairTurns, ReadyWork
from tests.site_plugins import MapStager
from tests.test_plugins import settings_from_environment

GB = 10**9


def test_the_shipped_turn_policy_is_fair_turns(settings):
    assert type(plugins.turn_policy()) is FairTurns
    assert plugins.turn_policy() is plugins.turn_policy()


@pytest.mark.parametrize("turn_policy, first", [(None, "alice"), ("tests.site_plugins.LargestBacklogFirst", "bob")])
def test_a_turn_policy_from_outside_the_package_changes_who_goes_first(monkeypatch, settings, alice, bob, now,
                                                                       turn_policy, first):
    """Alice has one tape of 5 files, bob one of 8; a cycle has 10 slots, so one whole tape
    goes. The fair turns give it to alice (the shorter mount ends her turn first); a site's
    policy, named in the environment, gives it to bob (the larger backlog)."""
    if turn_policy:
        fresh = settings_from_environment(monkeypatch, CAROUSEL_TURN_POLICY=turn_policy)
        settings.CAROUSEL_TURN_POLICY = fresh["CAROUSEL_TURN_POLICY"]
    Control.objects.update_or_create(id=1, defaults={"sort_policy": "TAPEID", "share_policy": "EQUAL",
                                                     "files_per_job": 10, "jobs_in_flight": 1, "mount_min_files": 1})
    where = {**{f"/alice/{i}": ("TA", i * GB) for i in range(5)}, **{f"/bob/{i}": ("TB", i * GB) for i in range(8)}}
    restore_submit(user=alice, now=now, paths=[p for p in where if p.startswith("/alice/")])
    restore_submit(user=bob, now=now, paths=[p for p in where if p.startswith("/bob/")])
    stager = MapStager(where)
    report = run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert report.error == ""
    assert [{where[p][0] for p in job.paths} for job in stager.sent] == [{"TA" if first == "alice" else "TB"}]


def test_a_turn_policy_that_does_not_import_stops_scheduling_and_fails_the_check(settings, alice, now):
    settings.CAROUSEL_TURN_POLICIES = {**settings.CAROUSEL_TURN_POLICIES, "site": json.__name__ + ".Nothing"}
    settings.CAROUSEL_TURN_POLICY = "site.nowhere.Turns"
    assert {"carousel.E001", "carousel.E005"} <= {e.id for e in run_checks()}
    Control.objects.update_or_create(id=1, defaults={"mount_min_files": 1})
    restore_submit(user=alice, now=now, paths=["/a"])
    stager = MapStager()
    report = run_cycle(now=now, stager=stager)
    assert stager.sent == [] and "scheduling stopped: CAROUSEL_TURN_POLICY = 'site.nowhere.Turns'" in report.error


class InMemoryWork(ReadyWork):
    """Ready work held in lists: each user's requests already in the sorting policy's order."""

    def __init__(self, queues, tapes, **work):
        super().__init__(**work)
        self.queues, self.every = queues, tapes

    def held_drive_time(self, users):
        return dict.fromkeys(users, 0.0)

    def runs(self, allotments):
        runs = {}
        for user, n in allotments.items():
            for c in self.queues.get(user, [])[:n]:
                tape = self.every[c.tape]
                self.tapes[c.tape] = TapeInfo(id=tape.id, media=tape.media, files=tape.files, bytes=tape.bytes,
                                              oldest_age_s=0.0, user_files={user: tape.user_files[user]})
                if runs.get(user) and runs[user][-1][0].tape == c.tape:
                    runs[user][-1].append(c)
                else:
                    runs.setdefault(user, []).append([c])
        return runs

    def every_user_on(self, tape):
        self.tapes[tape].user_files.update(self.every[tape].user_files)
        return self.tapes[tape].user_files

    def on_tape(self, tape, wanted):
        return [c for user, n in wanted.items() for c in [c for c in self.queues[user] if c.tape == tape][:n]]


def test_fair_turns_take_the_other_users_files_on_a_tape_along_without_a_database():
    """Alice's turn on tape 1 takes bob's two files on it too: one mount, not one per user; then
    bob's own tape 2, then alice's tape 3."""
    def files(user, tape, n):
        return [Candidate(id=user * 100 + tape * 10 + i, user=user, tape=tape, position=i * GB, size=GB, priority=0,
                          age_s=60.0) for i in range(n)]

    queues = {1: files(1, 1, 2) + files(1, 3, 2), 2: files(2, 2, 3) + files(2, 1, 2)}
    counts = {1: {1: 2, 2: 2}, 2: {2: 3}, 3: {1: 2}}
    tapes = {t: TapeInfo(id=t, media="LTO-8", files=sum(c.values()), bytes=0, oldest_age_s=60.0, user_files=c)
             for t, c in counts.items()}
    work = InMemoryWork(queues, tapes, demands=[UserDemand(1, None, 4, 100), UserDemand(2, None, 5, 100)], groups={},
                        in_flight={}, files_per_job=10, share=Equal(), whole_tapes=True)
    chosen = FairTurns().take_turns(work, slots=9, most_slots=9, mounts=None)
    assert [(c.user, c.tape) for c in chosen] == [(1, 1)] * 2 + [(2, 1)] * 2 + [(2, 2)] * 3 + [(1, 3)] * 2
