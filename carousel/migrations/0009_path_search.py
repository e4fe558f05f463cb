"""The path filter's trigram index leaves the request table (issue 24, time until queued): a
GIN trigram index cost each new request about 10 us, about a second of the move that queues a
100,000-file submission from the intake, the largest single part of it. The index now lives on
PathSearch (request id, path), filled by triggers on the request table for every insert
except the rows of a submission whose paths are indexed after its move
(Bulk.paths_searchable false: carousel/domain/intake.py, index_paths), and emptied by one on
delete. The filter (carousel/infra/db.py, path_contains) reads this index and, for the few
submissions not indexed yet, their requests' paths.

PostgreSQL only: SQLite has no trigram index (its filter is a LIKE over the request table), so
there the table stays empty and no trigger is made."""
from django.db import migrations, models

SEARCH = "carousel_pathsearch"
REQUESTS = "carousel_restorerequest"

POSTGRESQL = [
    f"INSERT INTO {SEARCH} (request_id, path) SELECT id, path FROM {REQUESTS}",
    f"CREATE INDEX pathsearch_trgm ON {SEARCH} USING gin (path gin_trgm_ops)",
    "DROP INDEX IF EXISTS request_path_trgm",
    f"""
CREATE FUNCTION carousel_path_search_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A submission moved from the intake has its paths indexed after its move.
    INSERT INTO {SEARCH} (request_id, path)
    SELECT n.id, n.path FROM new_rows n
    WHERE n.bulk_id IS NULL
       OR n.bulk_id NOT IN (SELECT b.id FROM carousel_bulk b WHERE NOT b.paths_searchable);
    RETURN NULL;
END $$;
CREATE TRIGGER carousel_path_search_insert AFTER INSERT ON {REQUESTS}
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION carousel_path_search_insert();
CREATE FUNCTION carousel_path_search_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {SEARCH} s USING old_rows o WHERE s.request_id = o.id;
    RETURN NULL;
END $$;
CREATE TRIGGER carousel_path_search_delete AFTER DELETE ON {REQUESTS}
REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION carousel_path_search_delete();
""",
]
POSTGRESQL_BACKWARDS = [
    f"DROP TRIGGER IF EXISTS carousel_path_search_insert ON {REQUESTS}",
    f"DROP TRIGGER IF EXISTS carousel_path_search_delete ON {REQUESTS}",
    "DROP FUNCTION IF EXISTS carousel_path_search_insert()",
    "DROP FUNCTION IF EXISTS carousel_path_search_delete()",
    f"CREATE INDEX IF NOT EXISTS request_path_trgm ON {REQUESTS} USING gin (path gin_trgm_ops)",
    f"DELETE FROM {SEARCH}",
]


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in POSTGRESQL:
            schema_editor.execute(sql)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in POSTGRESQL_BACKWARDS:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("carousel", "0008_counter_deltas")]
    operations = [
        migrations.CreateModel(
            name="PathSearch",
            fields=[
                ("request_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("path", models.TextField()),
            ],
        ),
        migrations.AddField(
            model_name="bulk",
            name="paths_searchable",
            field=models.BooleanField(db_default=True, default=True),
        ),
        migrations.AddIndex(
            model_name="bulk",
            index=models.Index(condition=models.Q(("paths_searchable", False)), fields=["created_at"],
                               name="bulk_paths_unsearchable"),
        ),
        migrations.RunPython(forwards, backwards),
    ]
