import json

import pytest

from carousel.sim.library import LOCATE_CONSTANTS, File, Library, Mismatch
from carousel.sim.replay import drain
from carousel.tape import GB, MEDIA, locate_s, read_s, rewind_s

LTO7 = MEDIA["LTO-7"]
EXCHANGE = 11.0


def lto7(path, offset_gb, size_gb=2, tape="T1"):
    return File(path, tape, "LTO-7", int(offset_gb * GB), int(size_gb * GB))


def library(drives=1, robots=4, **kwargs):
    return Library(drives={"LTO-7": drives}, robots=robots, exchange_s=EXCHANGE, **kwargs)


def read_end(lib, path):
    return next(t for t, _, p, _ in lib.reads if p == path)


def test_it_mounts_locates_and_reads_in_the_order_given():
    lib = library()
    far, near = lto7("/far", 300), lto7("/near", 10)
    lib.submit("j1", [far, near])
    drain(lib)
    mounted = EXCHANGE + LTO7.load_s
    first = mounted + locate_s(LTO7, 0, far.offset) + read_s(LTO7, far.size)
    second = first + locate_s(LTO7, far.offset + far.size, near.offset) + read_s(LTO7, near.size)
    assert read_end(lib, "/far") == pytest.approx(first)
    assert read_end(lib, "/near") == pytest.approx(second)
    # Then rewind, unload and the robot puts it back.
    assert lib.now == pytest.approx(second + rewind_s(LTO7, near.offset + near.size) + LTO7.unload_s + EXCHANGE)
    assert lib.mounts == 1 and lib.state("j1", "/far") == "done"
    assert [s.phase for s in lib.segments] == ["fetch", "load", "locate", "read", "locate", "read", "rewind",
                                               "unload", "put-back"]


def test_it_reads_straight_on_into_the_next_file_without_a_locate():
    lib = library()
    lib.submit("j1", [lto7("/a", 10), lto7("/b", 12)])
    drain(lib)
    assert [s.phase for s in lib.segments].count("locate") == 1


def test_a_job_on_two_tapes_is_split_per_tape_in_order():
    lib = library(drives=2)
    lib.submit("j1", [lto7("/a1", 5, tape="A"), lto7("/b1", 5, tape="B"), lto7("/a2", 50, tape="A")])
    assert [d.tape for d in lib.drives] == ["A", "B"]
    assert [item[1] for item in lib.drives[0].work] == ["/a1", "/a2"]


def test_a_job_for_a_tape_in_a_drive_joins_its_work():
    lib = library(drives=2)
    lib.submit("j1", [lto7("/a", 5)])
    lib.advance(30)
    lib.submit("j2", [lto7("/b", 50)])
    drain(lib)
    assert lib.mounts == 1
    assert lib.state("j2", "/b") == "done"


def test_a_job_for_a_tape_being_put_away_waits_for_it_to_come_back():
    lib = library(drives=2)
    lib.submit("j1", [lto7("/a", 5)])
    lib.advance(read_end(_run([lto7("/a", 5)]), "/a") + 1)  # rewinding now
    assert lib.drives[0].phase == "rewind"
    lib.submit("j2", [lto7("/b", 50)])
    assert lib.drives[1].phase == "idle"  # the tape is not in the library's cells yet
    drain(lib)
    assert lib.mounts == 2


def test_a_job_for_a_tape_waiting_for_the_robot_to_put_it_away_waits_too():
    lib = library(drives=2, robots=1)
    lib.submit("j1", [lto7("/a", 0)])
    while lib.drives[0].phase != "unload":
        lib.advance(lib.next_event())
    lib.robots_busy = 1  # the only robot is busy elsewhere when the unload ends
    lib.advance(lib.drives[0].until)
    assert lib.drives[0].phase == "robot-wait"
    lib.submit("j2", [lto7("/b", 50)])
    assert not lib.drives[0].work and lib.queue
    lib._robot_free()
    drain(lib)
    assert lib.mounts == 2 and lib.state("j2", "/b") == "done"


def _run(files, **kwargs):
    lib = library(**kwargs)
    lib.submit("j", files)
    drain(lib)
    return lib


def test_a_free_drive_takes_the_oldest_job_whose_tape_is_free():
    lib = library(drives=1)
    lib.submit("j1", [lto7("/a", 5, tape="A")])
    lib.submit("j2", [lto7("/b", 5, tape="B")])
    lib.submit("j3", [lto7("/c", 5, tape="C")])
    drain(lib)
    assert [s.tape for s in lib.segments if s.phase == "fetch"] == ["A", "B", "C"]


def test_drives_read_only_their_own_technology():
    lib = Library(drives={"LTO-7": 1, "LTO-8": 1})
    lib.submit("j1", [File("/x", "X8", "LTO-8", 0, GB)])
    assert lib.drives[0].phase == "idle" and lib.drives[1].tape == "X8"


def test_drives_wait_their_turn_for_a_robot():
    lib = library(drives=2, robots=1)
    lib.submit("j1", [lto7("/a", 5, tape="A"), lto7("/b", 5, tape="B")])
    assert [d.phase for d in lib.drives] == ["fetch", "robot-wait"]
    lib.advance(EXCHANGE)
    assert [d.phase for d in lib.drives] == ["load", "fetch"]


def test_cancelling_removes_queued_files_and_the_current_one_finishes():
    lib = library()
    lib.submit("j1", [lto7("/a", 5), lto7("/b", 100), lto7("/c", 200)])
    lib.advance(EXCHANGE + LTO7.load_s + 1)  # locating to /a
    lib.cancel("j1", ["/a", "/b"])
    drain(lib)
    assert [lib.state("j1", p) for p in ("/a", "/b", "/c")] == ["done", "cancelled", "done"]
    assert [p for _, _, p, _ in lib.reads] == ["/a", "/c"]


def test_status_shows_each_drive_and_the_progress_of_its_file():
    lib = library(drives=2)
    lib.submit("j1", [lto7("/a", 0, size_gb=30)])
    lib.advance(EXCHANGE + LTO7.load_s + read_s(LTO7, 30 * GB) / 2)
    status = lib.status()
    assert status["drives"][0]["tape"] == "T1" and status["drives"][0]["activity"] == "read"
    assert status["drives"][0]["file"] == "/a"
    assert status["drives"][0]["progress"] == pytest.approx(0.5)
    assert status["drives"][1]["activity"] == "idle"


def test_its_state_survives_a_trip_through_json():
    files = [lto7(f"/f{i}", i * 37 % 500, tape=f"T{i % 3}") for i in range(12)]
    whole = library(drives=2)
    whole.submit("j1", files)
    drain(whole)

    lib = library(drives=2)
    lib.submit("j1", files)
    lib.advance(whole.now / 2)
    lib = Library.from_state(json.loads(json.dumps(lib.to_state())))
    drain(lib)
    assert lib.reads == whole.reads and lib.now == whole.now and lib.mounts == whole.mounts


def test_busy_time_counts_mounting_positioning_and_reading():
    lib = _run([lto7("/a", 100)])
    assert lib.busy_seconds() == pytest.approx(lib.now)
    assert lib.busy_seconds(until=read_end(lib, "/a")) == pytest.approx(read_end(lib, "/a"))


def test_an_unknown_technology_is_refused():
    with pytest.raises(ValueError, match="LTO-3"):
        Library(drives={"LTO-3": 1})


def mismatch_job(lib):
    """One job of scattered files on one tape; (its last read's end, the library's clock at the end)."""
    files = [lto7(f"/m{i}", offset, 3) for i, offset in enumerate((5, 900, 2400, 4100, 5600))]
    lib.submit("j", files)
    drain(lib)
    return [t for t, _, _, _ in lib.reads], lib.now


def test_a_mismatched_library_departs_from_the_model_and_its_seed_repeats():
    nominal = mismatch_job(library())
    # The nominal library takes exactly what the model says (test above); a departed one does
    # not: its locates, wraps and read rate are the tape's and drive's own.
    departed = mismatch_job(library(mismatch=Mismatch(0.3, 7)))
    assert departed[1] != pytest.approx(nominal[1], rel=1e-3)
    assert all(a != pytest.approx(b, rel=1e-4) for a, b in zip(departed[0], nominal[0]))
    # The same seed gives the same library; another seed another one.
    assert mismatch_job(library(mismatch=Mismatch(0.3, 7))) == departed
    assert mismatch_job(library(mismatch=Mismatch(0.3, 8)))[1] != pytest.approx(departed[1], rel=1e-6)


def test_a_mismatch_stays_within_its_bounds():
    mismatch = Mismatch(0.3, 1)
    for tape in ("T1", "T2", "T3", "T4"):
        media = mismatch.tape_media("LTO-7", tape)
        for name in LOCATE_CONSTANTS:
            assert 0.7 <= getattr(media, name) / getattr(LTO7, name) <= 1.3
        assert 1 - 0.02 <= media.bytes_per_wrap / LTO7.bytes_per_wrap <= 1 + 0.02
        assert media.load_s == LTO7.load_s and media.wraps == LTO7.wraps
    factors = {mismatch.read_rate_factor(f"LTO-7 #{i}") for i in range(1, 6)}
    assert len(factors) == 5 and all(0.9 <= f <= 1.1 for f in factors)


def test_a_mismatched_library_survives_a_trip_through_json():
    lib = library(mismatch=Mismatch(0.3, 7))
    lib.submit("j", [lto7("/a", 900), lto7("/b", 10)])
    lib.advance(200)
    again = Library.from_state(json.loads(json.dumps(lib.to_state())))
    drain(lib)
    drain(again)
    assert again.reads == lib.reads and again.mismatch == lib.mismatch
