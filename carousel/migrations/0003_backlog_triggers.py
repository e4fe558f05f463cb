"""The scheduler's counters (UserBacklog, TapeBacklog) are kept by the database: every insert,
update or delete of a request adjusts them for rows entering or leaving "queued and located",
so they cannot drift from the requests whatever code path changed them."""
from django.db import migrations

READY = "state = 'queued' AND tape_id IS NOT NULL"

# PostgreSQL: statement-level triggers with transition tables, one aggregated upsert per statement.
# Counter rows are upserted in key order so concurrent statements cannot deadlock on them.
PG_APPLY = """
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
PG_ADD = f"SELECT user_id, tape_id, 1 AS n, coalesce(size, 0) AS b FROM new_rows WHERE {READY}"
PG_SUB = f"SELECT user_id, tape_id, -1 AS n, -coalesce(size, 0) AS b FROM old_rows WHERE {READY}"
PG_OPS = {"insert": (PG_ADD, "NEW TABLE AS new_rows"),
          "update": (f"{PG_ADD} UNION ALL {PG_SUB}", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
          "delete": (PG_SUB, "OLD TABLE AS old_rows")}


def pg_sql():
    out = []
    for op, (rows, referencing) in PG_OPS.items():
        out.append(f"""
CREATE FUNCTION carousel_backlog_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{PG_APPLY.format(rows=rows)}
RETURN NULL;
END $$;
CREATE TRIGGER carousel_backlog_{op} AFTER {op.upper()} ON carousel_restorerequest
REFERENCING {referencing} FOR EACH STATEMENT EXECUTE FUNCTION carousel_backlog_{op}();""")
    return "\n".join(out)


def pg_drop():
    return "\n".join(f"DROP TRIGGER IF EXISTS carousel_backlog_{op} ON carousel_restorerequest; "
                     f"DROP FUNCTION IF EXISTS carousel_backlog_{op}();" for op in PG_OPS)


# SQLite: row-level triggers, one per direction of change.
SQLITE_APPLY = """
INSERT INTO carousel_tapebacklog (user_id, tape_id, files, bytes) VALUES ({r}.user_id, {r}.tape_id, {n}, {n} * coalesce({r}.size, 0))
ON CONFLICT (user_id, tape_id) DO UPDATE SET files = files + excluded.files, bytes = bytes + excluded.bytes;
INSERT INTO carousel_userbacklog (user_id, files, bytes) VALUES ({r}.user_id, {n}, {n} * coalesce({r}.size, 0))
ON CONFLICT (user_id) DO UPDATE SET files = files + excluded.files, bytes = bytes + excluded.bytes;
"""
SQLITE_TRIGGERS = {
    "insert_new": ("INSERT", "NEW", 1),
    "update_old": ("UPDATE", "OLD", -1),
    "update_new": ("UPDATE", "NEW", 1),
    "delete_old": ("DELETE", "OLD", -1),
}


def sqlite_sql():
    return [f"""CREATE TRIGGER carousel_backlog_{name} AFTER {event} ON carousel_restorerequest
FOR EACH ROW WHEN {r}.state = 'queued' AND {r}.tape_id IS NOT NULL
BEGIN {SQLITE_APPLY.format(r=r, n=n)} END;""" for name, (event, r, n) in SQLITE_TRIGGERS.items()]


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(pg_sql())
    else:
        for statement in sqlite_sql():
            schema_editor.execute(statement)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(pg_drop())
    else:
        for name in SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS carousel_backlog_{name};")


class Migration(migrations.Migration):
    dependencies = [("carousel", "0002_transition_trigger")]
    operations = [migrations.RunPython(forwards, backwards)]
