"""The squashed migrations (carousel/migrations/) build the database the first chain built, on
PostgreSQL and on SQLite: the first chain is taken from git history, each set migrates a fresh
database in a `manage.py migrate` of its own, and the two databases are compared (tables,
columns, indexes, constraints, triggers, trigger functions, rows). A database migrated through
the first chain then takes the squashed set as already applied, as an existing site's does. And
every trigger the code relies on (carousel/infra/checks.py, TRIGGERS) exists."""
import io
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection

from carousel.infra.checks import TRIGGERS, installed_triggers, triggers_exist

ROOT = Path(__file__).resolve().parent.parent
# A file of the first chain; the chain is read from the last commit that has it.
FIRST_CHAIN_LAST = "carousel/migrations/0021_intake.py"
FIRST_CHAIN_PACKAGE = "first_chain_migrations"
# Triggers the code relies on that migrations after the first chain make (0009_path_search).
MADE_AFTER_THE_SQUASH = {"carousel_path_search_insert", "carousel_path_search_delete",  # 0009_path_search
                         # 0014_request_refs
                         "carousel_request_refs_insert", "carousel_request_refs_update",
                         "carousel_request_refs_auth_user_delete", "carousel_request_refs_auth_group_delete",
                         "carousel_request_refs_carousel_bulk_delete"}
# The squashed set alone (the files that replace the first chain), so that migrations added
# after the squash do not enter the comparison.
SQUASHED_PACKAGE = "squashed_migrations"


def squashed_files():
    return sorted(p for p in (ROOT / "carousel" / "migrations").glob("0*.py") if "replaces = [" in p.read_text())


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def first_chain_commit():
    """The last commit with the first chain: the one before the commit that removed it (or the
    commit that last changed it, while it is still there)."""
    commit = _git("rev-list", "-1", "HEAD", "--", FIRST_CHAIN_LAST).strip()
    assert commit, f"no commit has {FIRST_CHAIN_LAST}: this test needs the git history (not a shallow clone)"
    if subprocess.run(["git", "cat-file", "-e", f"{commit}:{FIRST_CHAIN_LAST}"], cwd=ROOT).returncode != 0:
        commit = _git("rev-parse", f"{commit}^").strip()
    return commit


@pytest.fixture(scope="module")
def first_chain(tmp_path_factory):
    """A directory for PYTHONPATH with the first chain as a package and a settings module that
    migrates through it."""
    root = tmp_path_factory.mktemp("first-chain")
    package = root / FIRST_CHAIN_PACKAGE
    package.mkdir()
    commit = first_chain_commit()
    names = _git("ls-tree", "--name-only", f"{commit}:carousel/migrations/").split()
    for name in names:
        if name.endswith(".py"):
            text = _git("show", f"{commit}:carousel/migrations/{name}")
            # 0009_g imports 0008_g by its module path.
            package.joinpath(name).write_text(text.replace('"carousel.migrations.', f'"{FIRST_CHAIN_PACKAGE}.'))
    assert len(names) == 31 and "0021_intake.py" in names, names
    (root / "first_chain_settings.py").write_text(
        "from carousel.settings import *  # noqa: F403\n"
        f"MIGRATION_MODULES = {{'carousel': '{FIRST_CHAIN_PACKAGE}'}}\n")
    squashed = root / SQUASHED_PACKAGE
    squashed.mkdir()
    (squashed / "__init__.py").write_text("")
    for path in squashed_files():
        (squashed / path.name).write_text(path.read_text())
    (root / "squashed_settings.py").write_text(
        "from carousel.settings import *  # noqa: F403\n"
        f"MIGRATION_MODULES = {{'carousel': '{SQUASHED_PACKAGE}'}}\n")
    return root


def manage(*args, env, first_chain=None, squashed=None):
    """`manage.py *args`, with the first chain's migrations when first_chain is given, with the
    squashed set alone when squashed is (both: the directory the first_chain fixture made)."""
    root = first_chain or squashed
    settings = "first_chain_settings" if first_chain else "squashed_settings" if squashed else "carousel.settings"
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(root or ""), str(ROOT)])),
               DJANGO_SETTINGS_MODULE=settings)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def migrate(env, first_chain=None, squashed=None):
    done = manage("migrate", "--noinput", env=env, first_chain=first_chain, squashed=squashed)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def build_both(env_first, env_squashed, first_chain):
    """Migrates one database through the first chain and one through the squashed set, at once."""
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(migrate, env_first, first_chain)
        squashed = pool.submit(migrate, env_squashed, None, first_chain)
        first.result(), squashed.result()


def first_chain_names(first_chain):
    return {p.stem for p in (first_chain / FIRST_CHAIN_PACKAGE).glob("0*.py")}


def squashed_names():
    return {p.stem for p in squashed_files()}


def check_upgrade(first_chain, env_first, applied_after_first, applied_after_squashed):
    """A database migrated through the first chain takes the squashed set as applied, without
    running it (and `migrate`'s checks, the triggers' among them, pass on it); one migrated
    through the squashed set has the first chain's names recorded too, so a migration that
    depends on one of them is satisfied."""
    out = migrate(env_first, squashed=first_chain)
    assert "No migrations to apply." in out, out
    assert first_chain_names(first_chain) | squashed_names() <= applied_after_first()
    assert first_chain_names(first_chain) | squashed_names() <= applied_after_squashed()


def assert_same(first, squashed):
    """Compares two snapshots part by part, showing only what differs."""
    assert first.keys() == squashed.keys()
    differences = {}
    for part in first:
        a, b = first[part], squashed[part]
        if a != b:
            if isinstance(a, dict):
                differences[part] = {key: {"first chain": a.get(key), "squashed": b.get(key)}
                                     for key in sorted(a.keys() | b.keys(), key=str) if a.get(key) != b.get(key)}
            else:
                differences[part] = {"first chain": a, "squashed": b}
    assert not differences, json.dumps(differences, indent=1, default=str)[:20000]


# Content types and permissions are numbered in the order the models were created, which the
# squashed set cannot keep (a table is created after those it references): they are compared
# by what they name.
BY_NAME = {
    "django_content_type": "SELECT app_label, model FROM django_content_type",
    "auth_permission": """SELECT ct.app_label, ct.model, p.codename, p.name FROM auth_permission p
                          JOIN django_content_type ct ON ct.id = p.content_type_id""",
}
NOT_COMPARED = ("django_migrations", "sqlite_sequence", *BY_NAME)


# PostgreSQL ----------------------------------------------------------------------------------

PG_SNAPSHOT = {
    "relations": """SELECT c.relname, c.relkind, c.relpersistence FROM pg_class c
                    WHERE c.relnamespace = 'public'::regnamespace""",
    "columns": """SELECT table_name, ordinal_position, column_name, data_type, udt_name, character_maximum_length,
                         numeric_precision, numeric_scale, datetime_precision, is_nullable, column_default,
                         is_identity, identity_generation, identity_start, identity_increment, is_generated,
                         generation_expression, collation_name
                  FROM information_schema.columns WHERE table_schema = 'public'""",
    "constraints": """SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid), condeferrable,
                             condeferred, convalidated
                      FROM pg_constraint WHERE connamespace = 'public'::regnamespace""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "triggers": """SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid), tgenabled FROM pg_trigger
                   WHERE NOT tgisinternal""",
    # The database's own functions (the triggers'), with their SET options and bodies; those of
    # extensions are compared as the extensions' names and versions.
    "functions": """SELECT p.proname, pg_get_functiondef(p.oid), p.proconfig FROM pg_proc p
                    WHERE p.pronamespace = 'public'::regnamespace
                    AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')""",
    "extensions": "SELECT extname, extversion, extnamespace::regnamespace::text FROM pg_extension",
}


def pg_snapshot(url):
    with psycopg.connect(url) as conn:
        snapshot = {part: sorted(map(tuple, conn.execute(sql).fetchall()), key=repr)
                    for part, sql in PG_SNAPSHOT.items()}
        tables = [name for (name,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        snapshot["rows"] = {table: sorted(row for (row,) in conn.execute(
            f'SELECT row_to_json(t)::text FROM "{table}" AS t')) for table in tables if table not in NOT_COMPARED}
        snapshot["rows"].update({table: sorted(conn.execute(sql).fetchall()) for table, sql in BY_NAME.items()})
    return snapshot


def pg_applied(url):
    with psycopg.connect(url) as conn:
        return {name for (name,) in conn.execute("SELECT name FROM django_migrations WHERE app = 'carousel'")}


@pytest.fixture
def pg_databases():
    """Two new, empty databases on the test server: their URLs."""
    server = os.environ["DATABASE_URL"]
    base, _, _ = server.rpartition("/")
    names = [f"carousel_migrations_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("first", "squashed")]
    with psycopg.connect(server, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    yield [f"{base}/{name}" for name in names]
    with psycopg.connect(server, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.long(18)
def test_the_squashed_migrations_build_the_first_chains_database_on_postgresql(first_chain, pg_databases):
    first_url, squashed_url = pg_databases
    env = dict(os.environ)
    build_both(dict(env, DATABASE_URL=first_url), dict(env, DATABASE_URL=squashed_url), first_chain)
    first = pg_snapshot(first_url)
    assert {name for _, name, *_ in first["triggers"]} == {n for names in TRIGGERS.values()
                                                           for n in names["postgresql"]} - MADE_AFTER_THE_SQUASH
    assert_same(first, pg_snapshot(squashed_url))
    check_upgrade(first_chain, dict(env, DATABASE_URL=first_url), lambda: pg_applied(first_url),
                  lambda: pg_applied(squashed_url))
    assert_same(first, pg_snapshot(first_url))


# SQLite --------------------------------------------------------------------------------------

def _items(create_table):
    """The column definitions and table constraints of a CREATE TABLE statement. SQLite's ADD
    COLUMN appends the new column's text after the table's constraints, so their order differs
    between a table built at once and one grown column by column; PRAGMA table_xinfo gives the
    columns' order."""
    body = create_table[create_table.index("(") + 1:create_table.rindex(")")]
    items, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(body):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i].strip())
            start = i + 1
    items.append(body[start:].strip())
    return sorted(items)


# SQLite rebuilds a table (most AlterFields, an AddField with a default) with its
# self-referencing foreign keys last: the first chain's rebuilds of carousel_job moved after_id
# behind the columns added after it. Its place is not compared, its definition is.
MOVED_BY_REBUILDS = {"carousel_job": "after_id"}


def _columns(conn, table):
    columns = [row[1:] for row in conn.execute(f'PRAGMA table_xinfo("{table}")')]
    moved = MOVED_BY_REBUILDS.get(table)
    return {"in order": [c for c in columns if c[0] != moved], "moved": [c for c in columns if c[0] == moved]}


def sqlite_snapshot(path):
    conn = sqlite3.connect(path)
    try:
        master = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        tables = sorted(name for kind, name, _, _ in master if kind == "table" and not name.startswith("sqlite_"))
        indexes = sorted(name for kind, name, _, _ in master if kind == "index")
        return {
            "tables": {name: _items(sql) for kind, name, _, sql in master if kind == "table"},
            "indexes": {name: (table, sql) for kind, name, table, sql in master if kind == "index"},
            "triggers": {name: (table, sql) for kind, name, table, sql in master if kind == "trigger"},
            "views": {name: sql for kind, name, _, sql in master if kind == "view"},
            "columns": {t: _columns(conn, t) for t in tables},
            "foreign_keys": {t: sorted(row[2:] for row in conn.execute(f'PRAGMA foreign_key_list("{t}")'))
                             for t in tables},
            "index_lists": {t: sorted(row[1:] for row in conn.execute(f'PRAGMA index_list("{t}")')) for t in tables},
            # Without the column's number (cid): the columns' order is above.
            "index_columns": {i: [(r[0], *r[2:]) for r in conn.execute(f'PRAGMA index_xinfo("{i}")')]
                              for i in indexes},
            "rows": {**{t: sorted(map(repr, conn.execute(f'SELECT * FROM "{t}"'))) for t in tables
                        if t not in NOT_COMPARED},
                     **{t: sorted(conn.execute(sql)) for t, sql in BY_NAME.items()}},
            # A table rebuilt while empty leaves a 0, the same as none.
            "sequences": sorted(conn.execute(
                "SELECT * FROM sqlite_sequence WHERE name <> 'django_migrations' AND seq > 0")),
        }
    finally:
        conn.close()


def sqlite_applied(path):
    conn = sqlite3.connect(path)
    try:
        return {name for (name,) in conn.execute("SELECT name FROM django_migrations WHERE app = 'carousel'")}
    finally:
        conn.close()


def sqlite_env(var_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return dict(env, CAROUSEL_VAR_DIR=str(var_dir))


@pytest.mark.long(25)
def test_the_squashed_migrations_build_the_first_chains_database_on_sqlite(first_chain, tmp_path):
    env_first, env_squashed = sqlite_env(tmp_path / "first"), sqlite_env(tmp_path / "squashed")
    build_both(env_first, env_squashed, first_chain)
    first_db, squashed_db = tmp_path / "first" / "carousel.sqlite3", tmp_path / "squashed" / "carousel.sqlite3"
    first = sqlite_snapshot(first_db)
    assert set(first["triggers"]) == {name for names in TRIGGERS.values() for name in names["sqlite"]}
    assert_same(first, sqlite_snapshot(squashed_db))
    check_upgrade(first_chain, env_first, lambda: sqlite_applied(first_db), lambda: sqlite_applied(squashed_db))
    assert_same(first, sqlite_snapshot(first_db))

    # Without one of its triggers, the check fails and names it.
    conn = sqlite3.connect(squashed_db)
    conn.execute("DROP TRIGGER carousel_state_counts_update_new")
    conn.commit()
    conn.close()
    done = manage("check", "--database", "default", env=env_squashed, squashed=first_chain)
    assert done.returncode != 0 and "carousel.E004" in done.stderr, done.stderr[-3000:]
    assert "carousel_state_counts_update_new" in done.stderr and "UserStateCount" in done.stderr


def test_the_models_need_no_new_migration(db):
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


# The triggers the code relies on -------------------------------------------------------------

def test_every_trigger_the_code_relies_on_exists_on_postgresql(db):
    expected = {name for names in TRIGGERS.values() for name in names["postgresql"]}
    assert {name for name in installed_triggers(connection) if name.startswith("carousel_")} == expected
    assert triggers_exist(None, databases=["default"]) == []
    assert "carousel.E004" not in {e.id for e in run_checks(databases=["default"])}


def test_the_check_names_a_missing_trigger(db):
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER carousel_backlog_update ON carousel_restorerequest")
        cursor.execute("ALTER TABLE carousel_restorerequest DISABLE TRIGGER carousel_hourly_stats")
    errors = triggers_exist(None, databases=["default"])
    assert [e.id for e in errors] == ["carousel.E004", "carousel.E004"]
    assert "carousel_hourly_stats" in errors[0].msg and "HourlyStats" in errors[0].msg
    assert "carousel_backlog_update" in errors[1].msg and "UserBacklog" in errors[1].msg
