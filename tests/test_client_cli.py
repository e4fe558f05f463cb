"""The `carousel` command line, end to end: the installed program against a live Carousel (API on
loopback, a real worker, the simulated library with bytes); and the package alone in a bare
virtual environment."""
import json
import os
import pty
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from carousel.models import Control, RestoreRequest
from tests.live import carousel, client_venv, open_dir, program  # noqa: F401 (fixtures)

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
    assert json.loads(out)["id"] == bulk and json.loads(out)["states"]["done"] == 5

    code, out, err = run(carousel, alice, "ls", "--bulk", bulk, "--state", "done", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert sorted(r["path"] for r in rows) == sorted(paths)
    assert all(r["priority"] == 2 and Path(r["disk_path"]).read_bytes() == (carousel.archive / r["path"][1:])
               .read_bytes() for r in rows)
    code, out, _ = run(carousel, alice, "ls", "--path", "file3")
    assert code == 0 and out.count("\n") == 1 and "done" in out and paths[3] in out

    code, out, _ = run(carousel, alice, "why", paths[0])
    assert code == 0 and f"{paths[0]}: done" in out and f"on disk at {carousel.disk}{paths[0]}" in out


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


def test_each_error_has_its_message_and_exit_code(carousel, alice):
    code, out, err = run(carousel, alice, "submit", "relative/path", "/fine", "--json")
    assert code == client_api.EXIT_REFUSED
    assert "refused:" in err and "line 1: relative/path: not an absolute path" in err
    assert json.loads(out)["exit_code"] == client_api.EXIT_REFUSED
    assert not RestoreRequest.objects.exists()  # nothing half stored

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


def test_a_reader_that_goes_away_is_not_an_error(carousel, alice):
    # `carousel ls | head`: the pipe closes before the listing is written.
    assert run(carousel, alice, "submit", "/pipe/a", "/pipe/b")[0] == 0
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = subprocess.Popen([program("carousel"), "ls", "--json"], stdout=write_end, stderr=subprocess.PIPE,
                            env=carousel.env(alice))
    os.close(write_end)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in err, err
