import threading
from datetime import timedelta

import pytest
from django.db import connections

from carousel.loop.claiming import claim_jobs
from carousel.loop.cycle import run_cycle
from carousel.models import Control, RestoreRequest, TapeBacklog, UserBacklog
from carousel.domain.services import restore_submit
from policies.selection import share_policy, sort_policy
from tests.site_plugins import MapStager

SORTS = ["NONE", "TAPEID", "SLIDER"]
SHARES = ["EQUAL", "GROUP", "GRPW"]
GB = 10**9


def control(**fields):
    defaults = {"files_per_job": 5, "jobs_in_flight": 1, "mount_min_files": 1, "max_wait_s": 3600}
    Control.objects.update_or_create(id=1, defaults={**defaults, **fields})
    return Control.get()


def sent_paths(stager):
    return [p for job in stager.sent for p in job.paths]


def submit_at(user, when, paths, **kw):
    restore_submit(user=user, now=when, paths=paths, **kw)


@pytest.mark.parametrize("sort", SORTS)
@pytest.mark.parametrize("share", SHARES)
def test_every_policy_pair_runs_a_cycle(alice, charlie, now, sort, share):
    control(sort_policy=sort, share_policy=share, files_per_job=5, jobs_in_flight=2)
    submit_at(alice, now, [f"/a/{i}" for i in range(10)])
    submit_at(charlie, now, [f"/c/{i}" for i in range(10)])
    stager = MapStager({f"/{u}/{i}": (f"T{u}{i % 2}", i * GB) for u in "ac" for i in range(10)})
    report = run_cycle(now=now, stager=stager)
    assert report.error == "" and report.submitted == 10
    assert RestoreRequest.objects.filter(state="submitted").count() == 10
    # both users got turns in the 10 slots
    users = set(RestoreRequest.objects.filter(state="submitted").values_list("user__username", flat=True))
    assert users == {"alice", "charlie"}


def test_none_is_first_in_first_out(alice, now):
    control(sort_policy="NONE", files_per_job=1, jobs_in_flight=2)
    for i in range(4):
        submit_at(alice, now + timedelta(seconds=i), [f"/f/{i}"])
    stager = MapStager({f"/f/{i}": (f"T{i}", 0) for i in range(4)})
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert sorted(sent_paths(stager)) == ["/f/0", "/f/1"]


def test_tapeid_sends_the_tape_with_most_demand_first_in_read_order(alice, now):
    control(sort_policy="TAPEID", files_per_job=3, jobs_in_flight=1)
    submit_at(alice, now, ["/x/old"])  # oldest, alone on its tape
    paths = [f"/y/{i}" for i in range(3)]
    submit_at(alice, now + timedelta(seconds=5), paths)
    where = {"/x/old": ("TX", 0)}
    where.update({p: ("TY", (3 - i) * GB) for i, p in enumerate(paths)})
    stager = MapStager(where)
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert [job.paths for job in stager.sent] == [["/y/2", "/y/1", "/y/0"]]  # by position on TY


def test_slider_takes_the_oldest_and_its_tape_comes_along(alice, now):
    control(sort_policy="SLIDER", files_per_job=3, jobs_in_flight=1, policy_params={"slider_age_weight": 0.9})
    submit_at(alice, now, ["/old/a"])
    submit_at(alice, now + timedelta(seconds=100), ["/new/1", "/new/2", "/new/3", "/old/b"])
    stager = MapStager({"/old/a": ("TO", 0), "/old/b": ("TO", GB), "/new/1": ("TN", 0), "/new/2": ("TN", GB),
                        "/new/3": ("TN", 2 * GB)})
    run_cycle(now=now + timedelta(seconds=200), stager=stager)
    assert sent_paths(stager)[:2] == ["/old/a", "/old/b"]


@pytest.mark.parametrize("sort", SORTS)
def test_a_lone_old_request_is_not_left_behind(alice, now, sort):
    # A busy tape keeps winning on demand; the lone file's tape is not worth mounting (M=5).
    control(sort_policy=sort, files_per_job=2, jobs_in_flight=1, mount_min_files=5, mount_max_wait_s=7200,
            max_wait_s=3600)
    submit_at(alice, now, ["/lone"])
    busy = [f"/busy/{i}" for i in range(50)]
    submit_at(alice, now + timedelta(seconds=1), busy)
    stager = MapStager({"/lone": ("TLONE", 0), **{p: ("TBUSY", i * GB) for i, p in enumerate(busy)}})
    run_cycle(now=now + timedelta(minutes=30), stager=stager)
    assert "/lone" not in sent_paths(stager)
    RestoreRequest.objects.filter(state="submitted").update(state="done", finished_at=now, job=None)
    run_cycle(now=now + timedelta(seconds=3600), stager=stager)  # the lone file reached max wait
    assert "/lone" in sent_paths(stager)


def test_higher_priority_goes_first_within_a_users_queue(alice, now):
    control(sort_policy="TAPEID", files_per_job=1, jobs_in_flight=1)
    submit_at(alice, now, [f"/p/{i}" for i in range(5)])
    submit_at(alice, now + timedelta(seconds=1), ["/urgent"], priority=3)
    stager = MapStager({"/urgent": ("TU", 0), **{f"/p/{i}": ("TP", i * GB) for i in range(5)}})
    run_cycle(now=now + timedelta(seconds=2), stager=stager)
    assert sent_paths(stager) == ["/urgent"]


def test_a_tape_waits_until_it_is_worth_mounting(alice, now):
    control(mount_min_files=3, mount_max_wait_s=600, max_wait_s=7200)
    submit_at(alice, now, ["/w/1", "/w/2"])
    stager = MapStager({"/w/1": ("TW", 0), "/w/2": ("TW", GB), "/w/3": ("TW", 2 * GB), "/v/1": ("TV", 0)})
    run_cycle(now=now, stager=stager)
    assert stager.sent == []  # two files: not yet
    submit_at(alice, now, ["/w/3", "/v/1"])
    run_cycle(now=now + timedelta(seconds=1), stager=stager)
    assert sorted(sent_paths(stager)) == ["/w/1", "/w/2", "/w/3"]  # three files: worth it; TV waits
    run_cycle(now=now + timedelta(seconds=601), stager=stager)
    assert "/v/1" in sent_paths(stager)  # its oldest request waited T


@pytest.mark.parametrize("share", SHARES)
def test_caps_are_never_exceeded(alice, bob, charlie, now, share):
    control(share_policy=share, files_per_job=10, jobs_in_flight=10, default_group_cap=7)
    alice.account.inflight_cap = 3
    alice.account.save()
    for user in (alice, bob, charlie):
        submit_at(user, now, [f"/{user.username}/{i}" for i in range(30)])
    stager = MapStager()
    for k in range(3):
        run_cycle(now=now + timedelta(seconds=k), stager=stager)
        flying = RestoreRequest.objects.filter(state__in=["submitted", "staging"])
        assert flying.filter(user=alice).count() <= 3
        assert flying.filter(group__name="analysis").count() <= 7
        assert flying.filter(group__name="production").count() <= 7
    assert RestoreRequest.objects.filter(state__in=["submitted", "staging"], user=alice).count() == 3


def on_tapes(users, per_tape, tapes):
    """A MapStager putting each user's files, `per_tape` to a tape, on tapes of their own."""
    return MapStager({f"/{u}/{i}": (f"T{u}{i // per_tape}", (i % per_tape) * GB)
                      for u in users for i in range(per_tape * tapes)})


def test_equal_gives_users_turns_of_whole_tapes(alice, charlie, now):
    control(share_policy="EQUAL", sort_policy="TAPEID", files_per_job=5, jobs_in_flight=2)
    submit_at(alice, now, [f"/a/{i}" for i in range(50)])
    submit_at(charlie, now, [f"/c/{i}" for i in range(50)])
    stager = on_tapes("ac", 5, 10)
    run_cycle(now=now, stager=stager)
    # One tape (one mount of equal drive time) each, whole.
    assert sorted(len(job.paths) for job in stager.sent) == [5, 5]
    assert {job.paths[0][1] for job in stager.sent} == {"a", "c"}


def test_grpw_gives_turns_in_drive_time_by_group_weight(alice, charlie, now):
    from carousel.models import GroupShare

    GroupShare.objects.filter(group__name="production").update(weight=3)
    control(share_policy="GRPW", sort_policy="TAPEID", files_per_job=4, jobs_in_flight=2)
    submit_at(alice, now, [f"/a/{i}" for i in range(50)])
    submit_at(charlie, now, [f"/c/{i}" for i in range(50)])
    run_cycle(now=now, stager=on_tapes("ac", 2, 25))
    flying = RestoreRequest.objects.filter(state="submitted")
    # Three of charlie's tapes for one of alice's: equal tapes, so three times the drive time.
    assert flying.filter(user=charlie).count() == 6 and flying.filter(user=alice).count() == 2


def test_the_first_round_of_mounts_already_follows_the_weights(alice, charlie, now):
    """Turns go by the drive time held once the mount is read (weighted fair queueing), not
    before it: otherwise every user with work takes a drive in the first round, whatever their
    weight, and on real tapes that round lasts an hour or more."""
    from carousel.models import GroupShare

    GroupShare.objects.filter(group__name="production").update(weight=5)
    control(share_policy="GRPW", sort_policy="TAPEID", files_per_job=2, jobs_in_flight=4)
    submit_at(alice, now, [f"/a/{i}" for i in range(20)])
    submit_at(charlie, now, [f"/c/{i}" for i in range(20)])
    run_cycle(now=now, stager=on_tapes("ac", 2, 10))
    flying = RestoreRequest.objects.filter(state__in=["submitted", "planned"])
    # Four mounts of equal drive time T: charlie's would end at T/5, 2T/5, 3T/5 and 4T/5 per unit
    # of his weight, alice's first at T. All four are charlie's.
    assert flying.filter(user=charlie).count() == 8 and flying.filter(user=alice).count() == 0


def test_drive_time_held_counts_against_the_next_turns(alice, charlie, now):
    """A user whose mounts are planned or on the drives waits while the other catches up: the
    share is of drive time held, not of one cycle's slots."""
    from carousel.loop.locating import locate_requests

    ctl = control(share_policy="EQUAL", sort_policy="TAPEID", files_per_job=5, jobs_in_flight=4)
    stager = on_tapes("ac", 5, 10)
    submit_at(alice, now, [f"/a/{i}" for i in range(50)])
    locate_requests(now=now, stager=stager, limit=1000)
    sort, share = sort_policy("TAPEID"), share_policy("EQUAL")
    claim_jobs(now=now, control=ctl, sort=sort, share=share, jobs_limit=2)  # alice alone: two tapes
    submit_at(charlie, now, [f"/c/{i}" for i in range(50)])
    locate_requests(now=now, stager=stager, limit=1000)
    jobs = claim_jobs(now=now + timedelta(seconds=10), control=ctl, sort=sort, share=share, jobs_limit=4)
    # Ten new slots: charlie's two tapes catch up with the two alice holds.
    assert sorted(p[1] for job in jobs for p in job.paths) == ["c"] * 10
    flying = RestoreRequest.objects.filter(state="submitted")
    assert flying.filter(user=charlie).count() == 10 and flying.filter(user=alice).count() == 10


def test_a_site_policy_named_in_settings_is_picked_up(alice, now, settings):
    settings.CAROUSEL_SORT_POLICIES = {**settings.CAROUSEL_SORT_POLICIES, "NEWEST": "tests.site_plugins.Newest"}
    control(sort_policy="NEWEST", files_per_job=1, jobs_in_flight=1)
    for i in range(3):
        submit_at(alice, now + timedelta(seconds=i), [f"/n/{i}"])
    stager = MapStager()
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert sent_paths(stager) == ["/n/2"]


def test_a_policy_name_that_no_longer_resolves_stops_scheduling_cleanly(alice, now):
    control(sort_policy="GONE")
    submit_at(alice, now, ["/a"])
    stager = MapStager()
    report = run_cycle(now=now, stager=stager)
    assert stager.sent == [] and "'GONE' is not in CAROUSEL_SORT_POLICIES" in report.error
    assert "scheduling stopped" in Control.get().last_cycle_error


def test_backlog_counters_match_a_recount(alice, bob, now):
    control(files_per_job=3, jobs_in_flight=1)
    submit_at(alice, now, [f"/a/{i}" for i in range(10)])
    submit_at(bob, now, [f"/b/{i}" for i in range(4)])
    stager = MapStager({f"/{u}/{i}": (f"T{i % 3}", i * GB) for u in "ab" for i in range(10)})
    run_cycle(now=now, stager=stager)
    RestoreRequest.objects.filter(path="/a/9").update(state="cancelled", finished_at=now)
    RestoreRequest.objects.filter(path="/b/3").delete()
    for user in (alice, bob):
        ready = RestoreRequest.objects.filter(user=user, state="queued", tape__isnull=False)
        assert UserBacklog.objects.get(user=user).files == ready.count()
        for tb in TapeBacklog.objects.filter(user=user):
            assert tb.files == ready.filter(tape=tb.tape).count()


def test_two_concurrent_claims_never_send_the_same_request(transactional_db, alice, now):
    control(files_per_job=50, jobs_in_flight=4)
    submit_at(alice, now, [f"/c/{i}" for i in range(400)])
    run_cycle(now=now, stager=MapStager())  # locates and sends the first 200
    RestoreRequest.objects.filter(state="submitted").update(state="done", finished_at=now)
    ctl = Control.get()
    results, barrier = [], threading.Barrier(2)

    def claim():
        barrier.wait()
        results.append(claim_jobs(now=now, control=ctl, sort=sort_policy("TAPEID"), share=share_policy("EQUAL")))
        connections.close_all()

    threads = [threading.Thread(target=claim) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    paths = [p for jobs in results for job in jobs for p in job.paths]
    assert len(paths) == len(set(paths)) and len(paths) > 0
    assert RestoreRequest.objects.filter(state="submitted").count() == len(paths)


@pytest.mark.parametrize("sort", ["TAPEID", "SLIDER"])
def test_a_tape_is_not_cut_where_the_allotment_ends(alice, now, sort):
    """4 slots, tapes of 3 and 2 files: the first tape goes whole, the second waits for a cycle
    where it fits whole instead of going half now and half in a second mount."""
    control(sort_policy=sort, files_per_job=4, jobs_in_flight=1)
    where = {f"/a/{i}": ("TA", i * GB) for i in range(3)}
    where.update({f"/b/{i}": ("TB", i * GB) for i in range(2)})
    submit_at(alice, now, list(where))
    stager = MapStager(where)
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert sorted(sent_paths(stager)) == ["/a/0", "/a/1", "/a/2"]


def test_a_tape_bigger_than_the_allotment_still_goes(alice, now):
    control(sort_policy="TAPEID", files_per_job=4, jobs_in_flight=1)
    where = {f"/a/{i}": ("TA", i * GB) for i in range(6)}
    submit_at(alice, now, list(where))
    stager = MapStager(where)
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert len(sent_paths(stager)) == 4


def test_an_overdue_backlog_still_goes_tape_by_tape(alice, now):
    """Everything overdue (a bulk submission hours ago): the oldest rule keeps its order by
    tape, not by id across all the tapes."""
    control(sort_policy="TAPEID", files_per_job=4, jobs_in_flight=1, max_wait_s=3600)
    where = {f"/m/{i}": (f"T{i % 4}", (i // 4) * GB) for i in range(16)}  # ids interleave the tapes
    submit_at(alice, now, list(where))
    stager = MapStager(where)
    run_cycle(now=now + timedelta(hours=5), stager=stager)
    assert len(stager.sent) == 1 and len(stager.sent[0].paths) == 4
    assert len({where[p][0] for p in stager.sent[0].paths}) == 1  # one tape, whole


def test_a_tape_two_users_want_is_chosen_whole_in_one_turn(alice, charlie, bob, now):
    """Alice's turn on a tape takes bob's ready files on it too (within his cap): the tape is
    mounted once, not once per user's turn, possibly hours apart."""
    control(share_policy="EQUAL", sort_policy="TAPEID", files_per_job=10, jobs_in_flight=1, choose_per_cycle=8)
    # Tape S: 4 of alice's files and 4 of bob's; charlie's 8 on tape C. Alice's turn comes
    # first (lowest id), then charlie's (created before bob), whose whole tape does not fit
    # in what is left of the cycle's 8 (and files stay in flight here: no room after).
    where = {**{f"/a/{i}": ("S", i * GB) for i in range(4)}, **{f"/b/{i}": ("S", (10 + i) * GB) for i in range(4)},
             **{f"/c/{i}": ("C", i * GB) for i in range(8)}}
    submit_at(alice, now, [f"/a/{i}" for i in range(4)])
    submit_at(bob, now, [f"/b/{i}" for i in range(4)])
    submit_at(charlie, now, [f"/c/{i}" for i in range(8)])
    stager = MapStager(where)
    for k in range(3):
        run_cycle(now=now + timedelta(seconds=k), stager=stager)
    on_s = [job for job in stager.sent if where[job.paths[0]][0] == "S"]
    assert len(on_s) == 1
    assert sorted(on_s[0].paths) == sorted([*(f"/a/{i}" for i in range(4)), *(f"/b/{i}" for i in range(4))])
