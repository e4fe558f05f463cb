"""Claiming writes each request's job and place in it with UPDATEs that join a list of (file,
job, rank) (carousel/infra/db.py update_joined): a file must get the job and the rank it is sent
with, whoever asked for it, and the claim must stamp the request as a transition does."""
import random
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection

from carousel.infra import db
from carousel.loop.claiming import claim_jobs
from carousel.loop.locating import locate_requests
from carousel.loop.cycle import run_cycle
from carousel.models import Control, Job, JobState, RestoreRequest, Transition
from carousel.loop.mounts import MOUNTS_AHEAD, MountPlanner
from carousel.domain.services import request_claim, request_transition, restore_submit
from carousel.tape import GB
from policies.selection import share_policy, sort_policy
from tests.test_plan import library_stager, run_until


@pytest.fixture
def control(db):
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 3, "jobs_in_flight": 3, "sort_policy": "TAPEID",
                                                     "share_policy": "EQUAL", "mount_min_files": 1})
    return Control.get()


def test_each_claimed_request_gets_the_job_and_the_rank_its_file_is_sent_with(control, now, alice, bob):
    # Two tapes of 7 files each whose places on tape are shuffled against their names, asked
    # for in another shuffled order: each tape's files are cut into several jobs of 3, and a
    # job's files interleave with the other jobs' in the order of the keys and of the rows.
    rng = random.Random(7)
    tapes = {}
    for label in ("T1", "T2"):
        offsets = rng.sample(range(40), 7)
        tapes[label] = [(f"/d/{label}/f{i}", offsets[i] * 100 * GB, 5 * GB) for i in range(7)]
    paths = [p for entries in tapes.values() for p, _, _ in entries]
    rng.shuffle(paths)
    restore_submit(user=alice, paths=paths, now=now)
    # Bob asks for some of the same files: his requests ride along in alice's jobs.
    restore_submit(user=bob, paths=paths[::2], now=now)
    stager, _ = library_stager(2, tapes)
    locate_requests(now=now, stager=stager, limit=100, control=control)
    specs = claim_jobs(now=now, control=control, sort=sort_policy("TAPEID"), share=share_policy("EQUAL"),
                       drives=MountPlanner.from_status(stager.status(), control))
    jobs_of_tape = Counter(Job.objects.get(id=s.id).tape_id for s in specs)
    assert max(jobs_of_tape.values()) >= 2  # two jobs on one tape at least
    assert any(len(s.paths) > 1 for s in specs)

    sent = {path: (spec.id, rank) for spec in specs for rank, path in enumerate(spec.paths)}
    for r in RestoreRequest.objects.all():
        if r.path in sent:
            assert (str(r.job_id), r.job_rank) == sent[r.path], r.path
            assert r.state == "submitted" and r.attempts == 1
            assert r.submitted_at == now and r.updated_at == now
            assert list(r.transitions.values_list("from_state", "to_state")) == [("queued", "submitted")]
        else:  # not chosen this cycle (the window is N x K files): untouched
            assert r.state == "queued" and r.job_id is None and r.attempts == 0 and not r.transitions.exists()
    assert RestoreRequest.objects.filter(user=bob, state="submitted").exists()
    assert RestoreRequest.objects.filter(state="queued").exists()


def test_a_joined_transition_moves_only_the_listed_requests_the_transition_allows(control, now, alice, bob):
    restore_submit(user=alice, paths=["/d/a", "/d/b", "/d/c"], now=now)
    restore_submit(user=bob, paths=["/d/b"], now=now)
    a, b, c = (RestoreRequest.objects.get(user=alice, path=p) for p in ("/d/a", "/d/b", "/d/c"))
    job1, job2 = Job.objects.create(created_at=now), Job.objects.create(created_at=now)
    # a already left the queue: SUBMITTED is not allowed from where it is.
    request_transition(RestoreRequest.objects.filter(id=a.id), "cancelled", now=now)
    moved = request_claim([(a.path_key, job1.id, 0), (b.path_key, job2.id, 5)], now=now)
    assert moved == 2  # alice's and bob's b
    assert set(RestoreRequest.objects.filter(job=job2).values_list("user__username", "job_rank", "state",
                                                                    "attempts")) == {
        ("alice", 5, "submitted", 1), ("bob", 5, "submitted", 1)}
    assert set(RestoreRequest.objects.filter(job=job2).values_list("submitted_at", "updated_at")) == {(now, now)}
    a.refresh_from_db()
    c.refresh_from_db()
    assert a.state == "cancelled" and a.job_id is None
    assert c.state == "queued" and c.job_id is None
    assert Transition.objects.filter(to_state="submitted").count() == 2


def test_update_joined_matches_on_every_key_field(control, now):
    # The chains' links: a job is relinked only where both its chain and the job it follows match.
    old, new = Job.objects.create(created_at=now), Job.objects.create(created_at=now)
    same = Job.objects.create(created_at=now, chain="LTO-8/0", after=old)
    other_chain = Job.objects.create(created_at=now, chain="LTO-8/1", after=old)
    assert db.update_joined(Job, [("LTO-8/0", old.id, new.id)], on=("chain", "after_id"), columns=("after_id",)) == 1
    same.refresh_from_db()
    other_chain.refresh_from_db()
    assert same.after_id == new.id and other_chain.after_id == old.id
    assert db.update_joined(Job, [], on=("chain",), columns=("after_id",)) == 0


def test_update_joined_changes_only_the_rows_its_conditions_keep(control, now):
    old, new = Job.objects.create(created_at=now), Job.objects.create(created_at=now)
    later = now + timedelta(seconds=1)
    kept = Job.objects.create(created_at=now, chain="c", after=old, state=JobState.PENDING)
    sent = Job.objects.create(created_at=now, chain="c", after=old, state=JobState.SENT, sent_at=now)
    this_cycle = Job.objects.create(created_at=later, chain="c", after=old, state=JobState.PENDING)
    assert db.update_joined(Job, [("c", old.id, new.id)], on=("chain", "after_id"), columns=("after_id",),
                            where={"state": [JobState.PENDING, JobState.FAILED]}, exclude={"created_at": later},
                            assign={"rank": 7}) == 1
    kept.refresh_from_db()
    sent.refresh_from_db()
    this_cycle.refresh_from_db()
    assert (kept.after_id, kept.rank) == (new.id, 7)
    assert sent.after_id == this_cycle.after_id == old.id
    assert db.update_joined(Job, [("c", new.id, old.id)], on=("chain", "after_id"), columns=("after_id",),
                            where={"state": []}) == 0


def test_short_mounts_put_first_keep_each_drive_a_single_line_of_jobs(control, now, alice, bob):
    # One drive: alice's long mounts fill its chain, one on the drive and one waiting; then two
    # short mounts of bob's in one cycle go before the waiting one. The chain must stay a line:
    # the drive's mount, bob's two, then alice's waiting mount (each job followed by one job at
    # most), which takes several relinks resolved together in one UPDATE.
    Control.objects.filter(id=1).update(files_per_job=10, jobs_in_flight=3, choose_per_cycle=20, short_mount_s=300,
                                        preempt_after_s=0)
    long_tapes = {f"L{t}": [(f"/d/L{t}/f{i}", i * 200 * GB, 20 * GB) for i in range(10)] for t in range(4)}
    stager, clock = library_stager(1, {**long_tapes, "S1": [("/d/S1/one", 0, 2 * GB)],
                                       "S2": [("/d/S2/one", 0, 2 * GB)]})
    restore_submit(user=alice, paths=[p for entries in long_tapes.values() for p, _, _ in entries], now=now)
    run_cycle(now=now, stager=stager)
    first = set(Job.objects.values_list("id", flat=True))
    waiting = set(Job.objects.filter(state=JobState.PENDING).values_list("id", flat=True))
    assert len(first) == 2 and len(waiting) == 1
    clock[0] = 10.0
    later = now + timedelta(seconds=10)
    restore_submit(user=bob, paths=["/d/S1/one", "/d/S2/one"], now=later)
    run_cycle(now=later, stager=stager)
    jobs = {j.id: j for j in Job.objects.all()}
    shorts = [j for j in jobs.values() if j.jumps_queue]
    assert len(shorts) == 2
    followers = Counter(j.after_id for j in jobs.values() if j.after_id)
    assert max(followers.values()) == 1  # a line, not a fork
    (head,) = [j for j in jobs.values() if j.state == JobState.SENT]
    line, current = [head.id], head.id
    following = {j.after_id: j.id for j in jobs.values() if j.after_id}
    while current in following:
        current = following[current]
        line.append(current)
    assert set(line) == set(jobs)
    # Bob's two right after the drive's mount, alice's waiting one after them.
    assert {jobs[j].jumps_queue for j in line[1:3]} == {True}
    assert line[3] in waiting


def test_with_more_work_than_the_window_each_drive_gets_its_mount_and_the_next_only(control, now, alice, bob):
    # Two drives, 25 whole tapes of alice's waiting, a window of 200 files (20 tapes): the
    # cycle lays out MOUNTS_AHEAD mounts per drive, not 20 tapes whose turns would be fixed
    # hours ahead. Bob's single file still goes at once, as a
    # short mount, although no drive wants another long one.
    Control.objects.filter(id=1).update(files_per_job=10, jobs_in_flight=20, choose_per_cycle=200, short_mount_s=300,
                                        preempt_after_s=0)
    long_tapes = {f"L{t:02d}": [(f"/d/L{t:02d}/f{i}", i * 200 * GB, 20 * GB) for i in range(10)] for t in range(25)}
    stager, clock = library_stager(2, {**long_tapes, "S1": [("/d/S1/one", 0, 2 * GB)]})
    restore_submit(user=alice, paths=[p for entries in long_tapes.values() for p, _, _ in entries], now=now)
    run_cycle(now=now, stager=stager)
    each = {"LTO-8/0": MOUNTS_AHEAD, "LTO-8/1": MOUNTS_AHEAD}
    assert Job.objects.values("tape_id").distinct().count() == 2 * MOUNTS_AHEAD
    assert Counter(Job.objects.values_list("chain", flat=True)) == each

    clock[0] = 10.0
    later = now + timedelta(seconds=10)
    restore_submit(user=bob, paths=["/d/S1/one"], now=later)
    run_cycle(now=later, stager=stager)
    assert Job.objects.filter(jumps_queue=True).count() == 1
    assert RestoreRequest.objects.get(user=bob).state in {"submitted", "staging"}
    assert Job.objects.filter(jumps_queue=False).values("tape_id").distinct().count() == 2 * MOUNTS_AHEAD

    # A drive that finishes its mount gets one more, the turn taken then.
    assert run_until(stager, clock, now, lambda: Job.objects.filter(state=JobState.DONE, jumps_queue=False).exists(),
                     limit=20_000)
    open_long = Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT), jumps_queue=False)
    assert Counter(open_long.values_list("chain", flat=True)) == each


def _tuplestore_nested_loops(plan):
    """Nested loops in an auto_explain plan whose inner side scans a transition table."""
    lines = plan.splitlines()
    found = 0
    for i, line in enumerate(lines):
        if "Nested Loop" in line:
            depth = len(line) - len(line.lstrip(" ->"))
            below = []
            for child in lines[i + 1:]:
                if child.strip() and len(child) - len(child.lstrip(" ->")) <= depth:
                    break
                below.append(child)
            found += sum("Named Tuplestore Scan" in child for child in below) >= 2
    return found


@pytest.mark.django_db(transaction=True)
def test_the_triggers_join_a_large_update_without_a_nested_loop_whatever_the_sessions_first(now):
    # The history and counter triggers join the UPDATE's old and new rows on id; PostgreSQL
    # plans that join once per session. The session's first UPDATE changes no row here, and
    # the claim after it changes 300: their join must not be a nested loop (300 x 300 rows).
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 100})
    alice = User.objects.create_user("alice-fresh")
    restore_submit(user=alice, paths=[f"/d/big/f{i}" for i in range(300)], now=now)
    job = Job.objects.create(created_at=now)
    keys = list(RestoreRequest.objects.values_list("path_key", flat=True))
    connection.close()  # a new session: no plan cached yet
    notices = []
    with connection.cursor() as cursor:
        cursor.connection.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        RestoreRequest.objects.filter(path="/d/none").update(updated_at=now)
        for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                        "auto_explain.log_level = notice"):
            cursor.execute(f"SET {setting}")
        cursor.execute("LOAD 'auto_explain'")
        moved = request_claim([(k, job.id, 0) for k in keys], now=now)
        cursor.execute("SET auto_explain.log_min_duration = -1")
    assert moved == 300
    joins = [n for n in notices if "JOIN old_rows o ON o.id = n.id" in n]
    assert len(joins) >= 3  # history, state counters, usage
    assert sum(_tuplestore_nested_loops(n) for n in joins) == 0
    assert Transition.objects.filter(to_state="submitted").count() == 300


def test_files_many_users_share_take_one_place_each_in_the_window(db, now):
    """The window (N x K files at the stager) counted requests: ten users asking for the same
    20 files held 200 places for 20 files, and nothing else was sent while the stager had room
    for 20 more (a reviewer's finding). A file in a job counts once, however many ask for it."""
    from carousel.loop.cycle import run_cycle
    from tests.conftest import make_user
    from tests.test_loop import ScriptedStager

    Control.objects.update_or_create(id=1, defaults={"files_per_job": 10, "jobs_in_flight": 4})
    stager = ScriptedStager()
    stager.answer = "staging"
    shared = [f"/popular/f{i:02}" for i in range(20)]
    restore_submit(user=make_user("first", "analysis"), paths=shared, now=now)
    run_cycle(now=now, stager=stager)
    for n in range(9):
        restore_submit(user=make_user(f"fan{n}", "analysis"), paths=shared, now=now)
    assert RestoreRequest.objects.filter(state__in=("submitted", "staging")).count() == 200
    late = make_user("late", "production")
    restore_submit(user=late, paths=[f"/other/g{i}" for i in range(10)], now=now)
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert set(RestoreRequest.objects.filter(user=late).values_list("state", flat=True)) == {"submitted"}
