"""What the rolled-up counters' triggers (carousel/migrations/0002_triggers.py) cost the hot paths:
a 100,000-row insert (a large submission) and 100,000-row state updates (claims, results), with
the triggers enabled and disabled, on the same table.

    .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/counter_triggers.py

Needs PostgreSQL in DATABASE_URL (a fresh private server with the command above). Each round
inserts --rows requests with one INSERT ... SELECT, moves them queued -> submitted -> done with
two UPDATEs, and deletes them, timing each statement; rounds alternate the usage triggers
(carousel_usage_insert/update/delete) enabled and disabled (ALTER TABLE ... DISABLE TRIGGER); the
older triggers (history, backlog, hourly stats) stay on in both. Prints one line per round and as
the last line a JSON object of the medians per statement with and without."""
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

INSERT = """
INSERT INTO carousel_restorerequest (user_id, group_id, path, path_key, size, tape_id, position, priority,
    destination, state, attempts, error_class, last_error, created_at, updated_at, job_rank, staged_path,
    delivery_fs, delivery_attempts)
SELECT %(user)s, %(group)s, '/trig/' || %(round)s || '/' || i, md5('trig/' || %(round)s || '/' || i)::uuid,
       1000000 + i, %(tape)s, i, 0, '', 'queued', 0, '', '', now(), now(), 0, '', '', 0
FROM generate_series(1, %(n)s) AS i
"""
SUBMIT = ("UPDATE carousel_restorerequest SET state = 'submitted', submitted_at = now(), job_id = %(job)s, "
          "updated_at = now() WHERE state = 'queued'")
DONE = "UPDATE carousel_restorerequest SET state = 'done', finished_at = now(), updated_at = now() WHERE state = 'submitted'"
DELETE = "DELETE FROM carousel_restorerequest"
TRIGGERS = ("carousel_usage_insert", "carousel_usage_update", "carousel_usage_delete")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("needs PostgreSQL in DATABASE_URL: run it under `python -m carousel.infra.localservices --`")
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from carousel.models import Job, Tape

    call_command("migrate", verbosity=0)
    user = User.objects.create(username="trig")
    group = Group.objects.create(name="trig")
    tape = Tape.objects.create(label="TRIG01", media="LTO-8")
    job = Job.objects.create(created_at=timezone.now())
    times = {True: {}, False: {}}
    for r in range(args.rounds):
        on = r % 2 == 0
        with connection.cursor() as cursor:
            for trigger in TRIGGERS:
                cursor.execute(f"ALTER TABLE carousel_restorerequest {'ENABLE' if on else 'DISABLE'} TRIGGER {trigger}")
            row = {}
            for name, sql in (("insert", INSERT), ("submit", SUBMIT), ("done", DONE), ("delete", DELETE)):
                if name == "delete":  # the history rows reference the requests (not timed)
                    cursor.execute("TRUNCATE carousel_transition")
                t0 = time.perf_counter()
                cursor.execute(sql, {"user": user.id, "group": group.id, "tape": tape.id, "n": args.rows,
                                     "round": r, "job": job.id})
                row[name] = time.perf_counter() - t0
                times[on].setdefault(name, []).append(row[name])
        print(f"round {r} triggers {'on ' if on else 'off'}: " + ", ".join(f"{k} {v:.2f} s" for k, v in row.items()),
              flush=True)
    medians = {("on" if on else "off"): {k: round(statistics.median(v), 3) for k, v in t.items()}
               for on, t in times.items()}
    print(json.dumps({"rows": args.rows, **medians, "load_avg": os.getloadavg()}))


if __name__ == "__main__":
    main()
