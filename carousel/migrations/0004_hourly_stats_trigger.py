"""The live page's hourly counters (HourlyStats) are kept by the database, like the backlog
counters: every change of a request's state to done, failed or retry adds to its hour, so the
plots read a dozen rows however long the history, and no code path can miss one."""
from django.db import migrations

POSTGRES = """
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
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS carousel_hourly_stats ON carousel_restorerequest;
DROP FUNCTION IF EXISTS carousel_hourly_stats();
"""
SQLITE = """
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
SQLITE_DROP = "DROP TRIGGER IF EXISTS carousel_hourly_stats;"


def forwards(apps, schema_editor):
    schema_editor.execute(POSTGRES if schema_editor.connection.vendor == "postgresql" else SQLITE)


def backwards(apps, schema_editor):
    schema_editor.execute(POSTGRES_DROP if schema_editor.connection.vendor == "postgresql" else SQLITE_DROP)


class Migration(migrations.Migration):
    dependencies = [("carousel", "0003_backlog_triggers")]
    operations = [migrations.RunPython(forwards, backwards)]
