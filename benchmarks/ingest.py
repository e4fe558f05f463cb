"""Ingest benchmark: a 100,000-file stage through each door, against a bare COPY of the same
rows into an unindexed table (issue "The grid front door").

    .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/ingest.py

It needs PostgreSQL in DATABASE_URL (the command above gives a fresh private server each
time). Re-runnable: it refuses to start unless the request table is empty, empties it again
after every measurement (TRUNCATE, and the counters the triggers keep with it: the table was
empty, so they are zero), and at the end drops its bare table, its users and their tokens.

It migrates, creates a user with an API token, starts the application under gunicorn (2 sync
workers) on loopback, and then measures, --runs times each (the median is kept):

- each door (a function of DOORS): one submission of --files new paths over HTTP (httpx),
  timed from sending the request to receiving the answer (parsing, validation, the
  service's queries and COPYs, the commit). The JSON body is encoded beforehand.
  - api: POST /api/v1/requests/ (the native API).
  - tape_rest: POST {endpoint}/stage of the WLCG Tape REST API. The door is built in another
    branch (helper e); until it is served here (its discovery document answers 404) the
    script says so and reports null.
- bare_copy: the same rows (every column a request row has, values as the service writes
  for a new queued request, built before the clock starts) written with COPY into
  `bench_bare_copy`, a table made `LIKE carousel_restorerequest` (defaults, identity) without its indexes,
  constraints or triggers; timed from the start of the COPY to the commit.

A submission this big is answered once its files are durable in the intake (carousel/domain/intake.py);
the move into the queue that follows is the loop's work. After each door's answer (and its
clock) the script checks that every file is stored, then makes that move itself, as the cycle
would, timed and reported as <door>_settle_s beside the door's time (it is not the answer's).
Then the step that follows the move in the same task (and in the cycle), adding the moved
paths to the path filter's trigram index (PathSearch), timed apart as <door>_index_s: the
files are queued, listed and found by the filter before it runs, so it is not part of the time
until queued, but it is work the broker does for every big submission.

Last line, JSON: files, api_s, tape_rest_s (null while the door is missing), bare_copy_s,
x_bare_copy (the slower measured door's time over bare_copy_s), api_settle_s, tape_rest_settle_s,
queued_x_bare_copy (the time until queued: the slower door's answer plus its move into the
queue, medians, over bare_copy_s; issue 24's goal: at most 5), api_index_s, tape_rest_index_s."""
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
BARE_TABLE = "bench_bare_copy"


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
                 "the PostgreSQL path. Run it as: python -m carousel.infra.localservices -- "
                 f"python benchmarks/{Path(sys.argv[0]).name}")
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")
    import django

    django.setup()
    return database_url


def start_gunicorn(port, workers=WORKERS, env=None):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "carousel.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", str(workers), "--timeout", "300", "--log-level", "warning"], cwd=ROOT, env=env)
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


# --- The doors: each takes (client, paths) and returns the seconds of one submission, after
# checking that every path was accepted; or None when the door is not served here. ---

def _timed_post(client, url, body, expect):
    data = json.dumps(body).encode()
    start = time.perf_counter()
    response = client.post(url, content=data, headers={"Content-Type": "application/json"})
    seconds = time.perf_counter() - start
    if response.status_code != expect:
        raise RuntimeError(f"POST {url} answered {response.status_code}: {response.text[:500]}")
    return seconds, response


def api_door(client, paths):
    seconds, response = _timed_post(client, "/api/v1/requests/", {"paths": paths}, 201)
    if response.json()["created"] != len(paths):
        raise RuntimeError(f"the API created {response.json()['created']} requests, expected {len(paths)}")
    return seconds


def tape_rest_door(client, paths):
    discovery = client.get("/.well-known/wlcg-tape-rest-api")
    if discovery.status_code == 404:
        return None
    discovery.raise_for_status()
    endpoint = next(e["uri"] for e in discovery.json()["endpoints"] if str(e.get("version", "")).startswith("v1"))
    seconds, response = _timed_post(client, endpoint.rstrip("/") + "/stage",
                                    {"files": [{"path": p} for p in paths]}, 201)
    if "requestId" not in response.json():
        raise RuntimeError(f"stage answered without a requestId: {response.text[:300]}")
    return seconds


DOORS = {"api": api_door, "tape_rest": tape_rest_door}


# --- The floor: a bare COPY ---

def bare_rows(user_id, paths):
    """The rows the service writes for new queued requests, every column of a request row."""
    from carousel.models import RestoreRequest, path_key

    now = datetime.now(timezone.utc)
    columns = [f.column for f in RestoreRequest._meta.concrete_fields if not f.primary_key]
    values = {"user_id": user_id, "state": "queued", "created_at": now, "updated_at": now, "priority": 0,
              "destination": "", "destination_layout": "path", "attempts": 0, "error_class": "", "last_error": "", "job_rank": 0,
              "staged_path": "", "delivery_fs": "", "delivery_attempts": 0, "activity": "default"}
    rows = [tuple(values.get(c, (p if c == "path" else path_key(p) if c == "path_key" else None)) for c in columns)
            for p in paths]
    return columns, rows


def bare_copy(database_url, columns, rows):
    """COPY the rows into the unindexed table and commit; the seconds from the COPY's start."""
    with psycopg.connect(database_url) as conn:
        conn.execute(f"TRUNCATE {BARE_TABLE}")
        conn.commit()
        start = time.perf_counter()
        with conn.cursor() as cursor, cursor.copy(f"COPY {BARE_TABLE} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        conn.commit()
        seconds = time.perf_counter() - start
        stored = conn.execute(f"SELECT count(*) FROM {BARE_TABLE}").fetchone()[0]
    if stored != len(rows):
        raise RuntimeError(f"{stored} rows in {BARE_TABLE}, expected {len(rows)}")
    return seconds


def setup_database(needed_ceiling):
    """(For ingest_profile.py.) Migrate, create the benchmark user and its token, raise the
    default queued ceiling. Returns (user, token key)."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from carousel.models import Control

    call_command("migrate", interactive=False, verbosity=0)
    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    control = Control.get()
    if control.default_queued_ceiling < needed_ceiling:
        control.default_queued_ceiling = needed_ceiling
        control.save(update_fields=["default_queued_ceiling"])
    return user, Token.objects.get_or_create(user=user)[0].key


def copy_rows(database_url, user_id, paths):
    """(For ingest_profile.py.) COPY new queued requests into the request table itself (its
    indexes and triggers included) and commit; returns the seconds."""
    columns, rows = bare_rows(user_id, paths)
    with psycopg.connect(database_url) as conn:
        start = time.perf_counter()
        with conn.cursor() as cursor, cursor.copy(
                f"COPY carousel_restorerequest ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        conn.commit()
        return time.perf_counter() - start


def empty_requests():
    """Back to the empty table the run started from: the requests, their submissions, and the
    counters the triggers keep (TRUNCATE fires no delete trigger; the table was empty, so
    every counter is zero: no delta rows)."""
    from django.db import connection

    from carousel.domain.counters import DELTAS

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE carousel_restorerequest, carousel_bulkitem, carousel_transition, carousel_bulk, "
                       "carousel_intake, carousel_pathsearch, " + ", ".join(m._meta.db_table for m in DELTAS))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="measurements of each door and of the bare COPY")
    parser.add_argument("--files", type=int, default=100_000, help="paths per submission")
    args = parser.parse_args()
    database_url = setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from rest_framework.authtoken.models import Token

    from django.utils.timezone import now as django_now

    from carousel.domain import intake
    from carousel.models import Control, Intake, RestoreRequest

    call_command("migrate", interactive=False, verbosity=0)
    if RestoreRequest.objects.exists():
        sys.exit("the request table is not empty: the benchmark starts from an empty one (and empties it "
                 "again as it goes). Run it on a fresh database: python -m carousel.infra.localservices -- "
                 f"python benchmarks/{Path(sys.argv[0]).name}")
    print("load average at start (the figures are noisy on a busy machine): "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    key = Token.objects.get_or_create(user=user)[0].key
    control = Control.get()
    if control.default_queued_ceiling < args.files:
        control.default_queued_ceiling = args.files
        control.save(update_fields=["default_queued_ceiling"])
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {BARE_TABLE}")
        cursor.execute(f"CREATE TABLE {BARE_TABLE} (LIKE carousel_restorerequest INCLUDING DEFAULTS INCLUDING IDENTITY)")

    times = {name: [] for name in DOORS}
    settle_times = {name: [] for name in DOORS}
    index_times = {name: [] for name in DOORS}
    missing = set()
    bare_times = []
    port = free_port()
    proc = start_gunicorn(port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600,
                          headers={"Authorization": f"Token {key}"}) as client:
            # Warm-up: each worker imports the views on its first request; not what we measure.
            with ThreadPoolExecutor(WORKERS) as pool:
                list(pool.map(lambda w: api_door(client, batch_paths(-1 - w, WARMUP_FILES)), range(WORKERS)))
            empty_requests()
            batch = 0
            for run in range(args.runs):
                for name, door in DOORS.items():
                    if name in missing:
                        continue
                    seconds = door(client, batch_paths(batch, args.files))
                    batch += 1
                    if seconds is None:
                        missing.add(name)
                        print(f"{name}: not served here yet (its discovery answers 404): reported as null")
                        continue
                    # Every file durable at the answer: as requests, or in the intake.
                    stored = RestoreRequest.objects.count() + Intake.objects.count()
                    if stored != args.files:
                        raise RuntimeError(f"{name}: {stored} files stored, expected {args.files}")
                    times[name].append(seconds)
                    # What the answer left to the loop: the move into the queue (no worker runs
                    # here; the cycle's own call), after the clock, reported beside it.
                    start = time.perf_counter()
                    intake.settle_pending(now=django_now(), most=10 * args.files)
                    settle_s = time.perf_counter() - start
                    settle_times[name].append(settle_s)
                    if RestoreRequest.objects.count() != args.files:
                        raise RuntimeError(f"{name}: {RestoreRequest.objects.count()} requests after the move")
                    # Then, queued, their paths join the path filter's index (the task's second
                    # transaction): after the time until queued, reported beside it.
                    start = time.perf_counter()
                    indexed = intake.index_pending(most=10 * args.files)
                    index_s = time.perf_counter() - start
                    index_times[name].append(index_s)
                    if indexed != args.files:
                        raise RuntimeError(f"{name}: {indexed} paths indexed after the move")
                    print(f"run {run + 1}: {name:9} {args.files} paths in {seconds:.3f} s "
                          f"({args.files / seconds:,.0f} paths/s); queued from the intake in {settle_s:.3f} s; "
                          f"paths indexed in {index_s:.3f} s")
                    empty_requests()
                columns, rows = bare_rows(user.id, batch_paths(batch, args.files))  # before the clock
                batch += 1
                seconds = bare_copy(database_url, columns, rows)
                bare_times.append(seconds)
                print(f"run {run + 1}: bare COPY {args.files} rows in {seconds:.3f} s")
    finally:
        stop(proc)
        empty_requests()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {BARE_TABLE}")
        get_user_model().objects.filter(username=USERNAME).delete()

    medians = {name: (round(statistics.median(t), 3) if t else None) for name, t in times.items()}
    bare_s = statistics.median(bare_times)
    slowest = max(v for v in medians.values() if v is not None)
    print(f"medians of {args.runs}: " + ", ".join(f"{n} {v} s" for n, v in medians.items())
          + f", bare COPY {bare_s:.3f} s; slower door / bare COPY = {slowest / bare_s:.2f}"
          + (f" (not measured: {', '.join(sorted(missing))})" if missing else ""))
    settled = {name: (round(statistics.median(t), 3) if t else None) for name, t in settle_times.items()}
    print("queued from the intake after the answer (the loop's work, not the POST's), medians: "
          + ", ".join(f"{n} {v} s" for n, v in settled.items()))
    indexed = {name: (round(statistics.median(t), 3) if t else None) for name, t in index_times.items()}
    print("paths added to the path filter's index after the move (not part of the time until queued), medians: "
          + ", ".join(f"{n} {v} s" for n, v in indexed.items()))
    until_queued = max(medians[n] + settled[n] for n in DOORS if medians[n] is not None)
    print(f"until queued (slower door's answer plus its move into the queue): {until_queued:.3f} s, "
          f"{until_queued / bare_s:.2f} x bare COPY")
    print(json.dumps({"files": args.files, "api_s": medians["api"], "tape_rest_s": medians["tape_rest"],
                      "bare_copy_s": round(bare_s, 3), "x_bare_copy": round(slowest / bare_s, 2),
                      "api_settle_s": settled["api"], "tape_rest_settle_s": settled["tape_rest"],
                      "queued_x_bare_copy": round(until_queued / bare_s, 2),
                      "api_index_s": indexed["api"], "tape_rest_index_s": indexed["tape_rest"]}))


if __name__ == "__main__":
    main()
