"""History is written by the database: a trigger on RestoreRequest.state records every change,
so no code path (ORM update, raw SQL, admin) can change a state without a trace."""
from django.db import migrations

POSTGRES = """
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
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS carousel_request_transitions ON carousel_restorerequest;
DROP FUNCTION IF EXISTS carousel_record_transitions();
"""
SQLITE = """
CREATE TRIGGER carousel_request_transitions
AFTER UPDATE OF state ON carousel_restorerequest
FOR EACH ROW WHEN OLD.state <> NEW.state
BEGIN
    INSERT INTO carousel_transition (request_id, from_state, to_state, at)
    VALUES (NEW.id, OLD.state, NEW.state, NEW.updated_at);
END;
"""
SQLITE_DROP = "DROP TRIGGER IF EXISTS carousel_request_transitions;"


def forwards(apps, schema_editor):
    sql = POSTGRES if schema_editor.connection.vendor == "postgresql" else SQLITE
    schema_editor.execute(sql)


def backwards(apps, schema_editor):
    sql = POSTGRES_DROP if schema_editor.connection.vendor == "postgresql" else SQLITE_DROP
    schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("carousel", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
