"""The rolled-up rows of 0007 (UsageDay, UsageWait, StateCount, CounterTotal) are kept by the
database, like the backlog counters of 0003: triggers on requests and jobs, so no code path can
miss one, and pruning old requests (carousel/retention.py) leaves them be.

- insert of a request: requested files (its day, user, group), the active count of its state,
  the requests total;
- update: the active counts move with state, size and group; a state change to done, failed,
  retry, cancelled or expired adds to the day of the change (done: bytes and the wait's
  bucket); a size becoming known adds requested bytes at the submission's day;
- delete: the active counts;
- a job sent: one mount, a job finished: its drive seconds (sent to finished), each shared
  among the users by their files in the job.

PostgreSQL: statement-level triggers with transition tables, aggregated upserts in key order
(no deadlock between concurrent statements). SQLite: row-level triggers."""
from django.db import migrations

# Frozen copy of carousel.models.WAIT_BUCKETS_S (tests/test_usage.py checks they agree).
WAIT_BUCKETS_S = (60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 259200, 604800)
ACTIVE = "('queued', 'submitted', 'staging', 'retry', 'delivering')"
CLASSES = ("transient", "permanent", "user", "delivery")
PG_DAY = "date_trunc('day', {} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
SQLITE_DAY = "strftime('%Y-%m-%d 00:00:00', {})"

USAGE_SUMS = ["requested_bytes", "restored_files", "restored_bytes", *(f"failed_{c}" for c in CLASSES),
              "failed_other", "retries", "cancelled", "expired", "wait_sum_s"]


def _usage_upsert(alias):
    sets = [f"{c} = {alias}.{c} + EXCLUDED.{c}" for c in USAGE_SUMS]
    sets.append(f"wait_max_s = {'greatest' if alias else 'max'}({alias}.wait_max_s, EXCLUDED.wait_max_s)")
    return ", ".join(sets)


def _event_columns(r, wait):
    """Per changed row r: the usage columns' values for a change of state (SQL expressions)."""
    failed_other = f"{r}.error_class NOT IN ({', '.join(repr(c) for c in CLASSES)})"
    return {
        "restored_files": f"CASE WHEN {r}.state = 'done' THEN 1 ELSE 0 END",
        "restored_bytes": f"CASE WHEN {r}.state = 'done' THEN coalesce({r}.size, 0) ELSE 0 END",
        **{f"failed_{c}": f"CASE WHEN {r}.state = 'failed' AND {r}.error_class = '{c}' THEN 1 ELSE 0 END"
           for c in CLASSES},
        "failed_other": f"CASE WHEN {r}.state = 'failed' AND {failed_other} THEN 1 ELSE 0 END",
        "retries": f"CASE WHEN {r}.state = 'retry' THEN 1 ELSE 0 END",
        "cancelled": f"CASE WHEN {r}.state = 'cancelled' THEN 1 ELSE 0 END",
        "expired": f"CASE WHEN {r}.state = 'expired' THEN 1 ELSE 0 END",
        "wait_sum_s": f"CASE WHEN {r}.state = 'done' THEN {wait} ELSE 0 END",
        "wait_max_s": f"CASE WHEN {r}.state = 'done' THEN {wait} ELSE 0 END",
    }


def _bucket(wait):
    cases = " ".join(f"WHEN {wait} <= {b} THEN {i}" for i, b in enumerate(WAIT_BUCKETS_S))
    return f"CASE {cases} ELSE {len(WAIT_BUCKETS_S)} END"


def _totals(r):
    """(name, label, value expression) per changed row r, for CounterTotal."""
    return [("files_restored", "''", f"CASE WHEN {r}.state = 'done' THEN 1 ELSE 0 END"),
            ("bytes_restored", "''", f"CASE WHEN {r}.state = 'done' THEN coalesce({r}.size, 0) ELSE 0 END"),
            ("failures", f"CASE WHEN {r}.error_class IN ({', '.join(repr(c) for c in CLASSES)}) "
                         f"THEN {r}.error_class ELSE 'other' END",
             f"CASE WHEN {r}.state = 'failed' THEN 1 ELSE 0 END"),
            ("retries", "''", f"CASE WHEN {r}.state = 'retry' THEN 1 ELSE 0 END"),
            ("cancelled", "''", f"CASE WHEN {r}.state = 'cancelled' THEN 1 ELSE 0 END"),
            ("expired", "''", f"CASE WHEN {r}.state = 'expired' THEN 1 ELSE 0 END")]


# PostgreSQL ---------------------------------------------------------------------------------

PG_WAIT = "extract(epoch FROM n.updated_at - n.created_at)::float8"
PG_CHANGED = "FROM new_rows n JOIN old_rows o ON o.id = n.id WHERE n.state IS DISTINCT FROM o.state"
PG_STATECOUNT = """
INSERT INTO carousel_statecount AS c (state, group_key, files, bytes)
SELECT state, g, sum(k), sum(b) FROM ({rows}) AS d GROUP BY state, g HAVING sum(k) <> 0 OR sum(b) <> 0
ORDER BY state, g
ON CONFLICT (state, group_key) DO UPDATE SET files = c.files + EXCLUDED.files, bytes = c.bytes + EXCLUDED.bytes;
"""
PG_SC_NEW = f"SELECT state, coalesce(group_id, 0) AS g, 1 AS k, coalesce(size, 0) AS b FROM new_rows WHERE state IN {ACTIVE}"
PG_SC_OLD = (f"SELECT state, coalesce(group_id, 0) AS g, -1 AS k, -coalesce(size, 0) AS b FROM old_rows "
             f"WHERE state IN {ACTIVE}")
PG_TOTAL_UPSERT = """
INSERT INTO carousel_countertotal AS t (name, label, value)
SELECT name, label, sum(v) FROM ({rows}) AS d GROUP BY name, label HAVING sum(v) <> 0 ORDER BY name, label
ON CONFLICT (name, label) DO UPDATE SET value = t.value + EXCLUDED.value;
"""


def pg_insert():
    day = PG_DAY.format("created_at")
    return f"""
INSERT INTO carousel_usageday AS u (day, user_id, group_key, requested_files, requested_bytes)
SELECT {day}, user_id, coalesce(group_id, 0), count(*), coalesce(sum(size), 0) FROM new_rows
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
ON CONFLICT (day, user_id, group_key) DO UPDATE SET requested_files = u.requested_files + EXCLUDED.requested_files,
    requested_bytes = u.requested_bytes + EXCLUDED.requested_bytes;
{PG_STATECOUNT.format(rows=PG_SC_NEW)}
{PG_TOTAL_UPSERT.format(rows="SELECT 'requests' AS name, '' AS label, count(*) AS v FROM new_rows")}
"""


def pg_update():
    cols = _event_columns("n", PG_WAIT)
    day = PG_DAY.format("n.updated_at")
    select = ", ".join(f"{expr} AS {name}" for name, expr in cols.items())
    sums = ", ".join(f"max({c})" if c == "wait_max_s" else f"sum({c})" for c in cols)
    totals = " UNION ALL ".join(f"SELECT '{name}' AS name, {label} AS label, {v} AS v {PG_CHANGED}"
                                for name, label, v in _totals("n"))
    return f"""
{PG_STATECOUNT.format(rows=f"{PG_SC_NEW} UNION ALL {PG_SC_OLD}")}
INSERT INTO carousel_usageday AS u (day, user_id, group_key, requested_bytes, {", ".join(cols)})
SELECT day, user_id, g, sum(grown), {sums} FROM (
    SELECT {day} AS day, n.user_id, coalesce(n.group_id, 0) AS g, 0 AS grown, {select} {PG_CHANGED}
    UNION ALL
    SELECT {PG_DAY.format("n.created_at")}, n.user_id, coalesce(n.group_id, 0),
           coalesce(n.size, 0) - coalesce(o.size, 0), {", ".join("0" for _ in cols)}
    FROM new_rows n JOIN old_rows o ON o.id = n.id WHERE n.size IS DISTINCT FROM o.size
) AS e GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
ON CONFLICT (day, user_id, group_key) DO UPDATE SET {_usage_upsert("u")};
INSERT INTO carousel_usagewait AS w (day, user_id, group_key, bucket, files)
SELECT {day}, n.user_id, coalesce(n.group_id, 0), {_bucket(PG_WAIT)}, count(*) {PG_CHANGED} AND n.state = 'done'
GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
ON CONFLICT (day, user_id, group_key, bucket) DO UPDATE SET files = w.files + EXCLUDED.files;
{PG_TOTAL_UPSERT.format(rows=totals + " UNION ALL SELECT 'requested_bytes', '', coalesce(n.size, 0) - coalesce(o.size, 0) "
                        "FROM new_rows n JOIN old_rows o ON o.id = n.id WHERE n.size IS DISTINCT FROM o.size")}
"""


def pg_delete():
    return PG_STATECOUNT.format(rows=PG_SC_OLD)


PG_JOB = f"""
WITH ev AS (
    SELECT n.id, {PG_DAY.format("n.sent_at")} AS day, 1.0 AS mounts, 0.0 AS drive
    FROM new_rows n JOIN old_rows o ON o.id = n.id WHERE n.sent_at IS NOT NULL AND o.sent_at IS NULL
    UNION ALL
    SELECT n.id, {PG_DAY.format("n.finished_at")}, 0.0, greatest(extract(epoch FROM n.finished_at - n.sent_at)::float8, 0)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.finished_at IS NOT NULL AND o.finished_at IS NULL AND n.sent_at IS NOT NULL
), share AS (
    SELECT r.job_id, r.user_id, coalesce(r.group_id, 0) AS g,
           count(*)::float8 / sum(count(*)) OVER (PARTITION BY r.job_id) AS f
    FROM carousel_restorerequest r WHERE r.job_id IN (SELECT id FROM ev)
    GROUP BY r.job_id, r.user_id, coalesce(r.group_id, 0)
), totals AS (
    INSERT INTO carousel_countertotal AS t (name, label, value)
    SELECT name, '', v FROM (SELECT 'mounts' AS name, sum(mounts)::bigint AS v FROM ev
                             UNION ALL SELECT 'drive_seconds', round(sum(drive))::bigint FROM ev) AS x
    WHERE v > 0 ORDER BY name
    ON CONFLICT (name, label) DO UPDATE SET value = t.value + EXCLUDED.value
)
INSERT INTO carousel_usageday AS u (day, user_id, group_key, mounts, drive_s)
SELECT ev.day, s.user_id, s.g, sum(ev.mounts * s.f), sum(ev.drive * s.f) FROM ev JOIN share s ON s.job_id = ev.id
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
ON CONFLICT (day, user_id, group_key) DO UPDATE SET mounts = u.mounts + EXCLUDED.mounts,
    drive_s = u.drive_s + EXCLUDED.drive_s;
"""


def pg_sql():
    out = []
    for op, body, table, referencing in (
            ("insert", pg_insert(), "carousel_restorerequest", "NEW TABLE AS new_rows"),
            ("update", pg_update(), "carousel_restorerequest", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
            ("delete", pg_delete(), "carousel_restorerequest", "OLD TABLE AS old_rows"),
            ("job", PG_JOB, "carousel_job", "OLD TABLE AS old_rows NEW TABLE AS new_rows")):
        event = "UPDATE" if op == "job" else op.upper()
        out.append(f"""
CREATE FUNCTION carousel_usage_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{body}
RETURN NULL;
END $$;
CREATE TRIGGER carousel_usage_{op} AFTER {event} ON {table}
REFERENCING {referencing} FOR EACH STATEMENT EXECUTE FUNCTION carousel_usage_{op}();""")
    return "\n".join(out)


PG_DROP = "\n".join(f"DROP TRIGGER IF EXISTS carousel_usage_{op} ON {t}; DROP FUNCTION IF EXISTS carousel_usage_{op}();"
                    for op, t in (("insert", "carousel_restorerequest"), ("update", "carousel_restorerequest"),
                                  ("delete", "carousel_restorerequest"), ("job", "carousel_job")))

# SQLite -------------------------------------------------------------------------------------

SQLITE_WAIT = "((julianday(NEW.updated_at) - julianday(NEW.created_at)) * 86400.0)"


def _sqlite_statecount(r, k):
    return (f"INSERT INTO carousel_statecount (state, group_key, files, bytes) "
            f"VALUES ({r}.state, coalesce({r}.group_id, 0), {k}, {k} * coalesce({r}.size, 0)) "
            f"ON CONFLICT (state, group_key) DO UPDATE SET files = files + excluded.files, bytes = bytes + excluded.bytes;")


def _sqlite_total(name, label, value, when):
    return (f"INSERT INTO carousel_countertotal (name, label, value) SELECT '{name}', {label}, {value} WHERE {when} "
            f"ON CONFLICT (name, label) DO UPDATE SET value = value + excluded.value;")


def sqlite_sql():
    cols = _event_columns("NEW", SQLITE_WAIT)
    usage_sets = ", ".join([f"{c} = {c} + excluded.{c}" for c in USAGE_SUMS]
                           + ["wait_max_s = max(wait_max_s, excluded.wait_max_s)"])
    created_day, updated_day = SQLITE_DAY.format("NEW.created_at"), SQLITE_DAY.format("NEW.updated_at")
    totals = "\n".join(_sqlite_total(name, label, v, "1") for name, label, v in _totals("NEW"))
    return [
        f"""CREATE TRIGGER carousel_usage_insert AFTER INSERT ON carousel_restorerequest BEGIN
INSERT INTO carousel_usageday (day, user_id, group_key, requested_files, requested_bytes)
VALUES ({created_day}, NEW.user_id, coalesce(NEW.group_id, 0), 1, coalesce(NEW.size, 0))
ON CONFLICT (day, user_id, group_key) DO UPDATE SET requested_files = requested_files + 1,
    requested_bytes = requested_bytes + excluded.requested_bytes;
{_sqlite_total("requests", "''", "1", "1")}
END;""",
        f"""CREATE TRIGGER carousel_usage_insert_active AFTER INSERT ON carousel_restorerequest
FOR EACH ROW WHEN NEW.state IN {ACTIVE} BEGIN {_sqlite_statecount("NEW", 1)} END;""",
        f"""CREATE TRIGGER carousel_usage_update_old AFTER UPDATE ON carousel_restorerequest
FOR EACH ROW WHEN OLD.state IN {ACTIVE} AND (OLD.state <> NEW.state OR OLD.size IS NOT NEW.size
    OR OLD.group_id IS NOT NEW.group_id) BEGIN {_sqlite_statecount("OLD", -1)} END;""",
        f"""CREATE TRIGGER carousel_usage_update_new AFTER UPDATE ON carousel_restorerequest
FOR EACH ROW WHEN NEW.state IN {ACTIVE} AND (OLD.state <> NEW.state OR OLD.size IS NOT NEW.size
    OR OLD.group_id IS NOT NEW.group_id) BEGIN {_sqlite_statecount("NEW", 1)} END;""",
        f"""CREATE TRIGGER carousel_usage_update_state AFTER UPDATE OF state ON carousel_restorerequest
FOR EACH ROW WHEN OLD.state <> NEW.state BEGIN
INSERT INTO carousel_usageday (day, user_id, group_key, {", ".join(cols)})
VALUES ({updated_day}, NEW.user_id, coalesce(NEW.group_id, 0), {", ".join(cols.values())})
ON CONFLICT (day, user_id, group_key) DO UPDATE SET {usage_sets};
INSERT INTO carousel_usagewait (day, user_id, group_key, bucket, files)
SELECT {updated_day}, NEW.user_id, coalesce(NEW.group_id, 0), {_bucket(SQLITE_WAIT)}, 1 WHERE NEW.state = 'done'
ON CONFLICT (day, user_id, group_key, bucket) DO UPDATE SET files = files + 1;
{totals}
END;""",
        f"""CREATE TRIGGER carousel_usage_update_size AFTER UPDATE OF size ON carousel_restorerequest
FOR EACH ROW WHEN OLD.size IS NOT NEW.size BEGIN
INSERT INTO carousel_usageday (day, user_id, group_key, requested_bytes)
VALUES ({created_day}, NEW.user_id, coalesce(NEW.group_id, 0), coalesce(NEW.size, 0) - coalesce(OLD.size, 0))
ON CONFLICT (day, user_id, group_key) DO UPDATE SET requested_bytes = requested_bytes + excluded.requested_bytes;
{_sqlite_total("requested_bytes", "''", "coalesce(NEW.size, 0) - coalesce(OLD.size, 0)", "1")}
END;""",
        f"""CREATE TRIGGER carousel_usage_delete AFTER DELETE ON carousel_restorerequest
FOR EACH ROW WHEN OLD.state IN {ACTIVE} BEGIN {_sqlite_statecount("OLD", -1)} END;""",
        f"""CREATE TRIGGER carousel_usage_job_sent AFTER UPDATE OF sent_at ON carousel_job
FOR EACH ROW WHEN NEW.sent_at IS NOT NULL AND OLD.sent_at IS NULL BEGIN
INSERT INTO carousel_usageday (day, user_id, group_key, mounts)
SELECT {SQLITE_DAY.format("NEW.sent_at")}, user_id, coalesce(group_id, 0),
       count(*) * 1.0 / (SELECT count(*) FROM carousel_restorerequest WHERE job_id = NEW.id)
FROM carousel_restorerequest WHERE job_id = NEW.id GROUP BY user_id, coalesce(group_id, 0)
ON CONFLICT (day, user_id, group_key) DO UPDATE SET mounts = mounts + excluded.mounts;
{_sqlite_total("mounts", "''", "1", "1")}
END;""",
        f"""CREATE TRIGGER carousel_usage_job_finished AFTER UPDATE OF finished_at ON carousel_job
FOR EACH ROW WHEN NEW.finished_at IS NOT NULL AND OLD.finished_at IS NULL AND NEW.sent_at IS NOT NULL BEGIN
INSERT INTO carousel_usageday (day, user_id, group_key, drive_s)
SELECT {SQLITE_DAY.format("NEW.finished_at")}, user_id, coalesce(group_id, 0),
       max((julianday(NEW.finished_at) - julianday(NEW.sent_at)) * 86400.0, 0) * count(*)
       / (SELECT count(*) FROM carousel_restorerequest WHERE job_id = NEW.id)
FROM carousel_restorerequest WHERE job_id = NEW.id GROUP BY user_id, coalesce(group_id, 0)
ON CONFLICT (day, user_id, group_key) DO UPDATE SET drive_s = drive_s + excluded.drive_s;
{_sqlite_total("drive_seconds", "''", "CAST(round(max((julianday(NEW.finished_at) - julianday(NEW.sent_at)) * 86400.0, 0)) AS INTEGER)", "1")}
END;""",
    ]


SQLITE_TRIGGERS = ("insert", "insert_active", "update_old", "update_new", "update_state", "update_size", "delete",
                   "job_sent", "job_finished")

# What a database upgraded with requests in it starts from: the active counts as they are, the
# totals that the hourly stats and the tables can still tell.
BACKFILL = [
    f"""INSERT INTO carousel_statecount (state, group_key, files, bytes)
SELECT state, coalesce(group_id, 0), count(*), coalesce(sum(size), 0) FROM carousel_restorerequest
WHERE state IN {ACTIVE} GROUP BY state, coalesce(group_id, 0)""",
    """INSERT INTO carousel_countertotal (name, label, value)
SELECT 'files_restored', '', coalesce(sum(files_done), 0) FROM carousel_hourlystats
UNION ALL SELECT 'bytes_restored', '', coalesce(sum(bytes_done), 0) FROM carousel_hourlystats
UNION ALL SELECT 'requests', '', count(*) FROM carousel_restorerequest""",
]


def forwards(apps, schema_editor):
    for sql in BACKFILL:
        schema_editor.execute(sql)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(pg_sql())
    else:
        for statement in sqlite_sql():
            schema_editor.execute(statement)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DROP)
    else:
        for name in SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS carousel_usage_{name};")
    for table in ("statecount", "countertotal", "usageday", "usagewait"):
        schema_editor.execute(f"DELETE FROM carousel_{table}")


class Migration(migrations.Migration):
    dependencies = [("carousel", "0007_g_counters")]
    operations = [migrations.RunPython(forwards, backwards)]
