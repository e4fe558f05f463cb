"""The simulated library with bytes: archive_dir holds the "tape" copies, disk_dir receives the
restored ones, and the API says where a restored copy lies."""
from datetime import timedelta

import pytest

from carousel.loop.cycle import run_cycle
from carousel.models import Control, RestoreRequest
from carousel.domain.services import restore_submit
from carousel.stagers import simulated
from carousel.stagers.base import JobSpec, LocateError
from carousel.stagers.simulated import SimulatedStager
from tests.conftest import client_for


@pytest.fixture
def clock(monkeypatch):
    """The live library's wall clock, moved by the test."""
    now = [1_000_000.0]
    monkeypatch.setattr(simulated, "wall_clock", lambda: now[0])
    return now


@pytest.fixture
def dirs(tmp_path):
    archive, disk = tmp_path / "archive", tmp_path / "disk"
    (archive / "exp/run1").mkdir(parents=True)
    (archive / "exp/run1/a.root").write_bytes(b"A" * 1000 + bytes(range(256)))
    (archive / "exp/run1/b.root").write_bytes(b"b" * 70_000)
    return archive, disk


def stager_for(tmp_path, archive, disk):
    return SimulatedStager(speedup=1000, archive_dir=str(archive), disk_dir=str(disk),
                           state_file=str(tmp_path / "library.json"))


def test_locate_knows_only_files_in_the_archive_and_their_real_size(tmp_path, dirs):
    archive, disk = dirs
    found, missing, escaping = stager_for(tmp_path, archive, disk).locate(
        ["/exp/run1/a.root", "/exp/run1/nope.root", "/../../etc/passwd"])
    assert found.size == 1256 and found.tape.startswith("SIM")
    assert isinstance(missing, LocateError) and missing.error_class == "permanent"
    assert missing.message == "no such file on tape"
    assert isinstance(escaping, LocateError)


def test_a_read_file_appears_on_disk_with_the_tape_copys_bytes(tmp_path, dirs, clock):
    archive, disk = dirs
    stager = stager_for(tmp_path, archive, disk)
    job = JobSpec(id="j1", paths=["/exp/run1/a.root", "/exp/run1/b.root"])
    stager.submit(job)
    first = stager.poll([job])["j1"]
    assert [st.state for st in first] != ["done", "done"]
    assert not (disk / "exp/run1/a.root").exists()
    clock[0] += 3600  # an hour of wall clock: 1000 hours of library time, enough to mount and read
    answer = stager.poll([job])["j1"]
    assert [st.state for st in answer] == ["done", "done"]
    for st in answer:
        assert st.disk_path == str(disk / st.path.lstrip("/"))
        assert open(st.disk_path, "rb").read() == (archive / st.path.lstrip("/")).read_bytes()
    assert not [p for p in disk.rglob("*") if p.name.endswith(".part")]


def test_without_the_options_it_behaves_as_before(tmp_path):
    stager = SimulatedStager(speedup=1000, state_file=str(tmp_path / "library.json"))
    location, = stager.locate(["/any/path/at/all"])
    assert location.size >= 1 << 30  # the synthetic catalogue's 1-5 GB


def test_a_restored_request_exposes_its_disk_path_in_the_api(tmp_path, dirs, clock, alice, now, settings):
    archive, disk = dirs
    settings.CAROUSEL_STAGER = "simulated"
    settings.CAROUSEL_STAGER_OPTIONS = dict(speedup=1000, archive_dir=str(archive), disk_dir=str(disk),
                                            state_file=str(tmp_path / "library.json"))
    Control.objects.update_or_create(id=1, defaults={"cycle_s": 1})
    restore_submit(user=alice, now=now, paths=["/exp/run1/a.root", "/exp/run1/missing.root"])
    api = client_for(alice)
    for step in range(4):
        run_cycle(now=now + timedelta(seconds=10 * step))
        clock[0] += 600
    by_path = {r["path"]: r for r in api.get("/api/v1/requests/").json()["results"]}
    assert by_path["/exp/run1/a.root"]["state"] == "done"
    assert by_path["/exp/run1/a.root"]["disk_path"] == str(disk / "exp/run1/a.root")
    assert (disk / "exp/run1/a.root").read_bytes() == (archive / "exp/run1/a.root").read_bytes()
    assert by_path["/exp/run1/missing.root"]["state"] == "failed"
    assert by_path["/exp/run1/missing.root"]["last_error"] == "no such file on tape"
    assert by_path["/exp/run1/missing.root"]["disk_path"] is None
    assert RestoreRequest.objects.get(path="/exp/run1/a.root").staged_path == str(disk / "exp/run1/a.root")
