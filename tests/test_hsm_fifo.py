"""The hsm-fifo replay backend: a tape system that hides its tapes behind one FIFO recall
queue (carousel/sim/hsm.py), with and without the site's tape map."""
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from carousel.models import RestoreRequest
from carousel.sim.hsm import FifoLibrary, HiddenTapesStager
from carousel.sim.library import File
from carousel.sim.replay import drain, replay_broker, report
from carousel.sim.workload import parse
from carousel.stagers.base import JobSpec
from carousel.tape import GB


def small():
    """Four LTO-8 tapes on two drives; each directory holds files of every tape, so the
    directory (the stand-in a hiding backend leaves) says nothing of the tape."""
    tapes = [{"label": f"T{t}", "media": "LTO-8", "used_bytes": 11_000 * GB,
              "files": [[f"/data/run{i % 2}/T{t}-f{i}", 2 * GB, (i * 97 % 40) * 60 * GB] for i in range(6)]}
             for t in range(4)]
    requests = [{"t": 0, "user": "charlie", "path": f"/data/run{i % 2}/T{t}-f{i}"} for t in range(4) for i in range(6)]
    requests += [{"t": 60, "user": "alice", "path": "/data/run0/T3-f2"}]
    return {"format": "carousel-workload/1", "name": "small-hidden", "library": {"drives": {"LTO-8": 2}},
            "groups": {"production": {"weight": 3}, "analysis": {"weight": 1}},
            "users": {"charlie": {"group": "production"}, "alice": {"group": "analysis"}},
            "tapes": tapes, "requests": requests}


def f(path, tape, offset):
    return File(path, tape, "LTO-8", offset, GB)


def test_a_mount_reads_the_tapes_queued_files_in_position_order():
    library = FifoLibrary(drives={"LTO-8": 1})
    library.submit("j0", [f("/x", "T0", 0)])  # on the drive while the others queue
    library.submit("j1", [f("/a", "T1", 300 * GB), f("/b", "T2", 0)])
    library.submit("j2", [f("/c", "T1", 100 * GB)])
    drain(library)
    assert [path for _, _, path, _ in library.reads] == ["/x", "/c", "/a", "/b"]
    assert library.mounts == 3


def test_a_file_for_a_mounted_tape_waits_for_its_next_mount():
    library = FifoLibrary(drives={"LTO-8": 2})
    library.submit("j1", [f("/a", "T1", 0)])
    library.advance(60)  # T1 is on a drive
    library.submit("j2", [f("/b", "T1", 10 * GB), f("/c", "T2", 0)])
    assert library.state("j2", "/b") == "queued" and library.state("j2", "/c") == "staging"
    drain(library)
    assert library.mounts == 3  # T1 twice: the files queued at its mount, then the late one
    assert {path for _, _, path, _ in library.reads} == {"/a", "/b", "/c"}


def test_a_free_drive_takes_the_oldest_file_whose_tape_is_free():
    library = FifoLibrary(drives={"LTO-8": 2})
    library.submit("j1", [f("/a", "T1", 0)])
    library.advance(60)
    library.submit("j2", [f("/b", "T1", GB)])
    library.submit("j3", [f("/c", "T2", 0)])
    # The second drive skips /b (its tape is on the first) and mounts T2.
    assert library.drives[1].tape == "T2"


def test_its_stager_shows_no_tape_position_size_or_drive():
    w = parse(small())
    library = FifoLibrary(drives=w.drives)
    stager = HiddenTapesStager(library=library, files=w.files, clock=lambda: 0.0)
    [found, missing] = stager.locate(["/data/run1/T2-f1", "/nowhere"])
    assert (found.tape, found.position, found.size, found.tape_known) == ("rest:/data/run1", 0, 0, False)
    assert missing.error_class == "permanent"
    assert stager.status() == {}
    # Behind the front, the library knows where the files are.
    stager.submit(JobSpec(id="j", paths=["/data/run1/T2-f1"]))
    assert library.drives[0].tape == "T2"


def test_without_a_map_the_broker_sees_only_directories(db):
    w = parse(small())
    result = report(w, replay_broker(w, backend="hsm-fifo"))
    assert result["files_failed"] == 0 and result["backend"] == "hsm-fifo" and result["tape_map"] is False
    labels = set(RestoreRequest.objects.filter(tape__isnull=False).values_list("tape__label", flat=True))
    assert labels == {"rest:/data/run0", "rest:/data/run1"}


def test_with_the_map_the_broker_plans_the_workloads_tapes(db):
    w = parse(small())
    result = report(w, replay_broker(w, backend="hsm-fifo", tape_map=True))
    assert result["files_failed"] == 0 and result["tape_map"] is True
    labels = set(RestoreRequest.objects.filter(tape__isnull=False).values_list("tape__label", flat=True))
    assert labels == {"T0", "T1", "T2", "T3"}
    assert result["makespan_s"] >= result["lower_bound_s"]


def test_the_command_replays_hsm_fifo_with_the_map_in_a_throwaway_database(db, tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small()))
    call_command("simulate", str(path), "--backend", "hsm-fifo", "--tape-map", "--report", str(tmp_path / "r.json"))
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["backend"] == "hsm-fifo" and result["tape_map"] is True
    assert result["files_done"] == 25 and result["files_failed"] == 0
    # Each tape mounted once: the map gave the broker whole tapes.
    assert result["mounts"] == result["tapes"] == 4
    # The wear figure counts this library's mounts too (its own dispatch once skipped the log).
    assert result["max_mounts_per_tape_day"] == 1
    assert not RestoreRequest.objects.exists()


def test_the_command_refuses_a_map_without_a_hiding_backend(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small()))
    with pytest.raises(CommandError, match="--backend hsm-fifo"):
        call_command("simulate", str(path), "--tape-map")
    with pytest.raises(CommandError, match="not to a baseline"):
        call_command("simulate", str(path), "--baseline", "eradat", "--backend", "hsm-fifo")


def one_tape(arrivals, spacing_gb=900):
    """One LTO-8 tape of ten files scattered along it, `spacing_gb` apart, one drive;
    `arrivals`: [(t, [file indexes])]."""
    offsets = [(i * 7 % 10) * spacing_gb * GB for i in range(10)]
    tape = {"label": "T0", "media": "LTO-8", "used_bytes": 11_000 * GB,
            "files": [[f"/d/T0-f{i}", 2 * GB, offsets[i]] for i in range(10)]}
    requests = [{"t": t, "user": "charlie", "path": f"/d/T0-f{i}"} for t, files in arrivals for i in files]
    return parse({"format": "carousel-workload/1", "name": "one-tape", "library": {"drives": {"LTO-8": 1}},
                  "groups": {"production": {"weight": 1}}, "users": {"charlie": {"group": "production"}},
                  "tapes": [tape], "requests": requests})


def test_behind_hidden_drives_a_tape_is_cut_into_stretches_along_it(db):
    """Such a stager reads each request in position order, one mount per request: the parts of
    a tape longer than N files are stretches of it, not parts of the planner's read order that
    each reach across the tape."""
    from carousel.models import Job

    result = report(one_tape([(0, range(10))]),
                    replay_broker(one_tape([(0, range(10))]), backend="hsm-fifo", tape_map=True,
                                  control={"files_per_job": 4}))
    assert result["files_done"] == 10
    spans = []
    for job in Job.objects.filter(tape__label="T0").order_by("created_at", "rank"):
        places = list(RestoreRequest.objects.filter(job=job).values_list("position", flat=True))
        spans.append((min(places), max(places)))
    assert len(spans) == 3
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), spans


def test_behind_hidden_drives_late_files_of_a_mounted_tape_wait_for_its_next_mount(db):
    """Such a stager does not add a request to the mount of a tape it is reading (it waits for
    the tape's next mount), so the files that arrive while it is read are planned as a mount
    of their own, sent once the drive's mount before it is done, not at once."""
    from carousel.models import Job

    w = one_tape([(0, range(5)), (60, range(5, 10))])
    result = report(w, replay_broker(w, backend="hsm-fifo", tape_map=True))
    assert result["files_done"] == 10
    jobs = list(Job.objects.filter(tape__label="T0").order_by("sent_at"))
    assert len(jobs) == 2
    assert jobs[1].sent_at >= jobs[0].finished_at


def test_behind_hidden_drives_a_mount_is_estimated_in_the_order_the_stager_reads(db):
    """Such a stager reads in position order, whatever order the files were sent in: the job's
    estimate (what the turns charge, what the pages show) is that mount's, not the one the
    planner's read order would take (on LTO-8, position order over scattered files costs a
    pass along the tape per wrap: on groups' tapes 1.75 times the read order's)."""
    from carousel.models import Job
    from carousel.tape import mount_profile
    from policies.order import position_order, read_order

    w = one_tape([(0, range(10))], spacing_gb=60)  # ten wraps apart: the serpentine matters
    result = report(w, replay_broker(w, backend="hsm-fifo", tape_map=True))
    assert result["files_done"] == 10
    job = Job.objects.get(tape__label="T0")
    files = [(path, w.files[path].offset, w.files[path].size) for path in w.files]
    place = {path: (offset, size) for path, offset, size in files}

    def mount_s(order):
        return mount_profile("LTO-8", [place[k] for k in order], exchange_s=11.0)[0][-1]

    by_position, by_plan = mount_s(position_order(files)), mount_s(read_order("LTO-8", files))
    assert by_position > 1.2 * by_plan
    assert job.estimate_s == pytest.approx(by_position, rel=0.01), (job.estimate_s, by_position, by_plan)
