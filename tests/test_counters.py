"""The per-user state counters (UserStateCount, kept by database triggers) stay equal to the
rows through every write path, on PostgreSQL and on the embedded SQLite default; the summary
reads them."""
import os
import subprocess
import sys
from pathlib import Path

from django.db import connection
from django.test.utils import CaptureQueriesContext

from carousel.domain import selectors

from . import counters_scenario, databases

ROOT = Path(__file__).resolve().parent.parent


def test_counters_follow_every_write_path_on_postgresql(db, now):
    counters_scenario.run(now)


def test_counters_follow_every_write_path_on_sqlite(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    # A copy of a migrated database (tests/databases.py), not a migration of its own.
    env.update(CAROUSEL_VAR_DIR=str(databases.sqlite_var_dir(tmp_path)), DJANGO_SETTINGS_MODULE="carousel.settings")
    code = ("import django; django.setup(); "
            "from django.db import connection; assert connection.vendor == 'sqlite'; "
            "from django.utils import timezone; from tests import counters_scenario; "
            "counters_scenario.run(timezone.now()); print('counters OK')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "counters OK" in done.stdout, done.stderr[-3000:]


def test_the_summary_reads_counters_not_the_users_rows(alice, now):
    """The summary's queries never count or sum the request table: they read the counters and
    take one row per active state from an index (LIMIT 1)."""
    from carousel.domain.services import restore_submit

    restore_submit(user=alice, paths=[f"/s/{i}" for i in range(50)], now=now)
    with CaptureQueriesContext(connection) as queries:
        summary = selectors.queue_summary(user=alice)
    assert summary["states"]["queued"] == 50 and summary["active"] == 50
    on_requests = [q["sql"] for q in queries.captured_queries if "carousel_restorerequest" in q["sql"]]
    assert on_requests and all("LIMIT 1" in sql and "COUNT(" not in sql.upper() and "SUM(" not in sql.upper()
                               for sql in on_requests), on_requests
