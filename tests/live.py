"""A live Carousel for the thin clients' tests: the API on loopback (pytest-django's live server),
a real Celery worker with beat driving the loop (`carousel`; `carousel_at_rest` has none, for
what the API answers alone), and the simulated library with bytes, fast."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from tests import parallel

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def program(name):
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: install the client package with `make client` (make test does)")
    return str(path)


def _test_database_url():
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


class Carousel:
    def __init__(self, url, archive, disk, worker):
        self.url, self.archive, self.disk, self.worker = url, archive, disk, worker

    def token(self, user):
        return Token.objects.get_or_create(user=user)[0].key

    def env(self, user, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAROUSEL_")}
        env.update({"CAROUSEL_URL": self.url, "CAROUSEL_TOKEN": self.token(user), "HOME": "/nonexistent", **extra})
        return env

    def tape(self, path, data):
        target = self.archive / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def check_worker(self):
        assert self.worker.poll() is None, self.worker.log_path.read_text()


@pytest.fixture
def open_dir():
    """A directory others may read (pytest's tmp_path is private to root): XRootD runs
    unprivileged and reads the restored copies."""
    path = Path(tempfile.mkdtemp(prefix="carousel-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def client_venv():
    """The client package installed with pip into a bare virtual environment of Debian's python
    (no Django), where an unprivileged XRootD can run its programs. Built once a run, by the
    first worker that needs it, in the directory the workers share; it is only read."""
    root = parallel.run_dir() / "client-venv"
    venv = root / "venv"
    with parallel.file_lock(parallel.run_dir() / "client-venv.lock"):
        if not (root / "installed").exists():
            shutil.rmtree(root, ignore_errors=True)  # a build that failed half way
            source = root / "client"
            shutil.copytree(ROOT / "client", source, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                                   "__pycache__"))
            root.chmod(0o755)
            subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
            install = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(source)], capture_output=True,
                                     text=True, timeout=300)
            assert install.returncode == 0, install.stderr
            (root / "installed").touch()
    return venv


@pytest.fixture
def carousel(live_server, open_dir, settings, library_speedup):
    """The API on loopback, the simulated library and a real worker with beat: the loop runs."""
    yield from _carousel(live_server, open_dir, settings, library_speedup, with_worker=True)


@pytest.fixture
def carousel_at_rest(live_server, open_dir, settings, library_speedup):
    """The same without the worker, for a test of what the API answers alone (a worker costs
    about 2 s of CPU to start and 40 ms for each of its cycles, twice a second)."""
    yield from _carousel(live_server, open_dir, settings, library_speedup, with_worker=False)


def _carousel(live_server, open_dir, settings, library_speedup, *, with_worker):
    from carousel.models import Control

    tmp_path = open_dir
    if not os.environ.get("REDIS_URL"):
        pytest.fail("REDIS_URL is not set: run the suite with `make test`")
    archive, disk = tmp_path / "archive", tmp_path / "disk"
    archive.mkdir()
    disk.mkdir()
    options = {"speedup": library_speedup, "archive_dir": str(archive), "disk_dir": str(disk),
               "state_file": str(tmp_path / "library.json")}
    # The live server runs in this process: its withdrawals reach the same library.
    settings.CAROUSEL_STAGER = "simulated"
    settings.CAROUSEL_STAGER_OPTIONS = options
    Control.objects.update_or_create(id=1, defaults={"cycle_s": 0.5})
    if not with_worker:
        yield Carousel(live_server.url, archive, disk, None)
        return
    env = dict(os.environ, DATABASE_URL=_test_database_url(), CAROUSEL_TICK_S="0.5", CAROUSEL_VAR_DIR=str(tmp_path),
               CAROUSEL_STAGER="simulated", CAROUSEL_STAGER_OPTIONS=json.dumps(options))
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "carousel", "worker", "-B", "--pool=solo",
                               "-Q", "celery,control,delivery", "--loglevel=WARNING",
                               "-s", str(tmp_path / "beat-schedule")],
                              env=env, stdout=open(tmp_path / "worker.log", "wb"), stderr=subprocess.STDOUT,
                              start_new_session=True)  # a file: an unread pipe fills up and blocks its logging
    worker.log_path = tmp_path / "worker.log"
    yield Carousel(live_server.url, archive, disk, worker)
    worker.terminate()
    try:
        worker.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)


def until(condition, *, timeout=60, every=0.3, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")
