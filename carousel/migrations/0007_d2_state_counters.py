"""Per-user counts of requests in each state (UserStateCount), kept by the database like the
backlog counters of 0003: every insert, update or delete of a request adjusts them, so the
summary a client polls reads a few rows however many requests the user has, and no code path
can make them drift.

Also the indexes of the API's list filters: state (user, state, created_at), tape (partial:
submitted rows have no tape yet), since/until (a BRIN index on created_at, which follows
insertion order: a few pages, and next to nothing per inserted row, unlike a btree), path
(PostgreSQL: a trigram index, pg_trgm; SQLite has none that serves "contains").

SQLite: this migration adds indexes and a table; it does not rebuild carousel_restorerequest,
so the triggers of 0002-0004 and the index of 0006 stay."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


# PostgreSQL: statement-level triggers with transition tables, one aggregated upsert per
# statement, counter rows upserted in key order (concurrent statements cannot deadlock on them).
PG_APPLY = """
INSERT INTO carousel_userstatecount AS c (user_id, state, files, bytes)
SELECT user_id, state, sum(n), sum(b) FROM ({rows}) AS d
GROUP BY user_id, state HAVING sum(n) <> 0 OR sum(b) <> 0 ORDER BY user_id, state
ON CONFLICT (user_id, state) DO UPDATE SET files = c.files + EXCLUDED.files, bytes = c.bytes + EXCLUDED.bytes;
"""
PG_ADD = "SELECT user_id, state, 1 AS n, coalesce(size, 0) AS b FROM new_rows"
PG_SUB = "SELECT user_id, state, -1 AS n, -coalesce(size, 0) AS b FROM old_rows"
# An update counts only rows whose owner, state or size changed (most of the loop's updates
# touch neither: job ranks, positions, timestamps).
PG_CHANGED = """SELECT n.user_id AS nu, n.state AS ns, coalesce(n.size, 0) AS nb,
       o.user_id AS ou, o.state AS os, coalesce(o.size, 0) AS ob
FROM new_rows n JOIN old_rows o ON o.id = n.id
WHERE n.state IS DISTINCT FROM o.state OR n.size IS DISTINCT FROM o.size OR n.user_id <> o.user_id"""
PG_UPDATE = (f"WITH changed AS ({PG_CHANGED}) SELECT nu AS user_id, ns AS state, 1 AS n, nb AS b FROM changed "
             "UNION ALL SELECT ou, os, -1, -ob FROM changed")
# A delete also removes the counters it brought to zero (a deleted user leaves none behind).
PG_PRUNE = """
DELETE FROM carousel_userstatecount c WHERE c.files = 0 AND c.bytes = 0
AND c.user_id IN (SELECT DISTINCT user_id FROM old_rows);
"""
PG_OPS = {"insert": (PG_ADD, "NEW TABLE AS new_rows", ""),
          "update": (PG_UPDATE, "OLD TABLE AS old_rows NEW TABLE AS new_rows", ""),
          "delete": (PG_SUB, "OLD TABLE AS old_rows", PG_PRUNE)}


def pg_sql():
    out = []
    for op, (rows, referencing, after) in PG_OPS.items():
        out.append(f"""
CREATE FUNCTION carousel_state_counts_{op}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{PG_APPLY.format(rows=rows)}
{after}
RETURN NULL;
END $$;
CREATE TRIGGER carousel_state_counts_{op} AFTER {op.upper()} ON carousel_restorerequest
REFERENCING {referencing} FOR EACH STATEMENT EXECUTE FUNCTION carousel_state_counts_{op}();""")
    out.append("CREATE INDEX request_created_brin ON carousel_restorerequest USING brin (created_at);")
    # The list's `path` filter (contains): a trigram index. pg_trgm ships with PostgreSQL and is
    # a trusted extension (the database's owner may create it).
    out.append("CREATE EXTENSION IF NOT EXISTS pg_trgm;")
    out.append("CREATE INDEX request_path_trgm ON carousel_restorerequest USING gin (path gin_trgm_ops);")
    return "\n".join(out)


def pg_drop():
    return "\n".join([f"DROP TRIGGER IF EXISTS carousel_state_counts_{op} ON carousel_restorerequest; "
                      f"DROP FUNCTION IF EXISTS carousel_state_counts_{op}();" for op in PG_OPS]
                     + ["DROP INDEX IF EXISTS request_created_brin;", "DROP INDEX IF EXISTS request_path_trgm;"])


# SQLite: row-level triggers, one per direction of change.
SQLITE_APPLY = """
INSERT INTO carousel_userstatecount (user_id, state, files, bytes) VALUES ({r}.user_id, {r}.state, {n}, {n} * coalesce({r}.size, 0))
ON CONFLICT (user_id, state) DO UPDATE SET files = files + excluded.files, bytes = bytes + excluded.bytes;
"""
SQLITE_PRUNE = """
DELETE FROM carousel_userstatecount WHERE user_id = OLD.user_id AND state = OLD.state AND files = 0 AND bytes = 0;
"""
SQLITE_TRIGGERS = {
    "insert_new": ("INSERT", "NEW", 1, "", ""),
    "update_old": ("UPDATE OF user_id, state, size", "OLD", -1, "WHEN {changed}", ""),
    "update_new": ("UPDATE OF user_id, state, size", "NEW", 1, "WHEN {changed}", ""),
    "delete_old": ("DELETE", "OLD", -1, "", SQLITE_PRUNE),
}
SQLITE_CHANGED = "OLD.user_id <> NEW.user_id OR OLD.state <> NEW.state OR OLD.size IS NOT NEW.size"


def sqlite_sql():
    return [f"""CREATE TRIGGER carousel_state_counts_{name} AFTER {event} ON carousel_restorerequest
FOR EACH ROW {when.format(changed=SQLITE_CHANGED)}
BEGIN {SQLITE_APPLY.format(r=r, n=n)}{after} END;""" for name, (event, r, n, when, after) in SQLITE_TRIGGERS.items()] + [
        "CREATE INDEX request_created_at_sqlite ON carousel_restorerequest (created_at);"]


BACKFILL = """
INSERT INTO carousel_userstatecount (user_id, state, files, bytes)
SELECT user_id, state, count(*), sum(coalesce(size, 0)) FROM carousel_restorerequest GROUP BY user_id, state
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # No request may change between the count and the trigger's first firing.
        schema_editor.execute("LOCK TABLE carousel_restorerequest IN SHARE ROW EXCLUSIVE MODE")
        schema_editor.execute(pg_sql())
    else:
        for statement in sqlite_sql():
            schema_editor.execute(statement)
    schema_editor.execute(BACKFILL)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(pg_drop())
    else:
        for name in SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS carousel_state_counts_{name};")
        schema_editor.execute("DROP INDEX IF EXISTS request_created_at_sqlite;")
    schema_editor.execute("DELETE FROM carousel_userstatecount")


class Migration(migrations.Migration):

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('carousel', '0006_sqlite_indexes'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='UserStateCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('state', models.CharField(choices=[('queued', 'Queued'), ('submitted', 'Submitted'), ('staging', 'Staging'), ('retry', 'Retry'), ('delivering', 'Delivering'), ('done', 'Done'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('expired', 'Expired')], max_length=16)),
                ('files', models.BigIntegerField(default=0)),
                ('bytes', models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RemoveIndex(
            model_name='restorerequest',
            name='request_user_state',
        ),
        migrations.AddIndex(
            model_name='restorerequest',
            index=models.Index(fields=['user', 'state', 'created_at'], name='request_user_state_age'),
        ),
        migrations.AddIndex(
            model_name='restorerequest',
            index=models.Index(condition=models.Q(('tape__isnull', False)), fields=['tape', 'user'], name='request_tape'),
        ),
        migrations.AddField(
            model_name='userstatecount',
            name='user',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='state_counts', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddConstraint(
            model_name='userstatecount',
            constraint=models.UniqueConstraint(fields=('user', 'state'), name='userstatecount_user_state'),
        ),
        migrations.RunPython(forwards, backwards),
    ]
