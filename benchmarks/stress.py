"""The whole broker under real concurrency and real failures, on PostgreSQL (issue 24):

    .venv/bin/python benchmarks/stress.py [--duration 300]

With nothing else started it starts PostgreSQL and Redis on loopback itself, as `make test`
does (carousel/infra/localservices.py); with DATABASE_URL and REDIS_URL set it uses those (and
restarts them only when they are localservices' own, CAROUSEL_SERVICES_DIR set). Then, as
production runs (docker-compose.yml): gunicorn (4 workers, shipped timeout), a Celery worker on
the celery and control queues, one on the delivery queue, and beat, on the live simulated
library running `--speedup` times faster than real tape (its reads logged, see RecordingStager)
with the shipped control defaults. `--clients` users (16) submit small and large (`--big`,
5,000 files, one every `--big-every` seconds over all clients) submissions, cancel them, cancel
and resubmit the same paths at once (the race of issue 24), release, and poll, for `--duration`
seconds, each through the `carousel` client's own HTTP client (retrying 429 and 502-504, a 503
after its Retry-After). Meanwhile the script kills the worker's process group (and restarts
it), and restarts PostgreSQL and Redis, each at random moments and at least once.

Then it waits for the queue to drain (at most `--drain` seconds) and checks, from the database
and the library's record of its reads:

- lost: client calls that failed after their retries, submissions answered 201 that the
  database does not hold whole, and files of a submission its client never cancelled that
  ended cancelled (accepted, then lost);
- read_twice: reads of a file beyond the times the broker sent it (a file goes out once per
  request unless a failure or a lost job sends it again: each send is a transition to
  `submitted`);
- cancelled_read: reads of a file in a job that the broker sent after every request for it in
  that job was cancelled (a cancel racing the job's submission);
- server_errors: answers 500, and any other 5xx except a 503 with Retry-After while PostgreSQL
  or Redis is down (or in the OUTAGE_GRACE_S after it is back: requests begun meanwhile);
- deadlocks: "deadlock detected" in PostgreSQL's log;
- stuck: requests not final at the end.

auto_explain logs the plan of every statement slower than `--explain-over` seconds (the 12,000-path
submission that once took 76 s); the slowest are printed. The last line is JSON.
Goal: lost, read_twice, server_errors, deadlocks and stuck all 0, with worker_kills, pg_restarts
and redis_restarts each at least 1."""
import argparse
import collections
import contextlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "client"))

from carousel.infra import localservices  # noqa: E402
from carousel.stagers.simulated import SimulatedStager  # noqa: E402

OUTAGE_GRACE_S = 10.0  # a request begun during an outage may be answered 503 a little after it
GUNICORN_WORKERS = 4
SHARED_FILES = 400  # a pool of paths that several users ask for


class RecordingStager(SimulatedStager):
    """The live simulated library, its reads appended to `reads_log` (one JSON line each: the
    library's time, the job, the path). Each read is logged by the session that saves the
    library's state; a session cut short by a kill saves nothing, and the next one reads again
    from the saved state (the same event at the same library time: deduplicated when read)."""

    def __init__(self, *, reads_log, **options):
        super().__init__(**options)
        self.reads_log = reads_log

    def _fresh(self):
        state = super()._fresh()
        state["library"]["record"] = True
        return state

    @contextlib.contextmanager
    def _session(self):
        with super()._session() as (library, reported):
            yield library, reported
            if library.reads:
                with open(self.reads_log, "a") as log:
                    log.writelines(json.dumps([t, job, path]) + "\n" for t, job, path, _ in library.reads)
            library.reads, library.segments = [], []


# --- Services -------------------------------------------------------------------------------

class Services:
    """PostgreSQL and Redis, and how to restart them. Down windows are kept for excusing 503s."""

    def __init__(self, workdir, stack):
        self.workdir = Path(workdir)
        self.redis_proc = None
        self.windows = []  # (service, start, end): monotonic seconds while "pg" or "redis" was down
        self.lock = threading.Lock()
        if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
            self.database_url, self.redis_url = os.environ["DATABASE_URL"], os.environ["REDIS_URL"]
            services = os.environ.get("CAROUSEL_SERVICES_DIR")
            self.pg_data = Path(services) / "pg" if services else None
            self.redis_port = int(os.environ["CAROUSEL_REDIS_PORT"]) if services else None
        else:
            os.chmod(workdir, 0o755)
            self.database_url = stack.enter_context(localservices.postgres(workdir))
            self.pg_data = self.workdir / "pg"
            self.redis_port = localservices.free_port()
            self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
            self._start_redis()
            stack.callback(self._stop_redis)
        self.pg_port = int(re.search(r":(\d+)/", self.database_url).group(1))

    @property
    def restartable(self):
        return self.pg_data is not None

    @property
    def pg_log(self):
        return self.pg_data / "server.log" if self.pg_data else None

    def _start_redis(self):
        self.redis_proc = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             "--save", "", "--appendonly", "no", "--databases", "256"], stdout=subprocess.DEVNULL)
        localservices._wait(lambda: localservices._port_open(self.redis_port), "redis-server")

    def _stop_redis(self):
        if self.redis_proc is not None:
            self.redis_proc.terminate()
            self.redis_proc.wait(timeout=10)
            self.redis_proc = None
        else:  # localservices' own: shut it down through its port
            subprocess.run(["redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            localservices._wait(lambda: not localservices._port_open(self.redis_port), "redis shutdown")

    def restart_redis(self, down_s):
        start = time.monotonic()
        self._stop_redis()
        time.sleep(down_s)
        self._start_redis()
        self._window("redis", start)

    def _pg_ctl(self, *args):
        subprocess.run(localservices._as_postgres([str(localservices.PG_BIN / "pg_ctl"), "-D", str(self.pg_data),
                                                   *args]), check=True, stdout=subprocess.DEVNULL)

    def restart_pg(self, down_s):
        # The options it was started with (localservices'), to start it again the same way.
        argv = shlex.split((self.pg_data / "postmaster.opts").read_text())[1:]
        options = " ".join(shlex.quote(a) for i, a in enumerate(argv)
                           if a != "-D" and (i == 0 or argv[i - 1] != "-D"))
        start = time.monotonic()
        self._pg_ctl("-m", "immediate", "-w", "stop")  # as a crash: no checkpoint, connections cut
        time.sleep(down_s)
        self._pg_ctl("-l", str(self.pg_log), "-o", options, "-w", "start")
        self._window("pg", start)

    def _window(self, service, start):
        with self.lock:
            self.windows.append((service, start, time.monotonic()))

    def excused(self, began, ended, body):
        """A 503 that says the service that was down is down (a deadlock also answers 503 as the
        database "unreachable or overloaded": excused only while PostgreSQL was down)."""
        says = {"pg": "database" in body, "redis": "Redis" in body}
        if not any(says.values()):
            says = {"pg": True, "redis": True}
        with self.lock:
            return any(says[service] and began <= end + OUTAGE_GRACE_S and ended >= start
                       for service, start, end in self.windows)


def configure_postgres(database_url, over_s):
    """Commits durable across a crash (localservices turns synchronous_commit off for speed: a
    restart would lose commits already answered), and every statement slower than over_s
    logged with its plan (auto_explain), and lock waits."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        # The database's own setting: it overrides the server's command line, where localservices
        # sets it off (ALTER SYSTEM does not).
        conn.execute(f"ALTER DATABASE {conn.execute('SELECT current_database()').fetchone()[0]} "
                     "SET synchronous_commit = on")
        conn.execute("LOAD 'auto_explain'")
        for name, value in (("session_preload_libraries", "auto_explain"),
                            ("auto_explain.log_min_duration", f"{int(over_s * 1000)}ms"),
                            ("auto_explain.log_analyze", "off"), ("log_min_duration_statement", f"{int(over_s * 1000)}ms"),
                            ("log_lock_waits", "on")):
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


# --- The broker's processes -----------------------------------------------------------------

class Broker:
    def __init__(self, services, workdir, args):
        self.workdir = Path(workdir)
        self.port = localservices.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.reads_log = self.workdir / "reads.jsonl"
        self.env = {
            **os.environ, "DATABASE_URL": services.database_url, "REDIS_URL": services.redis_url,
            "SECRET_KEY": f"stress-{random.getrandbits(128):032x}", "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost", "CAROUSEL_VAR_DIR": str(self.workdir / "var"),
            "CAROUSEL_STAGERS": json.dumps({"stress-simulated": "stress.RecordingStager"}),
            "CAROUSEL_STAGER": "stress-simulated",
            "CAROUSEL_STAGER_OPTIONS": json.dumps({"speedup": args.speedup, "drives": {"LTO-8": args.drives},
                                                   "reads_log": str(self.reads_log)}),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]),
            "CAROUSEL_LOG_FORMAT": "text",
        }
        self.procs = {}
        self.logs = {}
        (self.workdir / "var").mkdir(exist_ok=True)

    def _start(self, name, argv):
        log = self.logs.get(name) or open(self.workdir / f"{name}.log", "a")
        self.logs[name] = log
        # Each in its own session: a kill of its process group takes its children (the worker's
        # pool) and nothing else.
        self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def start_worker(self):
        self._start("worker", [sys.executable, "-m", "celery", "-A", "carousel", "worker", "-Q", "celery,control",
                               "--concurrency", "2", "-n", "loop@%h", "--loglevel=WARNING"])

    def start(self):
        self._start("web", [sys.executable, "-m", "gunicorn", "carousel.wsgi:application", "--bind",
                            f"127.0.0.1:{self.port}", "--workers", str(GUNICORN_WORKERS), "--log-level", "warning"])
        self.start_worker()
        self._start("delivery", [sys.executable, "-m", "celery", "-A", "carousel", "worker", "-Q", "delivery",
                                 "--concurrency", "2", "-n", "delivery@%h", "--loglevel=WARNING"])
        self._start("beat", [sys.executable, "-m", "celery", "-A", "carousel", "beat", "--loglevel=WARNING",
                             "--schedule", str(self.workdir / "var" / "celerybeat-schedule")])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with status {proc.returncode}: see {self.workdir}/{name}.log")
            try:
                httpx.get(f"{self.url}/api/v1/summary/", timeout=2)
                return
            except httpx.TransportError:
                time.sleep(0.3)
        raise RuntimeError("gunicorn did not answer within 60 s")

    def kill_worker(self, down_s):
        proc = self.procs["worker"]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(down_s)
        self.start_worker()

    def stop(self):
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in self.logs.values():
            log.close()


# --- The users ------------------------------------------------------------------------------

class Tally:
    def __init__(self, services):
        self.services = services
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.errors = []  # (what, detail) of server errors and lost calls, the first few printed
        self.unavailable = []  # (began, ended, detail) of each 503 with Retry-After

    def judge_unavailable(self):
        """503s with Retry-After: excused while PostgreSQL or Redis was down, else server errors."""
        for began, ended, detail in self.unavailable:
            if self.services.excused(began, ended, detail):
                self.add("outage_503")
            else:
                self.add("server_errors", detail=detail)

    def add(self, key, n=1, detail=None):
        with self.lock:
            self.counts[key] += n
            if detail and len(self.errors) < 200:
                self.errors.append((key, detail))

    def hook(self):
        """httpx event hooks: every answer is seen, retried or not."""

        def on_request(request):
            request.extensions["stress_began"] = time.monotonic()

        def on_response(response):
            status = response.status_code
            self.add("answers")
            if status < 500:
                if status == 429:
                    self.add("throttled")
                return
            began = response.request.extensions.get("stress_began", 0.0)
            response.read()
            detail = f"{response.request.method} {response.request.url.path} -> {status}: {response.text[:200]}"
            if status == 503 and "Retry-After" in response.headers:
                # Judged at the end, against every outage (one may still be under way now).
                with self.lock:
                    self.unavailable.append((began, time.monotonic(), detail))
                return
            self.add("server_errors", detail=detail)

        return {"request": [on_request], "response": [on_response]}


class User(threading.Thread):
    """One client: a user with a token, doing random actions until `until`."""

    def __init__(self, index, token, *, url, until, tally, big, big_gate, seed):
        super().__init__(name=f"client-{index}", daemon=True)
        from carousel_client.api import Client, Config

        self.index, self.until, self.tally, self.big, self.big_gate = index, until, tally, big, big_gate
        self.random = random.Random(seed)
        self.client = Client(Config(url, token))
        self.client.http.event_hooks = tally.hook()
        self.bulks = []  # dict(id, paths, cancelled)
        self.serial = 0

    def call(self, what, method, *args, **params):
        from carousel_client.api import ClientError

        try:
            return getattr(self.client, method)(*args, **params)
        except ClientError as exc:
            if exc.status is not None and 400 <= exc.status < 500 and exc.status not in (429,):
                self.tally.add("refused", detail=f"{what}: {exc.message}")
                return None
            self.tally.add("lost_calls", detail=f"{what}: {exc.message}")
            return None

    def new_paths(self, count):
        self.serial += 1
        # A directory per hundred files: the synthetic catalogue puts a directory on one tape.
        return [f"/stress/u{self.index:02d}/s{self.serial:05d}/d{i // 100:03d}/f{i:05d}.root" for i in range(count)]

    def submit(self, paths, label=""):
        body = self.call("submit", "submit", paths)
        if body is not None:
            bulk = {"id": body["bulk_id"], "paths": paths, "cancelled": False}
            self.bulks.append(bulk)
            self.tally.add("submitted", len(paths))
            self.tally.add("submissions")
            return bulk
        return None

    def cancel(self, bulk):
        bulk["cancelled"] = True  # from the moment it is asked: the cancel may win any race
        if self.call("cancel", "post", f"bulks/{bulk['id']}/cancel/") is not None:
            self.tally.add("cancels")

    def act(self):
        r = self.random.random()
        live = [b for b in self.bulks if not b["cancelled"]]
        if r < 0.30:
            shared = [f"/stress/shared/d{k // 100:02d}/f{k:05d}.root" for k in
                      self.random.sample(range(SHARED_FILES), self.random.randint(0, 3))]
            self.submit(self.new_paths(self.random.randint(1, 8)) + shared)
        elif r < 0.36 and self.big_gate():
            bulk = self.submit(self.new_paths(self.big))
            if bulk is not None and self.random.random() < 0.5:
                time.sleep(self.random.uniform(0, 3))
                self.cancel_and_resubmit(bulk)
        elif r < 0.46 and live:
            self.cancel(self.random.choice(live))
        elif r < 0.54 and live:
            self.cancel_and_resubmit(self.random.choice(live))
        elif r < 0.60 and self.bulks:
            self.submit(list(self.random.choice(self.bulks)["paths"]))  # asked again
        elif r < 0.68 and self.bulks:
            paths = self.random.choice(self.bulks)["paths"]
            body = self.call("release", "post", "requests/release/", {"paths": paths[:1000]})
            if body is not None:
                self.tally.add("releases")
        elif self.bulks:
            bulk = self.random.choice(self.bulks)
            self.call("poll", "get", f"bulks/{bulk['id']}/")
            if self.random.random() < 0.3:
                self.call("list", "get", "requests/", bulk=bulk["id"], page_size=100)
            self.tally.add("polls")
        else:
            self.call("summary", "get", "summary/")

    def cancel_and_resubmit(self, bulk):
        """The race of issue 24: a cancel and a resubmission of the same paths, together or a
        few ms apart. The resubmission must end restored."""
        offset = self.random.choice([0.0, 0.0, 0.01, 0.05])
        canceller = threading.Thread(target=self.cancel, args=(bulk,))
        canceller.start()
        time.sleep(offset)
        self.submit(list(bulk["paths"]))
        canceller.join()
        self.tally.add("races")

    def run(self):
        while time.monotonic() < self.until:
            try:
                self.act()
            except Exception as exc:  # noqa: BLE001 - a client's own bug must not end the run silently
                self.tally.add("lost_calls", detail=f"client error {type(exc).__name__}: {exc}")
            time.sleep(self.random.uniform(0.3, 1.5))


# --- Chaos ----------------------------------------------------------------------------------

def chaos(services, broker, *, start, duration, rng, counts, stop):
    """Kill the worker and restart PostgreSQL and Redis at random moments of the run, each at
    least once (more in a longer run), never two at once."""
    per_kind = max(1, round(duration / 150))
    events = sorted([(start + rng.uniform(0.1, 0.85) * duration, kind) for kind in ("worker", "pg", "redis")
                     for _ in range(per_kind)])
    for at, kind in events:
        while time.monotonic() < at:
            if stop.wait(min(1.0, at - time.monotonic())):
                return
        down = rng.uniform(1.0, 6.0)
        print(f"[{time.monotonic() - start:6.1f} s] chaos: {kind} down for {down:.1f} s", flush=True)
        try:
            if kind == "worker":
                broker.kill_worker(down)
                counts["worker_kills"] += 1
            elif kind == "pg" and services.restartable:
                services.restart_pg(down)
                counts["pg_restarts"] += 1
            elif kind == "redis" and services.restartable:
                services.restart_redis(down)
                counts["redis_restarts"] += 1
        except Exception as exc:  # noqa: BLE001 - say so, carry on
            print(f"chaos: {kind} failed: {exc}", flush=True)


# --- Checks ---------------------------------------------------------------------------------

def drain(limit_s):
    """Wait until nothing is active or in the intake, at most limit_s. Returns the seconds waited."""
    from django.db import close_old_connections

    from carousel.models import ACTIVE_STATES, Intake, RestoreRequest

    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        try:
            active = RestoreRequest.objects.filter(state__in=ACTIVE_STATES).count()
            pending = Intake.objects.count()
        except Exception as exc:  # noqa: BLE001 - the database may just have restarted
            print(f"drain: {exc}", flush=True)
            close_old_connections()
            time.sleep(2)
            continue
        print(f"[drain {time.monotonic() - start:5.0f} s] active {active}, in the intake {pending}", flush=True)
        if not active and not pending:
            break
        time.sleep(10)
    return time.monotonic() - start


def check(users, reads_log):
    from django.db.models import Count

    from carousel.domain.selectors import bulk_paths, bulk_requests
    from carousel.models import Bulk, Job, RequestState as S, RestoreRequest, TERMINAL_STATES, Transition

    found = collections.Counter()
    details = []
    # Accepted submissions: whole in the database; not cancelled by their client: none cancelled.
    for user in users:
        for bulk in user.bulks:
            row = Bulk.objects.filter(id=bulk["id"]).first()
            if row is None:
                found["lost"] += len(bulk["paths"])
                details.append(f"submission {bulk['id']} of {len(bulk['paths'])} files answered 201 is not stored")
                continue
            missing = len(set(bulk["paths"]) - set(bulk_paths(row)))
            if missing:
                found["lost"] += missing
                details.append(f"submission {bulk['id']}: {missing} of its files are not stored")
            if not bulk["cancelled"]:
                states = collections.Counter(bulk_requests(row).values_list("state", flat=True))
                gone = states[S.CANCELLED] + states[S.EXPIRED]
                if gone:
                    found["lost"] += gone
                    details.append(f"submission {bulk['id']} (never cancelled by its client): {gone} files "
                                   f"ended cancelled or expired ({dict(states)})")
                found["failed"] += states[S.FAILED]
    found["stuck"] = RestoreRequest.objects.exclude(state__in=TERMINAL_STATES).count()
    stuck_states = dict(RestoreRequest.objects.exclude(state__in=TERMINAL_STATES).values_list("state")
                        .annotate(n=Count("id")).values_list("state", "n"))
    if stuck_states:
        details.append(f"not final at the end: {stuck_states}")
    # The library's reads against the broker's sends.
    reads = set()
    if reads_log.exists():
        for line in reads_log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                t, job, path = json.loads(line)
                reads.add((round(t, 3), job, path))
    per_path = collections.Counter(path for _, _, path in reads)
    sends = collections.Counter()
    for path, at in (Transition.objects.filter(to_state=S.SUBMITTED).values_list("request__path", "at")
                     .distinct()):
        sends[path] += 1
    for path, n in per_path.items():
        if n > sends[path]:
            found["read_twice"] += n - sends[path]
            if len(details) < 60:
                details.append(f"{path} read {n} times, sent {sends[path]}")
    # Reads in a job sent after every request for that file in it was cancelled.
    sent_at = {}
    for job_id, at in Job.objects.exclude(sent_at=None).values_list("id", "sent_at"):
        sent_at[str(job_id)] = at
    by_job_path = collections.defaultdict(list)
    for job_id, path, state, finished in (RestoreRequest.objects.filter(job__isnull=False)
                                          .values_list("job_id", "path", "state", "finished_at")):
        by_job_path[(str(job_id), path)].append((state, finished))
    for _, job, path in reads:
        requests = by_job_path.get((job, path))
        at = sent_at.get(job)
        if requests and at and all(s in (S.CANCELLED, S.EXPIRED) and f is not None and f < at for s, f in requests):
            found["cancelled_read"] += 1
            details.append(f"{path} read in job {job}, sent after its requests were cancelled")
    found["reads"] = len(reads)
    return found, details


def server_tracebacks(web_log, most=3):
    """The tracebacks of the web workers' 500s (Django logs each with its traceback)."""
    if not web_log.exists():
        return []
    found, current = [], None
    for line in web_log.read_text(errors="replace").splitlines():
        if "Internal Server Error" in line:
            current = [line]
            found.append(current)
        elif current is not None and (line.startswith((" ", "Traceback")) or not line[:2].isdigit()):
            current.append(line)
        else:
            current = None
    return ["\n".join(t[:80]) for t in found[:most]]


def slow_statements(pg_log, most=5):
    """The slowest statements PostgreSQL logged (duration, first lines), and its deadlocks."""
    if pg_log is None or not pg_log.exists():
        return None, []
    text = pg_log.read_text(errors="replace")
    deadlocks = text.count("deadlock detected")
    # Where each was detected (the row the aborted statement waited for), for the report.
    where = collections.Counter(re.findall(r"ERROR:  deadlock detected\n(?:.*\n){0,12}?.*CONTEXT:  [^\n]*?"
                                           r"relation \"(\w+)\"", text))
    if where:
        print(f"deadlocks by relation: {dict(where)}")
    slow = []
    for match in re.finditer(r"duration: ([\d.]+) ms\s+(plan|statement|execute[^:]*):(.*?)(?=\n\S+ \S+ \S+ \[|\Z)",
                             text, re.S):
        slow.append((float(match.group(1)), match.group(3).strip()[:1500]))
    slow.sort(reverse=True)
    return deadlocks, slow[:most]


# --- Main -----------------------------------------------------------------------------------

def setup(users):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    call_command("migrate", interactive=False, verbosity=0)
    User = get_user_model()
    tokens = []
    for i in range(users):
        user, _ = User.objects.get_or_create(username=f"stress{i:02d}")
        tokens.append(Token.objects.get_or_create(user=user)[0].key)
    return tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of clients and chaos")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--big", type=int, default=5000, help="files in a large submission")
    parser.add_argument("--big-every", type=float, default=30.0,
                        help="a large submission at most this often, over all clients (s)")
    parser.add_argument("--speedup", type=float, default=1000.0, help="the simulated library's speed-up")
    parser.add_argument("--drives", type=int, default=8)
    parser.add_argument("--drain", type=float, default=780.0, help="longest wait for the queue to drain (s)")
    parser.add_argument("--explain-over", type=float, default=3.0, help="auto_explain: statements slower (s)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs) and say where")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    began = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="carousel-stress-")
    print(f"seed {seed}; working directory {workdir}", flush=True)
    with contextlib.ExitStack() as stack:
        services = Services(workdir, stack)
        os.environ.update(DATABASE_URL=services.database_url, REDIS_URL=services.redis_url,
                          DJANGO_SETTINGS_MODULE="carousel.settings",
                          CAROUSEL_VAR_DIR=str(Path(workdir) / "var"))
        import django

        django.setup()
        tokens = setup(args.clients)
        configure_postgres(services.database_url, args.explain_over)
        broker = Broker(services, workdir, args)
        stack.callback(broker.stop)
        broker.start()
        tally = Tally(services)
        gate_lock, last_big = threading.Lock(), [time.monotonic() - args.big_every]

        def big_gate():
            with gate_lock:
                if time.monotonic() - last_big[0] < args.big_every:
                    return False
                last_big[0] = time.monotonic()
                return True

        start = time.monotonic()
        until = start + args.duration
        users = [User(i, token, url=broker.url, until=until, tally=tally, big=args.big, big_gate=big_gate,
                      seed=rng.randrange(1 << 30)) for i, token in enumerate(tokens)]
        counts = collections.Counter()
        stop = threading.Event()
        chaos_thread = threading.Thread(target=chaos, args=(services, broker), daemon=True, kwargs=dict(
            start=start, duration=args.duration, rng=rng, counts=counts, stop=stop))
        chaos_thread.start()
        for user in users:
            user.start()
        for user in users:
            user.join()
        stop.set()
        chaos_thread.join()
        tally.judge_unavailable()
        print(f"clients done after {time.monotonic() - start:.0f} s: {dict(tally.counts)}", flush=True)
        from django.db import close_old_connections

        close_old_connections()
        drained_s = drain(args.drain)
        found, details = check(users, broker.reads_log)
        deadlocks, slow = slow_statements(services.pg_log)
        for what, detail in tally.errors[:40]:
            print(f"{what}: {detail}")
        for line in details[:40]:
            print(f"check: {line}")
        for text in server_tracebacks(broker.workdir / "web.log"):
            print(f"a 500 of the web server:\n  " + text.replace("\n", "\n  "))
        for ms, text in slow:
            print(f"slow statement, {ms / 1000:.1f} s:\n  " + text.replace("\n", "\n  ")[:1500])
        if args.keep:
            print(f"logs kept in {workdir}")
    if not args.keep:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "duration_s": args.duration, "submitted": tally.counts["submitted"],
        "lost": tally.counts["lost_calls"] + found["lost"], "read_twice": found["read_twice"],
        "cancelled_read": found["cancelled_read"], "server_errors": tally.counts["server_errors"],
        "deadlocks": deadlocks, "stuck": found["stuck"], "worker_kills": counts["worker_kills"],
        "pg_restarts": counts["pg_restarts"], "redis_restarts": counts["redis_restarts"],
        "failed": found["failed"], "reads": found["reads"], "submissions": tally.counts["submissions"],
        "cancels": tally.counts["cancels"], "races": tally.counts["races"], "releases": tally.counts["releases"],
        "polls": tally.counts["polls"], "refused": tally.counts["refused"], "outage_503": tally.counts["outage_503"],
        "throttled": tally.counts["throttled"], "slowest_statement_s": round(slow[0][0] / 1000, 1) if slow else None,
        "drain_s": round(drained_s, 1), "wall_s": round(time.monotonic() - began, 1), "seed": seed,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
