"""A request's user, group and submission checked once a statement, not once a row (issue 24,
time until queued).

On PostgreSQL a foreign key is a check per inserted row, deferred to the commit: the move of a
100,000-file submission from the intake paid about 2 s at its commit for three of them (user,
group, submission; measured with the constraints dropped: the move went from 5.1-5.9 s to
3.3-3.5 s, the commit from 2.0-2.2 s to nothing). Every row of a move names the same user, group
and submission, so these three are now checked by a statement trigger over the inserted rows
(each referenced row locked FOR KEY SHARE once, as the foreign key's check locks it for each
row, then any that is missing refused with the foreign key's error). The other side, a
referenced row deleted while a request still names it, is refused by a statement trigger on
the user, group and submission tables, and a request updated to name another by a row trigger
that fires only when one of the three changes. Together: what the constraints guaranteed. The
deletions the application makes (a user's requests deleted with the user, a group or
submission set to null on its requests: Django's on_delete, as before) come first and leave
nothing to refuse.

The job and tape keep their constraints: they are empty on a new request (no check), and the
loop's writes of them are row by row anyway.

SQLite keeps the constraints its table was created with (they cost little there; removing them
would rebuild the table); the model no longer declares them, so a later rebuild of the table
(see 0002 on SQLite's table rebuilds) drops them, and would have to add triggers like these."""
from django.db import migrations, models
import django.db.models.deletion
from django.conf import settings

REQUESTS = "carousel_restorerequest"
# column -> the referenced table
REFERENCES = {"user_id": "auth_user", "group_id": "auth_group", "bulk_id": "carousel_bulk"}

PG_INSERT = f"""
CREATE FUNCTION carousel_request_refs_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    missing text;
BEGIN
    {"".join(f'''
    PERFORM 1 FROM {table} t WHERE t.id IN (SELECT DISTINCT {column} FROM new_rows) FOR KEY SHARE OF t;
    SELECT n.{column}::text INTO missing FROM (SELECT DISTINCT {column} FROM new_rows WHERE {column} IS NOT NULL) n
        WHERE NOT EXISTS (SELECT 1 FROM {table} t WHERE t.id = n.{column}) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE foreign_key_violation USING MESSAGE = format(
            'insert on table "{REQUESTS}" violates its reference to "{table}": key ({column})=(%s) is not present',
            missing);
    END IF;''' for column, table in REFERENCES.items())}
    RETURN NULL;
END $$;
CREATE TRIGGER carousel_request_refs_insert AFTER INSERT ON {REQUESTS}
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION carousel_request_refs_insert();

CREATE FUNCTION carousel_request_refs_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {"".join(f'''
    IF NEW.{column} IS NOT NULL AND NEW.{column} IS DISTINCT FROM OLD.{column} THEN
        PERFORM 1 FROM {table} t WHERE t.id = NEW.{column} FOR KEY SHARE OF t;
        IF NOT FOUND THEN
            RAISE foreign_key_violation USING MESSAGE = format(
                'update of table "{REQUESTS}" violates its reference to "{table}": key ({column})=(%s) is not present',
                NEW.{column});
        END IF;
    END IF;''' for column, table in REFERENCES.items())}
    RETURN NULL;
END $$;
CREATE TRIGGER carousel_request_refs_update AFTER UPDATE OF {", ".join(REFERENCES)} ON {REQUESTS}
    FOR EACH ROW EXECUTE FUNCTION carousel_request_refs_update();
""" + "".join(f"""
CREATE FUNCTION carousel_request_refs_{table}_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    kept text;
BEGIN
    -- A new snapshot: requests committed while this statement waited for a row's lock count.
    SELECT r.{column}::text INTO kept FROM {REQUESTS} r JOIN old_rows o ON r.{column} = o.id LIMIT 1;
    IF kept IS NOT NULL THEN
        RAISE foreign_key_violation USING MESSAGE = format(
            'delete on table "{table}" violates the reference of "{REQUESTS}": key (id)=(%s) is still referenced',
            kept);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER carousel_request_refs_{table}_delete AFTER DELETE ON {table}
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION carousel_request_refs_{table}_delete();
""" for column, table in REFERENCES.items())

PG_DROP = "".join(f"DROP TRIGGER IF EXISTS carousel_request_refs_{table}_delete ON {table};"
                  f"DROP FUNCTION IF EXISTS carousel_request_refs_{table}_delete();"
                  for table in REFERENCES.values()) + (
    f"DROP TRIGGER IF EXISTS carousel_request_refs_insert ON {REQUESTS};"
    "DROP FUNCTION IF EXISTS carousel_request_refs_insert();"
    f"DROP TRIGGER IF EXISTS carousel_request_refs_update ON {REQUESTS};"
    "DROP FUNCTION IF EXISTS carousel_request_refs_update();")

PG_TRIGGERS = ["carousel_request_refs_insert", "carousel_request_refs_update",
               *(f"carousel_request_refs_{table}_delete" for table in REFERENCES.values())]


def constraints_to_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for column in REFERENCES:
            cursor.execute(
                "SELECT c.conname FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid "
                "AND a.attnum = ANY (c.conkey) WHERE c.conrelid = %s::regclass AND c.contype = 'f' AND a.attname = %s",
                [REQUESTS, column])
            for (name,) in cursor.fetchall():
                schema_editor.execute(f'ALTER TABLE {REQUESTS} DROP CONSTRAINT "{name}"')
    schema_editor.execute(PG_INSERT, params=None)  # its format() strings hold %s: no placeholders here


def triggers_to_constraints(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(PG_DROP)
    for column, table in REFERENCES.items():
        schema_editor.execute(
            f'ALTER TABLE {REQUESTS} ADD CONSTRAINT "{REQUESTS}_{column}_fk" FOREIGN KEY ({column}) '
            f'REFERENCES {table} (id) DEFERRABLE INITIALLY DEFERRED')


class Migration(migrations.Migration):

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('carousel', '0013_pinned_path'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='restorerequest',
                    name='user',
                    field=models.ForeignKey(db_constraint=False, db_index=False,
                                            on_delete=django.db.models.deletion.CASCADE,
                                            related_name='restore_requests', to=settings.AUTH_USER_MODEL),
                ),
                migrations.AlterField(
                    model_name='restorerequest',
                    name='group',
                    field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True,
                                            on_delete=django.db.models.deletion.SET_NULL, to='auth.group'),
                ),
                migrations.AlterField(
                    model_name='restorerequest',
                    name='bulk',
                    field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True,
                                            on_delete=django.db.models.deletion.SET_NULL,
                                            related_name='created_requests', to='carousel.bulk'),
                ),
            ],
            database_operations=[migrations.RunPython(constraints_to_triggers, triggers_to_constraints)],
        ),
    ]
