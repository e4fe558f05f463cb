"""The mount plan: the pure planner (carousel/loop/plan.py), and the loop laying jobs out on the
drives' chains, sending each when the one before it is done, and cutting a long mount for a
short one that waited (carousel/loop/mounts.py)."""
import math
import random
from datetime import timedelta

import pytest

from carousel.loop import plan
from policies.order import read_order
from carousel.sim import replay
from carousel.sim.library import File, Library
from carousel.loop.cycle import run_cycle
from carousel.models import Control, Job, JobState, RestoreRequest, StagerHealth
from carousel.domain.services import restore_submit
from carousel.stagers.base import StagerUnavailable
from carousel.stagers.simulated import SimulatedStager
from carousel.tape import GB, mount_profile, tape_work_s
from tests.conftest import make_user


def work(tape, media, files, exchange_s=11.0):
    pre, suf = mount_profile(media, files, exchange_s=exchange_s)
    return plan.TapeWork(tape, tuple(range(len(files))), tuple(pre), tuple(suf))


def scattered(rng, n, media_bytes=11_000 * GB, size=10 * GB):
    offsets = sorted(rng.sample(range(0, media_bytes // size - 1), n))
    return [(o * size, size) for o in offsets]


def test_mount_profile_adds_up_to_the_whole_mount():
    files = [(0, 2 * GB), (2 * GB, 3 * GB), (900 * GB, GB), (4_000 * GB, 5 * GB)]
    pre, suf = mount_profile("LTO-8", files, exchange_s=11.0)
    whole = tape_work_s("LTO-8", files) + 22.0
    assert pre[0] == 0 and suf[-1] == 0
    assert pre[-1] == pytest.approx(whole) and suf[0] == pytest.approx(whole)
    assert all(a < b for a, b in zip(pre, pre[1:]))
    assert all(a > b for a, b in zip(suf, suf[1:]))
    # Cut in two, the pieces cost more than the whole: a second mount's fixed costs.
    assert all(pre[k] + suf[k] > whole for k in range(1, len(files)))


def check(ends, tapes, layout, span):
    """Every file planned once; pieces of one tape never overlap in time, never shorter than
    MIN_PIECE_S when cut; the makespan is what the pieces say."""
    seen = {}
    windows = {}
    for chain, pieces in layout.items():
        clock = ends[chain]
        for piece in pieces:
            assert piece.start_s == pytest.approx(clock)
            clock += piece.seconds
            for key in piece.keys:
                assert (piece.tape, key) not in seen
                seen[(piece.tape, key)] = chain
            windows.setdefault(piece.tape, []).append((piece.start_s, piece.start_s + piece.seconds))
        assert clock <= span + 1e-6
    assert set(seen) == {(t.tape, k) for t in tapes for k in t.keys}
    for tape, spans in windows.items():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:])), tape
        if len(spans) > 1:
            assert all(b - a >= plan.MIN_PIECE_S for a, b in spans)


def test_whole_tapes_in_the_order_of_turns_when_more_work_waits():
    """While more work waits, the drives read the tapes in the order the policies chose them
    (the sharing policy's turns), not longest first: a group whose tapes are longer must not
    take the drives first."""
    rng = random.Random(1)
    tapes = [work(f"T{i}", "LTO-7", scattered(rng, 30)) for i in range(21)]
    ends = {f"d{i}": 0.0 for i in range(15)}
    layout, span = plan.plan(ends, tapes, split=False)
    check(ends, tapes, layout, span)
    assert sum(len(p) for p in layout.values()) == 21  # one mount per tape
    # The first 15 in turn start at once, one per drive; the other six go second, each to the
    # drive that frees first, in turn.
    first = {p.tape for ps in layout.values() for p in ps if p.start_s == 0}
    assert first == {t.tape for t in tapes[:15]}
    frees = sorted((ps[0].seconds, ps[0].tape) for ps in layout.values())
    second = {ps[0].tape: ps[1].tape for ps in layout.values() if len(ps) > 1}
    assert [second[tape] for _, tape in frees[:6]] == [t.tape for t in tapes[15:]]


def test_the_last_of_the_backlog_is_never_longer_than_the_order_of_turns():
    """The last of the backlog (split=True) is laid out for the shortest makespan: cut, whole
    longest first, or whole in turn, whichever ends first."""
    rng = random.Random(4)
    tapes = [work(f"T{i}", "LTO-7", scattered(rng, rng.randint(1, 40))) for i in range(8)]
    ends = {"d0": 0.0, "d1": 0.0}
    layout, span = plan.plan(ends, tapes, split=True)
    check(ends, tapes, layout, span)
    _, in_turn = plan.plan(ends, tapes, split=False)
    assert span <= in_turn + 1e-6


def test_the_last_of_the_backlog_is_cut_so_the_drives_finish_together():
    """bnl-704's shape: 21 tapes on 15 drives take two rounds whole; cut, far less."""
    rng = random.Random(2)
    tapes = [work(f"T{i}", "LTO-7", scattered(rng, 33)) for i in range(21)]
    ends = {f"d{i}": 0.0 for i in range(15)}
    _, whole = plan.plan(ends, tapes, split=False)
    layout, span = plan.plan(ends, tapes, split=True)
    check(ends, tapes, layout, span)
    total = sum(t.seconds for t in tapes)
    assert span < 0.8 * whole
    assert span < 1.15 * max(total / 15, max(t.seconds for t in tapes))
    pieces = sum(len(p) for p in layout.values())
    assert 21 < pieces <= 2 * 21  # at most one cut per tape


def test_random_plans_are_valid_and_never_worse_than_whole_tapes():
    rng = random.Random(3)
    for _ in range(60):
        drives = rng.randint(1, 6)
        ends = {f"d{i}": rng.choice([0.0, 0.0, rng.uniform(0, 3000)]) for i in range(drives)}
        tapes = [work(f"T{i}", "LTO-8", scattered(rng, rng.randint(1, 25))) for i in range(rng.randint(1, 12))]
        split = rng.random() < 0.7
        layout, span = plan.plan(ends, tapes, split=split)
        check(ends, tapes, layout, span)
        _, whole = plan.plan(ends, tapes, split=False)
        assert span <= whole + 1e-6


# The loop ------------------------------------------------------------------------------------

def library_stager(drives, tapes, *, start=0.0):
    """A simulated library in replay mode on a clock the test moves; `tapes`: label -> [(path,
    offset, size)]."""
    files = {path: File(path, label, "LTO-8", offset, size)
             for label, entries in tapes.items() for path, offset, size in entries}
    library = Library(drives={"LTO-8": drives}, now=start)
    clock = [start]
    return SimulatedStager(library=library, files=files, clock=lambda: clock[0]), clock


def run_until(stager, clock, now, done, *, limit):
    """Cycle as a replay does, every 10 simulated seconds while something may change and
    skipping the idle stretches (carousel.sim.replay.next_wake), until done() holds or the clock
    passes `limit`."""
    clock[0] += 10
    while clock[0] < limit:
        report = run_cycle(now=now + timedelta(seconds=clock[0]), stager=stager)
        if done():
            return True
        wake = replay.next_wake(report, stager.library, control=Control.get(), now=clock[0], period=10, epoch=now)
        if wake is None:
            return False
        clock[0] = max(clock[0] + 10, math.ceil(wake / 10 - 1e-9) * 10)
    return False


def all_done():
    return not RestoreRequest.objects.exclude(state="done").exists()


@pytest.fixture
def planned(db, now):
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 50, "jobs_in_flight": 10,
                                                     "sort_policy": "TAPEID", "mount_min_files": 1})
    return now


def test_one_mount_per_drive_at_the_stager_and_the_next_when_it_is_done(planned, alice):
    now = planned
    tapes = {f"T{t}": [(f"/d/T{t}/f{i}", i * 200 * GB, 20 * GB) for i in range(12)] for t in range(4)}
    stager, clock = library_stager(2, tapes)
    restore_submit(user=alice, paths=[p for entries in tapes.values() for p, _, _ in entries], now=now)
    run_cycle(now=now, stager=stager)
    jobs = list(Job.objects.order_by("created_at", "rank"))
    assert len(jobs) == 4 and {j.chain for j in jobs} == {"LTO-8/0", "LTO-8/1"}
    sent = [j for j in jobs if j.state == JobState.SENT]
    assert len(sent) == 2 and {j.chain for j in sent} == {"LTO-8/0", "LTO-8/1"}
    waiting = [j for j in jobs if j.state == JobState.PENDING]
    assert {j.after_id for j in waiting} == {j.id for j in sent}  # each behind its drive's mount
    # The stager holds one mount per drive; the rest waits here.
    assert len(stager.library.queue) == 0 and sum(1 for d in stager.library.drives if d.tape) == 2
    assert run_until(stager, clock, now, Job.objects.filter(state=JobState.DONE).exists, limit=20_000)
    first_done = Job.objects.filter(state=JobState.DONE).order_by("finished_at").first()
    follower = Job.objects.get(after=first_done)
    assert follower.state == JobState.SENT and follower.sent_at >= first_done.finished_at
    assert run_until(stager, clock, now, all_done, limit=40_000)
    assert stager.library.mounts == 4


def test_files_of_a_planned_mount_that_arrive_later_join_it_in_one_pass(planned, alice, bob):
    """One drive busy with T0; T1, then T2, planned behind it. Bob's two files of T1, asked
    for a cycle later, go into T1's planned job in read order: one job, one pass along the
    tape, not a second job that locates back over what the first read."""
    now = planned
    Control.objects.filter(id=1).update(short_mount_s=60)  # no mount here is short
    tapes = {f"T{t}": [(f"/d/T{t}/f{i}", i * 400 * GB, 20 * GB) for i in range(20)] for t in range(3)}
    stager, clock = library_stager(1, tapes)
    later = [tapes["T1"][3][0], tapes["T1"][11][0]]
    restore_submit(user=alice, now=now, paths=[p for p, _, _ in tapes["T0"]]
                   + [p for p, _, _ in tapes["T1"] if p not in later] + [p for p, _, _ in tapes["T2"][:5]])
    run_cycle(now=now, stager=stager)
    (first,) = Job.objects.filter(tape__label="T1", state=JobState.PENDING)
    clock[0] = 10.0
    restore_submit(user=bob, paths=later, now=now + timedelta(seconds=10))
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    (job,) = Job.objects.filter(tape__label="T1")
    assert job.id == first.id and job.files == 20 and job.estimate_s > first.estimate_s
    ranked = list(RestoreRequest.objects.filter(job=job).order_by("job_rank").values_list("path", flat=True))
    assert ranked == read_order("LTO-8", tapes["T1"])  # the union, in read order


def chain_lines(chain):
    """The chain's open jobs as the line its links make: [tape label of each step], from the
    mount on the drive; fails when two tapes' jobs wait on the same step (a drive reads one
    mount after another)."""
    jobs = list(Job.objects.filter(chain=chain, state__in=(JobState.PENDING, JobState.SENT)).select_related("tape"))
    ids = {j.id for j in jobs}
    step = {j.id: j for j in jobs if j.after_id not in ids}  # the mount on the drive, or next
    line = []
    while step:
        tapes = {j.tape.label for j in step.values()}
        assert len(tapes) == 1, f"{chain}: {sorted(tapes)} wait on the same step"
        line.append(tapes.pop())
        step = {j.id: j for j in jobs if j.after_id in step}
    return line


def test_files_that_join_the_mount_on_a_drive_keep_the_chain_one_line(planned, alice, bob, charlie):
    """T0 is on the only drive, T1 and T2 planned behind it. Bob's files of T0, asked for a cycle
    later, join the mount at once; T1 then waits for them too, not sent while the drive still
    reads T0. Charlie's T3, a cycle later, goes at the end of the line, after T2. (Before: T1
    still followed T0's first job, and the joined files, which nothing followed, were the
    chain's tail (MountPlanner._chains), so the next long work went beside T1: on overlap the
    final round laid out again went out of its turn, and the library's queue chose the order.)"""
    now = planned
    Control.objects.filter(id=1).update(short_mount_s=60)  # no mount here is short
    tapes = {f"T{t}": [(f"/d/T{t}/f{i}", i * 400 * GB, 20 * GB) for i in range(24 if t == 0 else 20)]
             for t in range(4)}
    stager, clock = library_stager(1, tapes)
    later = [tapes["T0"][15][0], tapes["T0"][18][0]]  # T0 still has the most files: first in turn
    restore_submit(user=alice, now=now, paths=[p for p, _, _ in tapes["T0"] if p not in later]
                   + [p for p, _, _ in tapes["T1"]] + [p for p, _, _ in tapes["T2"][:10]])
    run_cycle(now=now, stager=stager)
    assert chain_lines("LTO-8/0") == ["T0", "T1", "T2"]
    clock[0] = 10.0
    restore_submit(user=bob, paths=later, now=now + timedelta(seconds=10))
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    joined = Job.objects.get(tape__label="T0", requests__path=later[0])
    assert joined.state == JobState.SENT and joined.after_id is None  # read in the same mount
    assert chain_lines("LTO-8/0") == ["T0", "T1", "T2"]
    assert Job.objects.get(tape__label="T1").after_id == joined.id
    clock[0] = 20.0
    restore_submit(user=charlie, paths=[p for p, _, _ in tapes["T3"][:10]], now=now + timedelta(seconds=20))
    run_cycle(now=now + timedelta(seconds=20), stager=stager)
    assert chain_lines("LTO-8/0") == ["T0", "T1", "T2", "T3"]
    assert run_until(stager, clock, now, all_done, limit=100_000)
    assert stager.library.mounts == 4  # T0 once, with the files that joined it


def test_a_short_mount_goes_first_and_cuts_a_long_one_that_keeps_it_waiting(planned, alice, bob):
    now = planned
    # min_mount off: at the defaults it holds the short run behind a long mount big enough for
    # it (800 GB) for mount_max_wait_s (tests/test_wear.py); here the preemption is the subject.
    Control.objects.filter(id=1).update(preempt_after_s=120, preempt_gap_s=300, short_mount_s=900, min_mount_files=0)
    long_tape = [(f"/d/L/f{i}", i * 100 * GB, 20 * GB) for i in range(40)]
    stager, clock = library_stager(1, {"L": long_tape, "S": [("/d/S/one", 300 * GB, 2 * GB)]})
    restore_submit(user=alice, paths=[p for p, _, _ in long_tape], now=now)
    run_cycle(now=now, stager=stager)
    (long,) = Job.objects.filter(state=JobState.SENT)
    assert long.estimate_s > 900
    clock[0] = 300.0
    restore_submit(user=bob, paths=["/d/S/one"], now=now + timedelta(seconds=300))
    run_cycle(now=now + timedelta(seconds=300), stager=stager)
    short = Job.objects.get(tape__label="S")
    assert short.state == JobState.PENDING and short.after_id == long.id and short.jumps_queue
    # Not yet: it has waited less than preempt_after_s.
    clock[0] = 360.0
    assert run_cycle(now=now + timedelta(seconds=360), stager=stager).preempted == 0
    clock[0] = 430.0
    report = run_cycle(now=now + timedelta(seconds=430), stager=stager)
    assert report.preempted > 30
    # The cut files resume on the same drive right after the short mount.
    (resumed,) = Job.objects.filter(state=JobState.PENDING, tape__label="L")
    assert (resumed.after_id, resumed.chain, resumed.files) == (short.id, short.chain, report.preempted)
    back = RestoreRequest.objects.filter(user=alice, state="submitted", job=resumed)
    assert back.count() == report.preempted
    # The cut gave back its attempt; the job they resume in counts one, as any claim does.
    assert set(back.values_list("attempts", flat=True)) == {1}
    cut = set(back.values_list("path", flat=True))
    assert StagerHealth.get().preempted_at == now + timedelta(seconds=430)
    assert run_until(stager, clock, now, RestoreRequest.objects.filter(user=bob, state="done").exists, limit=3000)
    bob_done = RestoreRequest.objects.get(user=bob)
    assert (bob_done.finished_at - bob_done.created_at).total_seconds() < 1200
    # Alice's cut files are read after bob's, none lost and none read twice.
    assert run_until(stager, clock, now, all_done, limit=40_000)
    assert RestoreRequest.objects.filter(state="done").count() == 41
    reads = [path for _, _, path, _ in stager.library.reads]
    assert len(reads) == len(set(reads)) == 41
    assert set(reads[reads.index("/d/S/one") + 1:]) == cut


def test_a_short_mount_that_later_files_make_long_cuts_nothing(planned, alice, bob, charlie):
    """Bob's one file of S makes a short mount, waiting behind alice's long mount of L on the
    only drive; a cycle later charlie's 30 files of S join it (one pass along S), and it is a
    long mount now: it no longer cuts L when it has waited preempt_after_s. L is read through,
    then S: two mounts, not L cut, S, and L again (a burst trickling in over a minute made
    each tape's first mount short, then long, and they cut the mounts before them: 15 cuts, 51
    mounts for 30 tapes where 36 do)."""
    now = planned
    Control.objects.filter(id=1).update(preempt_after_s=120, preempt_gap_s=300, short_mount_s=900, min_mount_files=0)
    long_tape = [(f"/d/L/f{i}", i * 100 * GB, 20 * GB) for i in range(40)]
    on_s = [(f"/d/S/f{i}", i * 200 * GB, 20 * GB) for i in range(31)]
    stager, clock = library_stager(1, {"L": long_tape, "S": on_s})
    restore_submit(user=alice, paths=[p for p, _, _ in long_tape], now=now)
    run_cycle(now=now, stager=stager)
    (long,) = Job.objects.filter(state=JobState.SENT)
    clock[0] = 300.0
    restore_submit(user=bob, paths=[on_s[0][0]], now=now + timedelta(seconds=300))
    run_cycle(now=now + timedelta(seconds=300), stager=stager)
    short = Job.objects.get(tape__label="S")
    assert short.jumps_queue and short.after_id == long.id and short.estimate_s <= 900
    clock[0] = 310.0
    restore_submit(user=charlie, paths=[p for p, _, _ in on_s[1:]], now=now + timedelta(seconds=310))
    run_cycle(now=now + timedelta(seconds=310), stager=stager)
    (grown,) = Job.objects.filter(tape__label="S")
    assert grown.id == short.id and grown.files == 31 and grown.estimate_s > 900
    assert not grown.jumps_queue
    clock[0] = 430.0
    assert run_cycle(now=now + timedelta(seconds=430), stager=stager).preempted == 0
    assert run_until(stager, clock, now, all_done, limit=40_000)
    reads = [path for _, _, path, _ in stager.library.reads]
    assert len(reads) == len(set(reads)) == 71
    tapes = [path.split("/")[2] for path in reads]
    assert [t for i, t in enumerate(tapes) if i == 0 or tapes[i - 1] != t] == ["L", "S"]
    assert stager.library.mounts == 2


def test_a_short_mount_of_several_jobs_made_long_is_long_in_every_job(planned, alice, bob, charlie):
    """Bob's and erin's 60 files of S, close together, make a short mount of two jobs (N = 50) waiting
    behind alice's L, with her M planned after them; charlie's 20 files of S far along the tape
    join the second job and make the mount long. Both jobs lose the flag, not only the one joined:
    the first alone, still flagged short, cut L, and a short mount of T (a file of dave's)
    followed it while M followed the second: two tapes waiting on one step of the drive.
    Now T goes first, then S and M, in one line, and nothing is cut but by T."""
    now = planned
    dave, erin = make_user("dave", "production"), make_user("erin", "analysis")
    Control.objects.filter(id=1).update(preempt_after_s=120, preempt_gap_s=300, short_mount_s=900, min_mount_files=0)
    long_tape = [(f"/d/L/f{i}", i * 100 * GB, 20 * GB) for i in range(40)]
    on_m = [(f"/d/M/f{i}", i * 100 * GB, 20 * GB) for i in range(45)]
    close = [(f"/d/S/c{i:02d}", 300 * GB + i * GB, GB) for i in range(60)]
    far = [(f"/d/S/far{i:02d}", 1000 * GB + i * 400 * GB, 20 * GB) for i in range(20)]
    stager, clock = library_stager(1, {"L": long_tape, "M": on_m, "S": close + far,
                                       "T": [("/d/T/one", 300 * GB, 2 * GB)]})
    restore_submit(user=alice, paths=[p for p, _, _ in long_tape], now=now)
    run_cycle(now=now, stager=stager)
    clock[0] = 10.0
    restore_submit(user=alice, paths=[p for p, _, _ in on_m], now=now + timedelta(seconds=10))
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    clock[0] = 300.0
    # (Two users of fewer than N files each: a user with N in flight gets no short mount.)
    restore_submit(user=bob, paths=[p for p, _, _ in close[:30]], now=now + timedelta(seconds=300))
    restore_submit(user=erin, paths=[p for p, _, _ in close[30:]], now=now + timedelta(seconds=300))
    run_cycle(now=now + timedelta(seconds=300), stager=stager)
    assert [j.jumps_queue for j in Job.objects.filter(tape__label="S")] == [True, True]
    clock[0] = 310.0
    restore_submit(user=charlie, paths=[p for p, _, _ in far], now=now + timedelta(seconds=310))
    run_cycle(now=now + timedelta(seconds=310), stager=stager)
    jobs = list(Job.objects.filter(tape__label="S"))
    assert len(jobs) == 2 and sum(j.files for j in jobs) == 80 and not any(j.jumps_queue for j in jobs)
    clock[0] = 320.0
    restore_submit(user=dave, paths=["/d/T/one"], now=now + timedelta(seconds=320))
    run_cycle(now=now + timedelta(seconds=320), stager=stager)
    assert chain_lines("LTO-8/0") == ["L", "T", "S", "M"]
    assert run_until(stager, clock, now, all_done, limit=60_000)
    reads = [path for _, _, path, _ in stager.library.reads]
    assert len(reads) == len(set(reads)) == 40 + 45 + 80 + 1
    tapes = [path.split("/")[2] for path in reads]
    runs = [t for i, t in enumerate(tapes) if i == 0 or tapes[i - 1] != t]
    assert runs in (["L", "T", "S", "M"], ["L", "T", "L", "S", "M"]), runs  # T may cut L: it is short


def test_a_cut_mount_resumes_right_after_the_short_mount_not_behind_the_backlog(planned, alice, bob):
    """Alice's tape L on the only drive, her tape M (more files) planned after it. Bob's short
    mount cuts L; L's unread files resume right after bob's, before M: back in the queue,
    TAPEID would have put them behind every tape with more files."""
    now = planned
    Control.objects.filter(id=1).update(preempt_after_s=120, preempt_gap_s=300, short_mount_s=900, min_mount_files=0)
    on_l = [(f"/d/L/f{i}", i * 100 * GB, 20 * GB) for i in range(40)]
    on_m = [(f"/d/M/f{i}", i * 100 * GB, 20 * GB) for i in range(45)]
    stager, clock = library_stager(1, {"L": on_l, "M": on_m, "S": [("/d/S/one", 300 * GB, 2 * GB)]})
    restore_submit(user=alice, paths=[p for p, _, _ in on_l], now=now)
    run_cycle(now=now, stager=stager)
    restore_submit(user=alice, paths=[p for p, _, _ in on_m], now=now + timedelta(seconds=10))
    clock[0] = 10.0
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert chain_lines("LTO-8/0") == ["L", "M"]
    clock[0] = 300.0
    restore_submit(user=bob, paths=["/d/S/one"], now=now + timedelta(seconds=300))
    run_cycle(now=now + timedelta(seconds=300), stager=stager)
    clock[0] = 430.0
    cut = run_cycle(now=now + timedelta(seconds=430), stager=stager).preempted
    assert cut > 30
    assert chain_lines("LTO-8/0") == ["L", "S", "L", "M"]
    assert run_until(stager, clock, now, all_done, limit=100_000)
    reads = [path for _, _, path, _ in stager.library.reads]
    assert len(reads) == len(set(reads)) == 86
    tapes = [path.split("/")[2] for path in reads]
    assert [t for i, t in enumerate(tapes) if i == 0 or tapes[i - 1] != t] == ["L", "S", "L", "M"]
    assert stager.library.mounts == 4


def test_without_a_drive_count_every_job_goes_out_at_once(planned, alice, settings):
    settings.CAROUSEL_STAGER = "immediate"
    now = planned
    restore_submit(user=alice, paths=[f"/d/x/f{i}" for i in range(120)], now=now)
    run_cycle(now=now)
    assert not Job.objects.filter(state=JobState.PENDING).exists()
    assert set(Job.objects.values_list("chain", flat=True)) == {""}


@pytest.mark.parametrize("choose_per_cycle", [750, 10])
def test_a_replay_cuts_the_last_tapes_across_idle_drives(db, choose_per_cycle):
    """Three equal tapes on two drives, all requested at once: whole tapes take two rounds (one
    drive idle in the second); the plan cuts one tape so both drives finish together. Replayed
    through the real loop against the simulated library; also when one cycle's choice is
    smaller than the backlog (the whole ready backlog is planned when it fits the window)."""
    from carousel.sim.replay import replay_baseline, replay_broker, report
    from carousel.sim.workload import parse

    tapes, requests = [], []
    for t in range(3):
        files = [[f"/d/T{t}/f{i}", 20 * GB, i * 300 * GB] for i in range(12)]
        tapes.append({"label": f"T{t}", "media": "LTO-8", "used_bytes": 11_000 * GB, "files": files})
        requests += [{"t": 0, "user": "prod", "path": f[0]} for f in files]
    w = parse({"format": "carousel-workload/1", "name": "three-on-two", "library": {"drives": {"LTO-8": 2}},
               "groups": {"p": {"weight": 1}}, "users": {"prod": {"group": "p", "cap": 1000}},
               "tapes": tapes, "requests": requests})
    Control.get()
    Control.objects.filter(id=1).update(choose_per_cycle=choose_per_cycle)
    broker = report(w, replay_broker(w))
    eradat = report(w, replay_baseline(w, "eradat"))
    assert broker["files_done"] == 36
    assert broker["mounts"] == 4  # one tape read in two pieces
    assert broker["makespan_s"] < 0.85 * eradat["makespan_s"]
    assert broker["makespan_s"] >= broker["lower_bound_s"]


def _long_mount_with_a_short_one_waiting(now, alice, bob, charlie):
    """Alice's long mount on the only drive; charlie joins her stage for ten of its files (a
    shared request spends no attempt); bob's short mount waits behind it."""
    # min_mount off: at the defaults it holds the short run behind a long mount big enough for
    # it (800 GB) for mount_max_wait_s (tests/test_wear.py); here the preemption is the subject.
    Control.objects.filter(id=1).update(preempt_after_s=120, preempt_gap_s=300, short_mount_s=900, min_mount_files=0)
    long_tape = [(f"/d/L/f{i}", i * 100 * GB, 20 * GB) for i in range(40)]
    stager, clock = library_stager(1, {"L": long_tape, "S": [("/d/S/one", 300 * GB, 2 * GB)]})
    restore_submit(user=alice, paths=[p for p, _, _ in long_tape], now=now)
    run_cycle(now=now, stager=stager)
    shared = [p for p, _, _ in long_tape[-10:]]
    assert restore_submit(user=charlie, paths=shared, now=now + timedelta(seconds=10)).shared == 10
    assert set(RestoreRequest.objects.filter(user=charlie).values_list("attempts", flat=True)) == {0}
    clock[0] = 300.0
    restore_submit(user=bob, paths=["/d/S/one"], now=now + timedelta(seconds=300))
    run_cycle(now=now + timedelta(seconds=300), stager=stager)
    return stager, clock


def test_a_cut_gives_back_no_attempt_a_shared_request_never_spent(planned, alice, bob, charlie):
    """Preemption must not fail good files: a request that joined another user's stage spent no
    attempt, so the cut has none to give back (attempts >= 0 holds); every cut file, both users'
    requests for it, resumes in one job after the short mount and is read once."""
    now = planned
    stager, clock = _long_mount_with_a_short_one_waiting(now, alice, bob, charlie)
    clock[0] = 430.0
    report = run_cycle(now=now + timedelta(seconds=430), stager=stager)
    assert report.preempted > 30
    (resumed,) = Job.objects.filter(state=JobState.PENDING, tape__label="L")
    assert RestoreRequest.objects.filter(user=charlie, state="submitted", job=resumed).count() == 10
    # Given back and counted again by the job they resume in: one each, never more.
    assert set(RestoreRequest.objects.filter(job=resumed).values_list("attempts", flat=True)) == {1}
    assert run_until(stager, clock, now, all_done, limit=40_000)
    assert RestoreRequest.objects.filter(state="done").count() == 51
    reads = [path for _, _, path, _ in stager.library.reads]
    assert len(reads) == len(set(reads)) == 41


def test_a_cut_the_stager_refuses_leaves_the_long_mount_running(planned, alice, bob, charlie, monkeypatch):
    """Nothing goes back to the queue unless the stager let it go, and nothing fails: the
    long mount simply runs on and every file is read once."""
    now = planned
    stager, clock = _long_mount_with_a_short_one_waiting(now, alice, bob, charlie)

    def refuse(backend_id, paths):
        raise RuntimeError("cancel refused")

    monkeypatch.setattr(stager, "cancel", refuse)
    clock[0] = 430.0
    assert run_cycle(now=now + timedelta(seconds=430), stager=stager).preempted == 0
    assert not RestoreRequest.objects.filter(user__in=[alice, charlie], state="queued").exists()
    monkeypatch.undo()
    assert run_until(stager, clock, now, all_done, limit=40_000)
    assert not RestoreRequest.objects.exclude(state="done").exists()
    reads = [path for _, _, path, _ in stager.library.reads]
    assert len(reads) == len(set(reads)) == 41


def test_planned_mounts_not_sent_yet_are_planned_again_with_the_last_of_a_backlog_larger_than_the_window(db):
    """Five equal tapes on two drives; the window (N x K = 48 files) holds four: two go to the
    drives, two wait planned whole. When the fifth is claimed (the last of the backlog), the two
    waiting are planned again with it, so the last work is cut across both drives and they
    finish together instead of one drive reading a fifth tape alone."""
    from carousel.sim.replay import replay_baseline, replay_broker, report
    from carousel.sim.workload import parse

    tapes, requests = [], []
    for t in range(5):
        files = [[f"/d/T{t}/f{i}", 20 * GB, i * 300 * GB] for i in range(12)]
        tapes.append({"label": f"T{t}", "media": "LTO-8", "used_bytes": 11_000 * GB, "files": files})
        requests += [{"t": 0, "user": "prod", "path": f[0]} for f in files]
    w = parse({"format": "carousel-workload/1", "name": "five-on-two", "library": {"drives": {"LTO-8": 2}},
               "groups": {"p": {"weight": 1}}, "users": {"prod": {"group": "p", "cap": 1000}},
               "tapes": tapes, "requests": requests})
    broker = report(w, replay_broker(w, control={"files_per_job": 12, "jobs_in_flight": 4}))
    eradat = report(w, replay_baseline(w, "eradat"))
    assert broker["files_done"] == 60 and broker["files_failed"] == 0
    assert broker["mounts"] == 6  # one tape read in two pieces
    assert broker["makespan_s"] < 0.92 * eradat["makespan_s"]
    assert broker["makespan_s"] >= broker["lower_bound_s"]


# Drive allocation ------------------------------------------------------------------------------

def grouped(tapes, groups):
    return [plan.TapeWork(t.tape, t.keys, t.pre, t.suf, g) for t, g in zip(tapes, groups)]


def most_at_once(layout, group):
    """The most pieces of `group` being read at one moment in `layout`."""
    spans = [(p.start_s, p.start_s + p.seconds) for ps in layout.values() for p in ps if p.group == group]
    return max((sum(1 for s, e in spans if s <= at < e) for at, _ in spans), default=0)


def test_a_group_never_holds_more_than_its_most_drives():
    rng = random.Random(5)
    tapes = grouped([work(f"T{i}", "LTO-8", scattered(rng, 20)) for i in range(16)], ["a"] * 12 + ["b"] * 4)
    ends = {f"d{i}": 0.0 for i in range(4)}
    free, _ = plan.plan(ends, tapes, split=False)
    assert most_at_once(free, "a") == 4  # without an allocation, a's turns take every drive
    allocation = plan.Allocation({"a": (0, 2)}, {})
    layout, span = plan.plan(ends, tapes, split=True, allocation=allocation)
    check(ends, tapes, layout, span)
    assert most_at_once(layout, "a") == 2
    # b borrows the other drives while it has work; then they wait for a's mounts (a's most).
    assert all(p.start_s == 0 for ps in layout.values() for p in ps if p.group == "b" and p.tape in ("T12", "T13"))


def test_a_reserved_drive_goes_to_its_group_at_the_next_mount_boundary():
    """a's turns come first and would take every drive; b has one drive reserved: the first
    drive to free after b's work arrives is b's, and a borrows the rest."""
    rng = random.Random(6)
    tapes = grouped([work(f"T{i}", "LTO-8", scattered(rng, 20)) for i in range(12)], ["a"] * 9 + ["b"] * 3)
    ends = {f"d{i}": 0.0 for i in range(3)}
    without, _ = plan.plan(ends, tapes, split=False)
    first_b = min(p.start_s for ps in without.values() for p in ps if p.group == "b")
    layout, span = plan.plan(ends, tapes, split=False, allocation=plan.Allocation({"b": (1, None)}, {}))
    check(ends, tapes, layout, span)
    assert min(p.start_s for ps in layout.values() for p in ps if p.group == "b") == 0.0 < first_b
    assert most_at_once(layout, "b") == 1  # reserved one, and a's turns come first for the rest
    # a borrows the other two while b has work, and all three once b's is done.
    b_last = max(p.start_s for ps in layout.values() for p in ps if p.group == "b")
    a_starts = sorted(p.start_s for ps in layout.values() for p in ps if p.group == "a")
    assert a_starts[:2] == [0.0, 0.0] and any(s > b_last for s in a_starts)


def test_committed_work_counts_against_the_most():
    """Mounts already on the chains (busy) count: a group reading on two drives until 1000 s
    gets no third one before then."""
    rng = random.Random(7)
    tapes = grouped([work(f"T{i}", "LTO-8", scattered(rng, 10)) for i in range(2)], ["a", "a"])
    ends = {"d0": 1000.0, "d1": 1000.0, "d2": 0.0}
    busy = {"d0": [(0.0, 1000.0, "a")], "d1": [(0.0, 1000.0, "a")]}
    layout, _ = plan.plan(ends, tapes, split=False, allocation=plan.Allocation({"a": (0, 2)}, busy))
    assert min(p.start_s for ps in layout.values() for p in ps) == 1000.0


def test_drive_allocation_applies_at_the_next_cycle_and_shows_on_the_live_page(planned, alice, charlie):
    """An operator limits production to one drive: from the next cycle on, its mounts go to
    the stager one at a time (the other drives take analysis' work, or wait); raised to
    three, production reads on more drives at the next cycle. The live page shows both."""
    from carousel.domain.selectors import drives_in_use
    from carousel.outlook import live
    from carousel.models import GroupShare

    now = planned
    tapes = {f"P{t}": [(f"/d/P{t}/f{i}", i * 200 * GB, 20 * GB) for i in range(8)] for t in range(5)}
    tapes.update({f"A{t}": [(f"/d/A{t}/f{i}", i * 200 * GB, 20 * GB) for i in range(8)] for t in range(2)})
    stager, clock = library_stager(3, tapes)
    production = GroupShare.objects.get(group__name="production")
    production.max_drives = 1
    production.save()
    restore_submit(user=charlie, paths=[p for t in range(5) for p, _, _ in tapes[f"P{t}"]], now=now)
    restore_submit(user=alice, paths=[p for t in range(2) for p, _, _ in tapes[f"A{t}"]], now=now)

    def reading(group):
        return len(drives_in_use().get(group.id, ()))

    most = 0
    for _ in range(100):
        run_cycle(now=now + timedelta(seconds=clock[0]), stager=stager)
        most = max(most, reading(production.group))
        clock[0] += 10
    assert most == 1
    row = next(g for g in live.live_figures(now=now).groups if g["group"] == "production")
    assert (row["drives"], row["reserved_drives"], row["max_drives"]) == (1, 0, 1)
    production.max_drives = 3
    production.save()
    for _ in range(60):
        run_cycle(now=now + timedelta(seconds=clock[0]), stager=stager)
        most = max(most, reading(production.group))
        clock[0] += 10
    assert most >= 2
    assert run_until(stager, clock, now, all_done, limit=60_000)


def test_a_drive_that_frees_early_takes_a_mount_waiting_on_another_chain(planned, alice):
    """The final round was laid out from estimates; when a drive runs out of work while a long
    mount still waits on another drive's chain, the next cycle lays the final round out again
    and that mount goes to the free drive, without waiting for new work to be chosen."""
    from carousel.domain.services import request_transition
    from tests.site_plugins import MapStager

    now = planned
    Control.objects.filter(id=1).update(drives=2, short_mount_s=0)  # every mount a long one here
    where = {f"/d/T{t}/f{i}": (f"T{t}", i * 300 * GB) for t in range(4) for i in range(10)}
    stager = MapStager(where, media="LTO-8")  # files stay in flight until the test ends them
    restore_submit(user=alice, paths=list(where), now=now)
    run_cycle(now=now, stager=stager)
    chains = {}
    for job in Job.objects.exclude(chain=""):
        chains.setdefault(job.chain, []).append(job)
    assert len(chains) == 2 and all(len(jobs) == 2 for jobs in chains.values())
    # One drive finishes both its mounts at once (faster than its estimates).
    early, late = sorted(chains)
    done = RestoreRequest.objects.filter(job__chain=early)
    request_transition(done, "staging", now=now)
    request_transition(RestoreRequest.objects.filter(job__chain=early), "done", now=now)
    Job.objects.filter(chain=early).update(state=JobState.DONE, finished_at=now)
    (waiting,) = [j for j in chains[late] if j.state == JobState.PENDING]
    report = run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert report.submitted == 0  # nothing new: the same requests on a new job
    moved = Job.objects.get(tape=waiting.tape, state__in=[JobState.PENDING, JobState.SENT])
    assert moved.chain == early and moved.state == JobState.SENT
    assert RestoreRequest.objects.filter(job=moved).count() == 10
    assert not Job.objects.filter(id=waiting.id).exists()


def test_a_mount_whose_files_were_all_cancelled_lets_the_next_one_on_its_drive_go_in_the_same_cycle(
        planned, alice):
    """The middle of three mounts planned on one drive loses all its files to a cancel: when the
    first is done, the cycle that sees it ends the emptied job and sends the third, instead of
    leaving it for a later cycle (fault-simulator seed 4441: a loop that waits for something to
    change never came back for it)."""
    from carousel.domain.services import request_cancel

    now = planned
    tapes = {f"T{t}": [(f"/d/T{t}/f{i}", i * 200 * GB, 20 * GB) for i in range(4)] for t in range(3)}
    stager, clock = library_stager(1, tapes)
    restore_submit(user=alice, paths=[p for entries in tapes.values() for p, _, _ in entries], now=now)
    run_cycle(now=now, stager=stager)
    first = Job.objects.get(state=JobState.SENT)
    middle = Job.objects.get(after=first)
    last = Job.objects.get(after=middle)
    request_cancel(queryset=RestoreRequest.objects.filter(job=middle), now=now)
    assert run_until(stager, clock, now, lambda: Job.objects.filter(id=first.id, state=JobState.DONE).exists(),
                     limit=20_000)
    middle.refresh_from_db()
    last.refresh_from_db()
    assert middle.state == JobState.CANCELLED
    assert last.state == JobState.SENT and last.sent_at == middle.finished_at
    assert run_until(stager, clock, now, all_done_or_cancelled, limit=40_000)
    assert stager.library.mounts == 2


def all_done_or_cancelled():
    return not RestoreRequest.objects.exclude(state__in=("done", "cancelled")).exists()


def test_the_rest_of_a_tape_cut_by_the_cap_joins_its_mount_before_other_tapes(planned, alice):
    """Alice's cap (30 files, N = 10) lets her first turn take tape A whole and then only half
    of B. When room frees, B's rest goes before tape C, which has more of her files: it joins
    B's planned mount. (Ordered by files alone, C was cut in turn and B's rest waited.)"""
    now = planned
    Control.objects.filter(id=1).update(files_per_job=10, min_mount_files=0, remount_delay_s=0)
    alice.account.inflight_cap = 30
    alice.account.save()
    tapes = {label: [(f"/d/{label}/f{i}", i * 50 * GB, GB) for i in range(20)] for label in "ABC"}
    stager, clock = library_stager(1, tapes)
    restore_submit(user=alice, paths=[p for entries in tapes.values() for p, _, _ in entries], now=now)
    run_cycle(now=now, stager=stager)
    clock[0] = 10.0
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert RestoreRequest.objects.filter(tape__label="B", state="submitted").count() == 10  # cut by the cap
    early = []  # moments C was planned while B's rest still waited

    def done():
        if (Job.objects.filter(tape__label="C").exists()
                and RestoreRequest.objects.filter(tape__label="B", state="queued").exists()):
            early.append(clock[0])
        return all_done()

    assert run_until(stager, clock, now, done, limit=100_000)
    assert not early
    reads = [path for _, _, path, _ in stager.library.reads]
    assert len(reads) == len(set(reads)) == 60
    order = [path.split("/")[2] for path in reads]
    assert [t for i, t in enumerate(order) if i == 0 or order[i - 1] != t] == ["A", "B", "C"]
    assert stager.library.mounts == 3


def test_a_short_mount_cuts_the_long_mount_with_least_left(planned, alice, bob):
    """Both drives read long mounts that a short one would cut: it goes behind the one with
    least left, not always behind the first drive's."""
    now = planned
    Control.objects.filter(id=1).update(preempt_after_s=120, preempt_gap_s=300, short_mount_s=900, min_mount_files=0)
    tapes = {"L0": [(f"/d/L0/f{i}", i * 100 * GB, 20 * GB) for i in range(40)],
             "L1": [(f"/d/L1/f{i}", i * 100 * GB, 20 * GB) for i in range(30)],
             "S": [("/d/S/one", 300 * GB, 2 * GB)]}
    stager, clock = library_stager(2, tapes)
    restore_submit(user=alice, paths=[p for label in ("L0", "L1") for p, _, _ in tapes[label]], now=now)
    run_cycle(now=now, stager=stager)
    long = {j.tape.label: j for j in Job.objects.filter(state=JobState.SENT).select_related("tape")}
    assert set(long) == {"L0", "L1"} and long["L1"].estimate_s < long["L0"].estimate_s
    clock[0] = 300.0
    restore_submit(user=bob, paths=["/d/S/one"], now=now + timedelta(seconds=300))
    run_cycle(now=now + timedelta(seconds=300), stager=stager)
    short = Job.objects.get(tape__label="S")
    assert short.jumps_queue and (short.chain, short.after_id) == (long["L1"].chain, long["L1"].id)


class LosesAnAnswer:
    """The library, but the answer to the first submit of tape `tape`'s job is lost (a timeout
    after the library took it): the job stays pending, tried, and is sent again with its id."""

    def __init__(self, inner, tape):
        self.inner, self.tape, self.lost = inner, tape, False

    def submit(self, job):
        backend_id = self.inner.submit(job)
        if not self.lost and any(p.startswith(f"/d/{self.tape}/") for p in job.paths):
            self.lost = True
            raise StagerUnavailable("the stage call timed out")
        return backend_id

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_files_of_a_tape_whose_job_was_tried_are_not_merged_into_it(planned, alice):
    """A pending job already tried (its submit timed out after the stager took it) is sent again
    with its id, which every stager takes as the same job with the files it had: new files of
    its tape merged into it were never read (the simulated library and HPSS ignore them, so
    they waited for the job's deadline). They make a job of their own. (A reviewer's finding.)"""
    now = planned
    tapes = {f"T{t}": [(f"/d/T{t}/f{i}", i * 200 * GB, 20 * GB) for i in range(12)] for t in range(2)}
    library, clock = library_stager(1, tapes)
    stager = LosesAnAnswer(library, "T1")
    restore_submit(user=alice, paths=[f"/d/T0/f{i}" for i in range(12)] + [f"/d/T1/f{i}" for i in range(6)], now=now)

    def t1_tried():
        return Job.objects.filter(state=JobState.PENDING, sent_at__isnull=False).exists()

    assert run_until(stager, clock, now, t1_tried, limit=20_000)
    tried = Job.objects.get(state=JobState.PENDING, sent_at__isnull=False)
    restore_submit(user=alice, paths=[f"/d/T1/f{i}" for i in range(6, 12)], now=now + timedelta(seconds=clock[0]))
    assert run_until(stager, clock, now, all_done, limit=60_000), list(
        RestoreRequest.objects.exclude(state="done").values_list("path", "state", "job_id"))
    # Read in the job the stager took, or a job of their own; never failed for missing from it.
    assert not RestoreRequest.objects.filter(attempts__gt=1).exists(), list(
        RestoreRequest.objects.filter(attempts__gt=1).values_list("path", "attempts", "last_error"))
    assert set(RestoreRequest.objects.filter(job=tried).values_list("path", flat=True)) == {
        f"/d/T1/f{i}" for i in range(6)}
