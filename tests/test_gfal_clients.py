"""Debian's real grid clients (gfal2 2.21 through gfal-util and python3-gfal2) against a live
Carousel: gunicorn on loopback, the test PostgreSQL, a real worker running the loop with the
simulated library 2,000 times faster than life. Once with an API token, once with a WLCG JWT
(gfal2 sends BEARER_TOKEN as `Authorization: Bearer`)."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token

from carousel.models import Control, RestoreRequest, WlcgIdentity
from tests.fakes.wlcg_issuer import Issuer
from tests.test_worker import _test_database_url, worker  # noqa: F401 - the fixture

AUD = "https://carousel.test"
pytestmark = pytest.mark.skipif(not shutil.which("gfal-bringonline") or not os.path.exists("/usr/bin/python3"),
                                reason="Debian's gfal2-util-scripts and python3-gfal2 are installed by `make test`")

PY_GFAL2 = r"""
import json, sys, time
import gfal2
surls, abort = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ctx = gfal2.creat_context()
out = {}
if surls:
    errors, token = ctx.bring_online(surls, 0, 600, True)
    out["submit_errors"] = [e and e.message for e in errors]
    out["token"] = token
    deadline = time.time() + 120
    while time.time() < deadline:
        polled = ctx.bring_online_poll(surls, token)
        out["poll"] = [None if e is None else [e.code, e.message] for e in polled]
        if all(e is None or e.code != 11 for e in polled):  # 11 (EAGAIN): not yet on disk
            break
        time.sleep(1)
    out["status"] = ctx.getxattr(surls[0], "user.status")
if abort:
    errors, token2 = ctx.bring_online(abort, 0, 600, True)
    out["abort"] = [e and e.message for e in ctx.abort_bring_online(abort, token2)]
    out["after_abort"] = [None if e is None else [e.code, e.message] for e in ctx.bring_online_poll(abort, token2)]
print(json.dumps(out))
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def carousel_server(worker, api_server):  # noqa: F811
    """gunicorn on loopback over the test database, and the loop's worker; `start(env)` returns
    the server's URL."""
    return api_server


@pytest.fixture
def api_server(transactional_db, tmp_path):
    """gunicorn on loopback over the test database, no worker (the API's answers alone);
    `start(env)` returns its URL."""
    procs = []

    def start(extra_env):
        port = _free_port()
        env = dict(os.environ, DATABASE_URL=_test_database_url(), CAROUSEL_VAR_DIR=str(tmp_path),
                   CAROUSEL_STAGER="simulated", CAROUSEL_STAGER_OPTIONS='{"speedup": 2000}', **extra_env)
        proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "carousel.wsgi", "-b", f"127.0.0.1:{port}",
                                 # One worker: the clients send one request at a time, and
                                 # each worker costs a start of Django (about 1.7 s of CPU).
                                 "-w", "1", "--log-level", "warning"], env=env,
                                stdout=open(tmp_path / f"gunicorn-{port}.log", "wb"), stderr=subprocess.STDOUT)
        proc.log_path = tmp_path / f"gunicorn-{port}.log"  # a file: an unread pipe would block its logging
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return url
            except OSError:
                assert proc.poll() is None, proc.log_path.read_text()
                time.sleep(0.1)
        raise AssertionError("gunicorn did not start")

    Control.objects.update_or_create(id=1, defaults={"cycle_s": 0.5})
    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=15)


def gfal(*args, token, timeout=180):
    # The Debian scripts run on the system python3 (its gfal2 module), not this virtualenv's.
    env = {"PATH": "/usr/bin:/bin", "BEARER_TOKEN": token, "GFAL_PYTHONBIN": "/usr/bin/python3",
           "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(params=["api-token", "wlcg-jwt"])
def credentials(request, carousel_server, alice):
    """(Carousel's URL, bearer token, the user the files are restored for, path prefix)."""
    if request.param == "api-token":
        yield carousel_server({}), Token.objects.create(user=alice).key, lambda: alice, "/data"
        return
    with Issuer() as issuer:
        issuers = [{"issuer": issuer.url, "audiences": [AUD], "base_path": "/vo", "name": "vo"}]
        url = carousel_server({"CAROUSEL_WLCG_ISSUERS": json.dumps(issuers)})
        token = issuer.mint(sub="grid-user", aud=AUD, scope="storage.stage:/ storage.read:/", exp_in=3600)
        yield url, token, lambda: WlcgIdentity.objects.get(subject="grid-user").user, "/vo/data"


@pytest.mark.long(19)
def test_gfal2_clients_discover_stage_poll_and_abort(credentials, tmp_path):
    url, token, user, prefix = credentials
    files = [f"{url}{prefix}/run1/f{i}" for i in range(3)]

    r = gfal("gfal-xattr", files[0], "taperestapi.uri", token=token)
    assert r.returncode == 0 and r.stdout.strip() == f"{url}/api/tape-rest/v1", r
    r = gfal("gfal-xattr", files[0], "taperestapi.version", token=token)
    assert r.returncode == 0 and r.stdout.strip() == "v1", r

    listing = tmp_path / "files.txt"
    listing.write_text("".join(f + "\n" for f in files))
    r = gfal("gfal-bringonline", "--from-file", str(listing), "--polling-timeout", "120", token=token)
    assert r.returncode == 0, r
    last = {line.split()[0]: line.split()[1] for line in r.stdout.splitlines() if line.startswith(url)}
    assert last == {f: "READY" for f in files}, r.stdout
    owner = user()
    assert set(RestoreRequest.objects.filter(user=owner, path__startswith=f"{prefix}/run1/")
               .values_list("state", flat=True)) == {"done"}

    # archived on tape: what gfal-archivepoll waits for
    r = gfal("gfal-archivepoll", files[0], token=token)
    assert r.returncode == 0 and "READY" in r.stdout, r
    # restored and pinned: on disk and on tape
    r = gfal("gfal-xattr", files[0], "user.status", token=token)
    assert r.returncode == 0 and r.stdout.strip() == "ONLINE_AND_NEARLINE", r
    r = gfal("gfal-xattr", f"{url}{prefix}/never/asked", "user.status", token=token)
    assert r.returncode == 0 and r.stdout.strip() == "NEARLINE", r

    staged = [f"{url}{prefix}/run2/g{i}" for i in range(2)]
    aborted = [f"{url}{prefix}/run3/h0"]
    def python_gfal2(staged, aborted):
        r = subprocess.run(["/usr/bin/python3", "-c", PY_GFAL2, json.dumps(staged), json.dumps(aborted)],
                           env={"PATH": "/usr/bin:/bin", "BEARER_TOKEN": token}, capture_output=True, text=True,
                           timeout=240)
        assert r.returncode == 0, r
        return json.loads(r.stdout.strip().splitlines()[-1])

    out = python_gfal2(staged, [])
    assert out["submit_errors"] == [None, None]
    assert out["poll"] == [None, None], out  # both restored
    # The abort while the loop is paused: with it running, the file aborted right after its
    # stage could be restored first under a loaded machine (nothing left to cancel; seen once).
    Control.objects.filter(id=1).update(paused=True)
    # A cycle that read the control row before the pause could still claim the new stage: wait
    # for one that began after it.
    paused_at = timezone.now()
    deadline = time.monotonic() + 60
    while (Control.objects.get(id=1).last_cycle_at or paused_at) <= paused_at and time.monotonic() < deadline:
        time.sleep(0.2)
    out.update(python_gfal2([], aborted))
    Control.objects.filter(id=1).update(paused=False)
    assert out["abort"] == [None]
    # gfal2 2.21 spells it CANCELED and calls the spec's CANCELLED unrecognised: still this file's failure
    assert out["after_abort"][0] is not None and "CANCELLED" in out["after_abort"][0][1], out
    assert RestoreRequest.objects.get(user=owner, path=f"{prefix}/run3/h0").state == "cancelled"
    assert out["status"] == "ONLINE_AND_NEARLINE"


def test_gfal_evict_releases_the_callers_pins(credentials):
    pytest.importorskip("carousel.domain.pins")  # helper c's real pins: release_pins
    url, token, user, prefix = credentials
    f = f"{url}{prefix}/evict/f0"
    assert gfal("gfal-bringonline", f, "--polling-timeout", "120", token=token).returncode == 0
    r = gfal("gfal-evict", f, token=token)
    assert r.returncode == 0, r
