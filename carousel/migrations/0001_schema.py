"""The tables, as the models describe them: the squash of the first chain (0001_initial to
0021_intake, thirty migrations with six merges). Fields are in the order that chain left them
(columns added later come last), so a new database has the same columns in the same order as an
upgraded one; tests/test_migrations.py compares the two.

Django applies a squashed set only where none of the migrations it replaces is recorded, and
marks it applied where all of them are: a site must have applied the whole first chain (the
release before the squash) before it upgrades."""

import carousel.models
import django.core.validators
import django.db.models.deletion
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    # The first chain's migrations whose work is in this one: the models, fields, indexes and
    # constraints. The rest are replaced by 0002_triggers and 0003_vendor_indexes.
    replaces = [
        ("carousel", "0001_initial"),
        ("carousel", "0005_mount_plan"),
        ("carousel", "0007_c_bad_days"),
        ("carousel", "0007_d1_path_prefixes"),
        ("carousel", "0007_e_grid_door"),
        ("carousel", "0007_f_bulk_label"),
        ("carousel", "0007_g_counters"),
        ("carousel", "0008_c_locate_backoff"),
        ("carousel", "0008_d2_request_bulk"),
        ("carousel", "0009_c_job_deadline"),
        ("carousel", "0010_c_stager_calls"),
        ("carousel", "0011_c_pins"),
        ("carousel", "0011_merge_branches"),
        ("carousel", "0012_c_stager_status"),
        ("carousel", "0012_merge_request_bulk"),
        ("carousel", "0013_merge_pins"),
        ("carousel", "0014_merge_grid_door"),
        ("carousel", "0015_merge_update_trigger"),
        ("carousel", "0016_drive_allocation"),
        ("carousel", "0019_merge_cycle_speed"),
        ("carousel", "0020_locate_calls"),
    ]

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='HourlyStats',
            fields=[
                ('hour', models.DateTimeField(primary_key=True, serialize=False)),
                ('files_done', models.BigIntegerField(default=0)),
                ('bytes_done', models.BigIntegerField(default=0)),
                ('errors', models.BigIntegerField(default=0, help_text='Requests failed or sent to retry.')),
            ],
            options={
                'verbose_name_plural': 'hourly stats',
            },
        ),
        migrations.CreateModel(
            name='UserBacklog',
            fields=[
                ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='backlog', serialize=False, to=settings.AUTH_USER_MODEL)),
                ('files', models.BigIntegerField(default=0)),
                ('bytes', models.BigIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name='Account',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('inflight_cap', models.PositiveIntegerField(blank=True, help_text='Most requests in flight at once (empty: default).', null=True)),
                ('queued_ceiling', models.PositiveIntegerField(blank=True, help_text='Most active requests at once (empty: default).', null=True)),
                ('group', models.ForeignKey(blank=True, help_text="The group whose share this user's requests draw on.", null=True, on_delete=django.db.models.deletion.SET_NULL, to='auth.group')),
                ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='account', to=settings.AUTH_USER_MODEL)),
                ('acts_for_others', models.BooleanField(default=False, help_text="May name the user a submission is for (on_behalf_of): XRootD hooks, FTS-like services. The request then counts against that user's caps and shares.", verbose_name='service account')),
            ],
        ),
        migrations.CreateModel(
            name='Bulk',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('created_at', models.DateTimeField()),
                ('files', models.PositiveIntegerField()),
                ('created', models.PositiveIntegerField(help_text='Requests this submission created.')),
                ('notify', models.BooleanField(default=False)),
                ('notified_at', models.DateTimeField(blank=True, null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='bulks', to=settings.AUTH_USER_MODEL)),
                ('label', models.CharField(blank=True, default='', max_length=255)),
                ('activity', models.CharField(blank=True, max_length=128)),
                ('metadata', models.JSONField(blank=True, default=dict)),
                ('submitter', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('deadline', models.DateTimeField(blank=True, null=True)),
                ('destination', models.CharField(blank=True, default='', max_length=4096)),
                ('group', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='auth.group')),
                ('pending', models.PositiveIntegerField(default=0, help_text='New files still in the intake, not yet queued.')),
                ('pin_lifetime', models.DurationField(blank=True, null=True)),
                ('priority', models.PositiveSmallIntegerField(default=0)),
            ],
            options={
                'indexes': [
                    models.Index(fields=['user', '-created_at'], name='carousel_bu_user_id_c336a5_idx'),
                    models.Index(condition=models.Q(('notified_at__isnull', True), ('notify', True)), fields=['created_at'], name='bulk_notify_pending'),
                    models.Index(condition=models.Q(('label', ''), _negated=True), fields=['label'], name='bulk_label'),
                    models.Index(condition=models.Q(('pending__gt', 0)), fields=['user', 'created_at'], name='bulk_intake_pending'),
                ],
            },
        ),
        migrations.CreateModel(
            name='Control',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('sort_policy', models.CharField(default='TAPEID', max_length=64)),
                ('share_policy', models.CharField(default='GRPW', max_length=64)),
                ('policy_params', models.JSONField(blank=True, default=dict, validators=[carousel.models.validate_policy_params])),
                ('files_per_job', models.PositiveIntegerField(default=100, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(100000)], verbose_name='files per job (N)')),
                ('jobs_in_flight', models.PositiveIntegerField(default=50, help_text='N × K requests at most are planned or at the stager; the rest wait here, where the policies can still reorder them.', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(100000)], verbose_name='jobs in flight (K)')),
                ('cycle_s', models.FloatField(default=10.0, validators=[django.core.validators.MinValueValidator(0.1), django.core.validators.MaxValueValidator(3600)], verbose_name='cycle period (s)')),
                ('default_user_cap', models.PositiveIntegerField(default=2500, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000000000)], verbose_name='default requests in flight per user')),
                ('default_group_cap', models.PositiveIntegerField(default=5000, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000000000)], verbose_name='default requests in flight per group')),
                ('default_queued_ceiling', models.PositiveIntegerField(default=500000, validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(1000000000)], verbose_name='default queued requests per user')),
                ('max_wait_s', models.FloatField(default=14400.0, help_text='A request queued this long goes first, whatever its tape or policy.', validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(31536000.0)], verbose_name='maximum wait (s)')),
                ('mount_min_files', models.PositiveIntegerField(default=1, help_text='A tape goes out once it has this many files queued ...', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000000)], verbose_name='worth mounting: files (M)')),
                ('mount_min_bytes', models.BigIntegerField(default=0, help_text='... or this many bytes ...', validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(1000000000000000000)], verbose_name='worth mounting: bytes (B)')),
                ('mount_max_wait_s', models.FloatField(default=0.0, help_text='... or its oldest request has waited this long.', validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(31536000.0)], verbose_name='worth mounting: wait (T, s)')),
                ('retry_cycle_s', models.FloatField(default=600.0, help_text='Transient failures wait this long, then retry together.', validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(604800.0)], verbose_name='retry cycle (s)')),
                ('max_attempts', models.PositiveSmallIntegerField(default=5, help_text='Transient failures (stager, drive) per request.', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(100)], verbose_name='attempts before failing')),
                ('max_delivery_attempts', models.PositiveSmallIntegerField(default=3, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(100)], verbose_name='delivery attempts before failing')),
                ('stall_after_s', models.FloatField(default=1800.0, help_text='Jobs in flight with no progress for this long: the stager is stalled, submission stops until progress returns.', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(604800.0)], verbose_name='stalled after (s)')),
                ('failure_ratio', models.FloatField(default=0.5, help_text="When more than this fraction of a cycle's results are failures, the jobs in flight are halved.", validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(1)], verbose_name='halve on failure ratio')),
                ('disk_threshold', models.FloatField(default=0.9, help_text="New jobs go out only while the stager's disk buffer, with what is already on its way, stays below this fraction.", validators=[django.core.validators.MinValueValidator(0.01), django.core.validators.MaxValueValidator(1)], verbose_name='disk buffer threshold')),
                ('quarantine_failures', models.PositiveSmallIntegerField(default=3, help_text='Failures on one tape within the quarantine window that quarantine it.', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(10000)], verbose_name='quarantine after failures')),
                ('quarantine_window_s', models.FloatField(default=3600.0, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(2592000.0)], verbose_name='quarantine window (s)')),
                ('deliveries_per_fs', models.PositiveSmallIntegerField(default=4, help_text="Copies to one destination file system at once, so restores don't overload it.", validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000)], verbose_name='deliveries per file system')),
                ('locate_batch', models.PositiveIntegerField(default=5000, help_text="Paths asked of the stager in one call. A cycle calls until every new request is located, up to the largest submission's worth, so a burst is shared out whole.", validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(100000)], verbose_name='paths per locate call')),
                ('paused', models.BooleanField(default=False, verbose_name='submission paused')),
                ('last_cycle_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('last_cycle_error', models.TextField(blank=True, editable=False)),
                ('choose_per_cycle', models.PositiveIntegerField(default=750, help_text="Bounds one cycle's work; a window emptied at once refills over a few cycles.", validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000000)], verbose_name='requests chosen per cycle')),
                ('drives', models.PositiveSmallIntegerField(default=0, help_text='0: as many as the stager reports. With a count, each drive gets a chain of mounts, the next sent when the previous is done; a stager that reports none and no count here: no plan, every job goes out at once.', validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(1000)], verbose_name='drives to plan for')),
                ('preempt_after_s', models.FloatField(default=120.0, help_text="A short mount waiting this long behind a long one cuts it: the long one's unread files go back to the queue. 0: never.", validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(604800.0)], verbose_name='preempt after (s)')),
                ('preempt_gap_s', models.FloatField(default=300.0, validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(604800.0)], verbose_name='at most one preemption per (s)')),
                ('short_mount_s', models.FloatField(default=900.0, help_text='A planned mount estimated shorter than this goes before the long ones of its drive.', validators=[django.core.validators.MinValueValidator(0), django.core.validators.MaxValueValidator(604800.0)], verbose_name='short mount (s)')),
                ('locate_attempts', models.PositiveSmallIntegerField(default=20, help_text='A file the stager cannot place on a tape ("try later", or no answer) this many times fails.', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000)], verbose_name='locate attempts')),
                ('locate_backoff_s', models.FloatField(default=60.0, help_text='Such a file is asked about again after this long, doubled after each answer up to 64 times.', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(86400.0)], verbose_name='locate backoff (s)')),
                ('job_deadline_factor', models.FloatField(default=4.0, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(100)], verbose_name='job deadline: times its estimate')),
                ('job_deadline_floor_s', models.FloatField(default=21600.0, help_text="A job still at the stager this long after it was sent (or its estimate times the factor below, when longer) is asked about once more, then given up: its unfinished files go back to the queue and its drive's chain goes on.", validators=[django.core.validators.MinValueValidator(60), django.core.validators.MaxValueValidator(2592000.0)], verbose_name='job deadline at least (s)')),
            ],
            options={
                'verbose_name': 'control',
                'verbose_name_plural': 'control',
                'constraints': [
                    models.CheckConstraint(condition=models.Q(('id', 1)), name='control_is_singleton'),
                    models.CheckConstraint(condition=models.Q(('files_per_job__gte', 1), ('files_per_job__lte', 100000)), name='control_files_per_job_in_range'),
                    models.CheckConstraint(condition=models.Q(('jobs_in_flight__gte', 1), ('jobs_in_flight__lte', 100000)), name='control_jobs_in_flight_in_range'),
                    models.CheckConstraint(condition=models.Q(('choose_per_cycle__gte', 1), ('choose_per_cycle__lte', 1000000)), name='control_choose_per_cycle_in_range'),
                    models.CheckConstraint(condition=models.Q(('drives__gte', 0), ('drives__lte', 1000)), name='control_drives_in_range'),
                    models.CheckConstraint(condition=models.Q(('short_mount_s__gte', 0), ('short_mount_s__lte', 604800.0)), name='control_short_mount_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('preempt_after_s__gte', 0), ('preempt_after_s__lte', 604800.0)), name='control_preempt_after_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('preempt_gap_s__gte', 0), ('preempt_gap_s__lte', 604800.0)), name='control_preempt_gap_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('cycle_s__gte', 0.1), ('cycle_s__lte', 3600)), name='control_cycle_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('default_user_cap__gte', 1), ('default_user_cap__lte', 1000000000)), name='control_default_user_cap_in_range'),
                    models.CheckConstraint(condition=models.Q(('default_group_cap__gte', 1), ('default_group_cap__lte', 1000000000)), name='control_default_group_cap_in_range'),
                    models.CheckConstraint(condition=models.Q(('default_queued_ceiling__gte', 0), ('default_queued_ceiling__lte', 1000000000)), name='control_default_queued_ceiling_in_range'),
                    models.CheckConstraint(condition=models.Q(('max_wait_s__gte', 0), ('max_wait_s__lte', 31536000.0)), name='control_max_wait_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('mount_min_files__gte', 1), ('mount_min_files__lte', 1000000)), name='control_mount_min_files_in_range'),
                    models.CheckConstraint(condition=models.Q(('mount_min_bytes__gte', 0), ('mount_min_bytes__lte', 1000000000000000000)), name='control_mount_min_bytes_in_range'),
                    models.CheckConstraint(condition=models.Q(('mount_max_wait_s__gte', 0), ('mount_max_wait_s__lte', 31536000.0)), name='control_mount_max_wait_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('retry_cycle_s__gte', 0), ('retry_cycle_s__lte', 604800.0)), name='control_retry_cycle_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('max_attempts__gte', 1), ('max_attempts__lte', 100)), name='control_max_attempts_in_range'),
                    models.CheckConstraint(condition=models.Q(('max_delivery_attempts__gte', 1), ('max_delivery_attempts__lte', 100)), name='control_max_delivery_attempts_in_range'),
                    models.CheckConstraint(condition=models.Q(('stall_after_s__gte', 1), ('stall_after_s__lte', 604800.0)), name='control_stall_after_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('failure_ratio__gte', 0), ('failure_ratio__lte', 1)), name='control_failure_ratio_in_range'),
                    models.CheckConstraint(condition=models.Q(('disk_threshold__gte', 0.01), ('disk_threshold__lte', 1)), name='control_disk_threshold_in_range'),
                    models.CheckConstraint(condition=models.Q(('quarantine_failures__gte', 1), ('quarantine_failures__lte', 10000)), name='control_quarantine_failures_in_range'),
                    models.CheckConstraint(condition=models.Q(('quarantine_window_s__gte', 1), ('quarantine_window_s__lte', 2592000.0)), name='control_quarantine_window_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('deliveries_per_fs__gte', 1), ('deliveries_per_fs__lte', 1000)), name='control_deliveries_per_fs_in_range'),
                    models.CheckConstraint(condition=models.Q(('locate_batch__gte', 1), ('locate_batch__lte', 100000)), name='control_locate_batch_in_range'),
                    models.CheckConstraint(condition=models.Q(('locate_attempts__gte', 1), ('locate_attempts__lte', 1000)), name='control_locate_attempts_in_range'),
                    models.CheckConstraint(condition=models.Q(('locate_backoff_s__gte', 1), ('locate_backoff_s__lte', 86400.0)), name='control_locate_backoff_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('job_deadline_floor_s__gte', 60), ('job_deadline_floor_s__lte', 2592000.0)), name='control_job_deadline_floor_s_in_range'),
                    models.CheckConstraint(condition=models.Q(('job_deadline_factor__gte', 1), ('job_deadline_factor__lte', 100)), name='control_job_deadline_factor_in_range'),
                ],
            },
        ),
        migrations.CreateModel(
            name='GroupShare',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('weight', models.FloatField(default=1.0, help_text='Relative share under weighted sharing (GRPW).')),
                ('inflight_cap', models.PositiveIntegerField(blank=True, help_text='Most requests in flight for the group (empty: default).', null=True)),
                ('group', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='share', to='auth.group')),
                ('max_drives', models.PositiveIntegerField(blank=True, help_text='Most drives this group may hold at once (empty: no limit).', null=True)),
                ('reserved_drives', models.PositiveIntegerField(default=0, help_text='Drives this group gets first whenever it has work (0: none reserved).')),
            ],
            options={
                'constraints': [
                    models.CheckConstraint(condition=models.Q(('weight__gt', 0)), name='groupshare_weight_positive'),
                    models.CheckConstraint(condition=models.Q(('max_drives__isnull', True), ('max_drives__gte', models.F('reserved_drives')), _connector='OR'), name='groupshare_max_drives_covers_reserved', violation_error_message='The most drives cannot be below the reserved drives.'),
                ],
            },
        ),
        migrations.CreateModel(
            name='StagerHealth',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('state', models.CharField(choices=[('healthy', 'Healthy'), ('stalled', 'Stalled'), ('down', 'Down')], default='healthy', max_length=16)),
                ('reason', models.TextField(blank=True)),
                ('since', models.DateTimeField(blank=True, null=True)),
                ('jobs_limit', models.PositiveIntegerField(blank=True, help_text='The adaptive limit; empty: K from the control row.', null=True, verbose_name='jobs in flight now')),
                ('healthy_limit', models.PositiveIntegerField(blank=True, help_text='Restored at once when an outage or stall ends.', null=True, verbose_name='last healthy limit')),
                ('last_progress_at', models.DateTimeField(blank=True, null=True)),
                ('probes', models.PositiveIntegerField(default=0, help_text='Probes since the stager went down or stalled.')),
                ('disk_free_bytes', models.BigIntegerField(blank=True, null=True)),
                ('disk_total_bytes', models.BigIntegerField(blank=True, null=True)),
                ('checked_at', models.DateTimeField(blank=True, null=True)),
                ('preempted_at', models.DateTimeField(blank=True, null=True, verbose_name='last preemption')),
                ('status', models.JSONField(blank=True, default=dict)),
                ('status_at', models.DateTimeField(blank=True, null=True, verbose_name='status reported at')),
            ],
            options={
                'verbose_name': 'stager health',
                'verbose_name_plural': 'stager health',
                'constraints': [
                    models.CheckConstraint(condition=models.Q(('id', 1)), name='stagerhealth_is_singleton'),
                ],
            },
        ),
        migrations.CreateModel(
            name='Tape',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('label', models.CharField(max_length=64, unique=True)),
                ('media', models.CharField(blank=True, max_length=32)),
                ('used_bytes', models.BigIntegerField(blank=True, null=True)),
                ('quarantined_at', models.DateTimeField(blank=True, null=True)),
                ('quarantine_reason', models.TextField(blank=True)),
                ('recent_failures', models.PositiveIntegerField(default=0)),
                ('failures_since', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'indexes': [
                    models.Index(condition=models.Q(('quarantined_at__isnull', False)), fields=['id'], name='tape_quarantined'),
                ],
            },
        ),
        migrations.CreateModel(
            name='Job',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('sent', 'Sent'), ('done', 'Done'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='pending', max_length=16)),
                ('backend_id', models.CharField(blank=True, max_length=128)),
                ('files', models.PositiveIntegerField(default=0)),
                ('created_at', models.DateTimeField()),
                ('rank', models.PositiveIntegerField(default=0)),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('progress_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('tape', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to='carousel.tape')),
                ('after', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='carousel.job')),
                ('chain', models.CharField(blank=True, max_length=32)),
                ('estimate_s', models.FloatField(default=0.0)),
                ('jumps_queue', models.BooleanField(default=False)),
                ('overdue_at', models.DateTimeField(blank=True, help_text='When the loop found it past its deadline (given up a cycle later).', null=True)),
                ('group', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='auth.group')),
            ],
            options={
                'indexes': [
                    models.Index(condition=models.Q(('state__in', ['pending', 'sent'])), fields=['state'], name='job_open'),
                    models.Index(fields=['sent_at'], name='job_sent_at'),
                ],
            },
        ),
        migrations.CreateModel(
            name='RestoreRequest',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('path', models.TextField()),
                ('path_key', models.UUIDField()),
                ('size', models.BigIntegerField(blank=True, null=True)),
                ('position', models.BigIntegerField(blank=True, null=True)),
                ('priority', models.PositiveSmallIntegerField(default=0)),
                ('destination', models.TextField(blank=True)),
                ('deadline', models.DateTimeField(blank=True, help_text='Unfinished after this: expired.', null=True)),
                ('pin_lifetime', models.DurationField(blank=True, help_text='How long the restored copy must stay on disk.', null=True)),
                ('state', models.CharField(choices=[('queued', 'Queued'), ('submitted', 'Submitted'), ('staging', 'Staging'), ('retry', 'Retry'), ('delivering', 'Delivering'), ('done', 'Done'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('expired', 'Expired')], default='queued', max_length=16)),
                ('attempts', models.PositiveSmallIntegerField(default=0)),
                ('error_class', models.CharField(blank=True, choices=[('', 'none'), ('transient', 'Transient'), ('permanent', 'Permanent'), ('user', 'User'), ('delivery', 'Delivery')], default='', max_length=16)),
                ('last_error', models.TextField(blank=True)),
                ('job_rank', models.PositiveIntegerField(db_default=0)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('submitted_at', models.DateTimeField(blank=True, null=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('retry_at', models.DateTimeField(blank=True, null=True)),
                ('staged_path', models.TextField(blank=True, db_default='', help_text='Where the stager put the file, for delivery.')),
                ('delivery_fs', models.CharField(blank=True, db_default='', help_text="The destination's file system.", max_length=255)),
                ('delivery_started_at', models.DateTimeField(blank=True, null=True)),
                ('delivery_attempts', models.PositiveSmallIntegerField(db_default=0)),
                ('group', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, to='auth.group')),
                ('job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='requests', to='carousel.job')),
                ('user', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='restore_requests', to=settings.AUTH_USER_MODEL)),
                ('tape', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='requests', to='carousel.tape')),
                ('locate_after', models.DateTimeField(blank=True, null=True)),
                ('locate_attempts', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('bulk', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='created_requests', to='carousel.bulk')),
                ('pin_until', models.DateTimeField(blank=True, help_text="The restored copy is pinned on the stager's disk until then (carousel/domain/pins.py); empty: no pin, or it has ended.", null=True)),
            ],
            options={
                'indexes': [
                    models.Index(condition=models.Q(('state__in', ('queued', 'submitted', 'staging', 'retry', 'delivering'))), fields=['path_key'], name='request_active_path'),
                    models.Index(condition=models.Q(('deadline__isnull', False), ('state__in', ('queued', 'submitted', 'staging', 'retry', 'delivering'))), fields=['deadline'], name='request_active_deadline'),
                    models.Index(condition=models.Q(('state', 'retry')), fields=['retry_at'], name='request_retry_due'),
                    models.Index(condition=models.Q(('state', 'delivering')), fields=['delivery_fs', 'delivery_started_at'], name='request_delivering'),
                    models.Index(condition=models.Q(('state', 'queued'), ('tape__isnull', True)), fields=['created_at'], name='request_unlocated'),
                    models.Index(condition=models.Q(('state__in', ('submitted', 'staging'))), fields=['user'], name='request_in_flight'),
                    models.Index(condition=models.Q(('state', 'queued'), ('tape__isnull', False)), fields=['user', 'created_at', 'id'], name='request_ready_user_age'),
                    models.Index(condition=models.Q(('state', 'queued'), ('tape__isnull', False)), fields=['user', 'tape', 'position'], name='request_ready_user_tape'),
                    models.Index(condition=models.Q(('state', 'queued'), ('tape__isnull', False)), fields=['tape', 'created_at'], name='request_ready_tape_age'),
                    models.Index(condition=models.Q(('state', 'queued'), ('tape__isnull', False), ('priority__gt', 0)), fields=['user', '-priority', 'created_at'], name='request_ready_user_priority'),
                    models.Index(condition=models.Q(('locate_attempts__isnull', True), ('state', 'queued'), ('tape__isnull', True)), fields=['created_at', 'id'], name='request_locate_new'),
                    models.Index(condition=models.Q(('locate_attempts__isnull', False), ('state', 'queued'), ('tape__isnull', True)), fields=['locate_after'], name='request_locate_again'),
                    models.Index(condition=models.Q(('state__in', ('done', 'failed', 'cancelled', 'expired'))), fields=['finished_at'], name='request_finished'),
                    models.Index(fields=['user', 'state', 'created_at'], name='request_user_state_age'),
                    models.Index(condition=models.Q(('tape__isnull', False)), fields=['tape', 'user'], name='request_tape'),
                    models.Index(condition=models.Q(('bulk__isnull', False)), fields=['bulk'], name='request_bulk'),
                    models.Index(condition=models.Q(('pin_until__isnull', False)), fields=['pin_until'], name='request_pin_due'),
                ],
                'constraints': [
                    models.UniqueConstraint(condition=models.Q(('state__in', ('queued', 'submitted', 'staging', 'retry', 'delivering'))), fields=('user', 'path_key'), name='one_active_request_per_user_and_file'),
                    models.CheckConstraint(condition=models.Q(('priority__lte', 3)), name='request_priority_0_to_3'),
                    models.CheckConstraint(condition=models.Q(('state__in', ['queued', 'submitted', 'staging', 'retry', 'delivering', 'done', 'failed', 'cancelled', 'expired'])), name='request_state_known'),
                    models.CheckConstraint(condition=models.Q(models.Q(('finished_at__isnull', False), ('state__in', ('done', 'failed', 'cancelled', 'expired'))), models.Q(models.Q(('state__in', ('done', 'failed', 'cancelled', 'expired')), _negated=True), ('finished_at__isnull', True)), _connector='OR'), name='request_finished_iff_terminal'),
                    models.CheckConstraint(condition=models.Q(models.Q(('state__in', ('submitted', 'staging')), _negated=True), models.Q(('job__isnull', False), ('submitted_at__isnull', False)), _connector='OR'), name='request_in_flight_has_job'),
                    models.CheckConstraint(condition=models.Q(models.Q(('state', 'staging'), _negated=True), ('started_at__isnull', False), _connector='OR'), name='request_staging_has_started_at'),
                    models.CheckConstraint(condition=models.Q(models.Q(('state', 'retry'), _negated=True), ('retry_at__isnull', False), _connector='OR'), name='request_retry_has_retry_at'),
                    models.CheckConstraint(condition=models.Q(models.Q(('state', 'done'), _negated=True), ('error_class', ''), _connector='OR'), name='request_done_has_no_error'),
                ],
            },
        ),
        migrations.CreateModel(
            name='BulkItem',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('bulk', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='items', to='carousel.bulk')),
                ('request', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='bulk_items', to='carousel.restorerequest')),
            ],
            options={
                'constraints': [
                    models.UniqueConstraint(fields=('bulk', 'request'), name='bulkitem_unique'),
                ],
            },
        ),
        migrations.CreateModel(
            name='RetryQueue',
            fields=[
            ],
            options={
                'verbose_name': 'retry queue entry',
                'verbose_name_plural': 'retry queue',
                'proxy': True,
            },
            bases=('carousel.restorerequest',),
        ),
        migrations.CreateModel(
            name='FileLocation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('path', models.TextField()),
                ('path_key', models.UUIDField(unique=True)),
                ('position', models.BigIntegerField(help_text='Byte offset from the beginning of the tape.')),
                ('size', models.BigIntegerField()),
                ('located_at', models.DateTimeField()),
                ('tape', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='files', to='carousel.tape')),
            ],
        ),
        migrations.CreateModel(
            name='TapeBacklog',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('files', models.BigIntegerField(default=0)),
                ('bytes', models.BigIntegerField(default=0)),
                ('tape', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='backlog', to='carousel.tape')),
                ('user', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'indexes': [
                    models.Index(models.F('user'), models.OrderBy(models.F('files'), descending=True), condition=models.Q(('files__gt', 0)), name='tapebacklog_user_files'),
                ],
                'constraints': [
                    models.UniqueConstraint(fields=('user', 'tape'), name='tapebacklog_user_tape'),
                ],
            },
        ),
        migrations.CreateModel(
            name='Transition',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('from_state', models.CharField(choices=[('queued', 'Queued'), ('submitted', 'Submitted'), ('staging', 'Staging'), ('retry', 'Retry'), ('delivering', 'Delivering'), ('done', 'Done'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('expired', 'Expired')], max_length=16)),
                ('to_state', models.CharField(choices=[('queued', 'Queued'), ('submitted', 'Submitted'), ('staging', 'Staging'), ('retry', 'Retry'), ('delivering', 'Delivering'), ('done', 'Done'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('expired', 'Expired')], max_length=16)),
                ('at', models.DateTimeField()),
                ('request', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='transitions', to='carousel.restorerequest')),
            ],
            options={
                'indexes': [
                    models.Index(fields=['at'], name='transition_at'),
                ],
            },
        ),
        migrations.CreateModel(
            name='StagerCall',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('cancel', 'Cancel'), ('release', 'Release')], max_length=16)),
                ('backend_id', models.CharField(help_text="The stager's id of the job that holds the files.", max_length=128)),
                ('paths', models.JSONField()),
                ('created_at', models.DateTimeField()),
                ('next_at', models.DateTimeField(help_text='Not sent before this (retries back off).')),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_error', models.TextField(blank=True)),
            ],
            options={
                'indexes': [
                    models.Index(fields=['next_at', 'id'], name='stagercall_due'),
                ],
            },
        ),
        migrations.CreateModel(
            name='CounterTotal',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=32)),
                ('label', models.CharField(blank=True, max_length=32)),
                ('value', models.BigIntegerField(db_default=0)),
            ],
            options={
                'constraints': [
                    models.UniqueConstraint(fields=('name', 'label'), name='countertotal_key'),
                ],
            },
        ),
        migrations.CreateModel(
            name='CycleBucket',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('le', models.FloatField(unique=True)),
                ('count', models.BigIntegerField(default=0)),
                ('sum_s', models.FloatField(default=0.0, help_text="On the infinite bucket only: the durations' sum.")),
            ],
        ),
        migrations.CreateModel(
            name='StateCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('state', models.CharField(max_length=16)),
                ('group_key', models.BigIntegerField()),
                ('files', models.BigIntegerField(db_default=0)),
                ('bytes', models.BigIntegerField(db_default=0)),
            ],
            options={
                'constraints': [
                    models.UniqueConstraint(fields=('state', 'group_key'), name='statecount_key'),
                ],
            },
        ),
        migrations.CreateModel(
            name='UsageDay',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
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
                'constraints': [
                    models.UniqueConstraint(fields=('day', 'user_id', 'group_key'), name='usageday_key'),
                ],
            },
        ),
        migrations.CreateModel(
            name='UsageWait',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateTimeField(help_text='Midnight UTC.')),
                ('user_id', models.BigIntegerField()),
                ('group_key', models.BigIntegerField()),
                ('bucket', models.PositiveSmallIntegerField()),
                ('files', models.BigIntegerField(db_default=0)),
            ],
            options={
                'constraints': [
                    models.UniqueConstraint(fields=('day', 'user_id', 'group_key', 'bucket'), name='usagewait_key'),
                ],
            },
        ),
        migrations.CreateModel(
            name='UserStateCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('state', models.CharField(choices=[('queued', 'Queued'), ('submitted', 'Submitted'), ('staging', 'Staging'), ('retry', 'Retry'), ('delivering', 'Delivering'), ('done', 'Done'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('expired', 'Expired')], max_length=16)),
                ('files', models.BigIntegerField(default=0)),
                ('bytes', models.BigIntegerField(default=0)),
                ('user', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='state_counts', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'constraints': [
                    models.UniqueConstraint(fields=('user', 'state'), name='userstatecount_user_state'),
                ],
            },
        ),
        migrations.CreateModel(
            name='PathPrefix',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('prefix', models.CharField(help_text='An absolute path: /star/data covers /star/data/x, not /star/data2; / covers everything.', max_length=1024)),
                ('purpose', models.CharField(choices=[('restore', 'restore files under it'), ('destination', 'deliver restored files into it')], default='restore', max_length=16)),
                ('group', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='path_prefixes', to='auth.group')),
            ],
            options={
                'verbose_name': 'path prefix',
                'verbose_name_plural': 'path prefixes',
                'ordering': ['group', 'purpose', 'prefix'],
                'constraints': [
                    models.UniqueConstraint(fields=('group', 'purpose', 'prefix'), name='pathprefix_unique'),
                ],
            },
        ),
        migrations.CreateModel(
            name='WlcgGroupMap',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('issuer', models.CharField(blank=True, help_text='Empty: any trusted issuer.', max_length=255)),
                ('wlcg_group', models.CharField(help_text='e.g. /atlas/production', max_length=255, verbose_name='wlcg.groups entry')),
                ('group', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='wlcg_groups', to='auth.group')),
            ],
            options={
                'verbose_name': 'WLCG group mapping',
                'constraints': [
                    models.UniqueConstraint(fields=('issuer', 'wlcg_group'), name='wlcggroupmap_unique'),
                ],
            },
        ),
        migrations.CreateModel(
            name='WlcgIdentity',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('issuer', models.CharField(max_length=255)),
                ('subject', models.CharField(max_length=255)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='wlcg_identity', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'WLCG identity',
                'verbose_name_plural': 'WLCG identities',
                'constraints': [
                    models.UniqueConstraint(fields=('issuer', 'subject'), name='wlcgidentity_issuer_subject'),
                ],
            },
        ),
        migrations.CreateModel(
            name='Intake',
            fields=[
                ('pk', models.CompositePrimaryKey('bulk', 'n', blank=True, editable=False, primary_key=True, serialize=False)),
                ('bulk', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='carousel.bulk')),
                ('n', models.PositiveIntegerField(help_text="The file's place among the submission's new files.")),
                ('path', models.TextField()),
                ('path_key', models.UUIDField()),
            ],
        ),
    ]
