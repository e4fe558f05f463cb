"""The CPU a 100,000-path submission costs the web process, and its move into the queue: the
companion of benchmarks/ingest.py for a shared machine, where wall times follow the other
processes' load and CPU time far less.

    .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/ingest_cpu.py

In-process, no HTTP (same database setup as ingest.py: PostgreSQL only, a fresh database):
--runs times, restore_submit of 100,000 new paths (the doors' service; the files go to the
intake), then intake.settle_pending (the cycle's move into the queue), each timed by the wall
clock and by this process's CPU time (the database server's is not counted); the table is
emptied after each run. Last line, JSON: the medians submit_wall_s, submit_cpu_s, settle_wall_s,
settle_cpu_s, and the load average."""
import argparse
import json
import os
import statistics
import time

from ingest import batch_paths, empty_requests, setup_database, setup_django

FILES = 100_000


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    setup_django()
    from django.db import connection
    from django.utils import timezone

    from carousel.domain import intake
    from carousel.domain.services import restore_submit

    user, _ = setup_database(needed_ceiling=2 * FILES)
    restore_submit(user=user, paths=batch_paths(-1, 10), now=timezone.now())  # imports, first queries
    empty_requests()
    seconds = {"submit_wall_s": [], "submit_cpu_s": [], "settle_wall_s": [], "settle_cpu_s": []}
    for run in range(args.runs):
        paths = batch_paths(run, FILES)
        connection.close()  # gunicorn opens a connection per request
        for step, call in (("submit", lambda p=paths: restore_submit(user=user, paths=p, now=timezone.now())),
                           ("settle", lambda: intake.settle_pending(now=timezone.now(), most=10 * FILES))):
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            seconds[f"{step}_wall_s"].append(time.perf_counter() - wall)
            seconds[f"{step}_cpu_s"].append(time.process_time() - cpu)
        empty_requests()
        print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in seconds.items()), flush=True)
    print(json.dumps({**{k: round(statistics.median(v), 3) for k, v in seconds.items()},
                      "load_average": round(os.getloadavg()[0], 1)}))


if __name__ == "__main__":
    main()
