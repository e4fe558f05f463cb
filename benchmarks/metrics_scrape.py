"""Scrape cost of /metrics at 1,000 and at 1,000,000 queued requests.

    .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/metrics_scrape.py

Needs PostgreSQL in DATABASE_URL (a fresh private server with the command above). It migrates,
creates 100 users in 4 groups and 2,000 tapes, and for each size (--sizes, default 1000 and
1000000) loads that many queued, located requests with one INSERT ... SELECT (the triggers
keep their counters as in production), ANALYZEs, then times --scrapes GETs of /metrics through
Django's test client (the whole view: access check, every query, the text rendering), after two
warm-up scrapes. It prints one line per size, and as the last line a JSON object
{"sizes": {N: {"median_ms", "p95_ms", "max_ms"}}, "ratio_median": big / small}."""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")

LOAD = """
INSERT INTO carousel_restorerequest (user_id, group_id, path, path_key, size, tape_id, position, priority,
    destination, state, attempts, error_class, last_error, created_at, updated_at, job_rank, staged_path,
    delivery_fs, delivery_attempts)
SELECT u.ids[1 + (i %% 100)], g.ids[1 + (i %% 4)], '/bench/' || %(batch)s || '/' || i,
       md5(%(batch)s || '/' || i)::uuid, 1000000000 + i, t.ids[1 + (i %% 2000)], i * 1000, 0, '', 'queued', 0, '', '',
       now() - (i || ' seconds')::interval, now(), 0, '', '', 0
FROM generate_series(1, %(n)s) AS i,
     (SELECT array_agg(id ORDER BY id) AS ids FROM auth_user WHERE username LIKE 'bench%%') AS u,
     (SELECT array_agg(id ORDER BY id) AS ids FROM auth_group WHERE name LIKE 'bench%%') AS g,
     (SELECT array_agg(id ORDER BY id) AS ids FROM carousel_tape) AS t
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 1_000_000])
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("needs PostgreSQL in DATABASE_URL: run it under `python -m carousel.infra.localservices --`")
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from carousel.models import RestoreRequest, Tape

    call_command("migrate", verbosity=0)
    groups = [Group.objects.get_or_create(name=f"bench{g}")[0] for g in range(4)]
    for u in range(100):
        User.objects.get_or_create(username=f"bench{u:03d}")
    Tape.objects.bulk_create([Tape(label=f"B{t:05d}", media="LTO-8") for t in range(2000)], ignore_conflicts=True)
    del groups
    client = Client(HTTP_HOST="127.0.0.1")
    results, loaded = {}, 0
    for size in sorted(args.sizes):
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(LOAD, {"n": size - loaded, "batch": f"s{size}"})
            cursor.execute("ANALYZE")
        loaded = size
        load_s = time.perf_counter() - started
        assert RestoreRequest.objects.filter(state="queued").count() == size
        for _ in range(2):
            assert client.get("/metrics").status_code == 200
        times = []
        for _ in range(args.scrapes):
            t0 = time.perf_counter()
            response = client.get("/metrics")
            times.append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200
        text = response.content.decode()
        line = next(x for x in text.splitlines() if x.startswith('carousel_requests{group="bench0",state="queued"}'))
        times.sort()
        results[size] = {"median_ms": round(statistics.median(times), 2),
                         "p95_ms": round(times[int(0.95 * (len(times) - 1))], 2), "max_ms": round(times[-1], 2)}
        print(f"{size:>9} queued (loaded in {load_s:.1f} s): scrape median {results[size]['median_ms']} ms, "
              f"p95 {results[size]['p95_ms']} ms, max {results[size]['max_ms']} ms; {line}", flush=True)
    sizes = sorted(results)
    print(json.dumps({"sizes": results, "load_avg": os.getloadavg(),
                      "ratio_median": round(results[sizes[-1]]["median_ms"] / results[sizes[0]]["median_ms"], 2)}))


if __name__ == "__main__":
    main()
