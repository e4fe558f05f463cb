"""Databases migrated once a run and copied where a test needs a fresh one.

A `migrate` of an empty database costs about 3.5 s of CPU (46 migrations, most of it Django
rendering their model states), and the suite needed one for each xdist worker's test database,
for each database of schemathesis's servers and for each test that runs the embedded SQLite
default in a process of its own: ten in a run. A copy costs a fraction of that: PostgreSQL
makes a database from a template (CREATE DATABASE ... TEMPLATE, a file copy on the server), a
SQLite database is one file. Each is built by the first process of the run that needs it, under
a lock in the run's directory (tests/parallel.py), by `manage.py migrate` in a process of its
own, as a site migrates; the run drops the PostgreSQL one at its end."""
import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from django.conf import settings

from tests import parallel

ROOT = Path(__file__).resolve().parent.parent


def _migrate(env):
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "--skip-checks"], cwd=ROOT, env=env,
                   check=True, capture_output=True, text=True, timeout=300)


def env_without_servers(**changes):
    """This process's environment for a process of Django's own: without the suite's
    DATABASE_URL and REDIS_URL (the embedded defaults, unless `changes` names others); a change
    to None is left out."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({k: v for k, v in changes.items() if v is not None})
    return env


def admin_connection():
    """A connection to the suite's PostgreSQL server, outside any database a test uses."""
    admin = settings.DATABASES["default"]
    return psycopg.connect(host=admin["HOST"], port=admin["PORT"], user=admin["USER"],
                           password=admin["PASSWORD"] or None, dbname="postgres", autocommit=True)


def database_url(name):
    """DATABASE_URL for database `name` on the suite's PostgreSQL server."""
    return os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/" + name


def migrated_postgresql():
    """The name of a database on the suite's server, migrated and otherwise empty: a template,
    never connected to after it is built (PostgreSQL copies a template only while nobody is)."""
    marker = parallel.run_dir() / "migrated-postgresql"
    with parallel.file_lock(parallel.run_dir() / "migrated-postgresql.lock"):
        if not marker.exists():
            name = f"carousel_migrated_{uuid.uuid4().hex[:8]}"
            with admin_connection() as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            parallel.drop_database_at_the_end(name)
            _migrate(env_without_servers(DATABASE_URL=database_url(name),
                          CAROUSEL_VAR_DIR=str(parallel.run_dir() / "migrated-postgresql-var")))
            _wait_until_unused(name)
            marker.write_text(name)
    return marker.read_text()


def _wait_until_unused(name, timeout=30):
    """The migration's server process outlives its client by a moment; a copy started then is
    refused ("source database is being accessed by other users")."""
    deadline = time.monotonic() + timeout
    with admin_connection() as conn:
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [name]).fetchone()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} is still in use {timeout} s after its migration")
            time.sleep(0.05)


def copy_of(template, prefix="carousel_copy"):
    """A new database on the suite's server, a copy of `template`; its name. The caller drops it
    (or leaves it to parallel.drop_database_at_the_end). A template's last client may still be
    closing its connection: the copy is tried again for up to 5 s."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with admin_connection() as conn:
        for _ in range(50):
            try:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
                return name
            except psycopg.errors.ObjectInUse:
                time.sleep(0.1)
    raise RuntimeError(f"the template {template} stayed in use")


def copy_of_migrated_postgresql():
    """copy_of(migrated_postgresql())."""
    return copy_of(migrated_postgresql())


def migrated_sqlite():
    """The path of an embedded SQLite database, migrated and otherwise empty (only read)."""
    root = parallel.run_dir() / "migrated-sqlite"
    path = root / "carousel.sqlite3"
    with parallel.file_lock(parallel.run_dir() / "migrated-sqlite.lock"):
        if not (root / "built").exists():
            shutil.rmtree(root, ignore_errors=True)  # a build that failed half way
            _migrate(env_without_servers(CAROUSEL_VAR_DIR=str(root)))
            (root / "built").touch()
    return path


def sqlite_var_dir(directory):
    """`directory`, as CAROUSEL_VAR_DIR, with a copy of migrated_sqlite() as its embedded
    database (the write-ahead log too, had the migration's last connection not folded it in)."""
    source = migrated_sqlite()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(f"{source}{suffix}", directory / f"{source.name}{suffix}")
    return directory
