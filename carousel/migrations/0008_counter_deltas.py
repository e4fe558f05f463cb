"""Counters that never make two writers wait (issue 24): the triggers of 0002 upserted a few
shared rows (the per-state and per-group counts, the totals, the backlogs, usage); a transaction
changing requests held those rows' locks until it committed, so every other writer of the same
counters queued behind it, and two transactions that touched them in different orders deadlocked
(PostgreSQL aborted a cancel on carousel_statecount).

Now each counter is a table of appended rows (the *Delta models): the same triggers, the same
text, but an INSERT where they upserted, so writers only add rows nobody else locks. The old
tables become views summing them per key, under the same names, so every reader (the ORM
models, raw SQL) reads what it read. The cycle folds the deltas into one base row per key
(folded, unique per key: carousel/domain/counters.py), so a read sums a few rows per key.

The old tables' rows become the first base rows. Not reversible: the old tables are gone. A later
migration that must create the triggers again (see 0002 on SQLite's table rebuilds) takes them
from create_triggers here, not from 0002."""
import importlib
import re

from django.db import migrations, models

triggers = importlib.import_module("carousel.migrations.0002_triggers")

# model read (its old table, now a view) -> the model of its deltas
VIEWS = {"UserBacklog": "UserBacklogDelta", "TapeBacklog": "TapeBacklogDelta",
         "UserStateCount": "UserStateCountDelta", "HourlyStats": "HourlyStatsDelta", "UsageDay": "UsageDayDelta",
         "UsageWait": "UsageWaitDelta", "StateCount": "StateCountDelta", "CounterTotal": "CounterTotalDelta"}
MAXED = {"wait_max_s"}


def columns(model):
    """(key columns, value columns) of a delta model: the key is its base rows' unique one."""
    keys = list(model._meta.constraints[0].fields)
    values = [f.column for f in model._meta.concrete_fields if f.column not in ("id", "folded", *keys)]
    return keys, values


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for trigger, table in triggers.PG_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
        for function in triggers.PG_FUNCTIONS:
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {function}")
    else:
        for trigger in triggers.SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger}")


def tables_to_views(apps, schema_editor):
    postgres = schema_editor.connection.vendor == "postgresql"
    for name, delta in VIEWS.items():
        view = apps.get_model("carousel", name)._meta
        model = apps.get_model("carousel", delta)
        keys, values = columns(model)
        table = model._meta.db_table
        schema_editor.execute(f"INSERT INTO {table} ({', '.join(keys + values)}, folded) "
                              f"SELECT {', '.join(keys + values)}, true FROM {view.db_table}")
        schema_editor.execute(f"DROP TABLE {view.db_table}")
        sums = []
        for v in values:
            integer = model._meta.get_field(v).get_internal_type() == "BigIntegerField"
            sums.append(f"{'max' if v in MAXED else 'sum'}({v}){'::bigint' if postgres and integer else ''} AS {v}")
        ident = ["min(id) AS id"] if view.pk.column == "id" else []  # else the key is the primary key
        schema_editor.execute(f"CREATE VIEW {view.db_table} AS SELECT {', '.join(ident + keys + sums)} FROM {table} "
                              f"GROUP BY {', '.join(keys)}")


# 0002's SQL, appending where it upserted: its ON CONFLICT clauses go (each ends its statement
# or its CTE), its targets become the delta tables, and the per-user counts' prune of rows at
# zero (a DELETE of shared rows) moves to the fold.
ON_CONFLICT = re.compile(r"\s*ON CONFLICT \(.*?(?=\n\)|;)", re.DOTALL)
TARGET = re.compile(r"INSERT INTO (carousel_(?:userbacklog|tapebacklog|userstatecount|hourlystats|usageday|usagewait"
                    r"|statecount|countertotal))\b")


def appending(sql):
    sql = sql.replace(triggers.STATE_COUNTS_PG_PRUNE, "").replace(triggers.STATE_COUNTS_SQLITE_PRUNE, "")
    return TARGET.sub(r"INSERT INTO \1delta", ON_CONFLICT.sub("", sql))


def create_triggers(apps, schema_editor):
    t = triggers
    if schema_editor.connection.vendor == "postgresql":
        for sql in (t.TRANSITIONS_PG, t.backlog_pg(), t.HOURLY_PG, t.usage_pg(), t.state_counts_pg()):
            schema_editor.execute(appending(sql))
        for function in t.JOINING_FUNCTIONS:
            schema_editor.execute(f"ALTER FUNCTION {function} SET enable_nestloop = off")
            schema_editor.execute(f"ALTER FUNCTION {function} SET jit = off")
    else:
        for sql in (t.TRANSITIONS_SQLITE, *t.backlog_sqlite(), t.HOURLY_SQLITE, *t.usage_sqlite(),
                    *t.state_counts_sqlite()):
            schema_editor.execute(appending(sql))



class Migration(migrations.Migration):

    dependencies = [
        ('carousel', '0007_wantedlocation'),
    ]

    operations = [
        migrations.RunPython(drop_triggers),
        migrations.AlterModelOptions(
            name='countertotal',
            options={'managed': False},
        ),
        migrations.AlterModelOptions(
            name='hourlystats',
            options={'managed': False, 'verbose_name_plural': 'hourly stats'},
        ),
        migrations.AlterModelOptions(
            name='statecount',
            options={'managed': False},
        ),
        migrations.AlterModelOptions(
            name='tapebacklog',
            options={'managed': False},
        ),
        migrations.AlterModelOptions(
            name='usageday',
            options={'managed': False},
        ),
        migrations.AlterModelOptions(
            name='usagewait',
            options={'managed': False},
        ),
        migrations.AlterModelOptions(
            name='userbacklog',
            options={'managed': False},
        ),
        migrations.AlterModelOptions(
            name='userstatecount',
            options={'managed': False},
        ),
        migrations.CreateModel(
            name='CounterTotalDelta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('folded', models.BooleanField(db_default=False)),
                ('name', models.CharField(max_length=32)),
                ('label', models.CharField(blank=True, max_length=32)),
                ('value', models.BigIntegerField(db_default=0)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('folded', False)), fields=['name', 'label'], name='countertotaldelta_new')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('folded', True)), fields=('name', 'label'), name='countertotaldelta_base')],
            },
        ),
        migrations.CreateModel(
            name='HourlyStatsDelta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('folded', models.BooleanField(db_default=False)),
                ('files_done', models.BigIntegerField(default=0)),
                ('bytes_done', models.BigIntegerField(default=0)),
                ('errors', models.BigIntegerField(default=0, help_text='Requests failed or sent to retry.')),
                ('hour', models.DateTimeField()),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('folded', False)), fields=['hour'], name='hourlystatsdelta_new')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('folded', True)), fields=('hour',), name='hourlystatsdelta_base')],
            },
        ),
        migrations.CreateModel(
            name='StateCountDelta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('folded', models.BooleanField(db_default=False)),
                ('state', models.CharField(max_length=16)),
                ('group_key', models.BigIntegerField()),
                ('files', models.BigIntegerField(db_default=0)),
                ('bytes', models.BigIntegerField(db_default=0)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('folded', False)), fields=['state', 'group_key'], name='statecountdelta_new')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('folded', True)), fields=('state', 'group_key'), name='statecountdelta_base')],
            },
        ),
        migrations.CreateModel(
            name='TapeBacklogDelta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('files', models.BigIntegerField(default=0)),
                ('bytes', models.BigIntegerField(default=0)),
                ('folded', models.BooleanField(db_default=False)),
                ('user_id', models.BigIntegerField()),
                ('tape_id', models.BigIntegerField()),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('folded', False)), fields=['user_id', 'tape_id'], name='tapebacklogdelta_new'), models.Index(fields=['tape_id'], name='tapebacklogdelta_tape')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('folded', True)), fields=('user_id', 'tape_id'), name='tapebacklogdelta_base')],
            },
        ),
        migrations.CreateModel(
            name='UsageDayDelta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('folded', models.BooleanField(db_default=False)),
                ('day', models.DateTimeField(help_text='Midnight UTC.')),
                ('user_id', models.BigIntegerField()),
                ('group_key', models.BigIntegerField()),
                ('requested_files', models.BigIntegerField(db_default=0)),
                ('requested_bytes', models.BigIntegerField(db_default=0)),
                ('restored_files', models.BigIntegerField(db_default=0)),
                ('restored_bytes', models.BigIntegerField(db_default=0)),
                ('failed_transient', models.BigIntegerField(db_default=0)),
                ('failed_permanent', models.BigIntegerField(db_default=0)),
                ('failed_user', models.BigIntegerField(db_default=0)),
                ('failed_delivery', models.BigIntegerField(db_default=0)),
                ('failed_other', models.BigIntegerField(db_default=0)),
                ('retries', models.BigIntegerField(db_default=0, help_text='Transient failures sent to the retry queue.')),
                ('cancelled', models.BigIntegerField(db_default=0)),
                ('expired', models.BigIntegerField(db_default=0)),
                ('wait_sum_s', models.FloatField(db_default=0.0)),
                ('wait_max_s', models.FloatField(db_default=0.0)),
                ('mounts', models.FloatField(db_default=0.0)),
                ('drive_s', models.FloatField(db_default=0.0)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('folded', False)), fields=['day', 'user_id', 'group_key'], name='usagedaydelta_new')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('folded', True)), fields=('day', 'user_id', 'group_key'), name='usagedaydelta_base')],
            },
        ),
        migrations.CreateModel(
            name='UsageWaitDelta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('folded', models.BooleanField(db_default=False)),
                ('day', models.DateTimeField(help_text='Midnight UTC.')),
                ('user_id', models.BigIntegerField()),
                ('group_key', models.BigIntegerField()),
                ('bucket', models.PositiveSmallIntegerField()),
                ('files', models.BigIntegerField(db_default=0)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('folded', False)), fields=['day', 'user_id', 'group_key', 'bucket'], name='usagewaitdelta_new')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('folded', True)), fields=('day', 'user_id', 'group_key', 'bucket'), name='usagewaitdelta_base')],
            },
        ),
        migrations.CreateModel(
            name='UserBacklogDelta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('files', models.BigIntegerField(default=0)),
                ('bytes', models.BigIntegerField(default=0)),
                ('folded', models.BooleanField(db_default=False)),
                ('user_id', models.BigIntegerField()),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('folded', False)), fields=['user_id'], name='userbacklogdelta_new')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('folded', True)), fields=('user_id',), name='userbacklogdelta_base')],
            },
        ),
        migrations.CreateModel(
            name='UserStateCountDelta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('files', models.BigIntegerField(default=0)),
                ('bytes', models.BigIntegerField(default=0)),
                ('folded', models.BooleanField(db_default=False)),
                ('user_id', models.BigIntegerField()),
                ('state', models.CharField(max_length=16)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('folded', False)), fields=['user_id', 'state'], name='userstatecountdelta_new')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('folded', True)), fields=('user_id', 'state'), name='userstatecountdelta_base')],
            },
        ),
        migrations.RunPython(tables_to_views),
        migrations.RunPython(create_triggers),
    ]
