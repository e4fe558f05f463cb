from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('carousel', '0010_activities'),
    ]

    operations = [
        migrations.CreateModel(
            name='TapeMapEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('path', models.TextField()),
                ('path_key', models.UUIDField(unique=True)),
                ('tape', models.CharField(max_length=64)),
                ('media', models.CharField(blank=True, max_length=32)),
                ('position', models.BigIntegerField(blank=True, help_text='Byte offset on the tape, when known.', null=True)),
                ('size', models.BigIntegerField(blank=True, null=True)),
                ('ordinal', models.BigIntegerField()),
                ('loaded_at', models.DateTimeField()),
            ],
            options={
                'verbose_name_plural': 'tape map',
            },
        ),
    ]
