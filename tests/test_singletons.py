"""The one-row tables (the control row, the stager's health) read through raw SQL
(carousel/models.py, Singleton.get): each field comes back as the ORM would give it, on
PostgreSQL and on the embedded SQLite default (whose booleans, times and JSON are stored as
numbers and text), the row is made on first use, and what is read is the model's instance."""
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from carousel.models import Control, StagerHealth
from tests import databases

ROOT = Path(__file__).resolve().parent.parent


def check_the_rows_read_back_as_stored():
    now = timezone.now().replace(microsecond=123456)
    Control.objects.all().delete()
    StagerHealth.objects.all().delete()
    made = Control.get()
    assert made.pk == 1 and Control.objects.count() == 1 and made.cycle_s == Control._meta.get_field("cycle_s").default
    assert StagerHealth.get().state == "healthy" and StagerHealth.objects.count() == 1

    Control.objects.filter(id=1).update(paused=True, short_mount_s=12.5, policy_params={"weights": [3, 1]},
                                        last_cycle_at=now, files_per_job=77)
    StagerHealth.objects.filter(id=1).update(state="stalled", since=now - timedelta(minutes=5), jobs_limit=3)
    control, health = Control.get(), StagerHealth.get()
    assert control.paused is True and control.short_mount_s == 12.5 and control.files_per_job == 77
    assert control.policy_params == {"weights": [3, 1]}
    assert control.last_cycle_at == now and timezone.is_aware(control.last_cycle_at)
    assert (health.state, health.since, health.jobs_limit) == ("stalled", now - timedelta(minutes=5), 3)

    # The model's own instance: a change saved through it is stored.
    control.cycle_s = 3.0
    control.save(update_fields=["cycle_s"])
    assert Control.objects.get(id=1).cycle_s == 3.0


def test_the_rows_read_back_as_stored_on_postgresql(db):
    check_the_rows_read_back_as_stored()


SQLITE = """
import warnings; warnings.simplefilter("error", RuntimeWarning)
import django; django.setup()
from django.db import connection; assert connection.vendor == "sqlite"
from tests.test_singletons import check_the_rows_read_back_as_stored
check_the_rows_read_back_as_stored()
print("read back OK")
"""


def test_the_rows_read_back_as_stored_on_the_embedded_sqlite_default(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    # A copy of a migrated database (tests/databases.py), not a migration of its own.
    env.update(CAROUSEL_VAR_DIR=str(databases.sqlite_var_dir(tmp_path)), DJANGO_SETTINGS_MODULE="carousel.settings")
    done = subprocess.run([sys.executable, "-c", SQLITE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "read back OK" in done.stdout, done.stderr[-3000:]


def test_a_snapshot_read_made_before_the_row_exists_gives_its_defaults(transactional_db):
    """A page's reads share one REPEATABLE READ snapshot (db.one_snapshot). When the loop made
    the missing row after that snapshot was taken, get_or_create's insert met it and its look-up
    again could not see it: an IntegrityError, a 500 of a submission's summary (seen in the suite).
    Such a read now gives the row's defaults and writes nothing."""
    import threading

    from django.db import connection

    from carousel.infra import db

    StagerHealth.objects.all().delete()
    with db.one_snapshot():
        Control.get()  # the snapshot is taken at the first statement

        def the_loop():
            try:
                StagerHealth.get()  # another connection makes the row, and commits
            finally:
                connection.close()

        other = threading.Thread(target=the_loop)
        other.start()
        other.join()
        health = StagerHealth.get()
        assert health.pk == 1 and health.state == "healthy"
    assert StagerHealth.objects.count() == 1
