"""Cost of a usage report over a year with 1,000,000 requests in the history.

    .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/usage_report.py

Needs PostgreSQL in DATABASE_URL (a fresh private server with the command above). It migrates,
creates 100 users in 4 groups and 2,000 tapes, inserts --requests queued, located requests whose
submissions are spread over the 365 days before yesterday, then marks them restored (waits from 0 to
2 hours) in UPDATEs of 100,000 rows, so the triggers roll them up as in production. Then it
times the report (carousel.ops.usage.usage_report, by user and by group, over the whole year, as
staff) and its CSV, --runs times each. Prints one line per measurement and as the last line a
JSON object {"requests", "usage_rows", "wait_rows", "by_user_ms", "by_group_ms", "csv_ms"}
(medians)."""
import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")

LOAD = """
INSERT INTO carousel_restorerequest (user_id, group_id, path, path_key, size, tape_id, position, priority,
    destination, state, attempts, error_class, last_error, created_at, updated_at, job_rank, staged_path,
    delivery_fs, delivery_attempts)
SELECT u.ids[1 + (i %% 100)], g.ids[1 + ((i %% 100) %% 4)], '/bench/' || i, md5('bench/' || i)::uuid,
       1000000000 + i, t.ids[1 + (i %% 2000)], i * 1000, 0, '', 'queued', 0, '', '',
       now() - interval '366 days' + (i * (365 * 86400.0 / %(n)s) || ' seconds')::interval, now(), 0, '', '', 0
FROM generate_series(%(start)s, %(stop)s) AS i,
     (SELECT array_agg(id ORDER BY id) AS ids FROM auth_user WHERE username LIKE 'bench%%') AS u,
     (SELECT array_agg(id ORDER BY id) AS ids FROM auth_group WHERE name LIKE 'bench%%') AS g,
     (SELECT array_agg(id ORDER BY id) AS ids FROM carousel_tape) AS t
"""
RESTORE = """
UPDATE carousel_restorerequest SET state = 'done',
    updated_at = created_at + ((id %% 7200) || ' seconds')::interval,
    finished_at = created_at + ((id %% 7200) || ' seconds')::interval
WHERE id IN (SELECT id FROM carousel_restorerequest WHERE state = 'queued' ORDER BY id LIMIT %(batch)s)
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("needs PostgreSQL in DATABASE_URL: run it under `python -m carousel.infra.localservices --`")
    import django

    django.setup()
    from django.contrib.auth.models import Group, Permission, User
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from carousel.ops import usage
    from carousel.models import Tape, UsageDay, UsageWait

    call_command("migrate", verbosity=0)
    for g in range(4):
        Group.objects.get_or_create(name=f"bench{g}")
    # An operator: the report's every line needs the view permission on usage (is_staff alone
    # shows its own line since staff powers follow Django's permissions).
    staff, _ = User.objects.get_or_create(username="bench-staff", defaults={"is_staff": True})
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="carousel", codename="view_usageday"))
    for u in range(100):
        User.objects.get_or_create(username=f"bench{u:03d}")
    Tape.objects.bulk_create([Tape(label=f"B{t:05d}", media="LTO-8") for t in range(2000)], ignore_conflicts=True)
    started = time.perf_counter()
    step = 100_000
    with connection.cursor() as cursor:
        for start in range(1, args.requests + 1, step):
            cursor.execute(LOAD, {"n": args.requests, "start": start, "stop": min(start + step - 1, args.requests)})
            cursor.execute(RESTORE, {"batch": step})
        cursor.execute("ANALYZE")
    print(f"loaded and restored {args.requests} requests in {time.perf_counter() - started:.0f} s; "
          f"{UsageDay.objects.count()} usage rows, {UsageWait.objects.count()} wait rows", flush=True)
    now = timezone.now()
    since, until = now - timedelta(days=367), now

    def timed(fn):
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            result = fn()
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times), result

    by_user_ms, report = timed(lambda: usage.usage_report(since=since, until=until, by="user", viewer=staff))
    assert len(report.lines) == 100 and sum(line.restored_files for line in report.lines) == args.requests
    print(f"report by user over a year: {by_user_ms:.1f} ms median ({len(report.lines)} lines)", flush=True)
    by_group_ms, report = timed(lambda: usage.usage_report(since=since, until=until, by="group", viewer=staff))
    print(f"report by group over a year: {by_group_ms:.1f} ms median ({len(report.lines)} lines)", flush=True)
    csv_ms, _ = timed(lambda: usage.usage_csv(usage.usage_report(since=since, until=until, by="user", viewer=staff)))
    print(f"CSV by user over a year: {csv_ms:.1f} ms median", flush=True)
    print(json.dumps({"requests": args.requests, "usage_rows": UsageDay.objects.count(),
                      "wait_rows": UsageWait.objects.count(), "by_user_ms": round(by_user_ms, 1),
                      "by_group_ms": round(by_group_ms, 1), "csv_ms": round(csv_ms, 1),
                      "load_avg": os.getloadavg()}))


if __name__ == "__main__":
    main()
