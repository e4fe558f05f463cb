"""The few places where PostgreSQL has a mechanism SQLite lacks (COPY, advisory locks, arrays),
each with its one small fallback for the embedded SQLite default."""
import contextlib
import fcntl
import zlib
from datetime import timezone as dt_timezone
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Lookup, Q
from django.db.models.expressions import RawSQL
from django.utils.dateparse import parse_datetime


def is_postgres():
    return connection.vendor == "postgresql"


def read_moment(value):
    """A datetime read by raw SQL, as the ORM gives it (aware): SQLite answers text for an
    aggregate and a naive datetime (UTC) for a column, PostgreSQL an aware datetime."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=dt_timezone.utc)
    return value


@contextlib.contextmanager
def one_snapshot():
    """Reads that must agree with each other (a submission's files per step, which add up to its
    files) see one state of the database, whatever the loop commits meanwhile. PostgreSQL's
    default, READ COMMITTED, gives each statement its own snapshot: files the loop finished
    between two statements were counted by neither (a page said "finished", 185 of 200
    restored). A REPEATABLE READ transaction reads one snapshot, taken at its first statement;
    SQLite's read transaction already does. Inside a transaction already open, its own
    isolation holds (it can only be set before the first statement)."""
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        if is_postgres():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def insert_rows(model, columns, rows, *, ids=True):
    """Insert many rows of `model`, given as tuples in the order of `columns` (field attnames).
    Returns the new primary keys in order (with ids=False, nothing: the server numbers the rows
    itself, which spares fetching 100,000 ids). PostgreSQL: ids drawn from the table's sequence
    in one query, rows sent by COPY (about 10x faster than INSERT for 100,000 rows)."""
    rows = list(rows)
    if not rows:
        return []
    table = model._meta.db_table
    pk = model._meta.pk.column
    if is_postgres():
        cols = [model._meta.get_field(c).column for c in columns]
        # COPY goes to psycopg's own cursor: its errors become Django's (IntegrityError for a
        # refused row), as the ORM's would.
        with connection.wrap_database_errors, connection.cursor() as cursor:
            if not ids:
                with cursor.cursor.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                return []
            cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
                           [table, pk, len(rows)])
            new_ids = [r[0] for r in cursor.fetchall()]
            with cursor.cursor.copy(f"COPY {table} ({', '.join([pk, *cols])}) FROM STDIN") as copy:
                for id_, row in zip(new_ids, rows):
                    copy.write_row((id_, *row))
        return new_ids
    objs = model.objects.bulk_create([model(**dict(zip(columns, row))) for row in rows], batch_size=5000)
    return [o.pk for o in objs]


class _AnyKey(Lookup):
    """`field = ANY(%s::uuid[])`, the list of keys as one array literal (in_keys)."""

    lookup_name = "any_key"
    prepare_rhs = False

    def as_sql(self, compiler, connection):
        lhs, params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s::uuid[])", (*params, self.rhs)


def in_keys(field, keys):
    """`field IN keys` for a list of up to 100,000 UUIDs. PostgreSQL gets them as one array
    parameter (a 100,000-placeholder IN list costs about a second to compile and parse), as
    `field = ANY(array)`: one scan of the table, by the index (a probe per key) or whole (the
    keys hashed), never a join. `IN (SELECT unnest(array))` is a join planned from a guess of
    200 keys, which leaves the planner the choice of a nested loop over the table's rows with
    the keys walked for each: rows x keys (issue 24: a 12,000-path submission's look-up once
    took 76 s under load; the plans seen since were index probes, but this form cannot be
    anything slower than one pass over the table)."""
    keys = list(keys)
    if is_postgres():
        # One text literal, cast by the server: psycopg dumping a list of 100,000 UUIDs element
        # by element cost a quarter of a second. Keys are UUIDs or their hex (models.path_keys).
        return Q(_AnyKey(F(field), "{" + ",".join(map(str, keys)) + "}"))
    return Q(**{f"{field}__in": keys})


def path_contains(value):
    """The requests whose path contains `value` (the lists' path filter), for a query of
    RestoreRequest. PostgreSQL: the ids from the trigram index of PathSearch (migration 0009), and
    those of the few submissions whose paths are indexed only after their move from the intake,
    read from their requests (one UNION, one index per part: the planner cannot use an index for
    an OR of two subqueries). SQLite: a LIKE over the request table."""
    if not is_postgres():
        return Q(path__contains=value)
    pattern = f"%{connection.ops.prep_for_like_query(value)}%"
    return Q(id__in=RawSQL(
        "SELECT s.request_id FROM carousel_pathsearch s WHERE s.path LIKE %s "
        "UNION ALL SELECT r.id FROM carousel_bulk b JOIN carousel_restorerequest r ON r.bulk_id = b.id "
        "WHERE NOT b.paths_searchable AND r.path LIKE %s", [pattern, pattern]))


@contextlib.contextmanager
def try_lock(name):
    """A non-blocking lock held for the duration of the block: yields True when taken, False
    when another process holds it. PostgreSQL: a session advisory lock, freed by the server if
    the process dies. SQLite: an flock on a file beside the database, freed by the kernel."""
    key = zlib.crc32(name.encode())
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
            taken = cursor.fetchone()[0]
        try:
            yield taken
        finally:
            if taken:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
        return
    lock_dir = Path(settings.VAR_DIR)
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def try_lock_atomic(name):
    """try_lock() with a transaction.atomic() block inside it: yields True when taken. On
    PostgreSQL a transaction-level advisory lock, freed when the transaction ends (commit or
    rollback; inside an outer atomic block, when the outer transaction ends), one statement where
    the session lock's take and free are two; the same key as try_lock(name), so either excludes
    the other in other sessions (a session may take its own again). SQLite: try_lock's file lock,
    and no transaction when it is not taken."""
    if is_postgres():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [zlib.crc32(name.encode())])
            yield cursor.fetchone()[0]
        return
    with try_lock(name) as taken:
        if not taken:  # no transaction: a write lock it opened would wait on the holder's
            yield False
            return
        with transaction.atomic():
            yield True


_PROBES_ONLY = ("enable_seqscan", "enable_hashjoin", "enable_mergejoin", "jit")


@contextlib.contextmanager
def index_probes():
    """Within it, PostgreSQL joins by nested loops over index probes only (sequential scans, hash
    and merge joins off for the block, then as they were): a statement driven by a list of rows
    (INSERT ... SELECT of a submission's files) then costs a few probes per row, whatever the
    size of the tables it probes or their statistics. With statistics taken while the request
    table was small, the planner scanned it whole for each row, pages the statement had just
    filled included (100,000 rows took 141 s instead of 2), or hashed the whole table to join a
    few rows. JIT off too: the probes' estimated cost made PostgreSQL compile them, 0.1 s of a
    0.2 s statement. SQLite: nothing to do."""
    if not is_postgres():
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(f"current_setting('{name}'), set_config('{name}', 'off', true)"
                                             for name in _PROBES_ONLY))
        before = cursor.fetchone()[::2]
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(f"set_config('{name}', %s, true)" for name in _PROBES_ONLY),
                           list(before))


def fresh_statistics(table):
    """On PostgreSQL, ANALYZE `table` now if autovacuum would at its next round (more rows changed
    since the last ANALYZE than its threshold and scale factor allow, the server's own settings;
    this transaction's changes counted too). A statement driven by a list of rows is planned from
    the statistics: taken while the table was nearly empty, they let the planner join a whole
    submission against every active request (a 100,000-file move right after another took 680 s,
    index_probes notwithstanding), until autovacuum's next round, up to a minute later. Outside an
    atomic block the ANALYZE's lock is let go at once."""
    if not is_postgres():
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT s.n_mod_since_analyze + COALESCE(x.n_tup_ins + x.n_tup_upd + x.n_tup_del, 0)"
            " > current_setting('autovacuum_analyze_threshold')::float"
            "   + current_setting('autovacuum_analyze_scale_factor')::float * GREATEST(c.reltuples, 0)"
            " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
            " LEFT JOIN pg_stat_xact_user_tables x ON x.relid = s.relid"
            " WHERE s.relid = %s::regclass", [table])
        row = cursor.fetchone()
        if row and row[0]:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")


def lateral(inner_sql, keys, types=None):
    """Run `inner_sql` once per key tuple and return all rows. The SQL names the key's parts
    {a}, {b}, ... and may use {n} for the last part (a LIMIT). PostgreSQL runs it as one
    query, a LATERAL join over the unnested keys, so each key costs one index probe and no
    round trip; SQLite runs it once per key. `types`: each part's SQL type (default bigint)."""
    keys = list(keys)
    if not keys:
        return []
    width = len(keys[0])
    names = "abcdefgh"[:width - 1] + "n"
    types = types or ("bigint",) * width
    with connection.cursor() as cursor:
        if is_postgres():
            placeholders = {name: f"k.{name}" for name in names}
            arrays = ", ".join(f"%s::{kind}[]" for kind in types)
            sql = (f"SELECT x.* FROM unnest({arrays}) AS k({', '.join(names)}) "
                   f"CROSS JOIN LATERAL ({inner_sql.format(**placeholders)}) AS x")
            cursor.execute(sql, [list(col) for col in zip(*keys)])
            return cursor.fetchall()
        rows = []
        sql = inner_sql.format(**{name: f"%({name})s" for name in names})
        for key in keys:
            cursor.execute(sql, dict(zip(names, key)))
            rows.extend(cursor.fetchall())
        return rows


# SQLite allows 32,766 parameters in a statement (3.32+); a chunk of rows stays well below.
_SQLITE_PARAMS = 30_000


def update_joined(model, rows, *, on, columns, where=None, exclude=None, assign=None, increment=()):
    """UPDATE `model`'s table from a list, in one statement however long the list. Each of
    `rows` (the values of the fields `on`, then of the fields `columns`; one row per key at
    most) gives its `columns` to the table's rows that match it on every field of `on`, satisfy
    `where` (field -> value, or a list: one of them) and differ from `exclude` (field -> value).
    `assign` (field -> value) and `increment` (fields counted up by one) apply to every row changed.
    Returns the count.

    PostgreSQL joins one unnested array per field; SQLite (3.33+) a VALUES list, in chunks below
    its parameter limit. A CASE with a branch per key (QuerySet.update, bulk_update) costs
    PostgreSQL a second to plan and run for a few hundred keys."""
    rows = list(rows)
    if not rows:
        return 0
    table = f'"{model._meta.db_table}"'
    fields = [model._meta.get_field(name) for name in (*on, *columns)]
    names = [f"k{i}" for i in range(len(on))] + [f"c{i}" for i in range(len(columns))]

    def column(name):
        return f'"{model._meta.get_field(name).column}"'

    def prepared(name, value):
        return model._meta.get_field(name).get_db_prep_value(value, connection)

    assignments = [f"{column(c)} = v.{n}" for c, n in zip(columns, names[len(on):])]
    assignments += [f"{column(name)} = %s" for name in assign or {}]
    assignments += [f"{column(name)} = {column(name)} + 1" for name in increment]
    set_params = [prepared(name, value) for name, value in (assign or {}).items()]
    conditions = [f"{table}.{column(name)} = v.{n}" for name, n in zip(on, names)]
    where_params = []
    for name, value in (where or {}).items():
        if isinstance(value, (list, tuple, set, frozenset)):
            if not value:
                return 0
            conditions.append(f"{table}.{column(name)} IN ({', '.join(['%s'] * len(value))})")
            where_params += [prepared(name, v) for v in value]
        else:
            conditions.append(f"{table}.{column(name)} = %s")
            where_params.append(prepared(name, value))
    for name, value in (exclude or {}).items():
        conditions.append(f"{table}.{column(name)} <> %s")
        where_params.append(prepared(name, value))
    head = f"UPDATE {table} SET {', '.join(assignments)} FROM"
    tail = f"WHERE {' AND '.join(conditions)}"
    values = [[f.get_db_prep_value(value, connection) for f, value in zip(fields, row)] for row in rows]
    with connection.cursor() as cursor:
        if is_postgres():
            arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
            cursor.execute(f"{head} unnest({arrays}) AS v({', '.join(names)}) {tail}",
                           [*set_params, *map(list, zip(*values)), *where_params])
            return cursor.rowcount
        one = f"({', '.join(['%s'] * len(names))})"
        step = max(1, (_SQLITE_PARAMS - len(set_params) - len(where_params)) // len(names))
        count = 0
        for start in range(0, len(values), step):
            chunk = values[start:start + step]
            listed = (f"SELECT {', '.join(f'column{i + 1} AS {n}' for i, n in enumerate(names))} "
                      f"FROM (VALUES {', '.join([one] * len(chunk))})")
            cursor.execute(f"{head} ({listed}) AS v {tail}",
                           [*set_params, *(value for row in chunk for value in row), *where_params])
            count += cursor.rowcount
        return count
