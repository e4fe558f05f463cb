"""The `carousel` command line, end to end: the installed program against a live Carousel (API on
loopback, a real worker, the simulated library with bytes); and the package alone in a bare
virtual environment."""
import json
import os
import pty
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from carousel.models import Control, RestoreRequest
from tests.conftest import client_for
from tests.live import carousel, carousel_at_rest, client_venv, open_dir, program  # noqa: F401 (fixtures)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))
from carousel_client import api as client_api  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run(carousel, user, *args, stdin=None, **env):
    done = subprocess.run([program("carousel"), *args], input=stdin, capture_output=True, text=True, timeout=120,
                          env=carousel.env(user, **env))
    return done.returncode, done.stdout, done.stderr


def run_on_a_terminal(carousel, user, *args):
    """The program with its standard output on a pseudo-terminal: (exit code, what it drew)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([program("carousel"), *args], stdout=slave, stderr=slave, env=carousel.env(user))
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    return proc.wait(timeout=120), drawn.decode(errors="replace")


def test_the_client_installs_into_a_bare_venv_without_django(client_venv, tmp_path):
    venv = client_venv
    helped = subprocess.run([str(venv / "bin/carousel"), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "submit" in helped.stdout and "exit codes" in helped.stdout
    for hook in ("carousel-xrd-stagecmd", "carousel-xrd-prepare"):
        assert (venv / "bin" / hook).exists()
    freeze = subprocess.run([str(venv / "bin/pip"), "freeze"], capture_output=True, text=True).stdout.lower()
    assert "httpx==0.28.1" in freeze and "django" not in freeze
    unconfigured = subprocess.run([str(venv / "bin/carousel"), "ls"], capture_output=True, text=True,
                                  env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert unconfigured.returncode == 3 and "no Carousel server configured" in unconfigured.stderr


@pytest.mark.long(15)
def test_submit_a_list_wait_status_ls_and_why(carousel, alice, tmp_path):
    paths = [f"/exp/run7/file{i}.root" for i in range(5)]
    for i, path in enumerate(paths):
        carousel.tape(path, bytes([i]) * (1000 + i))
    listing = tmp_path / "list.txt"
    listing.write_text("# run 7\n" + "\n".join(paths[:3]) + "\n")
    code, out, err = run(carousel, alice, "submit", "--from-file", str(listing), "-", paths[4], "--priority", "2",
                         "--json", stdin=paths[3] + "\n")
    assert code == 0, err
    submitted = json.loads(out)
    bulk = submitted["id"]
    assert submitted["files"] == 5 and submitted["created"] == 5

    code, drawn = run_on_a_terminal(carousel, alice, "wait", bulk, "--interval", "0.3")
    assert code == 0, drawn
    assert "\r[" in drawn and "/5 files" in drawn and "files/s" in drawn  # the progress bar
    assert "5 of 5 files restored" in drawn

    code, out, err = run(carousel, alice, "wait", bulk)  # not a terminal: no bar
    assert code == 0 and "\r" not in out and out.strip() == "5 of 5 files restored"

    code, out, _ = run(carousel, alice, "status", bulk)
    assert code == 0 and f"submission {bulk}: 5 of 5 files restored" in out and "done 5" in out
    code, out, err = run(carousel, alice, "status", "--json")  # the latest submission
    assert code == 0, err
    status = json.loads(out)
    assert status["id"] == bulk and status["states"]["done"] == 5
    assert status["counts"]["restored"] == 5 and sum(status["counts"].values()) == 5
    finished = sorted(RestoreRequest.objects.filter(path__in=paths).values_list("finished_at", flat=True))
    assert status["estimate"] == {"earliest": finished[0].isoformat().replace("+00:00", "Z"),
                                  "latest": finished[-1].isoformat().replace("+00:00", "Z")}
    assert sorted((r["path"], r["where"]) for r in status["restored"]) == sorted(
        (p, f"{carousel.disk}{p}") for p in paths)

    code, out, err = run(carousel, alice, "ls", "--bulk", bulk, "--state", "done", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert sorted(r["path"] for r in rows) == sorted(paths)
    assert all(r["priority"] == 2 and Path(r["disk_path"]).read_bytes() == (carousel.archive / r["path"][1:])
               .read_bytes() for r in rows)
    code, out, _ = run(carousel, alice, "ls", "--path", "file3")
    assert code == 0 and out.count("\n") == 3 and out.startswith("      ID  STATE") and paths[3] in out

    code, out, _ = run(carousel, alice, "why", paths[0])
    assert code == 0 and f"{paths[0]}: done" in out and f"on disk at {carousel.disk}{paths[0]}" in out
    code, out, _ = run(carousel, alice, "ls", "--path", "file4")
    assert code == 0 and out.splitlines()[2].strip() == f"on disk at {carousel.disk}{paths[4]}"


@pytest.mark.long(20)
def test_wait_reports_failures_and_cancellations_with_their_own_codes(carousel, alice):
    carousel.tape("/exp/ok/a", b"a")
    code, out, err = run(carousel, alice, "submit", "/exp/ok/a", "/exp/not/on/tape")
    assert code == 0, err
    code, out, _ = run(carousel, alice, "wait", out.strip())
    assert code == client_api.EXIT_FAILED and "1 of 2 files restored; 1 failed" in out
    code, out, _ = run(carousel, alice, "why", "/exp/not/on/tape")
    assert code == 0 and "failed" in out and "no such file on tape" in out

    Control.objects.filter(id=1).update(paused=True)  # nothing leaves the queue: they can be cancelled
    carousel.tape("/exp/c/1", b"1")
    carousel.tape("/exp/c/2", b"2")
    carousel.tape("/exp/c/3", b"3")
    _, out, _ = run(carousel, alice, "submit", "/exp/c/1", "/exp/c/2", "--json")
    first = json.loads(out)["id"]
    _, out, _ = run(carousel, alice, "submit", "/exp/c/3")
    second = out.strip()
    code, out, _ = run(carousel, alice, "cancel", "/exp/c/1")
    assert code == 0 and out.strip() == "cancelled 1 request"
    code, out, _ = run(carousel, alice, "cancel", second, "--json")
    assert code == 0 and json.loads(out) == {"cancelled": 1}
    code, _, err = run(carousel, alice, "cancel", "/exp/c/1")
    assert code == client_api.EXIT_NOT_FOUND and "no active request for: /exp/c/1" in err
    Control.objects.filter(id=1).update(paused=False)
    code, out, _ = run(carousel, alice, "wait", first)
    assert code == client_api.EXIT_CANCELLED and "1 of 2 files restored" in out
    code, out, _ = run(carousel, alice, "wait", second, "--json")
    assert code == client_api.EXIT_CANCELLED and json.loads(out)["result"] == "cancelled"
    assert RestoreRequest.objects.filter(state="cancelled").count() == 2


def test_each_error_has_its_message_and_exit_code(carousel_at_rest, alice, tmp_path):
    carousel = carousel_at_rest  # the API alone: no cycle is needed
    code, out, err = run(carousel, alice, "submit", "relative/path", "/fine", "--json")
    assert code == client_api.EXIT_REFUSED
    assert "refused:" in err and "argument 1: relative/path: not an absolute path" in err
    assert json.loads(out)["exit_code"] == client_api.EXIT_REFUSED
    assert not RestoreRequest.objects.exists()  # nothing half stored
    # A refused path is named by its line in what the user gave (blank lines and comments
    # count), not by its place in the list sent (which said "line 2" for line 5 of the file).
    listing = tmp_path / "paths.txt"
    listing.write_text("# run 4\n\n/fine\n\nrel/bad\n")
    code, _, err = run(carousel, alice, "submit", "--from-file", str(listing), "-", stdin="/ok\nalso/bad\n")
    assert code == client_api.EXIT_REFUSED
    assert f"line 5 of {listing}: rel/bad: not an absolute path" in err
    assert "line 2 of standard input: also/bad: not an absolute path" in err

    code, _, err = run(carousel, alice, "status", str(uuid.uuid4()))
    assert code == client_api.EXIT_NOT_FOUND and "not found" in err
    code, _, err = run(carousel, alice, "status")
    assert code == client_api.EXIT_NOT_FOUND and "you have no submissions yet" in err
    code, _, err = run(carousel, alice, "wait", "not-an-id")
    assert code == client_api.EXIT_USAGE and "'not-an-id' is not a submission id" in err
    code, _, err = run(carousel, alice, "why", "/never/asked")
    assert code == client_api.EXIT_NOT_FOUND and "you have no request for /never/asked" in err
    code, _, err = run(carousel, alice, "submit")
    assert code == client_api.EXIT_USAGE and "no paths to submit" in err
    code, _, err = run(carousel, alice, "bogus")
    assert code == 2 and "invalid choice" in err

    code, out, err = run(carousel, alice, "ls", CAROUSEL_TOKEN="wrong")
    assert code == client_api.EXIT_AUTH, (out, err)
    assert code == client_api.EXIT_AUTH and "the server refused the token" in err and "CAROUSEL_TOKEN" in err
    code, out, _ = run(carousel, alice, "ls", CAROUSEL_TOKEN_FILE="/nonexistent/token")
    assert code == 0 and out.strip() == "(no requests)"  # CAROUSEL_TOKEN (set) wins over the file
    env_without_token = {"CAROUSEL_TOKEN": "", "CAROUSEL_TOKEN_FILE": "/nonexistent/token"}
    code, _, err = run(carousel, alice, "ls", **env_without_token)
    assert code == client_api.EXIT_CONFIG and "cannot read the token file /nonexistent/token" in err

    with socket_closed() as port:
        code, _, err = run(carousel, alice, "ls", CAROUSEL_URL=f"http://127.0.0.1:{port}", CAROUSEL_RETRY_S="1")
    assert code == client_api.EXIT_UNAVAILABLE and "cannot reach Carousel" in err
    # An empty filter was dropped (every request listed, exit 0), and an address with a page's
    # path printed that page's HTML as the error (a probe's findings).
    code, _, err = run(carousel, alice, "ls", "--state", "")
    assert code == client_api.EXIT_REFUSED and "state" in err, err
    code, _, err = run(carousel, alice, "ls", CAROUSEL_URL=carousel.url + "/live")
    assert code == client_api.EXIT_CONFIG and "not Carousel's API: check CAROUSEL_URL" in err and "<" not in err, err


def test_an_operator_is_shown_their_own_submissions_and_requests_by_default(carousel_at_rest, alice, operator):
    """`carousel status` (your latest), `ls` (your requests) and `why PATH` for someone who may
    see every user's: before, alice's latest submission, her requests and her request for the
    path. The API still lists everyone's when not asked for the caller's own (?mine=true)."""
    carousel = carousel_at_rest  # the API alone: no cycle is needed
    code, out, err = run(carousel, alice, "submit", "/exp/ok/a")
    assert code == 0, err
    code, _, err = run(carousel, operator, "status")
    assert code == client_api.EXIT_NOT_FOUND and "you have no submissions yet" in err
    code, out, _ = run(carousel, operator, "ls")
    assert code == 0 and out.strip() == "(no requests)"
    code, _, err = run(carousel, operator, "why", "/exp/ok/a")
    assert code == client_api.EXIT_NOT_FOUND and "you have no request for /exp/ok/a" in err
    api = client_for(operator)
    assert [r["path"] for r in api.get("/api/v1/requests/").json()["results"]] == ["/exp/ok/a"]
    assert api.get("/api/v1/requests/", {"mine": "true"}).json()["results"] == []
    assert len(api.get("/api/v1/bulks/").json()["results"]) == 1
    assert api.get("/api/v1/bulks/", {"mine": "true"}).json()["results"] == []
    assert api.get("/api/v1/bulks/", {"mine": "maybe"}).status_code == 400


class socket_closed:
    """A loopback port nothing listens on."""

    def __enter__(self):
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *exc):
        return False


def test_the_client_honours_retry_after_and_backs_off():
    answers = iter([httpx.Response(429, headers={"Retry-After": "7"}, json={"detail": "slow down"}),
                    httpx.Response(503, json={"detail": "busy"}),
                    httpx.Response(200, json={"results": []})])
    slept = []
    client = client_api.Client(client_api.Config("http://carousel.test", "k"), sleep=slept.append,
                               transport=httpx.MockTransport(lambda request: next(answers)))
    assert client.get("bulks/") == {"results": []}
    assert slept[0] == 7.0 and 1.0 <= slept[1] <= 3.0  # the second wait doubled, jittered

    always = httpx.MockTransport(lambda request: httpx.Response(429, headers={"Retry-After": "30"}, json={}))
    slept.clear()
    client = client_api.Client(client_api.Config("http://carousel.test", "k"), sleep=slept.append, patience=65,
                               transport=always)
    with pytest.raises(client_api.ClientError) as refused:
        client.get("bulks/")
    assert refused.value.code == client_api.EXIT_UNAVAILABLE and slept == [30.0, 30.0]


def test_a_reader_that_goes_away_is_not_an_error(carousel_at_rest, alice):
    carousel = carousel_at_rest  # the API alone: no cycle is needed
    # `carousel ls | head`: the pipe closes before the listing is written.
    assert run(carousel, alice, "submit", "/pipe/a", "/pipe/b")[0] == 0
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = subprocess.Popen([program("carousel"), "ls", "--json"], stdout=write_end, stderr=subprocess.PIPE,
                            env=carousel.env(alice))
    os.close(write_end)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in err, err


# The command line's own decisions, against a scripted server (no live Carousel) --------------

from carousel_client import cli as client_cli  # noqa: E402

BULK = "5f0c5a4e-1b7e-4f3a-9a61-0c6f3b1c2d7e"


@pytest.fixture
def scripted(monkeypatch):
    """`carousel` talking to `answers` (path -> JSON body, or an exception to raise); what it
    asked for and the pauses it took are recorded."""
    monkeypatch.setenv("CAROUSEL_URL", "http://carousel.test")
    monkeypatch.setenv("CAROUSEL_TOKEN", "k")
    monkeypatch.delenv("CAROUSEL_RETRY_S", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    seen, slept, answers = [], [], {}

    def server(request):
        seen.append(request.url.path)
        answer = answers.get(request.url.path)
        if isinstance(answer, Exception):
            raise answer
        if answer is None:
            return httpx.Response(404, json={"detail": "Not found.", "code": "not_found"})
        return httpx.Response(200, json=answer)
    real = client_api.Client
    monkeypatch.setattr(client_cli.api, "Client", lambda config, **kw: real(
        config, transport=httpx.MockTransport(server), sleep=slept.append, **kw))
    return answers, seen, slept


def lines_of(text):
    return [line for line in text.splitlines() if line.strip()]


def test_a_refused_server_ends_the_command_at_once_naming_its_address(scripted, capsys, monkeypatch):
    answers, _, slept = scripted
    answers["/api/v1/requests/"] = httpx.ConnectError("[Errno 111] Connection refused")
    assert client_cli.main(["ls"]) == client_api.EXIT_UNAVAILABLE
    assert slept == []  # no retries without CAROUSEL_RETRY_S
    assert "cannot reach Carousel at http://carousel.test" in capsys.readouterr().err
    assert client_cli.patience(None)["connect_timeout"] < 5  # an unreachable host is not waited for either
    monkeypatch.setenv("CAROUSEL_RETRY_S", "20")
    assert client_cli.main(["ls"]) == client_api.EXIT_UNAVAILABLE
    assert slept and sum(slept) <= 20
    assert "CAROUSEL_RETRY_S" in client_cli.EPILOG and "within 5 s" in client_cli.EPILOG


def test_an_address_ending_in_api_v1_is_named(scripted, capsys, monkeypatch):
    _, seen, _ = scripted
    monkeypatch.setenv("CAROUSEL_URL", "https://carousel.example.org/api/v1/")
    assert client_cli.main(["ls"]) == client_api.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "CAROUSEL_URL ends in /api/v1" in err and "https://carousel.example.org" in err and seen == []


@pytest.mark.parametrize("variable, value, says", [
    ("CAROUSEL_URL", "http://[::1", "CAROUSEL_URL is not a URL"),
    ("CAROUSEL_URL", "http://carousel.test:port", "CAROUSEL_URL is not a URL"),
    ("CAROUSEL_URL", "127.0.0.1:8000", "CAROUSEL_URL is not an http or https address"),
    ("CAROUSEL_URL", "ftp://carousel.test", "CAROUSEL_URL is not an http or https address"),
    ("CAROUSEL_TOKEN", "t\u00f8ken", "the API token has characters no token has"),
    ("CAROUSEL_TOKEN", "abc\ndef", "the API token has characters no token has"),
    ("CAROUSEL_TOKEN_FILE", b"\xff\xfe", "cannot read the token file"),
])
def test_a_bad_address_or_token_is_a_configuration_error_in_one_line(scripted, capsys, monkeypatch, tmp_path,
                                                                   variable, value, says):
    """Before: a traceback (an IPv6 address cut short, a token file that is not text, a token
    outside ASCII) or "cannot reach Carousel" with advice to check the server (exit 7)."""
    _, seen, _ = scripted
    if variable == "CAROUSEL_TOKEN_FILE":
        (tmp_path / "token").write_bytes(value)
        monkeypatch.delenv("CAROUSEL_TOKEN")
        value = str(tmp_path / "token")
    monkeypatch.setenv(variable, value)
    assert client_cli.main(["ls"]) == client_api.EXIT_CONFIG
    err = lines_of(capsys.readouterr().err)
    assert says in err[0] and "Traceback" not in "".join(err) and seen == []


@pytest.mark.parametrize("option", [["--interval", "-5"], ["--interval", "0"], ["--timeout", "nan"],
                                    ["--timeout", "-1"], ["--timeout", "inf"], ["--interval", "soon"]])
def test_wait_refuses_pauses_and_timeouts_that_are_not_positive_seconds(scripted, capsys, option):
    """A negative --interval polled the API without a pause (28 calls in 3 s); nan never timed
    out. (--timeout 0 looks once: test_status_and_wait_give_the_summary_line_and_the_range_...)"""
    _, seen, _ = scripted
    with pytest.raises(SystemExit) as stopped:
        client_cli.main(["wait", "1d57393c-7641-45e8-b8b0-3b988f8f2a11", *option])
    assert stopped.value.code == client_api.EXIT_USAGE and seen == []
    assert option[0] in capsys.readouterr().err


@pytest.mark.parametrize("limit", ["-1", "ten", "2.5"])
def test_ls_refuses_a_limit_that_is_not_a_count(scripted, capsys, limit):
    """`carousel ls --limit -1` showed one row."""
    _, seen, _ = scripted
    with pytest.raises(SystemExit) as stopped:
        client_cli.main(["ls", "--limit", limit])
    assert stopped.value.code == client_api.EXIT_USAGE and seen == []
    assert "--limit" in capsys.readouterr().err


def test_why_takes_a_path_or_a_request_id_and_offers_to_submit_only_paths(scripted, capsys):
    answers, seen, _ = scripted
    assert client_cli.main(["why", "351"]) == client_api.EXIT_NOT_FOUND
    assert seen == ["/api/v1/requests/351/"] and "carousel submit" not in capsys.readouterr().err
    answers["/api/v1/requests/352/"] = {"id": 352, "path": "/exp/a", "state": "done", "disk_path": "/disk/exp/a"}
    assert client_cli.main(["why", "352"]) == 0
    assert "/exp/a: done (request 352)" in capsys.readouterr().out
    assert client_cli.main(["why", "run7/file.root"]) == client_api.EXIT_USAGE
    err = capsys.readouterr().err
    assert "is neither a path nor a request id" in err and "carousel submit" not in err
    answers["/api/v1/requests/"] = {"results": [], "next": None}
    assert client_cli.main(["why", "/exp/b"]) == client_api.EXIT_NOT_FOUND
    assert "carousel submit /exp/b" in capsys.readouterr().err  # a path: asking for it makes sense


@pytest.mark.parametrize("states, shown", [({"done": 1, "cancelled": 2}, "--state cancelled"),
                                           ({"failed": 1, "expired": 1}, "--state failed,expired")])
def test_wait_points_at_the_files_that_did_not_come_back(scripted, capsys, states, shown):
    answers, _, _ = scripted
    answers[f"/api/v1/bulks/{BULK}/"] = {"id": BULK, "files": 3, "states": states}
    answers["/api/v1/requests/"] = {"results": [], "next": None}
    assert client_cli.main(["wait", BULK]) in (client_api.EXIT_FAILED, client_api.EXIT_CANCELLED)
    assert f"(see: carousel ls --bulk {BULK} {shown})" in capsys.readouterr().out


def test_status_and_wait_give_the_summary_line_and_the_range_for_the_rest(scripted, capsys, monkeypatch):
    answers, _, _ = scripted
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    today = datetime.now(timezone.utc).date().isoformat()
    answers[f"/api/v1/bulks/{BULK}/"] = {"id": BULK, "files": 50_000,
                                         "states": {"done": 31_204, "failed": 12, "queued": 18_784}}
    answers[f"/api/v1/bulks/{BULK}/summary/"] = {
        "counts": {"restored": 31_204, "failed": 12, "queued": 18_000, "planned": 784}, "size": 0,
        "bytes_restored": 0, "finished": False, "why": ["18 files wait for tape SIM021, planned on drive 2"],
        "estimate": {"earliest": f"{today}T17:40:00Z", "latest": f"{today}T19:10:00Z"}}
    assert client_cli.main(["status", BULK]) == 0
    out = capsys.readouterr().out
    assert f"submission {BULK}: 31,204 of 50,000 files restored, 12 failed, the rest between 17:40 and 19:10" in out
    assert "why not yet: 18 files wait for tape SIM021, planned on drive 2" in out
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert client_cli.main(["wait", BULK, "--timeout", "0"]) == client_api.EXIT_TIMEOUT
    drawn = capsys.readouterr().out
    assert "\r[" in drawn and "31204/50000 files" in drawn and "rest between 17:40 and 19:10" in drawn


def test_why_says_where_a_restored_file_is_and_until_when_it_is_pinned(scripted, capsys, monkeypatch):
    answers, _, _ = scripted
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    answers["/api/v1/requests/5/"] = {"id": 5, "path": "/exp/a", "state": "done", "disk_path": "/disk/exp/a",
                                      "where": "/scratch/exp/a", "where_kind": "delivered",
                                      "pin_until": "2030-01-02T03:04:00Z"}
    assert client_cli.main(["why", "5"]) == 0
    out = capsys.readouterr().out
    assert "restored: delivered to /scratch/exp/a" in out and "pinned until 2030-01-02 03:04" in out


def test_ls_has_a_header_and_its_json_is_the_servers_rows(scripted, capsys):
    answers, _, _ = scripted
    rows = [{"id": 7, "state": "done", "size": 1500, "tape": "T1", "path": "/exp/a"},
            {"id": 6, "state": "queued", "size": None, "tape": None, "path": "/exp/b"}]
    answers["/api/v1/requests/"] = {"results": rows, "next": None}
    assert client_cli.main(["ls"]) == 0
    out = lines_of(capsys.readouterr().out)
    assert out[0].split() == ["ID", "STATE", "SIZE", "TAPE", "PATH"] and len(out) == 3
    assert out[0].index("STATE") == out[1].index("done") and out[1].endswith("/exp/a")
    assert client_cli.main(["ls", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == rows


@pytest.mark.parametrize("content, said", [
    ("/exp/é.root\n".encode("latin-1"), "is not UTF-8 text (line 1 has the byte 0xe9)"),
    ("/exp/a.root\n".encode("utf-16"), "is UTF-16 text"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "is not a text file"),
])
def test_a_list_that_is_not_utf8_text_is_one_line_not_a_traceback(scripted, capsys, tmp_path, content, said):
    _, seen, _ = scripted
    listing = tmp_path / "list.txt"
    listing.write_bytes(content)
    assert client_cli.main(["submit", "--from-file", str(listing)]) == client_api.EXIT_USAGE
    err = lines_of(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith(f"carousel: {listing} {said}") and "UTF-8" in err[0]
    assert seen == []  # nothing sent


def test_a_list_with_a_byte_order_mark_is_read(scripted, capsys, tmp_path):
    answers, _, _ = scripted
    answers["/api/v1/requests/"] = {"bulk_id": BULK, "files": 1, "created": 1, "existing": 0, "shared": 0}
    listing = tmp_path / "list.txt"
    listing.write_bytes("/exp/é.root\r\n".encode("utf-8-sig"))
    assert client_cli.main(["submit", "--from-file", str(listing)]) == 0
    assert capsys.readouterr().out.strip() == BULK


def test_cancel_of_a_digit_that_is_not_ascii_is_a_usage_error(scripted, capsys):
    _, seen, _ = scripted
    assert client_cli.main(["cancel", "²"]) == client_api.EXIT_USAGE
    err = lines_of(capsys.readouterr().err)
    assert "'²' is neither a submission id, a request id nor a path" in err[0] and seen == []


def test_cancel_by_id_says_when_ids_were_not_cancelled(scripted, capsys):
    """The server skips ids the caller may not cancel or that are not active; the command said
    "cancelled 0 requests" and exit 0 for an id never seen, while a path with no active request
    is exit 5."""
    answers, seen, _ = scripted
    answers["/api/v1/requests/cancel/"] = {"cancelled": 1, "not_active": []}
    assert client_cli.main(["cancel", "7", "99999"]) == client_api.EXIT_NOT_FOUND
    assert "1 of the request ids given is not yours or not active (the others cancelled: 1)" in \
        capsys.readouterr().err
    answers["/api/v1/requests/cancel/"] = {"cancelled": 2, "not_active": []}
    assert client_cli.main(["cancel", "7", "8"]) == 0
    assert capsys.readouterr().out.strip() == "cancelled 2 requests"


def test_an_unreadable_configuration_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("CAROUSEL_URL", "CAROUSEL_TOKEN", "CAROUSEL_TOKEN_FILE", "CAROUSEL_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    ini = tmp_path / ".config" / "carousel" / "client.ini"
    ini.parent.mkdir(parents=True)
    ini.write_bytes(b"[carousel]\nurl = http://caf\xe9.test\n")
    assert client_cli.main(["ls"]) == client_api.EXIT_CONFIG
    assert lines_of(capsys.readouterr().err) == [f"carousel: cannot read {ini}: it is not UTF-8 text"]


def test_submit_names_an_activity_and_the_requests_get_its_priority(carousel_at_rest, alice):
    carousel = carousel_at_rest  # the API alone: no cycle is needed
    from django.contrib.auth.models import Group

    from carousel.models import Activity, RestoreRequest

    Activity.objects.create(group=Group.objects.get(name="analysis"), name="Express", priority=2, weight=3)
    code, out, err = run(carousel, alice, "submit", "/exp/act/a.root", "--activity", "Express", "--json")
    assert code == 0, err
    bulk = json.loads(out)["id"]
    assert RestoreRequest.objects.filter(bulk_id=bulk).values_list("activity", "priority").get() == ("Express", 2)
    code, out, err = run(carousel, alice, "submit", "--help")
    assert code == 0 and "--activity NAME" in out
