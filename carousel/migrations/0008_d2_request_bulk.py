"""The creating submission on the request row (RestoreRequest.bulk): a submission of 100,000
new files writes 100,000 request rows and no BulkItem rows. Rows stored before keep their
BulkItem rows, which the selectors still read. On SQLite this is an ADD COLUMN (nullable,
no default): the table is not rebuilt, the triggers and the index of 0002-0007 stay."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('carousel', '0007_d2_state_counters'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='restorerequest',
            name='bulk',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='created_requests', to='carousel.bulk'),
        ),
        migrations.AddIndex(
            model_name='restorerequest',
            index=models.Index(condition=models.Q(('bulk__isnull', False)), fields=['bulk'], name='request_bulk'),
        ),
    ]
