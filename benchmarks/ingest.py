"""Ingest benchmark: how long the API takes to accept 100,000 paths in one submission, against
the floor of loading the same rows with a raw COPY.

    cd /work/main && .venv/bin/python -m carousel.localservices -- .venv/bin/python benchmarks/ingest.py

It needs PostgreSQL in DATABASE_URL and a database without earlier benchmark rows (the command
above gives a fresh private server each time). It migrates, creates a user with an API token,
starts the application under gunicorn on loopback, and then, in each of --runs rounds:

- api_s: one POST of 100,000 new paths to /api/v1/requests/ over HTTP (httpx), timed from
  sending the request to receiving the response: parsing, validation, the queries and the
  COPYs of the service, the commit and the response. The JSON body is encoded beforehand.
- copy_s: 100,000 other new paths written with `COPY carousel_restorerequest ... FROM STDIN`
  by psycopg on its own connection, with the columns and values the service writes for a
  new queued request, timed from the COPY to its commit. The rows, path keys included, are
  built beforehand.

It prints one line per measurement, then the medians, and as the last line a JSON object:
{"files": ..., "api_s": ..., "copy_s": ..., "ratio": copy_s / api_s}."""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
USERNAME = "bench-ingest"
WORKERS = 2
WARMUP_FILES = 10
COPY_COLUMNS = ("user_id", "group_id", "path", "path_key", "priority", "destination", "deadline",
                "pin_lifetime", "state", "attempts", "error_class", "last_error", "job_id", "job_rank",
                "created_at", "updated_at", "submitted_at", "started_at")


def batch_paths(batch, count):
    """`count` paths of a STAR-like raw-data layout, 1,000 files per run directory; batches
    use disjoint runs, so every batch is new to the database."""
    runs_per_batch = 100
    return [f"/star/raw/2017/run{(r := 10_000 + batch * runs_per_batch + i // 1000):05d}/"
            f"st_physics_{r}_{i % 1000:05d}.daq" for i in range(count)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_django():
    """Refuse anything but PostgreSQL, then set Django up in this process. Returns DATABASE_URL."""
    database_url = os.environ.get("DATABASE_URL", "")
    if urlsplit(database_url).scheme not in ("postgres", "postgresql"):
        sys.exit("DATABASE_URL must name a PostgreSQL database (postgres://...): the benchmark measures "
                 "the PostgreSQL path. Run it as: python -m carousel.localservices -- "
                 f"python benchmarks/{Path(sys.argv[0]).name}")
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")
    import django

    django.setup()
    return database_url


def setup_database(needed_ceiling):
    """Migrate, create the benchmark user and its token, raise the default queued ceiling.
    Returns (user, token key)."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from carousel.models import Control, RestoreRequest

    call_command("migrate", interactive=False, verbosity=0)
    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    if RestoreRequest.objects.filter(user=user).exists():
        sys.exit(f"the database already holds requests of {USERNAME!r}; run the benchmark on a fresh "
                 f"database: python -m carousel.localservices -- python benchmarks/{Path(sys.argv[0]).name}")
    token, _ = Token.objects.get_or_create(user=user)
    control = Control.get()
    if control.default_queued_ceiling < needed_ceiling:
        control.default_queued_ceiling = needed_ceiling
        control.save(update_fields=["default_queued_ceiling"])
    return user, token.key


def start_gunicorn(port):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "carousel.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", str(WORKERS), "--log-level", "warning"],
        cwd=ROOT)
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


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def post_paths(client, paths):
    """POST one submission; returns (seconds, response). The body is encoded before the clock starts."""
    body = json.dumps({"paths": paths}).encode()
    start = time.perf_counter()
    response = client.post("/api/v1/requests/", content=body, headers={"Content-Type": "application/json"})
    return time.perf_counter() - start, response


def check_created(response, files):
    if response.status_code != 201:
        raise RuntimeError(f"POST answered {response.status_code}: {response.text[:500]}")
    created = response.json()["created"]
    if created != files:
        raise RuntimeError(f"POST created {created} requests, expected {files}")


def copy_rows(database_url, user_id, paths):
    """COPY one batch of new queued requests into the table and commit; returns the seconds."""
    from carousel.models import path_key

    now = datetime.now(timezone.utc)
    rows = [(user_id, None, p, path_key(p), 0, "", None, None, "queued", 0, "", "", None, 0, now, now, None, None)
            for p in paths]
    with psycopg.connect(database_url) as conn:
        start = time.perf_counter()
        with conn.cursor() as cursor, cursor.copy(
                f"COPY carousel_restorerequest ({', '.join(COPY_COLUMNS)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        conn.commit()
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds of one API and one COPY measurement")
    parser.add_argument("--files", type=int, default=100_000, help="paths per submission")
    args = parser.parse_args()
    database_url = setup_django()
    from carousel.models import RestoreRequest

    print("load average at start (the figures are noisy on a busy machine): "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    # Every request stays active, the COPY rows included: the ceiling must hold them all.
    user, key = setup_database(needed_ceiling=max(300_000, WORKERS * WARMUP_FILES + 2 * args.runs * args.files))
    port = free_port()
    proc = start_gunicorn(port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Token {key}"},
                          timeout=300) as client:
            # Warm-up: gunicorn workers import the URLconf, views and DRF on their first request;
            # that one-off cost is not what we measure. One small POST per worker, sent together,
            # so that each worker takes one while the other is busy.
            with ThreadPoolExecutor(WORKERS) as pool:
                warmups = pool.map(lambda w: post_paths(client, batch_paths(-1 - w, WARMUP_FILES)), range(WORKERS))
                for seconds, response in warmups:
                    check_created(response, WARMUP_FILES)
                    print(f"warm-up: {WARMUP_FILES} paths in {seconds:.3f} s")

            api_times, copy_times = [], []
            for run in range(args.runs):
                before = RestoreRequest.objects.filter(user=user).count()
                seconds, response = post_paths(client, batch_paths(2 * run, args.files))
                check_created(response, args.files)
                stored = RestoreRequest.objects.filter(user=user).count() - before
                if stored != args.files:
                    raise RuntimeError(f"{stored} rows committed by the API, expected {args.files}")
                api_times.append(seconds)
                print(f"run {run + 1}: API  {args.files} paths in {seconds:.3f} s "
                      f"({args.files / seconds:,.0f} paths/s)")

                before = RestoreRequest.objects.filter(user=user).count()
                seconds = copy_rows(database_url, user.id, batch_paths(2 * run + 1, args.files))
                stored = RestoreRequest.objects.filter(user=user).count() - before
                if stored != args.files:
                    raise RuntimeError(f"{stored} rows committed by COPY, expected {args.files}")
                copy_times.append(seconds)
                print(f"run {run + 1}: COPY {args.files} paths in {seconds:.3f} s "
                      f"({args.files / seconds:,.0f} paths/s)")
    finally:
        stop(proc)

    api_s = statistics.median(api_times)
    copy_s = statistics.median(copy_times)
    print(f"median of {args.runs}: API {api_s:.3f} s, COPY {copy_s:.3f} s, COPY/API {copy_s / api_s:.2f}")
    print(json.dumps({"files": args.files, "api_s": round(api_s, 3), "copy_s": round(copy_s, 3),
                      "ratio": round(copy_s / api_s, 3)}))


if __name__ == "__main__":
    main()
