"""Reliability with real parts: a Celery worker (beat inside) on Redis and PostgreSQL, talking
to a tape system through the `command` stager's site scripts (tests/fakes/site_stager), which
keep their state on disk, so every stage the broker ever asked for can be counted afterwards.

Killed with SIGKILL in the middle of cycles, again and again, or with Redis restarted under
it, the broker loses no request and stages no file twice."""
import contextlib
import json
import shlex
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db.models import Count
from django.utils import timezone

from carousel.infra.localservices import free_port
from carousel.models import Control, Job, RestoreRequest
from carousel.domain.services import restore_submit
from tests import parallel
from tests.test_worker import _test_database_url

SITE = Path(__file__).parent / "fakes" / "site_stager"
FILES = 120


@pytest.fixture
def site(tmp_path):
    """The fake tape system's state directory with its catalogue: FILES files on 8 tapes."""
    state = tmp_path / "site"
    state.mkdir()
    catalogue = {f"/rel/{i:04d}": [f"T{i % 8}", i * 10**9, 10**9] for i in range(FILES)}
    (state / "catalogue.json").write_text(json.dumps(catalogue))
    return state


class Worker:
    """A real worker process with beat inside, restartable, on the given Redis."""

    def __init__(self, tmp_path, site, redis_url):
        options = {op: [sys.executable, str(SITE / f"{op}.py")] for op in ("locate", "stage", "poll", "cancel")}
        self.env = dict(os.environ, DATABASE_URL=_test_database_url(), REDIS_URL=redis_url, CAROUSEL_TICK_S="0.3",
                        CAROUSEL_VAR_DIR=str(tmp_path / "var"), CAROUSEL_STAGER="command",
                        CAROUSEL_STAGER_OPTIONS=json.dumps(options), FAKE_SITE_DIR=str(site),
                        FAKE_SITE_STAGE_DELAY="0.2")
        self.log = open(tmp_path / "worker.log", "ab")
        self.tmp_path = tmp_path
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "carousel", "worker", "-B", "--pool=solo",
             "-Q", "celery,control,delivery", "--loglevel=WARNING",
             "-s", str(self.tmp_path / "beat-schedule")], env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def kill(self):
        # The whole process group, as when a machine or container dies: the worker, the beat
        # process it runs inside, and any site script it was waiting on.
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()

    def output(self):
        return (self.tmp_path / "worker.log").read_text(errors="replace")[-4000:]


def wait_until_done(worker, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if RestoreRequest.objects.filter(state="done").count() == FILES:
            return
        assert worker.proc.poll() is None, worker.output()
        time.sleep(0.5)
    states = dict(RestoreRequest.objects.values_list("state").annotate(n=Count("id")))
    pytest.fail(f"not all restored after {timeout} s: {states}\n{worker.output()}")


def wait_for_a_cycle(worker, *, since, timeout=60):
    """Until the worker has run a cycle that began after `since`. Start-up takes about 2 s on a
    quiet machine and several on a busy one (the suite runs in parallel): what a test does to a
    running worker is timed from its first cycle, not from its start."""
    deadline = time.monotonic() + timeout
    while not Control.objects.filter(id=1, last_cycle_at__gt=since).exists():
        assert worker.proc.poll() is None, worker.output()
        assert time.monotonic() < deadline, f"no cycle within {timeout} s of the start\n{worker.output()}"
        time.sleep(0.1)


def stages_per_file(site):
    """How many distinct stage jobs the tape system received for each file."""
    counts = {}
    for job in (site / "jobs").glob("*.json"):
        for path in json.loads(job.read_text())["files"]:
            counts[path] = counts.get(path, 0) + 1
    return counts


def setup_loop():
    Control.objects.update_or_create(id=1, defaults={"cycle_s": 0.3, "files_per_job": 5, "jobs_in_flight": 4,
                                                     "mount_min_files": 1})


@pytest.mark.long(38)
def test_killing_the_worker_mid_cycle_again_and_again_loses_nothing_and_stages_nothing_twice(
        transactional_db, tmp_path, site, alice, now):
    if not os.environ.get("REDIS_URL"):
        pytest.fail("REDIS_URL is not set: run the suite with `make test`")
    setup_loop()
    restore_submit(user=alice, now=now, paths=list(json.loads((site / "catalogue.json").read_text())))
    worker = Worker(tmp_path, site, os.environ["REDIS_URL"])
    try:
        kills = 0
        for delay in (1.0, 1.6, 0.6, 2.1, 1.3, 0.9):
            started = timezone.now()
            worker.start()
            wait_for_a_cycle(worker, since=started)
            time.sleep(delay)  # cycles run back to back: a kill lands in one
            worker.kill()
            kills += 1
        assert RestoreRequest.objects.exclude(state="queued").exists(), "no cycle ran between the kills"
        worker.start()
        wait_until_done(worker, timeout=150)
    finally:
        worker.stop()
    calls = (site / "stage-calls.log").read_text().split()
    # How often a kill fell between a job's commit and its acknowledgement (varies by run).
    print(f"{kills} kills; {len(calls) - len(set(calls))} jobs sent again with their own id")
    counts = stages_per_file(site)
    assert len(counts) == FILES
    assert max(counts.values()) == 1, {p: n for p, n in counts.items() if n > 1}
    assert not Job.objects.filter(state="pending").exists()


@pytest.mark.long(25)
def test_restarting_redis_in_the_middle_of_a_run_loses_nothing(transactional_db, tmp_path, site, alice, now):
    port = free_port()
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()

    def start_redis():
        return subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", str(redis_dir)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    setup_loop()
    restore_submit(user=alice, now=now, paths=list(json.loads((site / "catalogue.json").read_text())))
    redis = start_redis()
    worker = Worker(tmp_path, site, f"redis://127.0.0.1:{port}/0")
    try:
        time.sleep(0.5)
        worker.start()
        time.sleep(3)
        redis.terminate()  # the queue's contents are gone with it: nothing may depend on them
        redis.wait()
        time.sleep(3)
        redis = start_redis()
        wait_until_done(worker, timeout=150)
    finally:
        worker.stop()
        redis.terminate()
        redis.wait()
    assert max(stages_per_file(site).values()) == 1


@pytest.mark.long(29)
def test_restarting_postgresql_in_the_middle_of_a_run_loses_nothing_and_logs_the_outage_once(
        transactional_db, tmp_path, site, alice, now):
    """The suite's own PostgreSQL server (carousel.infra.localservices) is stopped for a few seconds
    under the running worker and beat, then started again with the same options."""
    from django.db import connections

    from carousel.infra.localservices import PG_BIN, _as_postgres

    services = os.environ.get("CAROUSEL_SERVICES_DIR")
    if not services:
        pytest.fail("CAROUSEL_SERVICES_DIR is not set: run the suite with `make test`")
    data = Path(services) / "pg"
    # postmaster.opts: the server's command line; its options after "-D <dir>" start it the same way.
    argv = shlex.split((data / "postmaster.opts").read_text())
    options = " ".join(shlex.quote(a) for i, a in enumerate(argv[1:], 1) if a != "-D" and argv[i - 1] != "-D")
    setup_loop()
    # Paused (the loop locates, sends nothing) until this test has the server to itself, so
    # that the outage still falls in the middle of the run however long the others take to
    # leave their tests.
    Control.objects.filter(id=1).update(paused=True)
    restore_submit(user=alice, now=now, paths=list(json.loads((site / "catalogue.json").read_text())))
    connections.close_all()
    worker = Worker(tmp_path, site, os.environ["REDIS_URL"])
    try:
        started = timezone.now()
        worker.start()
        wait_for_a_cycle(worker, since=started)  # start-up (seconds) while the others go on
        # Every xdist worker's test database is on that server: the others are held off from
        # the resumption until the server is back, not while the worker finishes the run.
        with parallel.alone():
            resumed = timezone.now()
            Control.objects.filter(id=1).update(paused=False)
            wait_for_a_cycle(worker, since=resumed)
            time.sleep(2)
            assert RestoreRequest.objects.exclude(state="done").exists()  # the outage falls mid-run
            connections.close_all()
            subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                           check=True, stdout=subprocess.DEVNULL)
            time.sleep(6)  # twenty ticks of the worker with no database
            subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"),
                                         "-o", options, "-w", "start"]), check=True, stdout=subprocess.DEVNULL)
            connections.close_all()  # this process's connection died with the server too
        wait_until_done(worker, timeout=150)
    finally:
        worker.stop()
    assert max(stages_per_file(site).values()) == 1
    assert len(stages_per_file(site)) == FILES
    log = (tmp_path / "worker.log").read_text(errors="replace")
    # Once when it began and once when it ended (each line as many times as the logging setup has
    # handlers for it), not once per tick: the outage lasted twenty.
    outage, back = log.count("database unreachable"), log.count("database back")
    assert 1 <= outage == back <= 2, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
