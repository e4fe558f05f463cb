"""A live Carousel for the thin clients' tests: the API on loopback (pytest-django's live server),
a real Celery worker with beat driving the loop, and the simulated library with bytes, fast."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

BIN = Path(sys.executable).parent


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
        assert self.worker.poll() is None, self.worker.stdout.read().decode()


@pytest.fixture
def carousel(live_server, tmp_path, settings):
    from carousel.models import Control

    if not os.environ.get("REDIS_URL"):
        pytest.fail("REDIS_URL is not set: run the suite with `make test`")
    archive, disk = tmp_path / "archive", tmp_path / "disk"
    archive.mkdir()
    disk.mkdir()
    options = {"speedup": 2000, "archive_dir": str(archive), "disk_dir": str(disk),
               "state_file": str(tmp_path / "library.json")}
    # The live server runs in this process: its withdrawals reach the same library.
    settings.CAROUSEL_STAGER = "simulated"
    settings.CAROUSEL_STAGER_OPTIONS = options
    Control.objects.update_or_create(id=1, defaults={"cycle_s": 0.5})
    env = dict(os.environ, DATABASE_URL=_test_database_url(), CAROUSEL_TICK_S="0.5", CAROUSEL_VAR_DIR=str(tmp_path),
               CAROUSEL_STAGER="simulated", CAROUSEL_STAGER_OPTIONS=json.dumps(options))
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "carousel", "worker", "-B", "--pool=solo",
                               "-Q", "celery,control,delivery", "--loglevel=WARNING",
                               "-s", str(tmp_path / "beat-schedule")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
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
