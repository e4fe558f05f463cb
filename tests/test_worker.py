"""The loop wired for real: a Celery worker with embedded beat, on the Redis and PostgreSQL
that `make test` started, drives requests to done with no test code calling the loop."""
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

from carousel.models import RestoreRequest
from carousel.domain.services import restore_submit


@pytest.fixture
def worker(transactional_db, tmp_path):
    if not os.environ.get("REDIS_URL"):
        pytest.fail("REDIS_URL is not set: run the suite with `make test`")
    # The embedded default stager, the simulated library, running 2,000 times faster than life.
    env = dict(os.environ, DATABASE_URL=_test_database_url(), CAROUSEL_TICK_S="0.5",
               CAROUSEL_VAR_DIR=str(tmp_path), CAROUSEL_STAGER="simulated",
               CAROUSEL_STAGER_OPTIONS='{"speedup": 2000}')
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "carousel", "worker", "-B", "--pool=solo",
                             "-Q", "celery,control,delivery", "--loglevel=WARNING",
                             "-s", str(tmp_path / "beat-schedule")],
                            env=env, stdout=open(tmp_path / "worker.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # a file: an unread pipe fills up and blocks its logging
    proc.log_path = tmp_path / "worker.log"
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # beat runs in a child process of its own


def _test_database_url():
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def test_a_real_worker_restores_submitted_files(worker, alice, now):
    from carousel.models import Control

    Control.objects.update_or_create(id=1, defaults={"cycle_s": 0.5})
    restore_submit(user=alice, now=now, paths=[f"/w/{i}" for i in range(20)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if RestoreRequest.objects.filter(state="done").count() == 20:
            break
        assert worker.poll() is None, worker.log_path.read_text()
        time.sleep(0.5)
    assert RestoreRequest.objects.filter(state="done").count() == 20
