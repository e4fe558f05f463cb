from django.db import migrations, models


class Migration(migrations.Migration):
    """A file's live pins by its key (issue 23, files already on disk are not read again)."""

    dependencies = [
        ('carousel', '0012_mount_wear'),
    ]

    operations = [
        migrations.AddField(
            model_name='restorerequest',
            name='copy_job',
            field=models.UUIDField(blank=True, help_text='The job whose restored copy this request was served from (a file already on disk).', null=True),
        ),
        migrations.AddIndex(
            model_name='restorerequest',
            index=models.Index(condition=models.Q(('pin_until__isnull', False)), fields=['path_key', 'pin_until'],
                               name='request_pinned_path'),
        ),
        migrations.AddIndex(
            model_name='restorerequest',
            index=models.Index(condition=models.Q(('copy_job__isnull', False)), fields=['copy_job'],
                               name='request_copy_job'),
        ),
    ]
