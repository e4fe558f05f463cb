"""Indexes of carousel_restorerequest that differ by database, so the models do not declare them
(like the triggers of 0002, they are invisible to Django's model state: a later migration that
makes SQLite rebuild the table drops them, and must create them again).

PostgreSQL: the API list's since/until filters read a BRIN index on created_at, which follows
insertion order (a few pages, next to nothing per inserted row, unlike a btree); its `path`
filter (contains) a trigram index (pg_trgm ships with PostgreSQL and is a trusted extension: the
database's owner may create it).

SQLite (the embedded database of `make run` and of replays) uses a partial index only when the
query repeats the index's own condition, so it cannot use request_active_path for
`state IN ('submitted', 'staging')`: finding the requests for a file would scan the table once
per claimed file. It gets a plain index on path_key (PostgreSQL keeps only the partial one: each
index costs a large submission's COPY; a plain index on state was tried too, and the storm replay
ran slower), and a plain one on created_at for since/until."""
from django.db import migrations

POSTGRESQL = [
    "CREATE INDEX request_created_brin ON carousel_restorerequest USING brin (created_at)",
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX request_path_trgm ON carousel_restorerequest USING gin (path gin_trgm_ops)",
]
SQLITE = [
    "CREATE INDEX IF NOT EXISTS request_path_key_sqlite ON carousel_restorerequest (path_key)",
    "CREATE INDEX request_created_at_sqlite ON carousel_restorerequest (created_at)",
]
INDEXES = {"postgresql": ["request_created_brin", "request_path_trgm"],
           "sqlite": ["request_path_key_sqlite", "request_created_at_sqlite"]}


def forwards(apps, schema_editor):
    for sql in POSTGRESQL if schema_editor.connection.vendor == "postgresql" else SQLITE:
        schema_editor.execute(sql)


def backwards(apps, schema_editor):
    for index in INDEXES.get(schema_editor.connection.vendor, INDEXES["sqlite"]):
        schema_editor.execute(f"DROP INDEX IF EXISTS {index}")


class Migration(migrations.Migration):
    # 0021_intake, the first chain's last, is here so that a migration written against that
    # chain runs after the whole of this set, as it did (see 0002_triggers).
    replaces = [
        ("carousel", "0006_sqlite_indexes"),
        ("carousel", "0021_intake"),
    ]
    dependencies = [("carousel", "0002_triggers")]
    operations = [migrations.RunPython(forwards, backwards)]
