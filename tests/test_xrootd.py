"""A real xrootd on loopback with both Carousel hooks (oss.stagecmd and libXrdOfsPrepGPI.so's
program) against a live Carousel whose simulated library has bytes; driven with Debian's xrdfs
and xrdcp, as a site would check it by hand (docs/xrootd.md)."""
import json
import os
import shutil
import socket
import subprocess

import pytest

from carousel.models import Control, RestoreRequest
from tests.live import carousel, client_venv, open_dir, until  # noqa: F401 (fixtures)

XROOTD = shutil.which("xrootd") or "/usr/bin/xrootd"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def xrootd(carousel, client_venv, alice, open_dir):
    if not os.path.exists(XROOTD) or not shutil.which("xrdfs"):
        pytest.fail("xrootd-server and xrootd-client are missing: `make test` installs them")
    home = open_dir / "xrootd"
    localroot = home / "data"
    (home / "admin").mkdir(parents=True)
    localroot.mkdir()
    port = free_port()
    config = home / "xrootd.cfg"
    config.write_text(f"""xrd.port {port}
all.adminpath {home}/admin
all.pidpath {home}/admin
oss.localroot {localroot}
all.export /exp stage nocheck
oss.stagecmd {client_venv}/bin/carousel-xrd-stagecmd
# two transfer threads; estimates of about 2 s (speed 1g, overhead 1 s); failures held 600 s
oss.xfr deny 600 2 1g 1
ofs.maxdelay 30
ofs.preplib libXrdOfsPrepGPI.so -admit all -run {client_venv}/bin/carousel-xrd-prepare
""")
    root = os.geteuid() == 0
    if root:  # xrootd refuses to run as root
        shutil.chown(home, "nobody")
        for sub in (home / "admin", localroot):
            shutil.chown(sub, "nobody")
    env = carousel.env(alice)
    proc = subprocess.Popen([XROOTD, "-c", str(config), "-l", str(home / "xrootd.log"),
                             *(["-R", "nobody"] if root else [])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def listening():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    until(listening, timeout=20, what="xrootd to listen")
    proc.url, proc.localroot, proc.home = f"root://127.0.0.1:{port}", localroot, home
    yield proc
    proc.terminate()
    proc.wait(timeout=10)


def xrd(*args, timeout=120):
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                          env={"PATH": os.environ["PATH"], "XRD_REQUESTTIMEOUT": "100"})
    return done.returncode, done.stdout, done.stderr


def query(server, reqid, *paths):
    code, out, err = xrd("xrdfs", server.url, "query", "prepare", reqid, *paths)
    assert code == 0, err
    return json.loads(out.rstrip("\x00\n"))


@pytest.mark.long(33)
def test_prepare_query_cancel_evict_and_stage_on_open_through_a_real_xrootd(xrootd, carousel, alice):
    paths = ["/exp/p/1.root", "/exp/p/2.root", "/exp/p/3.root"]
    for i, path in enumerate(paths + ["/exp/p/4.root", "/exp/p/5.root", "/exp/x/offline.root"]):
        carousel.tape(path, os.urandom(2000 + i))
    Control.objects.filter(id=1).update(paused=True)  # hold them in the queue: "requested" first

    code, out, err = xrd("xrdfs", xrootd.url, "prepare", "-s", *paths)
    assert code == 0, err
    reqid = out.strip()
    assert reqid
    until(lambda: RestoreRequest.objects.filter(path__in=paths).count() == 3, what="the stage to reach Carousel")
    reply = query(xrootd, reqid, *paths)
    assert reply["request_id"] == reqid
    assert [r["path"] for r in reply["responses"]] == paths  # one per path, in the request's order
    for response in reply["responses"]:
        assert response == {"path": response["path"], "path_exists": True, "on_tape": True, "online": False,
                            "requested": True, "has_reqid": True, "req_time": response["req_time"],
                            "error_text": ""}
        assert int(response["req_time"]) > 0

    # Cancel one file of a second request.
    code, out, err = xrd("xrdfs", xrootd.url, "prepare", "-s", "/exp/p/4.root", "/exp/p/5.root")
    second = out.strip()
    until(lambda: RestoreRequest.objects.filter(path__in=["/exp/p/4.root", "/exp/p/5.root"]).count() == 2,
          what="the second stage")
    code, _, err = xrd("xrdfs", xrootd.url, "prepare", "-a", second, "/exp/p/4.root")
    assert code == 0, err
    until(lambda: RestoreRequest.objects.filter(path="/exp/p/4.root", state="cancelled").exists(),
          what="the cancel")
    cancelled, kept = query(xrootd, second, "/exp/p/4.root", "/exp/p/5.root")["responses"]
    assert not cancelled["requested"] and cancelled["error_text"] and kept["requested"]

    Control.objects.filter(id=1).update(paused=False)
    until(lambda: all(r["online"] for r in query(xrootd, reqid, *paths)["responses"]), timeout=60,
          what="the prepared files online")
    assert query(xrootd, reqid, paths[0])["responses"][0]["requested"] is False

    # Evict releases Carousel's pins and deletes nothing.
    code, _, err = xrd("xrdfs", xrootd.url, "prepare", "-e", paths[0])
    assert code == 0, err
    assert (carousel.disk / paths[0][1:]).exists()

    # Open of an offline file: XRootD runs the stagecmd, the client waits, then gets the bytes.
    target = carousel.archive.parent / "copy.root"
    code, _, err = xrd("xrdcp", "-f", f"{xrootd.url}//exp/x/offline.root", str(target))
    assert code == 0, err
    assert target.read_bytes() == (carousel.archive / "exp/x/offline.root").read_bytes()
    assert (xrootd.localroot / "exp/x/offline.root").read_bytes() == target.read_bytes()

    # A file the library does not have fails cleanly, and a retry does not ask Carousel again.
    code, _, err = xrd("xrdcp", "-f", f"{xrootd.url}//exp/x/missing.root", str(target) + ".2")
    assert code != 0 and "no such file" in err.lower()
    fail = xrootd.localroot / "exp/x/missing.root.fail"
    assert fail.exists() and fail.stat().st_mtime == 2
    code, _, err = xrd("xrdcp", "-f", f"{xrootd.url}//exp/x/missing.root", str(target) + ".2")
    assert code != 0 and "no such file" in err.lower()
    assert RestoreRequest.objects.filter(path="/exp/x/missing.root").count() == 1
    assert RestoreRequest.objects.get(path="/exp/x/missing.root").state == "failed"
    carousel.check_worker()
