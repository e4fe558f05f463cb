"""SQLite (the embedded database of `make run` and of replays) cannot use the partial index
request_active_path for a condition like `state IN ('submitted', 'staging')`: it uses a
partial index only when the query repeats the index's own condition. Without it, finding the
requests for a file scans the table, once per claimed file in a claim. SQLite gets a plain
index on path_key; PostgreSQL keeps only the partial one (each index costs a large
submission's COPY). (A plain index on state was tried too: the storm replay ran slower.)

Like the triggers of 0002-0004, this index is invisible to Django's model state: a later
AlterField on RestoreRequest under SQLite rebuilds the table without it, so such a migration
must create it again."""
from django.db import migrations

CREATE = ["CREATE INDEX IF NOT EXISTS request_path_key_sqlite ON carousel_restorerequest (path_key)"]
DROP = ["DROP INDEX IF EXISTS request_path_key_sqlite"]


def _on_sqlite(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            for sql in statements:
                schema_editor.execute(sql)
    return run


class Migration(migrations.Migration):
    dependencies = [("carousel", "0005_mount_plan")]
    operations = [migrations.RunPython(_on_sqlite(CREATE), _on_sqlite(DROP))]
