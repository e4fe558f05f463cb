"""Tape REST poll benchmark: GET stage/{id} of a 10,000-file stage request from 200 concurrent
clients (Debian's wrk) against gunicorn and PostgreSQL.

    .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/tape_rest_poll.py

It migrates, creates a user with an API token, stages --files paths through the door (one
POST over HTTP), starts gunicorn on loopback (--workers), warms up with one GET, and then runs
`wrk -t2 -c<clients> -d<seconds>s --latency` with `Authorization: Bearer <token>`. Answers per
second count 200s only (wrk's non-2xx and socket errors taken out); p99 is wrk's latency
distribution. gunicorn runs with CONN_MAX_AGE=60 (persistent database connections) unless
set, and the throttles as shipped with their rate raised so that they never answer. The stage request is deleted at the end. The last line is JSON:
{"files", "clients", "seconds", "answers_per_s", "p99_ms", "non_2xx", "socket_errors", "workers"}."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.ingest import free_port, setup_django, stop  # noqa: E402
from benchmarks.load import RATE  # noqa: E402

USERNAME = "bench-tape-rest-poll"
UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def start_gunicorn(port, workers):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "carousel.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", str(workers), "--backlog", "2048", "--log-level", "warning"], cwd=ROOT,
        # Persistent database connections, as a production deployment has them; the throttles
        # as shipped but with a rate that never answers (this measures polls, not the 429s).
        env=dict(os.environ, CONN_MAX_AGE=os.environ.get("CONN_MAX_AGE", "60"), CAROUSEL_THROTTLE_RATE=RATE))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with status {proc.returncode}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/.well-known/wlcg-tape-rest-api", timeout=1)
            return proc
        except httpx.TransportError:
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError("gunicorn did not answer within 60 s")


def parse_wrk(text):
    total = re.search(r"(\d+) requests in ([\d.]+)(\w+)", text)
    seconds = float(total.group(2)) * UNITS_MS[total.group(3)] / 1000.0
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    p99 = re.search(r"^\s*99%\s+([\d.]+)(\w+)", text, re.M)
    return {"requests": int(total.group(1)), "seconds": seconds,
            "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
            "socket_errors": sum(int(x) for x in errors.groups()) if errors else 0,
            "p99_ms": float(p99.group(1)) * UNITS_MS[p99.group(2)]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed: `make services` installs it (Debian package wrk)")
    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    call_command("migrate", interactive=False, verbosity=0)
    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    key = Token.objects.get_or_create(user=user)[0].key
    port = free_port()
    server = start_gunicorn(port, args.workers)
    base = f"http://127.0.0.1:{port}/api/tape-rest/v1"
    headers = {"Authorization": f"Bearer {key}"}
    try:
        files = [{"path": f"/bench/poll/run{i // 1000:03d}/f{i:06d}.root"} for i in range(args.files)]
        r = httpx.post(f"{base}/stage/", json={"files": files}, headers=headers, timeout=300)
        if r.status_code != 201:
            raise RuntimeError(f"stage answered {r.status_code}: {r.text[:500]}")
        url = r.headers["Location"]
        # What a worker does moments after the answer (no worker runs here): the files leave the
        # intake for the queue, so the polls read requests, as they would all day long.
        from django.utils import timezone

        from carousel.domain import intake
        intake.settle_pending(now=timezone.now())
        first = httpx.get(url, headers=headers, timeout=60)
        if first.status_code != 200 or len(first.json()["files"]) != args.files:
            raise RuntimeError(f"poll answered {first.status_code}: {first.text[:300]}")
        print(f"stage request {url}: {args.files} files, {len(first.content)} bytes per answer", flush=True)
        wrk = subprocess.run(["wrk", "-t2", f"-c{args.clients}", f"-d{args.seconds}s", "--latency",
                              "--timeout", "10s", "-H", f"Authorization: Bearer {key}", url],
                             capture_output=True, text=True, check=True)
        print(wrk.stdout, flush=True)
        figures = parse_wrk(wrk.stdout)
        httpx.delete(url, headers=headers, timeout=60)
    finally:
        stop(server)
    answers = (figures["requests"] - figures["non_2xx"]) / figures["seconds"]
    print(json.dumps({"files": args.files, "clients": args.clients, "seconds": round(figures["seconds"], 2),
                      "answers_per_s": round(answers, 1), "p99_ms": round(figures["p99_ms"], 1),
                      "non_2xx": figures["non_2xx"], "socket_errors": figures["socket_errors"],
                      "workers": args.workers, "loadavg_1m": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
