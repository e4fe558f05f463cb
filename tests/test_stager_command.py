"""The command stager against the fake site scripts in tests/fakes/site_stager/, which keep the
state of a fake tape system in a temporary directory. No database."""
import json
import time
from pathlib import Path

import pytest

from carousel.stagers.base import FileStatus, JobSpec, LocateError, Location, StagerUnavailable
from carousel.stagers.command import CommandStager, SiteScriptError

SCRIPTS = Path(__file__).parent / "fakes" / "site_stager"
ODD_PATHS = ["/data/run 7/with space.root", "/data/tab\there/\tleading and trailing\t",
             "/données/Ünïcode €/Ωμέγα ファイル.root", "/data/ends with space "]


def script(name):
    return str(SCRIPTS / name)


@pytest.fixture
def site(tmp_path):
    """The fake tape system's directory, with an empty catalogue."""
    (tmp_path / "catalogue.json").write_text("{}")
    return tmp_path


def catalogue(site, entries):
    (site / "catalogue.json").write_text(json.dumps(entries))


def site_stager(site, **options):
    commands = {op: script(f"{op}.py") for op in ("locate", "stage", "poll", "cancel", "release", "status")}
    return CommandStager(**{**commands, "env": {"FAKE_SITE_DIR": site}, **options})


def saying(stdout="", *, stderr="", exit=0, **options):
    """A stager whose every script is say.sh, printing this answer."""
    env = {"FAKE_STDOUT": stdout, "FAKE_STDERR": stderr, "FAKE_EXIT": exit}
    return CommandStager(locate=script("say.sh"), stage=script("say.sh"), poll=script("say.sh"),
                         status=script("say.sh"), env=env, **options)


def test_it_locates_through_the_site_script(site):
    catalogue(site, {"/data/a.root": ["T00001", 4096, 10**9], "/data/b.root": ["T00002", 0, 7]})
    answers = site_stager(site).locate(["/data/b.root", "/data/gone.root", "/data/a.root"])
    assert answers == [
        Location(path="/data/b.root", tape="T00002", position=0, size=7, media="LTO-8"),
        LocateError(path="/data/gone.root", error_class="permanent", message="no such file in the tape catalogue"),
        Location(path="/data/a.root", tape="T00001", position=4096, size=10**9, media="LTO-8"),
    ]


def test_it_stages_polls_cancels_and_releases_through_the_site_scripts(site):
    stager = site_stager(site)
    job = JobSpec(id="j1", paths=["/data/a.root", "/data/b.root", "/data/unreadable.root"], tape="T00001")

    job.backend_id = stager.submit(job)
    assert job.backend_id == "be-j1"
    assert json.loads((site / "jobs" / "be-j1.json").read_text())["tape"] == "T00001"
    assert stager.status()["queued_files"] == 3

    failed = FileStatus(path="/data/unreadable.root", state="failed", error_class="permanent",
                        message="tape read error at block 1234")
    assert stager.poll([job]) == {"j1": [FileStatus(path="/data/a.root", state="staging"),
                                         FileStatus(path="/data/b.root", state="staging"), failed]}

    stager.cancel(job.backend_id, ["/data/b.root"])
    job.paths.remove("/data/b.root")
    assert stager.poll([job]) == {"j1": [FileStatus(path="/data/a.root", state="done"), failed]}

    stager.release(job.backend_id, ["/data/a.root"])
    assert json.loads((site / "released.jsonl").read_text()) == {"job": "be-j1", "path": "/data/a.root"}


def test_it_sends_the_same_job_id_again_and_gets_the_same_job(site):
    stager = site_stager(site)
    job = JobSpec(id="j1", paths=["/data/a.root"])
    assert stager.submit(job) == stager.submit(job) == "be-j1"
    assert [p.name for p in (site / "jobs").iterdir()] == ["be-j1.json"]


def test_it_leaves_out_jobs_the_poll_script_does_not_mention(site):
    stager = site_stager(site)
    known = JobSpec(id="j1", paths=["/data/a.root"])
    known.backend_id = stager.submit(known)
    lost = JobSpec(id="j2", paths=["/data/b.root"], backend_id="be-j2")
    assert stager.poll([known, lost]) == {"j1": [FileStatus(path="/data/a.root", state="staging")]}


def test_it_finds_the_job_of_a_poll_line_without_one_from_its_path():
    line = json.dumps({"path": "/data/b.root", "state": "done"})
    jobs = [JobSpec(id="j1", paths=["/data/a.root"], backend_id="x1"),
            JobSpec(id="j2", paths=["/data/b.root"], backend_id="x2")]
    assert saying(line).poll(jobs) == {"j2": [FileStatus(path="/data/b.root", state="done")]}


def test_it_ignores_poll_lines_about_files_it_did_not_ask_for():
    lines = "\n".join(json.dumps(line) for line in [
        {"job": "x1", "path": "/data/withdrawn.root", "state": "done"},
        {"path": "/data/never-asked.root", "state": "done"},
    ])
    assert saying(lines).poll([JobSpec(id="j1", paths=["/data/a.root"], backend_id="x1")]) == {"j1": []}


def test_paths_with_spaces_tabs_and_unicode_survive(site):
    catalogue(site, {path: ["T00001", n, 1] for n, path in enumerate(ODD_PATHS)})
    stager = site_stager(site)
    assert [a.path for a in stager.locate(ODD_PATHS)] == ODD_PATHS

    job = JobSpec(id="j1", paths=ODD_PATHS)
    job.backend_id = stager.submit(job)
    assert list(json.loads((site / "jobs" / "be-j1.json").read_text())["files"]) == ODD_PATHS
    assert [s.path for s in stager.poll([job])["j1"]] == ODD_PATHS


def test_it_sends_many_long_paths_through_standard_input(site):
    paths = [f"/data/{'d' * 200}/{n:05d}/{'f' * 3800}.root" for n in range(1000)]
    catalogue(site, {path: ["T00001", n, 1] for n, path in enumerate(paths)})
    assert [a.position for a in site_stager(site).locate(paths)] == list(range(1000))


def test_exit_75_raises_stager_unavailable(site):
    stager = site_stager(site, poll=script("unavailable.sh"))
    with pytest.raises(StagerUnavailable, match=r"unavailable \(exit 75\)[\s\S]*ACSLS not answering") as raised:
        stager.poll([JobSpec(id="j1", paths=["/data/a.root"], backend_id="x1")])
    assert not isinstance(raised.value, SiteScriptError)


def test_a_timeout_raises_stager_unavailable_and_kills_what_the_script_started(site):
    stager = site_stager(site, locate=script("slow.sh"), timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(StagerUnavailable, match=r"did not finish within 0.5 s[\s\S]*waiting for a drive"):
        stager.locate(["/data/a.root"])
    # The sleep slow.sh started holds the output pipe: only killing the group returns this fast.
    assert time.monotonic() - started < 10


def test_a_failing_script_reports_its_exit_code_and_standard_error():
    with pytest.raises(SiteScriptError, match=r"the locate script \(.*say.sh\) failed with exit 3[\s\S]*hsi: boom"):
        saying(exit=3, stderr="hsi: boom\n").locate(["/data/a.root"])


def test_a_missing_script_gives_a_clear_error(tmp_path):
    stager = CommandStager(locate=str(tmp_path / "nowhere" / "locate"), stage="true", poll="true")
    with pytest.raises(SiteScriptError, match=r"the locate script \(.*/nowhere/locate\) cannot be started: "
                                              r"No such file or directory"):
        stager.locate(["/data/a.root"])


@pytest.mark.parametrize("lines, number, problem", [
    ('{"path": "/data/a.root", "tape": "T1", "position": 0, "size": 1}\nT1 0 1', 2, "not JSON"),
    ('["/data/a.root", "T1"]', 1, "expected a JSON object, not list"),
    ('\n\n{"path": "/data/a.root", "tape": " ", "position": 0, "size": 1}', 3, '"tape" is empty'),
    ('{"path": "/data/a.root", "tape": "T1", "size": 1}', 1, '"position" is missing'),
    ('{"path": "/data/a.root", "tape": "T1", "position": "0", "size": 1}', 1, '"position" must be an integer, not "0"'),
    ('{"path": "/data/a.root", "tape": "T1", "position": 0, "size": -1}', 1, '"size" must not be negative'),
    # What the database could not store failed its insert, and the cycle with a database error.
    ('{"path": "/data/a.root", "tape": "%s", "position": 0, "size": 1}' % ("T" * 65), 1,
     '"tape" is longer than 64 characters'),
    ('{"path": "/data/a.root", "tape": "T1", "position": 0, "size": 1, "media": "%s"}' % ("M" * 33), 1,
     '"media" is longer than 32 characters'),
    ('{"path": "/data/a.root", "tape": "T1", "position": %d, "size": 1}' % 2**63, 1,
     '"position" must be at most 9223372036854775807'),
    ('{"path": "/data/a.root", "error": "gone", "class": "fatal"}', 1,
     '"class" must be one of permanent, transient, user'),
    ('{"path": "/data/b.root", "tape": "T1", "position": 0, "size": 1}', 1, "this path was not asked for"),
    ('{"path": "/data/a.root", "error": "gone"}\n{"path": "/data/a.root", "error": "gone"}', 2,
     "a second answer for this path"),
])
def test_malformed_locate_output_gives_an_error_naming_the_script_and_line(lines, number, problem):
    with pytest.raises(SiteScriptError, match=r"the locate script \(.*say.sh\)") as raised:
        saying(lines).locate(["/data/a.root"])
    assert f"printed a bad line {number}: {problem}" in str(raised.value)


def test_a_location_without_a_tape_is_left_to_the_sites_tape_map():
    [found] = saying('{"path": "/data/run7/a.root", "size": 5}').locate(["/data/run7/a.root"])
    assert (found.tape, found.position, found.size, found.tape_known) == ("rest:/data/run7", 0, 5, False)


@pytest.mark.parametrize("line, problem", [
    ({"job": "x1", "path": "/data/a.root", "state": "spinning"}, '"state" must be one of queued, staging, done'),
    ({"job": "x9", "path": "/data/a.root", "state": "done"}, "job 'x9' was not polled"),
    ({"path": "/data/shared.root", "state": "done"}, 'no "job", and this path is in 2 of the polled jobs'),
])
def test_malformed_poll_output_gives_an_error_naming_the_line(line, problem):
    jobs = [JobSpec(id="j1", paths=["/data/a.root", "/data/shared.root"], backend_id="x1"),
            JobSpec(id="j2", paths=["/data/shared.root"], backend_id="x2")]
    with pytest.raises(SiteScriptError, match="the poll script") as raised:
        saying(json.dumps(line)).poll(jobs)
    assert f"printed a bad line 1: {problem}" in str(raised.value)


def test_stage_uses_the_job_id_when_the_script_prints_nothing():
    assert saying("").submit(JobSpec(id="j1", paths=["/data/a.root"])) == "j1"


def test_stage_refuses_more_than_the_backend_id():
    with pytest.raises(SiteScriptError, match="printed a bad line 2: a second line: print the backend id alone"):
        saying("req-17\nqueued 1 file\n").submit(JobSpec(id="j1", paths=["/data/a.root"]))


def test_status_returns_the_scripts_object(site):
    assert site_stager(site).status()["disk_free_bytes"] == 7 * 10**12
    with pytest.raises(SiteScriptError, match="the status script .* printed a JSON list; expected one JSON object"):
        saying("[]").status()


def test_optional_operations_absent_are_no_ops(site):
    stager = CommandStager(locate=script("locate.py"), stage=script("stage.py"), poll=script("poll.py"),
                           env={"FAKE_SITE_DIR": site})
    stager.cancel("be-j1", ["/data/a.root"])
    stager.release("be-j1", ["/data/a.root"])
    assert stager.status() == {}
    assert list(site.iterdir()) == [site / "catalogue.json"]


def test_locate_stage_and_poll_are_required():
    with pytest.raises(TypeError, match="poll"):
        CommandStager(locate="true", stage="true")


def test_a_command_is_a_shell_like_string_or_a_list(tmp_path):
    answer = json.dumps({"path": "/data/a.root", "error": "gone"})
    env = {"FAKE_STDOUT": answer}
    as_string = CommandStager(locate=f"sh '{script('say.sh')}'", stage="true", poll="true", env=env)
    as_list = CommandStager(locate=["sh", script("say.sh")], stage="true", poll="true", env=env)
    assert as_string.locate(["/data/a.root"]) == as_list.locate(["/data/a.root"]) == [
        LocateError(path="/data/a.root", error_class="permanent", message="gone")]
