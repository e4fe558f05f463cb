"""The `tape-rest` stager against a small WLCG Tape REST API v1 server on loopback."""
from datetime import datetime, timezone

import pytest

from carousel.stagers.base import FileStatus, JobSpec, LocateError, Location, StagerUnavailable
from carousel.stagers.tape_rest import TapeRestStager
from tests.fakes.tape_rest_server import TapeRestServer

TOKEN = "alice-token"


@pytest.fixture
def server():
    with TapeRestServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def make_stager(server, tmp_path):
    made = []

    def make(**options):
        options = {"url": server.url, "token": TOKEN, "timeout_s": 5, "state_dir": tmp_path / "state", **options}
        made.append(TapeRestStager(**options))
        return made[-1]

    yield make
    for stager in made:
        stager.close()


@pytest.fixture
def stager(make_stager):
    return make_stager()


def sent(stager, job):
    job.backend_id = stager.submit(job)
    return job


def states(answer):
    return {s.path: (s.state, s.error_class) for s in answer}


def test_it_discovers_the_v1_endpoint_once(server, stager):
    stager.locate(["/data/a"])
    stager.locate(["/data/b"])
    assert stager._discover() == server.url + "/api/v1"
    assert server.calls["GET /.well-known/wlcg-tape-rest-api"] == 1


def test_it_discovers_again_after_a_connection_failure(server, stager):
    stager.locate(["/data/a"])
    server.down = True
    with pytest.raises(StagerUnavailable):
        stager.locate(["/data/a"])
    server.down = False
    stager.locate(["/data/a"])
    assert server.calls["GET /.well-known/wlcg-tape-rest-api"] == 2


def test_it_stages_one_request_per_job_and_returns_the_request_id(server, stager):
    first = stager.submit(JobSpec(id="job-1", paths=["/data/a", "/data/b"]))
    second = stager.submit(JobSpec(id="job-2", paths=["/data/c"]))
    assert server.calls["POST /stage"] == 2
    assert set(server.requests) == {first, second}
    assert list(server.requests[first]["files"]) == ["/data/a", "/data/b"]


def test_it_sends_disk_lifetimes(server, make_stager):
    stager = make_stager(disk_lifetime="P1D")
    stager.submit(JobSpec(id="job-1", paths=["/data/a", "/data/b"], lifetimes={"/data/b": 3600}))
    assert server.stage_bodies[0]["files"] == [
        {"path": "/data/a", "diskLifetime": "P1D"}, {"path": "/data/b", "diskLifetime": "PT3600S"}]


def test_it_leaves_disk_lifetime_to_the_server_by_default(server, stager):
    stager.submit(JobSpec(id="job-1", paths=["/data/a"]))
    assert server.stage_bodies[0]["files"] == [{"path": "/data/a"}]


def test_resubmitting_a_job_id_does_not_post_again(server, stager, make_stager):
    first = stager.submit(JobSpec(id="job-1", paths=["/data/a"]))
    again = stager.submit(JobSpec(id="job-1", paths=["/data/a"]))
    # A restarted process finds the record too.
    restarted = make_stager()
    assert restarted.submit(JobSpec(id="job-1", paths=["/data/a"])) == first == again
    assert server.calls["POST /stage"] == 1


def test_it_keeps_its_records_under_var_dir_by_default(make_stager, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    stager = make_stager(state_dir=None)
    request_id = stager.submit(JobSpec(id="job-1", paths=["/data/a"]))
    assert request_id in (tmp_path / "tape-rest" / "job-1.json").read_text()


def test_polling_forgets_the_record_once_the_loop_holds_the_id(stager, tmp_path):
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a"]))
    assert (tmp_path / "state" / "job-1.json").exists()
    stager.poll([job])
    assert not (tmp_path / "state" / "job-1.json").exists()


def test_it_stages_and_polls_to_done(server, stager):
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a", "/data/b"]))
    assert stager.poll([job]) == {"job-1": [FileStatus("/data/a", "queued"), FileStatus("/data/b", "queued")]}
    server.advance()
    assert states(stager.poll([job])["job-1"]) == {"/data/a": ("staging", ""), "/data/b": ("staging", "")}
    server.advance()
    assert states(stager.poll([job])["job-1"]) == {"/data/a": ("done", ""), "/data/b": ("done", "")}


def test_it_classifies_failures(server, stager):
    server.failing = {"/data/gone": "No such file or directory", "/data/lost": "file is lost on tape",
                      "/data/drive": "tape drive error, retry later", "/data/net": "connection lost to the mover"}
    job = sent(stager, JobSpec(id="job-1", paths=["/data/gone", "/data/lost", "/data/drive", "/data/net"]))
    server.advance()
    server.advance()
    answer = stager.poll([job])["job-1"]
    assert states(answer) == {"/data/gone": ("failed", "permanent"), "/data/lost": ("failed", "permanent"),
                              "/data/drive": ("failed", "transient"), "/data/net": ("failed", "transient")}
    assert "tape drive error" in answer[2].message


def test_a_cancellation_it_did_not_ask_for_is_a_transient_failure(server, stager):
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a"]))
    server.requests[job.backend_id]["files"]["/data/a"]["state"] = "CANCELLED"
    assert states(stager.poll([job])["job-1"]) == {"/data/a": ("failed", "transient")}


def test_it_reads_files_reported_as_on_disk(server, stager):
    server.on_disk_style = True
    server.failing = {"/data/b": "No such file"}
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a", "/data/b"]))
    assert states(stager.poll([job])["job-1"]) == {"/data/a": ("queued", ""), "/data/b": ("queued", "")}
    server.advance()
    server.advance()
    assert states(stager.poll([job])["job-1"]) == {"/data/a": ("done", ""), "/data/b": ("failed", "permanent")}


def test_it_matches_paths_the_server_sanitised(server, stager):
    job = sent(stager, JobSpec(id="job-1", paths=["/data//a"]))
    server.advance()
    server.advance()
    assert stager.poll([job]) == {"job-1": [FileStatus("/data//a", "done")]}


def test_a_file_missing_from_the_request_fails_as_transient(server, stager):
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a"]))
    job.paths = ["/data/a", "/data/never-sent"]
    assert states(stager.poll([job])["job-1"])["/data/never-sent"] == ("failed", "transient")


def test_it_leaves_out_a_job_the_server_does_not_know(server, stager):
    known = sent(stager, JobSpec(id="job-1", paths=["/data/a"]))
    forgotten = sent(stager, JobSpec(id="job-2", paths=["/data/b"]))
    del server.requests[forgotten.backend_id]
    assert list(stager.poll([known, forgotten])) == ["job-1"]


def test_it_accepts_millisecond_timestamps(server, stager):
    server.millis = True
    server.failing = {"/data/a": "checksum mismatch"}
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a"]))
    server.advance()
    server.advance()
    [status] = stager.poll([job])["job-1"]
    assert status.state == "failed"
    # Read as seconds, today in milliseconds would be some 50,000 years from now.
    assert f"(at {datetime.now(timezone.utc).year}-" in status.message


def test_it_cancels(server, stager):
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a", "/data/b"]))
    stager.cancel(job.backend_id, ["/data/a"])
    assert states(stager.poll([job])["job-1"])["/data/a"] == ("failed", "transient")
    assert server.requests[job.backend_id]["files"]["/data/a"]["state"] == "CANCELLED"
    assert server.requests[job.backend_id]["files"]["/data/b"]["state"] == "SUBMITTED"


def test_a_foreign_path_does_not_fail_the_whole_cancel(server, stager):
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a", "/data/b"]))
    stager.cancel(job.backend_id, ["/data/a", "/elsewhere/x"])
    assert server.requests[job.backend_id]["files"]["/data/a"]["state"] == "CANCELLED"
    assert server.calls["POST /stage/{id}/cancel"] == 3  # the list, then each path alone


def test_cancelling_a_forgotten_request_is_not_an_error(server, stager):
    stager.cancel("no-such-request", ["/data/a"])
    assert server.calls["POST /stage/{id}/cancel"] == 1


def test_it_releases(server, stager):
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a", "/data/b"]))
    stager.release(job.backend_id, ["/data/a"])
    assert server.released == [(job.backend_id, ["/data/a"])]


def test_it_locates(server, stager):
    server.files = {"/data/a": "TAPE", "/data/b": "DISK_AND_TAPE", "/data/lost": "LOST",
                    "/data/busy": "UNAVAILABLE", "/data/unknown": None}
    answer = stager.locate(["/data/a", "/data/b", "/data/lost", "/data/busy", "/data/unknown", "/data/nothing"])
    assert answer[:2] == [Location("/data/a", "rest:/data", 0, 0, tape_known=False),
                          Location("/data/b", "rest:/data", 0, 0, tape_known=False, on_disk=True)]
    assert [(type(a), getattr(a, "error_class", "")) for a in answer[2:]] == [
        (LocateError, "permanent"), (LocateError, "transient"), (Location, ""), (LocateError, "permanent")]
    assert "No such file" in answer[5].message


def test_an_archiveinfo_error_is_classed_by_its_words(server, stager):
    """Every per-path error of archiveinfo failed the file at once (permanent), also "not known
    yet, being located; ask again", which a second Carousel's door answers for a file it has not
    located yet: the user's request failed for a wait of seconds."""
    server.archive_errors = {"/data/soon": "not known yet, being located; ask again",
                             "/data/busy": "internal error, try later", "/data/gone": "No such file or directory"}
    answer = stager.locate(["/data/soon", "/data/busy", "/data/gone"])
    assert [(type(a), a.error_class) for a in answer] == [
        (LocateError, "transient"), (LocateError, "transient"), (LocateError, "permanent")]
    assert "being located" in answer[0].message


def test_it_takes_a_tape_label_a_server_offers(server, stager):
    server.files = {"/data/a": "TAPE", "/data/b": "TAPE", "/data/c": "TAPE"}
    server.archive_extras = {"/data/a": {"metadata": {"vid": "L80001"}},
                             "/data/b": {"targetedMetadata": {"fake-site": {"tape": "L80002"}, "other": {"tape": "X"}}}}
    assert [loc.tape for loc in stager.locate(["/data/a", "/data/b", "/data/c"])] == ["L80001", "L80002", "rest:/data"]


def test_it_locates_in_batches(server, make_stager):
    server.files = {f"/data/{i}": "TAPE" for i in range(5)}
    stager = make_stager(locate_batch=2)
    assert len(stager.locate(list(server.files))) == 5
    assert server.calls["POST /archiveinfo"] == 3


def test_a_long_directory_gets_a_label_that_fits(server, stager):
    path = "/data/" + "d" * 100 + "/file"
    server.files = {path: "TAPE"}
    [location] = stager.locate([path])
    assert len(location.tape) == 64 and location.tape.endswith("dd")


def test_a_wrong_token_gives_a_clear_error(server, make_stager):
    stager = make_stager(token="mallory")
    with pytest.raises(StagerUnavailable, match=r"401 Unauthorized: a valid bearer token is required \(is the token"):
        stager.submit(JobSpec(id="job-1", paths=["/data/a"]))
    assert server.requests == {}


def test_it_reads_the_token_file_at_every_call(make_stager, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("old-token\n")
    stager = make_stager(token="", token_file=token_file)
    with pytest.raises(StagerUnavailable, match="401"):
        stager.submit(JobSpec(id="job-1", paths=["/data/a"]))
    token_file.write_text(TOKEN + "\n")  # a renewer rotated it
    assert stager.submit(JobSpec(id="job-1", paths=["/data/a"]))


def test_a_server_that_drops_connections_is_unavailable(server, stager):
    job = sent(stager, JobSpec(id="job-1", paths=["/data/a"]))
    server.down = True
    with pytest.raises(StagerUnavailable):
        stager.poll([job])


def test_a_server_answering_503_is_unavailable(server, stager):
    server.answer_all = 503
    with pytest.raises(StagerUnavailable, match="503 Service unavailable: the fake is down"):
        stager.submit(JobSpec(id="job-1", paths=["/data/a"]))


def test_a_stopped_server_is_unavailable(make_stager):
    with TapeRestServer() as stopped:
        url = stopped.url
    with pytest.raises(StagerUnavailable, match="ConnectError"):
        make_stager(url=url).locate(["/data/a"])


def test_it_has_no_drive_view(stager):
    assert stager.status() == {}


def test_it_is_the_tape_rest_plugin(server, settings, tmp_path):
    from carousel.infra import plugins

    settings.CAROUSEL_STAGER = "tape-rest"
    settings.CAROUSEL_STAGER_OPTIONS = {"url": server.url, "token": TOKEN, "state_dir": str(tmp_path)}
    stager = plugins.stager()
    try:
        assert isinstance(stager, TapeRestStager)
        assert stager.submit(JobSpec(id="job-1", paths=["/data/a"])) in server.requests
    finally:
        stager.close()
