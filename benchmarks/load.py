"""Polls under load: the issue's "flood of clients" against gunicorn and PostgreSQL.

    python -m carousel.infra.localservices -- .venv/bin/python benchmarks/load.py

Needs PostgreSQL in DATABASE_URL (the command above gives a fresh private server, and Redis
for the shared cache the throttles count in). It migrates, queues --queued requests (default
100,000) for one user through the service that the API's POST calls, and 10 for another,
runs ANALYZE, starts gunicorn (4 sync workers, as the issue measured) on loopback with the
throttles as shipped but the rate raised (CAROUSEL_THROTTLE_RATE) so that they never answer,
and then:

- mix: Debian's `wrk` with --connections concurrent clients (200) for --seconds (30), a Lua
  script alternating GET /api/v1/summary/ and GET /api/v1/requests/?state=queued (a page of
  100) as the big user. Answers per second count the 200s only (the script counts them);
  p50 and p99 are wrk's latencies over every answer.
- single /summary/: then, with no load, --single (25) sequential calls for the big user and
  for the small one; the medians and their ratio (the goal: at most 2).

The machine may be shared: the script also reads the CPU time that gunicorn's workers and
PostgreSQL spent during the mix (from /proc), and gives the cost of an answer in server CPU
and the rate that two otherwise idle cores would sustain at that cost (a derived figure,
labelled as such). --conn-max-age sets the web workers' CONN_MAX_AGE (default: as shipped).

The last line is JSON: files queued, answers_per_s, p50_ms, p99_ms, summary_big_ms,
summary_small_ms, x_summary, server_cpu_ms_per_answer, answers_per_s_on_2_free_cores."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import ROOT, free_port, setup_django, stop  # noqa: E402 - one way to start and stop

WORKERS = 4
BIG, SMALL = "load-big", "load-small"
# As shipped (the same throttle class), raised so it never answers during the benchmark.
RATE = "1000000000/minute"

LUA = r"""
local token = os.getenv("LOAD_TOKEN")
local targets = {"/api/v1/summary/", "/api/v1/requests/?state=queued"}
local headers = {["Authorization"] = "Token " .. token}
threads = {}
n = 0
ok = 0
other = 0

function setup(thread)
  table.insert(threads, thread)
end

function request()
  n = n + 1
  return wrk.format("GET", targets[(n % 2) + 1], headers)
end

function response(status, hdrs, body)
  if status == 200 then ok = ok + 1 else other = other + 1 end
end

function done(summary, latency, requests)
  local total_ok, total_other = 0, 0
  for _, t in ipairs(threads) do
    total_ok = total_ok + t:get("ok")
    total_other = total_other + t:get("other")
  end
  io.write(string.format(
    'WRK {"ok": %d, "other": %d, "answers": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"connect_errors": %d, "read_errors": %d, "write_errors": %d, "timeouts": %d}\n',
    total_ok, total_other, summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout))
end
"""


def fill(queued):
    """The big user's queue (through restore_submit, in slices of 100,000) and the small one's."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone
    from rest_framework.authtoken.models import Token

    from carousel.domain import intake
    from carousel.models import Control, RestoreRequest
    from carousel.domain.services import restore_submit

    User = get_user_model()
    big, _ = User.objects.get_or_create(username=BIG)
    small, _ = User.objects.get_or_create(username=SMALL)
    control = Control.get()
    control.default_queued_ceiling = max(control.default_queued_ceiling, queued)
    control.save(update_fields=["default_queued_ceiling"])
    have = RestoreRequest.objects.filter(user=big).count()
    start = time.perf_counter()
    for first in range(have, queued, 100_000):
        restore_submit(user=big, now=timezone.now(),
                       paths=[f"/load/big/run{i // 1000:05d}/f{i:07d}.root" for i in range(first, min(queued, first + 100_000))])
    if not RestoreRequest.objects.filter(user=small).exists():
        restore_submit(user=small, now=timezone.now(), paths=[f"/load/small/f{i}.root" for i in range(10)])
    # Big submissions are answered from the intake; a worker queues them moments later (none
    # runs here): the polls must read a queue of `queued` requests.
    intake.settle_pending(now=timezone.now(), most=queued)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"queued: {RestoreRequest.objects.filter(user=big).count():,} for {BIG}, "
          f"{RestoreRequest.objects.filter(user=small).count()} for {SMALL} "
          f"({time.perf_counter() - start:.1f} s)")
    return Token.objects.get_or_create(user=big)[0].key, Token.objects.get_or_create(user=small)[0].key


def start_gunicorn(port, env):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "carousel.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", str(WORKERS), "--backlog", "2048", "--log-level", "warning"], cwd=ROOT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with status {proc.returncode}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/api/v1/summary/", timeout=1)
            return proc
        except httpx.TransportError:
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError("gunicorn did not answer within 60 s")


def _ticks(pid):
    """CPU ticks (user + system) of a process, and of its children it has reaped."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def server_cpu_s(gunicorn_pid, postmaster_pid):
    """CPU seconds used so far by the gunicorn workers and PostgreSQL (its postmaster, its live
    processes and the backends it has reaped): what the answers cost the machine, whatever
    else shares it."""
    ticks = 0
    for root in (gunicorn_pid, postmaster_pid):
        ticks += _ticks(root)
        for child in _children(root):
            try:
                ticks += _ticks(child)
            except FileNotFoundError:
                pass  # exited between the listing and the read (then reaped: in cutime)
    return ticks / os.sysconf("SC_CLK_TCK")


def postmaster_pid():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    with open(f"/proc/{backend}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def run_wrk(port, token, connections, seconds):
    wrk = shutil.which("wrk")
    if not wrk:
        sys.exit("needs Debian's wrk (apt-get install wrk)")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(LUA)
    try:
        out = subprocess.run(
            [wrk, "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "-s", script.name,
             f"http://127.0.0.1:{port}"], env={**os.environ, "LOAD_TOKEN": token},
            capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(script.name)
    print(out.rstrip())
    line = next(x for x in out.splitlines() if x.startswith("WRK "))
    return json.loads(line[4:])


def time_summary(port, token, calls):
    """Median seconds of one GET /api/v1/summary/, `calls` sequential calls after a warm-up."""
    times = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Token {token}"},
                      timeout=60) as client:
        for i in range(calls + 3):
            start = time.perf_counter()
            r = client.get("/api/v1/summary/")
            elapsed = time.perf_counter() - start
            if r.status_code != 200:
                raise RuntimeError(f"/summary/ answered {r.status_code}: {r.text[:300]}")
            if i >= 3:
                times.append(elapsed)
    return statistics.median(times), r.json()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--conn-max-age", type=int, default=None,
                        help="the web workers' CONN_MAX_AGE (default: as shipped, the settings' default)")
    parser.add_argument("--single", type=int, default=25, help="sequential /summary/ calls per user")
    args = parser.parse_args()
    setup_django()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    print("load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    big_token, small_token = fill(args.queued)
    port = free_port()
    env = {**os.environ, "CAROUSEL_THROTTLE_RATE": RATE}
    if args.conn_max_age is not None:
        env["CONN_MAX_AGE"] = str(args.conn_max_age)
    else:
        env.pop("CONN_MAX_AGE", None)
    from django.conf import settings
    conn_max_age = args.conn_max_age if args.conn_max_age is not None else settings.DATABASES["default"]["CONN_MAX_AGE"]
    proc = start_gunicorn(port, env)
    try:
        # Each worker imports the views on its first request: not what we measure.
        for _ in range(4 * WORKERS):
            httpx.get(f"http://127.0.0.1:{port}/api/v1/requests/?state=queued",
                      headers={"Authorization": f"Token {big_token}"}, timeout=60)
        postmaster = postmaster_pid()
        cpu_before = server_cpu_s(proc.pid, postmaster)
        result = run_wrk(port, big_token, args.connections, args.seconds)
        cpu_s = server_cpu_s(proc.pid, postmaster) - cpu_before
        print("load average after the mix: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
        big_s, big_body = time_summary(port, big_token, args.single)
        small_s, small_body = time_summary(port, small_token, args.single)
    finally:
        stop(proc)
    if big_body["states"]["queued"] != args.queued or small_body["states"]["queued"] != 10:
        raise RuntimeError(f"summaries disagree with the queues: {big_body['states']} / {small_body['states']}")
    seconds = result["duration_us"] / 1e6
    figures = {
        "files": args.queued, "connections": args.connections, "seconds": round(seconds, 1),
        "answers_per_s": round(result["ok"] / seconds, 1), "not_200": result["other"],
        "socket_errors": result["connect_errors"] + result["read_errors"] + result["write_errors"]
        + result["timeouts"],
        "p50_ms": round(result["p50_us"] / 1000, 1), "p99_ms": round(result["p99_us"] / 1000, 1),
        "summary_big_ms": round(big_s * 1000, 2), "summary_small_ms": round(small_s * 1000, 2),
        "x_summary": round(big_s / small_s, 2), "conn_max_age": conn_max_age,
        # What the answers cost: CPU seconds of gunicorn and PostgreSQL per answer, and the
        # answers per second that 2 cores spent on nothing else would give at that cost.
        "server_cpu_ms_per_answer": round(cpu_s / max(1, result["answers"]) * 1000, 2),
        "answers_per_s_on_2_free_cores": round(2 * max(1, result["answers"]) / cpu_s, 1) if cpu_s else None,
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(f"mix: {figures['answers_per_s']} answers/s (200s), p50 {figures['p50_ms']} ms, "
          f"p99 {figures['p99_ms']} ms; /summary/ alone: {figures['summary_big_ms']} ms for {args.queued:,} "
          f"queued vs {figures['summary_small_ms']} ms for 10 (x{figures['x_summary']})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
