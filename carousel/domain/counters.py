"""The fold of the trigger-kept counters (migrations/0008_counter_deltas.py): every statement that
changes requests appends its delta rows, which nobody updates, so writers never wait for each
other on a counter; the views the code reads sum a key's rows. Folding adds a key's new deltas
into its one base row, so a read sums a base row and the deltas since the last fold."""
from django.db import connection

from carousel.infra import db
from carousel.models import (CounterTotalDelta, HourlyStatsDelta, StateCountDelta, TapeBacklogDelta, UsageDayDelta,
                             UsageWaitDelta, UserBacklogDelta, UserStateCountDelta)

DELTAS = (UserBacklogDelta, TapeBacklogDelta, UserStateCountDelta, HourlyStatsDelta, UsageDayDelta, UsageWaitDelta,
          StateCountDelta, CounterTotalDelta)
MAXED = {"wait_max_s"}  # kept as the largest, not summed
# Per-user state counts at zero go (a deleted user leaves none behind); the other counters keep
# a key at zero, as their readers always saw it.
DROPPED_AT_ZERO = {UserStateCountDelta}


def _columns(model):
    """(key columns, value columns): the key is the base rows' unique one."""
    keys = list(model._meta.constraints[0].fields)
    values = [f.column for f in model._meta.concrete_fields if f.column not in ("id", "folded", *keys)]
    return keys, values


def _upsert(model, postgres):
    """(columns, key columns, aggregates, ON CONFLICT clause) of a fold into model's base rows."""
    keys, values = _columns(model)
    agg = ", ".join(f"{'max' if v in MAXED else 'sum'}({v})" for v in values)
    sets = ", ".join(f"{v} = {'greatest' if postgres else 'max'}(b.{v}, excluded.{v})" if v in MAXED
                     else f"{v} = b.{v} + excluded.{v}" for v in values)
    upsert = f"ON CONFLICT ({', '.join(keys)}) WHERE folded DO UPDATE SET {sets}"
    return ", ".join(keys + values), ", ".join(keys), agg, upsert


def _fold_ctes(model, n):
    """PostgreSQL: the fold of one counter as two data-modifying CTEs (gone<n>, put<n>) of one
    statement. It sums exactly the rows it deletes, so a delta committed meanwhile is neither
    lost nor counted twice (it waits for the next fold)."""
    table = model._meta.db_table
    cols, keys, agg, upsert = _upsert(model, postgres=True)
    return (f"gone{n} AS (DELETE FROM {table} WHERE NOT folded RETURNING {cols})",
            f"put{n} AS (INSERT INTO {table} AS b ({cols}, folded) SELECT {keys}, {agg}, true FROM gone{n} "
            f"GROUP BY {keys} {upsert} RETURNING 1)")


def _fold_sql_sqlite(model):
    """SQLite has one writer at a time: the transaction's first write locks the database, so the
    two statements see the same deltas."""
    table = model._meta.db_table
    cols, keys, agg, upsert = _upsert(model, postgres=False)
    return [f"INSERT INTO {table} AS b ({cols}, folded) SELECT {keys}, {agg}, 1 FROM {table} "
            f"WHERE NOT folded GROUP BY {keys} {upsert}",
            f"DELETE FROM {table} WHERE NOT folded"]


def counters_fold(new=None):
    """Fold every counter's deltas into its base rows, in one short transaction. Writers go on
    appending meanwhile. One fold at a time (two would lock each other's deltas): a fold that
    finds another running leaves the deltas to it. A counter with no new deltas is left alone,
    and with none anywhere the fold costs one statement (most cycles change no request), none
    when the caller has asked already: `new`, the counters with new deltas (NEW, which the
    cycle asks with its first question, carousel/loop/due.py)."""
    postgres = connection.vendor == "postgresql"
    if new is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(NEW))
            new = [model for model, any_new in zip(DELTAS, cursor.fetchone()) if any_new]
    if not new:
        # Read without the lock: a delta committed after this look waits for the next fold, as
        # one committed during a fold does.
        return
    with db.try_lock_atomic("carousel-counters-fold") as taken:
        if taken:
            with connection.cursor() as cursor:
                _fold(cursor, postgres, new)


# Whether each counter has deltas to fold, in DELTAS' order, in one row: each an indexed probe
# (the partial index on the new deltas).
NEW = [f"EXISTS (SELECT 1 FROM {model._meta.db_table} WHERE NOT folded)" for model in DELTAS]


def _fold(cursor, postgres, models=DELTAS):
    if postgres:
        # Every counter's fold in one statement (data-modifying CTEs run to completion whether
        # or not the final SELECT reads them): one round trip instead of one a counter, and a
        # cycle that changed requests folds five or six of them.
        cursor.execute(f"WITH {', '.join(cte for n, model in enumerate(models) for cte in _fold_ctes(model, n))} "
                       "SELECT 1")
    else:
        for model in models:
            for sql in _fold_sql_sqlite(model):
                cursor.execute(sql)
    for model in models:
        if model in DROPPED_AT_ZERO:
            _, values = _columns(model)
            cursor.execute(f"DELETE FROM {model._meta.db_table} WHERE folded AND "
                           + " AND ".join(f"{v} = 0" for v in values))
