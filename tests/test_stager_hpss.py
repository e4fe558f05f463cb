"""The hpss stager against tests/fakes/hsi, which prints hsi's formats; no database needed."""
import importlib.machinery
import importlib.util
import json
import time
from pathlib import Path

import pytest

from carousel.stagers.base import FileStatus, JobSpec, LocateError, Location, StagerUnavailable
from policies.order import read_order
from carousel.stagers.hpss import (
    OFFSET_BITS, HpssStager, parse_errors, parse_ls_P, parse_ls_V, tape_order_key,
)

FAKE_HSI = Path(__file__).parent / "fakes" / "hsi"
TB = 10**12


class Catalog:
    """The fake's files, and the log of its invocations."""

    def __init__(self, tmp_path, monkeypatch):
        self.file = tmp_path / "catalog.json"
        self.log = tmp_path / "hsi.log"
        self.files = {}
        self.save()
        monkeypatch.setenv("FAKE_HSI_CATALOG", str(self.file))
        monkeypatch.setenv("FAKE_HSI_LOG", str(self.log))

    def add(self, path, volume="VB000100", position=1, offset=0, size=1000, on_disk=False):
        self.files[path] = {"volume": volume, "position": position, "offset": offset, "size": size,
                            "cos": 5, "on_disk": on_disk}
        self.save()

    def save(self):
        self.file.write_text(json.dumps(self.files))

    def recall(self, path):
        """The tape recall finished: the file is in the disk cache."""
        self.files = json.loads(self.file.read_text())
        self.files[path]["on_disk"] = True
        self.save()

    def calls(self, verb=""):
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [json.loads(line) for line in lines if json.loads(line)[-1].startswith(verb)]


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    return Catalog(tmp_path, monkeypatch)


@pytest.fixture
def stager(tmp_path):
    return HpssStager(hsi=FAKE_HSI, state_dir=tmp_path / "state", timeout_s=20)


def job(paths, job_id="job-1"):
    return JobSpec(id=job_id, paths=list(paths))


def test_without_volumes_it_leaves_the_tape_to_the_sites_map(catalog, tmp_path):
    catalog.add("/exp/run1/a", volume="VB000100", position=119, offset=5, size=40)
    stager = HpssStager(hsi=FAKE_HSI, state_dir=tmp_path / "state", timeout_s=20, volumes=False)
    [found, missing] = stager.locate(["/exp/run1/a", "/exp/run1/gone"])
    assert (found.tape, found.position, found.size, found.tape_known) == ("rest:/exp/run1", 0, 40, False)
    assert isinstance(missing, LocateError)


def test_it_locates_files_in_tape_order(catalog, stager):
    catalog.add("/exp/c", volume="VB000200", position=3, offset=0, size=30)
    catalog.add("/exp/b", volume="VB000100", position=120, offset=0, size=20)
    # An offset beyond 2**32 (HPSS aggregates): still before the next position.
    catalog.add("/exp/a", volume="VB000100", position=119, offset=558936243566, size=10)
    catalog.add("/exp/d", volume="VB000100", position=119, offset=5, size=40)

    found = stager.locate(["/exp/c", "/exp/b", "/exp/a", "/exp/d"])

    assert [loc.path for loc in found] == ["/exp/c", "/exp/b", "/exp/a", "/exp/d"]
    assert all(isinstance(loc, Location) and loc.media == "" for loc in found)
    assert {loc.path: (loc.tape, loc.size) for loc in found} == {
        "/exp/a": ("VB0001", 10), "/exp/b": ("VB0001", 20), "/exp/c": ("VB0002", 30), "/exp/d": ("VB0001", 40)}
    in_tape_order = sorted(found, key=lambda loc: (loc.tape, loc.position))
    assert [loc.path for loc in in_tape_order] == ["/exp/d", "/exp/a", "/exp/b", "/exp/c"]
    assert len(catalog.calls("ls -P")) == 1


def test_it_batches_paths_into_few_calls(catalog, tmp_path):
    stager = HpssStager(hsi=FAKE_HSI, state_dir=tmp_path / "state", batch=2)
    for i in range(5):
        catalog.add(f"/exp/{i}", position=i)

    assert len(stager.locate([f"/exp/{i}" for i in range(5)])) == 5
    assert len(catalog.calls("ls -P")) == 3


def test_it_reports_missing_files_as_permanent_errors(catalog, stager):
    catalog.add("/exp/here")

    here, gone = stager.locate(["/exp/here", "/exp/gone"])

    assert isinstance(here, Location)
    assert gone == LocateError(path="/exp/gone", error_class="permanent",
                               message="hpss_Lstat: No such file or directory [-2: HPSS_ENOENT]")


def fake_words(command_string):
    """The fake hsi's reading of a command line (tests/fakes/hsi, words())."""
    loader = importlib.machinery.SourceFileLoader("fake_hsi", str(FAKE_HSI))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("fake_hsi", loader))
    loader.exec_module(module)
    return module.words(command_string)


SPACED = "/exp/run 7/a file.dat"
# Quotes, semicolons, backslashes, leading dashes, wildcards, relative paths, hsi's rename.
UNSAFE = ["/exp/it's.dat", '/exp/say "hi".dat', "/exp/both ' and \".dat", '/exp/q";stage "/exp/victim',
          "/exp/semi;stage /exp/victim", "/exp/back\\slash.dat", '/exp/back\\" ; stage /exp/victim',
          "-P", "-", "--help", "exp/relative", "/exp/*", "/exp/v[i]ctim", "/exp/run : /exp/victim",
          "/exp/ends with a blank "]


@pytest.mark.parametrize("unsafe", UNSAFE)
def test_a_path_hsi_cannot_be_given_safely_is_refused_and_its_batch_still_answered(catalog, stager, unsafe):
    catalog.add(unsafe, position=1)
    catalog.add("/exp/victim", position=2)
    catalog.add(SPACED, position=3, size=123)
    paths = [SPACED, unsafe]

    good, refused = stager.locate(paths)
    stager.submit(job(paths))
    statuses = stager.poll([job(paths)])["job-1"]

    assert (good.path, good.size) == (SPACED, 123)
    assert isinstance(refused, LocateError) and refused.error_class == "permanent" and "hsi" in refused.message
    assert statuses[0].state == "done"
    assert statuses[1].state == "failed" and statuses[1].error_class == "permanent"
    assert json.loads(catalog.file.read_text())["/exp/victim"]["on_disk"] is False
    # hsi heard of the spaced path only, as one word, and nothing else.
    for call in catalog.calls():
        assert fake_words(call[-1]) in ([["ls", "-P", SPACED]], [["stage", SPACED]], [["ls", "-V", SPACED]]), call


def test_paths_with_spaces_and_safe_punctuation_are_carried_as_one_word(catalog, stager):
    odd = [SPACED, "/exp/a+b,c@d%e~f=g-h_i.j", "/exp/double  space", "/exp/x:y"]
    for i, path in enumerate(odd):
        catalog.add(path, position=i, size=100 + i)

    found = stager.locate(odd)

    assert [(loc.path, loc.size) for loc in found] == [(p, 100 + i) for i, p in enumerate(odd)]
    stager.submit(job(odd))
    assert all(s.state == "done" for s in stager.poll([job(odd)])["job-1"])
    (call,) = catalog.calls("stage")
    assert fake_words(call[-1]) == [["stage", *odd]]


def test_it_rejects_paths_hsi_cannot_name_without_asking_it(catalog, stager):
    (error,) = stager.locate(["/exp/tab\there"])

    assert error.error_class == "permanent" and "printable ASCII" in error.message
    assert catalog.calls() == []


def test_submit_is_idempotent_on_the_job_id(catalog, stager):
    catalog.add("/exp/a")
    catalog.add("/exp/b")

    first = stager.submit(job(["/exp/a", "/exp/b"]))
    again = stager.submit(job(["/exp/a", "/exp/b"]))

    assert first == again == "hpss-job-1"
    assert len(catalog.calls("stage")) == 1


def test_a_resubmit_stages_what_an_unreachable_hsi_did_not(catalog, stager, monkeypatch):
    catalog.add("/exp/a")
    monkeypatch.setenv("FAKE_HSI_DOWN", "1")
    with pytest.raises(StagerUnavailable):
        stager.submit(job(["/exp/a"]))
    assert stager.poll([job(["/exp/a"])]) == {"job-1": [FileStatus(path="/exp/a", state="queued")]}

    monkeypatch.delenv("FAKE_HSI_DOWN")
    stager.submit(job(["/exp/a"]))

    assert len(catalog.calls("stage")) == 2
    assert stager.poll([job(["/exp/a"])])["job-1"][0].state == "done"


def test_poll_reports_staging_then_done(catalog, stager, monkeypatch):
    catalog.add("/exp/a")
    catalog.add("/exp/b", on_disk=True)
    monkeypatch.setenv("FAKE_HSI_HOLD", "1")
    spec = job(["/exp/a", "/exp/b"])
    stager.submit(spec)

    assert stager.poll([spec]) == {"job-1": [FileStatus(path="/exp/a", state="staging"),
                                             FileStatus(path="/exp/b", state="done")]}
    catalog.recall("/exp/a")
    assert [s.state for s in stager.poll([spec])["job-1"]] == ["done", "done"]


def test_poll_fails_files_hpss_does_not_have(catalog, stager):
    catalog.add("/exp/a")
    spec = job(["/exp/a", "/exp/gone"])
    stager.submit(spec)

    done, gone = stager.poll([spec])["job-1"]

    assert done.state == "done"
    assert (gone.state, gone.error_class) == ("failed", "permanent")
    assert "HPSS_ENOENT" in gone.message


def test_poll_leaves_out_jobs_it_does_not_know(catalog, stager):
    catalog.add("/exp/a")
    stager.submit(job(["/exp/a"], "known"))

    answer = stager.poll([job(["/exp/a"], "known"), job(["/exp/a"], "lost")])

    assert list(answer) == ["known"]


def test_poll_asks_nothing_when_no_job_is_known(catalog, stager):
    assert stager.poll([job(["/exp/a"], "lost")]) == {}
    assert catalog.calls() == []


def test_cancelled_files_are_no_longer_reported(catalog, stager):
    catalog.add("/exp/a")
    catalog.add("/exp/b")
    spec = job(["/exp/a", "/exp/b"])
    backend_id = stager.submit(spec)

    stager.cancel(backend_id, ["/exp/a", "/exp/not-in-job"])

    assert [s.path for s in stager.poll([spec])["job-1"]] == ["/exp/b"]
    stager.cancel("hpss-unknown", ["/exp/a"])  # an unknown job is nothing to do


def test_a_down_hsi_raises_unavailable(catalog, stager, monkeypatch):
    catalog.add("/exp/a")
    stager.submit(job(["/exp/a"]))
    monkeypatch.setenv("FAKE_HSI_DOWN", "1")

    with pytest.raises(StagerUnavailable, match="exited 69"):
        stager.locate(["/exp/a"])
    with pytest.raises(StagerUnavailable):
        stager.poll([job(["/exp/a"])])


def test_a_hanging_hsi_hits_the_timeout(catalog, tmp_path, monkeypatch):
    catalog.add("/exp/a")
    monkeypatch.setenv("FAKE_HSI_SLEEP", "30")
    stager = HpssStager(hsi=FAKE_HSI, state_dir=tmp_path / "state", timeout_s=0.5)

    started = time.monotonic()
    with pytest.raises(StagerUnavailable, match="did not answer"):
        stager.locate(["/exp/a"])
    assert time.monotonic() - started < 10


def test_a_missing_executable_raises_unavailable(tmp_path):
    stager = HpssStager(hsi=tmp_path / "no-hsi-here", state_dir=tmp_path / "state")

    with pytest.raises(StagerUnavailable, match="cannot run"):
        stager.locate(["/exp/a"])


def test_it_passes_the_extra_arguments_before_the_command(catalog, tmp_path):
    catalog.add("/exp/a")
    stager = HpssStager(hsi=FAKE_HSI, state_dir=tmp_path / "state", extra_args=["-A", "keytab"])

    stager.locate(["/exp/a"])

    assert catalog.calls() == [["-A", "keytab", "-q", 'ls -P "/exp/a"']]


def test_the_state_lives_under_var_dir_by_default(catalog, tmp_path, settings):
    catalog.add("/exp/a")
    stager = HpssStager(hsi=FAKE_HSI)
    settings.VAR_DIR = tmp_path / "var"  # read when first needed, not when constructed

    stager.submit(job(["/exp/a"]))

    assert json.loads((tmp_path / "var" / "hpss" / "job-1.json").read_text())["paths"] == ["/exp/a"]


def test_the_ordering_key_keeps_position_before_offset():
    assert tape_order_key(119, 558936243566) < tape_order_key(120, 0) < tape_order_key(120, 1)
    assert tape_order_key(2**20, 2**50) < 2**63  # clamped: it still fits a bigint
    assert tape_order_key(1, 0) == 1 << OFFSET_BITS


def test_it_reads_ls_P_lines_as_hsi_prints_them():
    # The shape of real lines (WIPACrepo/tacc-sync): 13 tab-separated fields, an 8-character
    # volume label, and a file spanning two volumes.
    dates = "\t03/01/2021\t11:15:47\t03/01/2021\t11:30:52"
    text = ("ls -NP /x.zip\n"
            f"FILE\t/x.zip\t99658060045\t99658060045\t840+0\tAG084600\t5\t0\t1{dates}\n"
            f"FILE\t/y.zip\t568860644320\t568860644320\t119+558936243566\tAU031800,AU031900\t12\t0\t1{dates}\n")

    listed = parse_ls_P(text, ["/x.zip", "/y.zip", "/z.zip"])

    assert listed["/x.zip"] == (99658060045, "AG0846", tape_order_key(840, 0))
    assert listed["/y.zip"] == (568860644320, "AU0318", tape_order_key(119, 558936243566))
    assert "/z.zip" not in listed


def test_it_reads_residency_from_the_level_table():
    text = ("-rw-r-----  1 u g  DISK  100 Mar 01 2021 /staged\n"
            "   0 (disk)   1   1   100\n"
            "   1 (tape)   1   1   100\n"
            "-rw-r-----  1 u g  DISK  100 Mar 01 2021 /on tape\n"
            "   0 (disk)   0   1   (no data at this level)\n"
            "   1 (tape)   1   1   100\n"
            "-rw-r-----  1 u g  DISK  100 Mar 01 2021 /half\n"
            "   0 (disk)   1   1   50\n"
            "   1 (tape)   1   1   100\n"
            "-rw-r-----  1 u g  DISK  100 Mar 01 2021 /no table\n")

    assert parse_ls_V(text, ["/staged", "/on tape", "/half", "/no table"]) == {
        "/staged": True, "/on tape": False, "/half": False}


def test_it_finds_the_path_an_error_is_about():
    text = ("*** hpss_Lstat: No such file or directory [-2: HPSS_ENOENT]\n    /gone\n"
            "*** hpss_Open: Permission denied [-13: HPSS_EACCES] /secret\n")

    assert parse_errors(text, ["/gone", "/secret", "/fine"]) == {
        "/gone": "hpss_Lstat: No such file or directory [-2: HPSS_ENOENT]",
        "/secret": "hpss_Open: Permission denied [-13: HPSS_EACCES] /secret"}


def test_site_label_patterns_give_each_volume_its_technology(catalog, tmp_path):
    stager = HpssStager(hsi=FAKE_HSI, state_dir=tmp_path / "state",
                        media={"LTO-7": ["AG*", "VB*"], "LTO-8": "AU*"}, default_media="LTO-9")
    catalog.add("/exp/a", volume="AG084600", position=9)
    catalog.add("/exp/b", volume="AU031800", position=3)
    catalog.add("/exp/c", volume="ZZ000100", position=1)
    catalog.add("/exp/d", volume="", position=0)  # not migrated yet: no tape, no technology
    catalog.add("/exp/e", volume="AG084600", position=2, offset=77)

    found = {loc.path: loc for loc in stager.locate(["/exp/a", "/exp/b", "/exp/c", "/exp/d", "/exp/e"])}

    assert {p: loc.media for p, loc in found.items()} == {
        "/exp/a": "LTO-7", "/exp/b": "LTO-8", "/exp/c": "LTO-9", "/exp/d": "", "/exp/e": "LTO-7"}
    # The broker's tape model reads HPSS's keys in HPSS's own order.
    files = [(p, found[p].position, found[p].size) for p in ("/exp/a", "/exp/e")]
    assert read_order("LTO-7", files) == ["/exp/e", "/exp/a"]
    with pytest.raises(ValueError, match="unknown technology 'LTO-3'"):
        HpssStager(hsi=FAKE_HSI, media={"LTO-3": ["X*"]})


def test_through_hsi_the_loop_lays_jobs_out_on_the_drives_chains(catalog, tmp_path, db, alice, now, monkeypatch):
    """hsi shows no drives: the control row's count and the site's label patterns give the plan."""
    from carousel.loop.cycle import run_cycle
    from carousel.models import Control, Job, JobState, RestoreRequest
    from carousel.domain.services import restore_submit

    monkeypatch.setenv("FAKE_HSI_HOLD", "1")  # recalls stay in flight: the plan can be seen
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 50, "jobs_in_flight": 10, "drives": 2,
                                                     "sort_policy": "TAPEID", "mount_min_files": 1})
    paths = []
    for t in range(4):
        for i in range(6):
            paths.append(f"/exp/T{t}/f{i}")
            catalog.add(paths[-1], volume=f"AG00{t}000", position=i + 1, size=20 * 10**9)
    stager = HpssStager(hsi=FAKE_HSI, state_dir=tmp_path / "state", media={"LTO-7": ["AG*"]})
    restore_submit(user=alice, paths=paths, now=now)
    run_cycle(now=now, stager=stager)
    assert not RestoreRequest.objects.filter(tape__isnull=True).exists()

    jobs = list(Job.objects.order_by("created_at", "rank"))
    assert len(jobs) == 4 and {j.chain for j in jobs} == {"/0", "/1"}
    sent = [j for j in jobs if j.state == JobState.SENT]
    assert len(sent) == 2 and {j.chain for j in sent} == {"/0", "/1"}  # one mount per drive at HPSS
    assert {j.after_id for j in jobs if j.state == JobState.PENDING} == {j.id for j in sent}
    assert all(j.estimate_s > 0 for j in jobs)
    staged = [w for call in catalog.calls("stage") for command in fake_words(call[-1]) for w in command[1:]]
    assert sorted(staged) == sorted(p for j in sent for p in j.requests.values_list("path", flat=True))
