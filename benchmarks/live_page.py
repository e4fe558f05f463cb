"""The live staging page's updating fragment against a large queue, without a cache.

Fills PostgreSQL as benchmarks/cycle.py does (default 1,000,000 queued located requests from
1,000 users in 10 groups over 20,000 tapes), adds 12 hours of history (requests restored at
--per-hour files an hour, with their transitions, jobs and a few errors) and a full stager
(N x K = 750 files in 50 jobs in flight), runs ANALYZE, then in a fresh process renders
/live/fragment/ through Django's test client several times. Also times the "my requests" page
of the user with the most requests queued. Prints the medians, then one JSON object as its
last line.

    python -m carousel.infra.localservices -- .venv/bin/python benchmarks/live_page.py [--queued 100000]
"""
import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cycle import ROOT, fill, prepare, setup_django  # noqa: E402 - one way to fill the queue, shared

HOURS = 12
RUNS = 7


def add_history(per_hour, seed=2):
    """Requests restored over the last HOURS hours, their transitions and jobs, a few
    transient errors, and a full stager of requests in flight."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.utils import timezone

    from carousel.models import Control, Job, RestoreRequest, Tape, Transition, path_key

    rng = random.Random(seed)
    now = timezone.now()
    control = Control.get()
    users = list(User.objects.filter(username__startswith="bench-u").values_list("id", flat=True))
    tapes = list(Tape.objects.values_list("id", flat=True))
    start = time.perf_counter()
    done, jobs = [], []
    for k in range(per_hour * HOURS):
        finished = now - timedelta(seconds=rng.uniform(0, HOURS * 3600))
        if k % control.files_per_job == 0:
            tape = rng.choice(tapes)
            sent = finished - timedelta(seconds=rng.uniform(60, 900))
            jobs.append(Job(tape_id=tape, state="done", files=control.files_per_job, created_at=sent, sent_at=sent,
                            progress_at=finished, finished_at=finished))
        done.append((users[rng.randrange(len(users))], tape, jobs[-1].id, sent, finished))
    Job.objects.bulk_create(jobs, batch_size=5000)
    in_flight = [Job(tape_id=rng.choice(tapes), state="sent", files=control.files_per_job, created_at=now,
                     sent_at=now, progress_at=now) for _ in range(control.jobs_in_flight)]
    Job.objects.bulk_create(in_flight)
    table = RestoreRequest._meta.db_table
    columns = ("user_id, path, path_key, size, tape_id, position, priority, destination, state, attempts, "
               "error_class, last_error, job_id, created_at, updated_at, submitted_at, started_at, finished_at")
    with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for i, (user, tape, job, sent, finished) in enumerate(done):
            path = f"/bench/history/f{i:07d}"
            copy.write_row((user, path, path_key(path), rng.randint(10**9, 5 * 10**9), tape, 0, 0, "", "done", 1, "",
                            "", job, sent - timedelta(hours=1), finished, sent, sent, finished))
        for j, job in enumerate(in_flight):
            for f in range(control.files_per_job):
                path = f"/bench/inflight/j{j}/f{f}"
                copy.write_row((users[rng.randrange(len(users))], path, path_key(path), rng.randint(10**9, 5 * 10**9),
                                job.tape_id, f, 0, "", "submitted", 1, "", "", job.id, now - timedelta(hours=1),
                                now, now, None, None))
    # The history the trigger would have written: submitted, staging, done; 1% retried once.
    rows = RestoreRequest.objects.filter(state="done", path__startswith="/bench/history/").values_list(
        "id", "submitted_at", "finished_at")
    history = []
    for rid, sent, finished in rows.iterator(chunk_size=10_000):
        history += [Transition(request_id=rid, from_state="queued", to_state="submitted", at=sent),
                    Transition(request_id=rid, from_state="submitted", to_state="staging", at=sent),
                    Transition(request_id=rid, from_state="staging", to_state="done", at=finished)]
        if rng.random() < 0.01:
            history.append(Transition(request_id=rid, from_state="staging", to_state="retry", at=sent))
    Transition.objects.bulk_create(history, batch_size=10_000)
    # The hourly counters the trigger would have kept (it counts UPDATEs; the history came by COPY),
    # as one delta row per hour (carousel_hourlystats is the view summing them).
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO carousel_hourlystatsdelta (hour, files_done, bytes_done, errors)
            SELECT date_trunc('hour', t.at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
                   count(*) FILTER (WHERE t.to_state = 'done'),
                   coalesce(sum(r.size) FILTER (WHERE t.to_state = 'done'), 0),
                   count(*) FILTER (WHERE t.to_state <> 'done')
            FROM carousel_transition t JOIN carousel_restorerequest r ON r.id = t.request_id
            WHERE t.to_state IN ('done', 'failed', 'retry') GROUP BY 1""")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return len(done), len(history), time.perf_counter() - start


def timed(client, url):
    start = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - start
    assert response.status_code == 200, response.status_code
    return elapsed


def measure():
    from django.contrib.auth.models import User
    from django.test import Client

    from carousel.models import RestoreRequest, UserBacklog

    client = Client(HTTP_HOST="127.0.0.1")
    heaviest = UserBacklog.objects.order_by("-files").values_list("user_id", flat=True).first()
    client.force_login(User.objects.get(id=heaviest))
    out = {"queued": RestoreRequest.objects.filter(state="queued").count(),
           "done_last_hours": RestoreRequest.objects.filter(state="done").count()}
    for name, url in (("live_fragment", "/live/fragment/"), ("my_requests", "/")):
        first = timed(client, url)
        runs = [timed(client, url) for _ in range(RUNS)]
        out[f"{name}_first_ms"] = round(first * 1000, 1)
        out[f"{name}_median_ms"] = round(statistics.median(runs) * 1000, 1)
        out[f"{name}_max_ms"] = round(max(runs) * 1000, 1)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--per-hour", type=int, default=5_000, help="files restored an hour in the history")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    setup_django()
    if args.measure:
        print(json.dumps(measure()))
        return
    print(f"filling {args.queued} queued requests ...", flush=True)
    prepare()
    print(f"filled and analysed in {fill(args.queued)['fill_s']:.1f} s", flush=True)
    done, transitions, seconds = add_history(args.per_hour)
    print(f"history: {done} restored requests, {transitions} transitions, in {seconds:.1f} s", flush=True)
    # A fresh process: no warm caches or imports from the fill count against the page.
    out = subprocess.run([sys.executable, __file__, "--measure"], check=True, capture_output=True, text=True,
                         cwd=ROOT).stdout
    result = json.loads(out.strip().splitlines()[-1])
    for name in ("live_fragment", "my_requests"):
        print(f"{name}: median {result[name + '_median_ms']} ms over {RUNS} renders "
              f"(first {result[name + '_first_ms']} ms, slowest {result[name + '_max_ms']} ms)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
