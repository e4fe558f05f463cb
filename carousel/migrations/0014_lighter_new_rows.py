from django.db import migrations, models


class Migration(migrations.Migration):
    """Two fewer index entries for each new request (issue 24, the time until a 100,000-file
    submission is queued): the job's index only for rows that have a job, and the file's
    active requests found through the one-per-user-and-file constraint, its columns turned
    file first, instead of a second index on path_key."""

    dependencies = [
        ('carousel', '0013_pinned_path'),
    ]

    operations = [
        # The foreign key's own index dropped by its name, the field altered in the state only:
        # an AlterField makes SQLite copy the table, which the triggers on it do not survive.
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL('DROP INDEX IF EXISTS "carousel_restorerequest_job_id_d009cb27"',
                                                   reverse_sql='CREATE INDEX "carousel_restorerequest_job_id_d009cb27" '
                                                               'ON "carousel_restorerequest" ("job_id")')],
            state_operations=[migrations.AlterField(
                model_name='restorerequest',
                name='job',
                field=models.ForeignKey(blank=True, db_index=False, null=True,
                                        on_delete=models.deletion.SET_NULL, related_name='requests',
                                        to='carousel.job'),
            )],
        ),
        migrations.AddIndex(
            model_name='restorerequest',
            index=models.Index(condition=models.Q(('job__isnull', False)), fields=['job'], name='request_job'),
        ),
        migrations.RemoveConstraint(
            model_name='restorerequest',
            name='one_active_request_per_user_and_file',
        ),
        migrations.AddConstraint(
            model_name='restorerequest',
            constraint=models.UniqueConstraint(condition=models.Q(('state__in', ('queued', 'submitted', 'staging', 'retry', 'delivering'))),
                                               fields=('path_key', 'user'),
                                               name='one_active_request_per_user_and_file'),
        ),
        migrations.RemoveIndex(
            model_name='restorerequest',
            name='request_active_path',
        ),
    ]
