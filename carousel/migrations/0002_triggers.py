"""The rows the database keeps itself, by triggers on requests and jobs, so that no code path
(ORM update, raw SQL, COPY, the admin) can change a request without them following:

- history: a Transition row for every change of a request's state;
- hourly stats (HourlyStats): files and bytes done, errors, per hour of the change, for the live
  page's plots;
- the scheduler's backlog (UserBacklog, TapeBacklog): requests queued and located, per user and
  per (user, tape);
- per-user state counts (UserStateCount): what the summary a client polls reads; a delete also
  removes the counts it brought to zero (a deleted user leaves none behind);
- the rolled-up usage (UsageDay, UsageWait), the active counts per state and group (StateCount)
  and the totals since the database was created (CounterTotal), which the usage reports and the
  metrics read and pruning old requests leaves be: requested files at insert, the day's outcomes
  at a change of state (done: bytes and the wait's bucket), requested bytes when a size becomes
  known (on the submission's day), a mount when a job is sent, its drive seconds when it ends,
  each shared among the users by their files in the job.

PostgreSQL: statement-level triggers with transition tables, one aggregated upsert per statement
whatever the rows, counter rows upserted in key order (concurrent statements cannot deadlock on
them). SQLite: row-level triggers. The squash of the first chain's 0002, 0003, 0004, 0007_d2,
0008_g, 0009_g and 0016_h: the same functions and triggers, the same text.

The SQLite triggers are invisible to Django's model state: a later migration that makes SQLite
rebuild carousel_restorerequest or carousel_job (most AlterFields, an AddField with a default)
drops them, and must create them again. The system check carousel.E004 (carousel/infra/checks.py)
lists the triggers the code relies on and fails when one is missing."""
from django.db import migrations

ACTIVE = "('queued', 'submitted', 'staging', 'retry', 'delivering')"


# History: Transition -----------------------------------------------------------------------

TRANSITIONS_PG = """
CREATE FUNCTION carousel_record_transitions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO carousel_transition (request_id, from_state, to_state, at)
    SELECT n.id, o.state, n.state, n.updated_at
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.state IS DISTINCT FROM n.state;
    RETURN NULL;
END $$;
-- Statement-level with transition tables: one INSERT ... SELECT per UPDATE, however many rows.
CREATE TRIGGER carousel_request_transitions
AFTER UPDATE ON carousel_restorerequest
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION carousel_record_transitions();
"""
TRANSITIONS_SQLITE = """
CREATE TRIGGER carousel_request_transitions
AFTER UPDATE OF state ON carousel_restorerequest
FOR EACH ROW WHEN OLD.state <> NEW.state
BEGIN
    INSERT INTO carousel_transition (request_id, from_state, to_state, at)
    VALUES (NEW.id, OLD.state, NEW.state, NEW.updated_at);
END;
"""


# Hourly stats: HourlyStats -----------------------------------------------------------------

HOURLY_PG = """
CREATE FUNCTION carousel_hourly_stats() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO carousel_hourlystats AS h (hour, files_done, bytes_done, errors)
    SELECT date_trunc('hour', n.updated_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
           count(*) FILTER (WHERE n.state = 'done'),
           coalesce(sum(n.size) FILTER (WHERE n.state = 'done'), 0),
           count(*) FILTER (WHERE n.state IN ('failed', 'retry'))
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE o.state IS DISTINCT FROM n.state AND n.state IN ('done', 'failed', 'retry')
    GROUP BY 1 ORDER BY 1
    ON CONFLICT (hour) DO UPDATE SET files_done = h.files_done + EXCLUDED.files_done,
        bytes_done = h.bytes_done + EXCLUDED.bytes_done, errors = h.errors + EXCLUDED.errors;
    RETURN NULL;
END $$;
CREATE TRIGGER carousel_hourly_stats
AFTER UPDATE ON carousel_restorerequest
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION carousel_hourly_stats();
"""
HOURLY_SQLITE = """
CREATE TRIGGER carousel_hourly_stats
AFTER UPDATE OF state ON carousel_restorerequest
FOR EACH ROW WHEN OLD.state <> NEW.state AND NEW.state IN ('done', 'failed', 'retry')
BEGIN
    INSERT INTO carousel_hourlystats (hour, files_done, bytes_done, errors)
    VALUES (strftime('%Y-%m-%d %H:00:00', NEW.updated_at), NEW.state = 'done',
            CASE WHEN NEW.state = 'done' THEN coalesce(NEW.size, 0) ELSE 0 END, NEW.state <> 'done')
    ON CONFLICT (hour) DO UPDATE SET files_done = files_done + excluded.files_done,
        bytes_done = bytes_done + excluded.bytes_done, errors = errors + excluded.errors;
END;
"""


# The scheduler's backlog: UserBacklog, TapeBacklog -----------------------------------------

BACKLOG_READY = "state = 'queued' AND tape_id IS NOT NULL"
BACKLOG_PG_APPLY = """
WITH delta AS (
    SELECT user_id, tape_id, sum(n) AS files, sum(b) AS bytes FROM ({rows}) AS d
    GROUP BY user_id, tape_id HAVING sum(n) <> 0 OR sum(b) <> 0
), per_tape AS (
    INSERT INTO carousel_tapebacklog AS t (user_id, tape_id, files, bytes)
    SELECT user_id, tape_id, files, bytes FROM delta ORDER BY user_id, tape_id
    ON CONFLICT (user_id, tape_id) DO UPDATE SET files = t.files + EXCLUDED.files, bytes = t.bytes + EXCLUDED.bytes
)
INSERT INTO carousel_userbacklog AS u (user_id, files, bytes)
SELECT user_id, sum(files), sum(bytes) FROM delta GROUP BY user_id ORDER BY user_id
ON CONFLICT (user_id) DO UPDATE SET files = u.files + EXCLUDED.files, bytes = u.bytes + EXCLUDED.bytes;
"""
BACKLOG_PG_ADD = f"SELECT user_id, tape_id, 1 AS n, coalesce(size, 0) AS b FROM new_rows WHERE {BACKLOG_READY}"
BACKLOG_PG_SUB = f"SELECT user_id, tape_id, -1 AS n, -coalesce(size, 0) AS b FROM old_rows WHERE {BACKLOG_READY}"
BACKLOG_PG_OPS = {"insert": (BACKLOG_PG_ADD, "NEW TABLE AS new_rows"),
                  "update": (f"{BACKLOG_PG_ADD} UNION ALL {BACKLOG_PG_SUB}",
                             "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
                  "delete": (BACKLOG_PG_SUB, "OLD TABLE AS old_rows")}


def backlog_pg():
    out = []
    for op, (rows, referencing) in BACKLOG_PG_OPS.items():
        out.append(f"""
CREATE FUNCTION carousel_backlog_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{BACKLOG_PG_APPLY.format(rows=rows)}
RETURN NULL;
END $$;
CREATE TRIGGER carousel_backlog_{op} AFTER {op.upper()} ON carousel_restorerequest
REFERENCING {referencing} FOR EACH STATEMENT EXECUTE FUNCTION carousel_backlog_{op}();""")
    return "\n".join(out)


BACKLOG_SQLITE_APPLY = """
INSERT INTO carousel_tapebacklog (user_id, tape_id, files, bytes) VALUES ({r}.user_id, {r}.tape_id, {n}, {n} * coalesce({r}.size, 0))
ON CONFLICT (user_id, tape_id) DO UPDATE SET files = files + excluded.files, bytes = bytes + excluded.bytes;
INSERT INTO carousel_userbacklog (user_id, files, bytes) VALUES ({r}.user_id, {n}, {n} * coalesce({r}.size, 0))
ON CONFLICT (user_id) DO UPDATE SET files = files + excluded.files, bytes = bytes + excluded.bytes;
"""
BACKLOG_SQLITE_TRIGGERS = {
    "insert_new": ("INSERT", "NEW", 1),
    "update_old": ("UPDATE", "OLD", -1),
    "update_new": ("UPDATE", "NEW", 1),
    "delete_old": ("DELETE", "OLD", -1),
}


def backlog_sqlite():
    return [f"""CREATE TRIGGER carousel_backlog_{name} AFTER {event} ON carousel_restorerequest
FOR EACH ROW WHEN {r}.state = 'queued' AND {r}.tape_id IS NOT NULL
BEGIN {BACKLOG_SQLITE_APPLY.format(r=r, n=n)} END;""" for name, (event, r, n) in BACKLOG_SQLITE_TRIGGERS.items()]


# Per-user state counts: UserStateCount -----------------------------------------------------

STATE_COUNTS_PG_APPLY = """
INSERT INTO carousel_userstatecount AS c (user_id, state, files, bytes)
SELECT user_id, state, sum(n), sum(b) FROM ({rows}) AS d
GROUP BY user_id, state HAVING sum(n) <> 0 OR sum(b) <> 0 ORDER BY user_id, state
ON CONFLICT (user_id, state) DO UPDATE SET files = c.files + EXCLUDED.files, bytes = c.bytes + EXCLUDED.bytes;
"""
STATE_COUNTS_PG_ADD = "SELECT user_id, state, 1 AS n, coalesce(size, 0) AS b FROM new_rows"
STATE_COUNTS_PG_SUB = "SELECT user_id, state, -1 AS n, -coalesce(size, 0) AS b FROM old_rows"
# An update counts only rows whose owner, state or size changed (most of the loop's updates
# touch neither: job ranks, positions, timestamps).
STATE_COUNTS_PG_CHANGED = """SELECT n.user_id AS nu, n.state AS ns, coalesce(n.size, 0) AS nb,
       o.user_id AS ou, o.state AS os, coalesce(o.size, 0) AS ob
FROM new_rows n JOIN old_rows o ON o.id = n.id
WHERE n.state IS DISTINCT FROM o.state OR n.size IS DISTINCT FROM o.size OR n.user_id <> o.user_id"""
STATE_COUNTS_PG_UPDATE = (f"WITH changed AS ({STATE_COUNTS_PG_CHANGED}) SELECT nu AS user_id, ns AS state, 1 AS n, "
                          "nb AS b FROM changed UNION ALL SELECT ou, os, -1, -ob FROM changed")
STATE_COUNTS_PG_PRUNE = """
DELETE FROM carousel_userstatecount c WHERE c.files = 0 AND c.bytes = 0
AND c.user_id IN (SELECT DISTINCT user_id FROM old_rows);
"""
STATE_COUNTS_PG_OPS = {"insert": (STATE_COUNTS_PG_ADD, "NEW TABLE AS new_rows", ""),
                       "update": (STATE_COUNTS_PG_UPDATE, "OLD TABLE AS old_rows NEW TABLE AS new_rows", ""),
                       "delete": (STATE_COUNTS_PG_SUB, "OLD TABLE AS old_rows", STATE_COUNTS_PG_PRUNE)}


def state_counts_pg():
    out = []
    for op, (rows, referencing, after) in STATE_COUNTS_PG_OPS.items():
        out.append(f"""
CREATE FUNCTION carousel_state_counts_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{STATE_COUNTS_PG_APPLY.format(rows=rows)}
{after}
RETURN NULL;
END $$;
CREATE TRIGGER carousel_state_counts_{op} AFTER {op.upper()} ON carousel_restorerequest
REFERENCING {referencing} FOR EACH STATEMENT EXECUTE FUNCTION carousel_state_counts_{op}();""")
    return "\n".join(out)


STATE_COUNTS_SQLITE_APPLY = """
INSERT INTO carousel_userstatecount (user_id, state, files, bytes) VALUES ({r}.user_id, {r}.state, {n}, {n} * coalesce({r}.size, 0))
ON CONFLICT (user_id, state) DO UPDATE SET files = files + excluded.files, bytes = bytes + excluded.bytes;
"""
STATE_COUNTS_SQLITE_PRUNE = """
DELETE FROM carousel_userstatecount WHERE user_id = OLD.user_id AND state = OLD.state AND files = 0 AND bytes = 0;
"""
STATE_COUNTS_SQLITE_CHANGED = "OLD.user_id <> NEW.user_id OR OLD.state <> NEW.state OR OLD.size IS NOT NEW.size"
STATE_COUNTS_SQLITE_TRIGGERS = {
    "insert_new": ("INSERT", "NEW", 1, "", ""),
    "update_old": ("UPDATE OF user_id, state, size", "OLD", -1, "WHEN {changed}", ""),
    "update_new": ("UPDATE OF user_id, state, size", "NEW", 1, "WHEN {changed}", ""),
    "delete_old": ("DELETE", "OLD", -1, "", STATE_COUNTS_SQLITE_PRUNE),
}


def state_counts_sqlite():
    return [f"""CREATE TRIGGER carousel_state_counts_{name} AFTER {event} ON carousel_restorerequest
FOR EACH ROW {when.format(changed=STATE_COUNTS_SQLITE_CHANGED)}
BEGIN {STATE_COUNTS_SQLITE_APPLY.format(r=r, n=n)}{after} END;"""
            for name, (event, r, n, when, after) in STATE_COUNTS_SQLITE_TRIGGERS.items()]


# Usage and totals: UsageDay, UsageWait, StateCount, CounterTotal ---------------------------

# Frozen copy of carousel.models.WAIT_BUCKETS_S (tests/test_usage.py checks that the installed
# trigger agrees with the model).
WAIT_BUCKETS_S = (60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 259200, 604800)
CLASSES = ("transient", "permanent", "user", "delivery")
PG_DAY = "date_trunc('day', {} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
SQLITE_DAY = "strftime('%Y-%m-%d 00:00:00', {})"

USAGE_SUMS = ["requested_bytes", "restored_files", "restored_bytes", *(f"failed_{c}" for c in CLASSES),
              "failed_other", "retries", "cancelled", "expired", "wait_sum_s"]


def _usage_upsert(alias):
    sets = [f"{c} = {alias}.{c} + EXCLUDED.{c}" for c in USAGE_SUMS]
    sets.append(f"wait_max_s = greatest({alias}.wait_max_s, EXCLUDED.wait_max_s)")
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


USAGE_PG_STATECOUNT = """
INSERT INTO carousel_statecount AS c (state, group_key, files, bytes)
SELECT state, g, sum(k), sum(b) FROM ({rows}) AS d GROUP BY state, g HAVING sum(k) <> 0 OR sum(b) <> 0
ORDER BY state, g
ON CONFLICT (state, group_key) DO UPDATE SET files = c.files + EXCLUDED.files, bytes = c.bytes + EXCLUDED.bytes;
"""
USAGE_PG_SC_NEW = (f"SELECT state, coalesce(group_id, 0) AS g, 1 AS k, coalesce(size, 0) AS b FROM new_rows "
                   f"WHERE state IN {ACTIVE}")
USAGE_PG_SC_OLD = (f"SELECT state, coalesce(group_id, 0) AS g, -1 AS k, -coalesce(size, 0) AS b FROM old_rows "
                   f"WHERE state IN {ACTIVE}")
USAGE_PG_TOTAL_UPSERT = """
INSERT INTO carousel_countertotal AS t (name, label, value)
SELECT name, label, sum(v) FROM ({rows}) AS d GROUP BY name, label HAVING sum(v) <> 0 ORDER BY name, label
ON CONFLICT (name, label) DO UPDATE SET value = t.value + EXCLUDED.value;
"""


def usage_pg_insert():
    day = PG_DAY.format("created_at")
    return f"""
INSERT INTO carousel_usageday AS u (day, user_id, group_key, requested_files, requested_bytes)
SELECT {day}, user_id, coalesce(group_id, 0), count(*), coalesce(sum(size), 0) FROM new_rows
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
ON CONFLICT (day, user_id, group_key) DO UPDATE SET requested_files = u.requested_files + EXCLUDED.requested_files,
    requested_bytes = u.requested_bytes + EXCLUDED.requested_bytes;
{USAGE_PG_STATECOUNT.format(rows=USAGE_PG_SC_NEW)}
{USAGE_PG_TOTAL_UPSERT.format(rows="SELECT 'requests' AS name, '' AS label, count(*) AS v FROM new_rows")}
"""


# CounterTotal (name, label) <- the usage column that counts it.
USAGE_AGG_TOTALS = [("files_restored", "", "restored_files"), ("bytes_restored", "", "restored_bytes"),
                    *(("failures", c, f"failed_{c}") for c in CLASSES), ("failures", "other", "failed_other"),
                    ("retries", "", "retries"), ("cancelled", "", "cancelled"), ("expired", "", "expired"),
                    ("requested_bytes", "", "requested_bytes")]


def usage_pg_update():
    """One statement: the changed rows are joined once (the CTE n), every counter is derived from
    them, and the totals from the few aggregated rows, not from every changed request (nine
    statements, each joining the transition tables again, cost bulk state changes 50-100% more:
    docs/benchmarks.md, "What the counters' triggers cost")."""
    cols = _event_columns("n", "n.wait")
    day = PG_DAY.format("n.updated_at")
    select = ", ".join(f"{expr} AS {name}" for name, expr in cols.items())
    sums_named = ", ".join(f"max({c}) AS {c}" if c == "wait_max_s" else f"sum({c}) AS {c}" for c in cols)
    totals = ", ".join(f"('{name}', '{label}', {column})" for name, label, column in USAGE_AGG_TOTALS)
    return f"""
WITH n AS MATERIALIZED (
    SELECT n.user_id, n.group_id, n.state, n.error_class, n.size, n.created_at, n.updated_at,
           o.state AS old_state, o.size AS old_size, o.group_id AS old_group_id,
           n.state IS DISTINCT FROM o.state AS moved, extract(epoch FROM n.updated_at - n.created_at)::float8 AS wait
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.state IS DISTINCT FROM o.state OR n.size IS DISTINCT FROM o.size OR n.group_id IS DISTINCT FROM o.group_id
), counts AS (
    INSERT INTO carousel_statecount AS c (state, group_key, files, bytes)
    SELECT state, g, sum(k), sum(b) FROM (
        SELECT state, coalesce(group_id, 0) AS g, 1 AS k, coalesce(size, 0) AS b FROM n WHERE state IN {ACTIVE}
        UNION ALL
        SELECT old_state, coalesce(old_group_id, 0), -1, -coalesce(old_size, 0) FROM n WHERE old_state IN {ACTIVE}
    ) AS d GROUP BY state, g HAVING sum(k) <> 0 OR sum(b) <> 0 ORDER BY state, g
    ON CONFLICT (state, group_key) DO UPDATE SET files = c.files + EXCLUDED.files, bytes = c.bytes + EXCLUDED.bytes
), agg AS MATERIALIZED (
    SELECT day, user_id, g, sum(grown) AS requested_bytes, {sums_named} FROM (
        SELECT {day} AS day, n.user_id, coalesce(n.group_id, 0) AS g, 0 AS grown, {select} FROM n WHERE n.moved
        UNION ALL
        SELECT {PG_DAY.format("n.created_at")}, n.user_id, coalesce(n.group_id, 0),
               coalesce(n.size, 0) - coalesce(n.old_size, 0), {", ".join("0" for _ in cols)}
        FROM n WHERE n.size IS DISTINCT FROM n.old_size
    ) AS e GROUP BY 1, 2, 3
), usage AS (
    INSERT INTO carousel_usageday AS u (day, user_id, group_key, requested_bytes, {", ".join(cols)})
    SELECT * FROM agg ORDER BY 1, 2, 3
    ON CONFLICT (day, user_id, group_key) DO UPDATE SET {_usage_upsert("u")}
), waits AS (
    INSERT INTO carousel_usagewait AS w (day, user_id, group_key, bucket, files)
    SELECT {day}, n.user_id, coalesce(n.group_id, 0), {_bucket("n.wait")}, count(*) FROM n
    WHERE n.moved AND n.state = 'done'
    GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
    ON CONFLICT (day, user_id, group_key, bucket) DO UPDATE SET files = w.files + EXCLUDED.files
)
INSERT INTO carousel_countertotal AS t (name, label, value)
SELECT x.name, x.label, sum(x.v)::bigint FROM agg CROSS JOIN LATERAL (VALUES {totals}) AS x(name, label, v)
GROUP BY x.name, x.label HAVING sum(x.v) <> 0 ORDER BY x.name, x.label
ON CONFLICT (name, label) DO UPDATE SET value = t.value + EXCLUDED.value;
"""


USAGE_PG_JOB = f"""
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

USAGE_PG_TRIGGERS = (("insert", "carousel_restorerequest", "INSERT", "NEW TABLE AS new_rows"),
                     ("update", "carousel_restorerequest", "UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
                     ("delete", "carousel_restorerequest", "DELETE", "OLD TABLE AS old_rows"),
                     ("job", "carousel_job", "UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"))


def usage_pg():
    bodies = {"insert": usage_pg_insert(), "update": usage_pg_update(),
              "delete": USAGE_PG_STATECOUNT.format(rows=USAGE_PG_SC_OLD), "job": USAGE_PG_JOB}
    out = []
    for op, table, event, referencing in USAGE_PG_TRIGGERS:
        out.append(f"""
CREATE FUNCTION carousel_usage_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{bodies[op]}
RETURN NULL;
END $$;
CREATE TRIGGER carousel_usage_{op} AFTER {event} ON {table}
REFERENCING {referencing} FOR EACH STATEMENT EXECUTE FUNCTION carousel_usage_{op}();""")
    return "\n".join(out)


SQLITE_WAIT = "((julianday(NEW.updated_at) - julianday(NEW.created_at)) * 86400.0)"


def _sqlite_statecount(r, k):
    return (f"INSERT INTO carousel_statecount (state, group_key, files, bytes) "
            f"VALUES ({r}.state, coalesce({r}.group_id, 0), {k}, {k} * coalesce({r}.size, 0)) "
            f"ON CONFLICT (state, group_key) DO UPDATE SET files = files + excluded.files, bytes = bytes + excluded.bytes;")


def _sqlite_total(name, label, value, when):
    return (f"INSERT INTO carousel_countertotal (name, label, value) SELECT '{name}', {label}, {value} WHERE {when} "
            f"ON CONFLICT (name, label) DO UPDATE SET value = value + excluded.value;")


def usage_sqlite():
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


# A squashed set runs only on a new database (see 0001_schema), so the first chain's backfills,
# which counted the requests already there, are left out, but for the totals' start: on a new
# database, the three zero rows that chain left.
TOTALS_START = """INSERT INTO carousel_countertotal (name, label, value)
SELECT 'files_restored', '', coalesce(sum(files_done), 0) FROM carousel_hourlystats
UNION ALL SELECT 'bytes_restored', '', coalesce(sum(bytes_done), 0) FROM carousel_hourlystats
UNION ALL SELECT 'requests', '', count(*) FROM carousel_restorerequest"""


# The statement triggers that join a request UPDATE's old and new rows on id plan that join once
# per session, with the row counts of their first call, and keep the plan. A session's first
# UPDATE usually changes none or one row (statement triggers fire for zero rows too), so the join
# became a nested loop, quadratic in the rows an UPDATE changes (a 100,000-request cancel would
# take hours). Without nested loops it is a hash or merge join whatever the first call's size;
# these functions read only the transition tables, so nothing else loses an index nested loop
# (carousel_usage_job, which reads requests by job, keeps them). And without JIT: the usage
# totals' LATERAL VALUES cost more than jit_above_cost, and compiling took 950 ms for a statement
# that runs in 2.
JOINING_FUNCTIONS = ["carousel_record_transitions()", "carousel_hourly_stats()", "carousel_state_counts_update()",
                     "carousel_usage_update()"]
PG_FUNCTIONS = ["carousel_record_transitions()", "carousel_hourly_stats()",
                *(f"carousel_backlog_{op}()" for op in BACKLOG_PG_OPS),
                *(f"carousel_usage_{op}()" for op, *_ in USAGE_PG_TRIGGERS),
                *(f"carousel_state_counts_{op}()" for op in STATE_COUNTS_PG_OPS)]
PG_TRIGGERS = [("carousel_request_transitions", "carousel_restorerequest"),
               ("carousel_hourly_stats", "carousel_restorerequest"),
               *((f"carousel_backlog_{op}", "carousel_restorerequest") for op in BACKLOG_PG_OPS),
               *((f"carousel_usage_{op}", table) for op, table, *_ in USAGE_PG_TRIGGERS),
               *((f"carousel_state_counts_{op}", "carousel_restorerequest") for op in STATE_COUNTS_PG_OPS)]
SQLITE_TRIGGERS = ["carousel_request_transitions", *(f"carousel_backlog_{n}" for n in BACKLOG_SQLITE_TRIGGERS),
                   "carousel_hourly_stats",
                   *(f"carousel_usage_{n}" for n in ("insert", "insert_active", "update_old", "update_new",
                                                     "update_state", "update_size", "delete", "job_sent",
                                                     "job_finished")),
                   *(f"carousel_state_counts_{n}" for n in STATE_COUNTS_SQLITE_TRIGGERS)]


def forwards(apps, schema_editor):
    schema_editor.execute(TOTALS_START)
    if schema_editor.connection.vendor == "postgresql":
        for sql in (TRANSITIONS_PG, backlog_pg(), HOURLY_PG, usage_pg(), state_counts_pg()):
            schema_editor.execute(sql)
        for function in JOINING_FUNCTIONS:
            schema_editor.execute(f"ALTER FUNCTION {function} SET enable_nestloop = off")
            schema_editor.execute(f"ALTER FUNCTION {function} SET jit = off")
    else:
        for sql in (TRANSITIONS_SQLITE, *backlog_sqlite(), HOURLY_SQLITE, *usage_sqlite(), *state_counts_sqlite()):
            schema_editor.execute(sql)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for trigger, table in PG_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
        for function in PG_FUNCTIONS:
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {function}")
    else:
        for trigger in SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    schema_editor.execute("DELETE FROM carousel_countertotal")


class Migration(migrations.Migration):
    # The first chain's trigger migrations. 0021_intake, that chain's last, is replaced by
    # 0003_vendor_indexes, the last of this set: a migration written against the first chain
    # (depending on 0021_intake) runs after all of it, as it did.
    replaces = [
        ("carousel", "0002_transition_trigger"),
        ("carousel", "0003_backlog_triggers"),
        ("carousel", "0004_hourly_stats_trigger"),
        ("carousel", "0007_d2_state_counters"),
        ("carousel", "0008_g_counter_triggers"),
        ("carousel", "0009_g_update_trigger"),
        ("carousel", "0016_h_trigger_joins"),
    ]
    dependencies = [("carousel", "0001_schema")]
    operations = [migrations.RunPython(forwards, backwards)]
