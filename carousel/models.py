"""The core domain: restore requests, the bulk submissions that group them, tapes, jobs,
limits per user and group, the control row, and the history of every state change."""
import hashlib
import math
import uuid

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import connection, models
from django.db.models import F, Q


def path_key(path: str) -> uuid.UUID:
    """A fixed-size key for a path. Paths reach 4096 bytes, past what a btree index entry may
    hold, so uniqueness and look-ups go through this 16-byte digest instead of the text."""
    return uuid.UUID(bytes=hashlib.blake2b(path.encode(), digest_size=16).digest())


def path_keys(paths):
    """path_key of each path, as the 32 hex digits a uuid column reads (and UUID(hex) gives back):
    for a submission's 100,000 paths, making a UUID object of each digest cost more than the digest."""
    return [hashlib.blake2b(path.encode(), digest_size=16).hexdigest() for path in paths]


class RequestState(models.TextChoices):
    QUEUED = "queued"
    SUBMITTED = "submitted"  # in a job at the stager
    STAGING = "staging"  # the stager reports work on it
    RETRY = "retry"  # failed transiently, waits for its retry time
    DELIVERING = "delivering"  # on the stager's disk, being put where the user asked
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


S = RequestState
ACTIVE_STATES = (S.QUEUED, S.SUBMITTED, S.STAGING, S.RETRY, S.DELIVERING)
IN_FLIGHT_STATES = (S.SUBMITTED, S.STAGING)
TERMINAL_STATES = (S.DONE, S.FAILED, S.CANCELLED, S.EXPIRED)


def sql_values(choices):
    """Choices (states) as a list of SQL literals for raw SQL: the enums' own values, never input."""
    return ", ".join(f"'{choice.value}'" for choice in choices)


# target state -> the states it may be reached from; every change is guarded by this table.
ALLOWED_FROM = {
    S.SUBMITTED: (S.QUEUED,),
    S.STAGING: (S.SUBMITTED,),
    # A queued request completes when another user's shared stage of the same file does.
    S.DONE: (S.QUEUED, S.SUBMITTED, S.STAGING, S.RETRY, S.DELIVERING),
    S.DELIVERING: (S.QUEUED, S.SUBMITTED, S.STAGING, S.RETRY),
    S.RETRY: (S.SUBMITTED, S.STAGING, S.DELIVERING),
    # retry time reached; a job reconciled as never received; an operator's "retry now".
    S.QUEUED: (S.RETRY, S.SUBMITTED, S.STAGING, S.DELIVERING, S.FAILED),
    S.FAILED: ACTIVE_STATES,
    S.CANCELLED: ACTIVE_STATES,
    S.EXPIRED: ACTIVE_STATES,
}


# Queued and located: what the scheduler may choose from.
READY = Q(state=S.QUEUED, tape__isnull=False)


class ErrorClass(models.TextChoices):
    NONE = "", "none"
    TRANSIENT = "transient"  # stager unreachable, timeout, drive error: retried on the cycle
    PERMANENT = "permanent"  # no such file, lost or unreadable tape
    USER = "user"  # bad destination, quota
    DELIVERY = "delivery"  # copying the staged file to its destination failed


class DestinationLayout(models.TextChoices):
    """Where under its submission's destination directory a file is delivered."""
    PATH = "path", "by the file's whole path (DEST/star/run1/a.root)"
    NAME = "name", "by the file's name (DEST/a.root)"


class Singleton(models.Model):
    """A table of one row (id 1), created on first use."""

    class Meta:
        abstract = True

    @classmethod
    def get(cls):
        # Read by every cycle and every poll of the summary: for one row, building the ORM's
        # query was most of the cost (Control, 39 columns: 0.87 ms a read, 0.37 ms through raw();
        # the two rows took 9 % of a fault seed's CPU). raw() still applies the fields'
        # converters and gives the model's instance.
        table = connection.ops.quote_name(cls._meta.db_table)

        def read():
            return next(iter(cls.objects.raw(f"SELECT * FROM {table} WHERE id = %s", [1])), None)

        row = read()
        if row is not None:
            return row
        # Missing: made here, on first use. Inside one REPEATABLE READ snapshot (a page's reads,
        # db.one_snapshot) a row another process made after the snapshot is neither seen nor
        # insertable (get_or_create's insert met it and its look-up again did not see it: an
        # IntegrityError, a 500), and a read must not write: such a read gets the row's defaults,
        # which is what that snapshot holds.
        if connection.vendor == "postgresql" and connection.in_atomic_block:
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_setting('transaction_isolation')")
                if cursor.fetchone()[0] != "read committed":
                    return cls(id=1)
        cls.objects.bulk_create([cls(id=1)], ignore_conflicts=True)  # a concurrent first use made it too
        return read() or cls(id=1)


DAY = 86400.0
# The control row's sane ranges: {field: (lowest, highest)}, both included. The admin's
# validators and the database's CHECK constraints are made from this one table, so neither a
# form nor a raw UPDATE stores a value that stops all work (files_per_job = 0) or crashes each
# cycle. Float bounds also keep NaN and infinity out (PostgreSQL sorts NaN above every number).
CONTROL_BOUNDS = {
    "files_per_job": (1, 100_000), "jobs_in_flight": (1, 100_000), "choose_per_cycle": (1, 1_000_000),
    "drives": (0, 1000), "short_mount_s": (0, 7 * DAY), "preempt_after_s": (0, 7 * DAY),
    "preempt_gap_s": (0, 7 * DAY), "cycle_s": (0.1, 3600), "default_user_cap": (1, 10**9),
    "default_group_cap": (1, 10**9), "default_queued_ceiling": (0, 10**9), "max_wait_s": (0, 365 * DAY),
    "mount_min_files": (1, 10**6), "mount_min_bytes": (0, 10**18), "mount_max_wait_s": (0, 365 * DAY),
    "min_mount_files": (0, 10**9), "min_mount_bytes": (0, 10**18), "remount_delay_s": (0, 30 * DAY),
    "retry_cycle_s": (0, 7 * DAY), "max_attempts": (1, 100), "max_delivery_attempts": (1, 100),
    "stall_after_s": (1, 7 * DAY), "failure_ratio": (0, 1), "disk_threshold": (0.01, 1),
    "quarantine_failures": (1, 10_000), "quarantine_window_s": (1, 30 * DAY), "deliveries_per_fs": (1, 1000),
    "locate_batch": (1, 100_000), "locate_attempts": (1, 1000), "locate_backoff_s": (1, DAY),
    "job_deadline_floor_s": (60, 30 * DAY), "job_deadline_factor": (1, 100),
}


def bounded(name):
    low, high = CONTROL_BOUNDS[name]
    return [MinValueValidator(low), MaxValueValidator(high)]


def _finite(value):
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def validate_policy_params(value):
    """The policies' parameters: an object; the ones the shipped policies read, in range."""
    if not isinstance(value, dict):
        raise ValidationError("policy parameters must be a JSON object, e.g. {\"slider_age_weight\": 0.5}")
    if not _finite(value):
        # Python's JSON reader takes NaN and 1e999 (infinity), which JSON has not: the database
        # refused the row (a 500 in the admin, a traceback in simulate --set).
        raise ValidationError("policy parameters must hold finite numbers only (not NaN, Infinity or 1e999)")
    weight = value.get("slider_age_weight", 0.5)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 1:
        raise ValidationError(f"slider_age_weight must be a number from 0 to 1, not {weight!r}")


class Control(Singleton):
    """The one row operators edit to steer the loop; read at every cycle, so a change applies
    at the next one without a restart."""

    sort_policy = models.CharField(max_length=64, default="TAPEID")
    share_policy = models.CharField(max_length=64, default="GRPW")
    policy_params = models.JSONField(default=dict, blank=True, validators=[validate_policy_params])
    files_per_job = models.PositiveIntegerField("files per job (N)", validators=bounded("files_per_job"), default=100)
    jobs_in_flight = models.PositiveIntegerField(
        "jobs in flight (K)", validators=bounded("jobs_in_flight"), default=50,
        help_text="N × K requests at most are planned or at the stager; the rest wait here, where the policies "
                  "can still reorder them.")
    choose_per_cycle = models.PositiveIntegerField(
        "requests chosen per cycle", validators=bounded("choose_per_cycle"), default=750,
        help_text="Bounds one cycle's work; a window emptied at once refills over a few cycles.")
    drives = models.PositiveSmallIntegerField(
        "drives to plan for", validators=bounded("drives"), default=0,
        help_text="0: as many as the stager reports. With a count, each drive gets a chain of mounts, the next "
                  "sent when the previous is done; a stager that reports none and no count here: no plan, every "
                  "job goes out at once.")
    short_mount_s = models.FloatField(
        "short mount (s)", validators=bounded("short_mount_s"), default=900.0,
        help_text="A planned mount estimated shorter than this goes before the long ones of its drive.")
    preempt_after_s = models.FloatField(
        "preempt after (s)", validators=bounded("preempt_after_s"), default=120.0,
        help_text="A short mount waiting this long behind a long one cuts it: the long one's unread files "
                  "resume on the same drive after it. 0: never.")
    preempt_gap_s = models.FloatField("at most one preemption per (s)", validators=bounded("preempt_gap_s"),
                                      default=300.0)
    cycle_s = models.FloatField("cycle period (s)", validators=bounded("cycle_s"), default=10.0)
    default_user_cap = models.PositiveIntegerField(
        "default requests in flight per user", validators=bounded("default_user_cap"), default=2500)
    default_group_cap = models.PositiveIntegerField(
        "default requests in flight per group", validators=bounded("default_group_cap"), default=5000)
    default_queued_ceiling = models.PositiveIntegerField(
        "default queued requests per user", validators=bounded("default_queued_ceiling"), default=500_000)
    max_wait_s = models.FloatField("maximum wait (s)", validators=bounded("max_wait_s"), default=4 * 3600.0,
                                   help_text="A request queued this long goes first, whatever its tape or policy.")
    mount_min_files = models.PositiveIntegerField("worth mounting: files (M)", validators=bounded("mount_min_files"),
                                                  default=1,
                                                  help_text="A tape goes out once it has this many files queued ...")
    mount_min_bytes = models.BigIntegerField("worth mounting: bytes (B)", validators=bounded("mount_min_bytes"),
                                             default=0,
                                             help_text="... or this many bytes ...")
    mount_max_wait_s = models.FloatField(
        "worth mounting: wait (T, s)", validators=bounded("mount_max_wait_s"), default=900.0,
        help_text="... or its oldest request has waited this long. Also frees a run the wear rules below hold back.")
    # Mounts worth their wear (issue 23; carousel/loop/wear.py, applied by the mount planner).
    # Defaults: CTA's mount criteria (500 GB or 10,000 files), ENDIT's two hours before a tape
    # is mounted again; mount_max_wait_s above bounds what either holds back (docs/benchmarks.md).
    min_mount_files = models.PositiveIntegerField(
        "wear: least files a mount", validators=bounded("min_mount_files"), default=10_000,
        help_text="A mount starts for at least this many files or the bytes below, unless its oldest request "
                  "waited the wait T above or it is of priority 1 or more; only while a bigger run can use the "
                  "drive, never leaving a drive idle. 0 here or in the bytes: off.")
    min_mount_bytes = models.BigIntegerField(
        "wear: least bytes a mount", validators=bounded("min_mount_bytes"), default=500 * 10**9,
        help_text="... or at least this many bytes.")
    remount_delay_s = models.FloatField(
        "wear: remount delay (s)", validators=bounded("remount_delay_s"), default=7200.0,
        help_text="A tape is not mounted again this soon after its last unmount, unless a request on it waited "
                  "the wait T above; only while other work can use the drive. 0: off.")
    retry_cycle_s = models.FloatField("retry cycle (s)", validators=bounded("retry_cycle_s"), default=600.0,
                                      help_text="Transient failures wait this long, then retry together.")
    max_attempts = models.PositiveSmallIntegerField("attempts before failing", validators=bounded("max_attempts"),
                                                    default=5,
                                                    help_text="Transient failures (stager, drive) per request.")
    max_delivery_attempts = models.PositiveSmallIntegerField(
        "delivery attempts before failing", validators=bounded("max_delivery_attempts"), default=3)
    stall_after_s = models.FloatField("stalled after (s)", validators=bounded("stall_after_s"), default=1800.0,
                                      help_text="Jobs in flight with no progress for this long: the stager is "
                                                "stalled, submission stops until progress returns.")
    failure_ratio = models.FloatField("halve on failure ratio", validators=bounded("failure_ratio"), default=0.5,
                                      help_text="When more than this fraction of a cycle's results are failures, "
                                                "the jobs in flight are halved.")
    disk_threshold = models.FloatField("disk buffer threshold", validators=bounded("disk_threshold"), default=0.9,
                                       help_text="New jobs go out only while the stager's disk buffer, with what "
                                                 "is already on its way, stays below this fraction.")
    quarantine_failures = models.PositiveSmallIntegerField(
        "quarantine after failures", validators=bounded("quarantine_failures"), default=3,
        help_text="Failures on one tape within the quarantine window that quarantine it.")
    quarantine_window_s = models.FloatField("quarantine window (s)", validators=bounded("quarantine_window_s"),
                                            default=3600.0)
    deliveries_per_fs = models.PositiveSmallIntegerField(
        "deliveries per file system", validators=bounded("deliveries_per_fs"), default=4,
        help_text="Copies to one destination file system at once, so restores don't overload it.")
    locate_batch = models.PositiveIntegerField(
        "paths per locate call", validators=bounded("locate_batch"), default=5000,
        help_text="Paths asked of the stager in one call. A cycle calls until every new request is "
                  "located, up to the largest submission's worth, so a burst is shared out whole.")
    locate_attempts = models.PositiveSmallIntegerField(
        "locate attempts", validators=bounded("locate_attempts"), default=20,
        help_text="A file the stager cannot place on a tape (\"try later\", or no answer) this many times fails.")
    locate_backoff_s = models.FloatField(
        "locate backoff (s)", validators=bounded("locate_backoff_s"), default=60.0,
        help_text="Such a file is asked about again after this long, doubled after each answer up to 64 times.")
    job_deadline_floor_s = models.FloatField(
        "job deadline at least (s)", validators=bounded("job_deadline_floor_s"), default=6 * 3600.0,
        help_text="A job still at the stager this long after it was sent (or its estimate times the factor below, "
                  "when longer) is asked about once more, then given up: its unfinished files go back to the queue "
                  "and its drive's chain goes on.")
    job_deadline_factor = models.FloatField(
        "job deadline: times its estimate", validators=bounded("job_deadline_factor"), default=4.0)
    paused = models.BooleanField("submission paused", default=False)
    last_cycle_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_cycle_error = models.TextField(blank=True, editable=False)

    class Meta:
        verbose_name = "control"
        verbose_name_plural = "control"
        constraints = [models.CheckConstraint(condition=Q(id=1), name="control_is_singleton"), *[
            models.CheckConstraint(condition=Q(**{f"{name}__gte": low, f"{name}__lte": high}),
                                   name=f"control_{name}_in_range") for name, (low, high) in CONTROL_BOUNDS.items()]]

    def __str__(self):
        return "Carousel control"


class HealthState(models.TextChoices):
    HEALTHY = "healthy"
    STALLED = "stalled"  # reachable, but jobs in flight make no progress
    DOWN = "down"  # unreachable


class StagerHealth(Singleton):
    """What the loop has judged of the stager, written by the loop only (one row)."""

    state = models.CharField(max_length=16, choices=HealthState.choices, default=HealthState.HEALTHY)
    reason = models.TextField(blank=True)
    since = models.DateTimeField(null=True, blank=True)
    jobs_limit = models.PositiveIntegerField("jobs in flight now", null=True, blank=True,
                                             help_text="The adaptive limit; empty: K from the control row.")
    healthy_limit = models.PositiveIntegerField("last healthy limit", null=True, blank=True,
                                                help_text="Restored at once when an outage or stall ends.")
    last_progress_at = models.DateTimeField(null=True, blank=True)
    probes = models.PositiveIntegerField(default=0, help_text="Probes since the stager went down or stalled.")
    disk_free_bytes = models.BigIntegerField(null=True, blank=True)
    disk_total_bytes = models.BigIntegerField(null=True, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    preempted_at = models.DateTimeField("last preemption", null=True, blank=True)
    # What the stager last reported of itself (status(): drives, queues, disk), recorded by the
    # loop each cycle it reaches the stager, so pages never call the stager in a web request.
    status = models.JSONField(default=dict, blank=True)
    status_at = models.DateTimeField("status reported at", null=True, blank=True)

    class Meta:
        verbose_name = "stager health"
        verbose_name_plural = "stager health"
        constraints = [models.CheckConstraint(condition=Q(id=1), name="stagerhealth_is_singleton")]

    def __str__(self):
        return f"stager {self.state}"


class Account(models.Model):
    """Per-user limits. Empty limits fall back to the control row's defaults; a privileged
    user is simply given larger numbers here."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="account")
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL,
                              help_text="The group whose share this user's requests draw on.")
    inflight_cap = models.PositiveIntegerField(null=True, blank=True,
                                               help_text="Most requests in flight at once (empty: default).")
    queued_ceiling = models.PositiveIntegerField(null=True, blank=True,
                                                 help_text="Most active requests at once (empty: default).")
    acts_for_others = models.BooleanField(
        "service account", default=False,
        help_text="May name the user a submission is for (on_behalf_of): XRootD hooks, FTS-like services. "
                  "The request then counts against that user's caps and shares.")

    def __str__(self):
        return f"limits of {self.user}"


class GroupShare(models.Model):
    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="share")
    weight = models.FloatField(default=1.0, help_text="Relative share under weighted sharing (GRPW).")
    inflight_cap = models.PositiveIntegerField(null=True, blank=True,
                                               help_text="Most requests in flight for the group (empty: default).")
    # Drive allocation, as ERADAT and TReqS have it (carousel/loop/plan.py): drives the group gets
    # first whenever it has work, and the most it may hold at once. Between the two it
    # borrows drives nobody else needs and gives them back at its next mount boundary.
    reserved_drives = models.PositiveIntegerField(
        default=0, help_text="Drives this group gets first whenever it has work (0: none reserved).")
    max_drives = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most drives this group may hold at once (empty: no limit).")

    class Meta:
        # At most an activity's largest weight: 1e300 was taken, and two such groups' weights add
        # up to infinity in the sharing policy's arithmetic.
        constraints = [models.CheckConstraint(condition=Q(weight__gt=0, weight__lte=1e6), name="groupshare_weight_positive",
                                              violation_error_message="The weight must be greater than 0 and at most "
                                                                      "1,000,000."),
                       models.CheckConstraint(condition=Q(max_drives__isnull=True) | Q(max_drives__gte=F("reserved_drives")),
                                              name="groupshare_max_drives_covers_reserved",
                                              violation_error_message="The most drives cannot be below the reserved "
                                                                      "drives.")]

    def __str__(self):
        return f"share of {self.group}"

    def clean(self):
        # 0 was stored and read as 1 (selectors/drives.py: a most below 1 counts as 1).
        if self.max_drives == 0:
            raise ValidationError({"max_drives": "At least 1 (leave it empty for no limit)."})


# The activity a request names when it names none, or one its group's table does not know.
DEFAULT_ACTIVITY = "default"


class Activity(models.Model):
    """What an activity (FTS's and Rucio's `activity`, the native API's and the CLI's) means to
    the scheduler: the priority its requests get and its weight in its group's share of drive
    time. A row names a group, or none: then it applies to every group without its own row of
    that name. The row named "default" is what a request without an activity, or with one no row
    names, gets (carousel/domain/activities.py)."""

    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="activities",
                              help_text="Empty: every group that has no row of this name.")
    name = models.CharField(max_length=128, help_text=f'As clients send it (e.g. "Express", "Staging"); '
                                                      f'"{DEFAULT_ACTIVITY}": the group\'s default.')
    priority = models.PositiveSmallIntegerField(
        default=0, validators=[MaxValueValidator(3)],
        help_text="0 to 3; within a group, the activities of the highest priority with work take its whole share.")
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(1e-6), MaxValueValidator(1e6)],
                               help_text="Its part of the group's drive time against the group's other activities "
                                         "of the same priority with work.")

    class Meta:
        verbose_name_plural = "activities"
        ordering = ["group__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["group", "name"], condition=Q(group__isnull=False),
                                    name="activity_group_name",
                                    violation_error_message="This group already has an activity of that name."),
            models.UniqueConstraint(fields=["name"], condition=Q(group__isnull=True), name="activity_global_name",
                                    violation_error_message="An activity of that name for every group exists already."),
            models.CheckConstraint(condition=Q(weight__gt=0, weight__lte=1e6), name="activity_weight_positive",
                                   violation_error_message="The weight must be greater than 0 and at most 1,000,000."),
            models.CheckConstraint(condition=Q(priority__lte=3), name="activity_priority_0_to_3",
                                   violation_error_message="The priority is 0 to 3."),
        ]

    def __str__(self):
        return f"{self.name} ({self.group or 'every group'})"

    def clean(self):
        # Clients' names are looked up stripped (carousel/domain/activities.py), and a client's
        # name with a control character is refused (services.restore_submit): such a row could
        # never match a request.
        self.name = (self.name or "").strip()
        if self.name and not self.name.isprintable():
            raise ValidationError({"name": "Printable characters only, as clients' activity names are."})


class UnknownActivity(models.Model):
    """An activity clients sent that no Activity row names for the group: its requests got the
    group's default. Listed for the operator, who may add it to the table; recorded at most once
    an hour per (group, name) and process (carousel/domain/activities.py), not per request."""

    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=128)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        verbose_name_plural = "unknown activities"
        ordering = ["-last_seen"]
        constraints = [
            models.UniqueConstraint(fields=["group", "name"], condition=Q(group__isnull=False),
                                    name="unknownactivity_group_name"),
            models.UniqueConstraint(fields=["name"], condition=Q(group__isnull=True),
                                    name="unknownactivity_ungrouped_name"),
        ]

    def __str__(self):
        return f"{self.name} ({self.group or 'no group'})"


class Tape(models.Model):
    label = models.CharField(max_length=64, unique=True)
    media = models.CharField(max_length=32, blank=True)
    used_bytes = models.BigIntegerField(null=True, blank=True)
    quarantined_at = models.DateTimeField(null=True, blank=True)
    quarantine_reason = models.TextField(blank=True)
    # Failures counted in the current window; reset when the window passes or a file is read.
    recent_failures = models.PositiveIntegerField(default=0)
    failures_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["id"], name="tape_quarantined", condition=Q(quarantined_at__isnull=False))]

    def __str__(self):
        return self.label


# The counters kept by database triggers (migrations/0002_triggers.py, 0008_counter_deltas.py) are
# appended, never updated: each statement that changes requests adds its delta rows (a *Delta
# model), which nobody else writes, so two transactions never wait for each other on a counter
# nor deadlock on one. The cycle folds the deltas into one base row per key from time to time
# (carousel/domain/counters.py), so a read sums a few rows per key. The models the code reads
# (UserBacklog, StateCount, ...) are views over their deltas, summed per key: read-only.


class BacklogColumns(models.Model):
    files = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)

    class Meta:
        abstract = True


class CounterDelta(models.Model):
    """A delta row (folded=False, appended by a trigger) or a key's base row (folded=True,
    written only by the fold)."""

    folded = models.BooleanField(db_default=False)

    class Meta:
        abstract = True


class UserBacklog(BacklogColumns):
    """How many located requests a user has queued: kept by a database trigger, so the
    scheduler reads who has work without counting a million rows."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.DO_NOTHING,
                                db_constraint=False, related_name="backlog")

    class Meta:
        managed = False  # a view of UserBacklogDelta


class UserBacklogDelta(BacklogColumns, CounterDelta):
    user_id = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user_id"], condition=Q(folded=True),
                                               name="userbacklogdelta_base")]
        indexes = [models.Index(fields=["user_id"], condition=Q(folded=False), name="userbacklogdelta_new")]


class TapeBacklog(BacklogColumns):
    """Located queued requests per (user, tape), kept by the same trigger."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, db_constraint=False,
                             db_index=False)
    tape = models.ForeignKey(Tape, on_delete=models.DO_NOTHING, db_constraint=False, related_name="backlog")

    class Meta:
        managed = False  # a view of TapeBacklogDelta


class TapeBacklogDelta(BacklogColumns, CounterDelta):
    user_id = models.BigIntegerField()
    tape_id = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user_id", "tape_id"], condition=Q(folded=True),
                                               name="tapebacklogdelta_base")]
        indexes = [models.Index(fields=["user_id", "tape_id"], condition=Q(folded=False),
                                name="tapebacklogdelta_new"),
                   models.Index(fields=["tape_id"], name="tapebacklogdelta_tape")]


class UserStateCount(BacklogColumns):
    """How many requests a user has in each state, and their known bytes: kept by database
    triggers on every insert, update and delete of a request, so a poll of a user's summary
    reads a few rows however large the user's queue. A key summing to zero is dropped when
    folded (a deleted user leaves none behind)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, db_constraint=False,
                             db_index=False, related_name="state_counts")
    state = models.CharField(max_length=16, choices=RequestState.choices)

    class Meta:
        managed = False  # a view of UserStateCountDelta


class UserStateCountDelta(BacklogColumns, CounterDelta):
    user_id = models.BigIntegerField()
    state = models.CharField(max_length=16)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user_id", "state"], condition=Q(folded=True),
                                               name="userstatecountdelta_base")]
        indexes = [models.Index(fields=["user_id", "state"], condition=Q(folded=False),
                                name="userstatecountdelta_new")]


class FileLocation(models.Model):
    """Where a file lies on tape, as the stager's locate() reported it."""

    path = models.TextField()
    path_key = models.UUIDField(unique=True)
    tape = models.ForeignKey(Tape, on_delete=models.CASCADE, related_name="files")
    position = models.BigIntegerField(help_text="Byte offset from the beginning of the tape.")
    size = models.BigIntegerField()
    located_at = models.DateTimeField()

    def __str__(self):
        return self.path


class TapeMapEntry(models.Model):
    """A site's map of files to tapes (`manage.py load-tape-map`, carousel/domain/tapemap.py),
    for backends that do not say where a file is (Tape REST): the locating step takes a file's
    tape from here when the stager's answer names none."""

    path = models.TextField()
    path_key = models.UUIDField(unique=True)
    tape = models.CharField(max_length=64)
    media = models.CharField(max_length=32, blank=True)
    position = models.BigIntegerField(null=True, blank=True, help_text="Byte offset on the tape, when known.")
    size = models.BigIntegerField(null=True, blank=True)
    # The map's own order (line order of the loads, later loads after earlier ones): a tape's
    # files are read in it when no position is known.
    ordinal = models.BigIntegerField()
    loaded_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "tape map"

    def __str__(self):
        return self.path


class WantedLocation(models.Model):
    """A path someone asked the whereabouts of (Tape REST archiveinfo) that the stager did not
    answer within the call: the loop's locating step asks for it (carousel/loop/locating.py),
    records what it learns as a FileLocation and drops the row."""

    path = models.TextField()
    path_key = models.UUIDField(unique=True)
    wanted_at = models.DateTimeField(help_text="When it was first asked for; dropped a day later unanswered.")
    asked_at = models.DateTimeField(null=True, help_text="When the loop last asked the stager (never: first in line).")

    def __str__(self):
        return self.path


class Bulk(models.Model):
    """The requests of one submission, under one id (the shape of a WLCG stage request)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="bulks")
    created_at = models.DateTimeField()
    files = models.PositiveIntegerField()
    created = models.PositiveIntegerField(help_text="Requests this submission created.")
    notify = models.BooleanField(default=False)
    notified_at = models.DateTimeField(null=True, blank=True)
    # When its owner (or their service) cancelled it: its requests are cancelled unless another
    # submission not cancelled still asks for them (services.bulk_cancel).
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # The client's own name for the submission: XRootD's prepare request id, so that a later
    # query or cancel with that id finds it.
    label = models.CharField(max_length=255, blank=True, default="")
    # The service account that submitted it for `user` (on_behalf_of); it may follow it too.
    submitter = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                  related_name="+", db_index=False)
    # The Tape REST door's targetedMetadata as sent (Rucio's "default" and this site's key), and
    # the activity named there or in the native API, as sent.
    metadata = models.JSONField(default=dict, blank=True)
    activity = models.CharField(max_length=128, blank=True)
    # The activity its requests draw on: `activity` if the Activity table names it for the
    # group, else "default" (carousel/domain/activities.py); the intake's move copies it.
    resolved_activity = models.CharField(max_length=128, default=DEFAULT_ACTIVITY, db_default=DEFAULT_ACTIVITY)
    # A big submission's new files wait in the intake (Intake rows) until the mover queues
    # them, with the options below, moments after the answer (carousel/domain/intake.py).
    pending = models.PositiveIntegerField(default=0, help_text="New files still in the intake, not yet queued.")
    # Whether its requests' paths are in the path filter's index (PathSearch). A big submission's
    # are added after the move that queues them, in a transaction of their own.
    paths_searchable = models.BooleanField(default=True, db_default=True)
    priority = models.PositiveSmallIntegerField(default=0)
    destination = models.CharField(max_length=4096, blank=True, default="")
    destination_layout = models.CharField(max_length=8, choices=DestinationLayout.choices,
                                          default=DestinationLayout.PATH, db_default=DestinationLayout.PATH)
    deadline = models.DateTimeField(null=True, blank=True)
    pin_lifetime = models.DurationField(null=True, blank=True)
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                              db_index=False)

    class Meta:
        # Every page, the API's texts and the CLI say "submission"; the model keeps its name.
        verbose_name = "submission"
        verbose_name_plural = "submissions"
        indexes = [models.Index(fields=["user", "-created_at"]),
                   models.Index(fields=["label"], name="bulk_label", condition=~Q(label="")),
                   # The loop's completion notices look only at submissions still to be told.
                   models.Index(fields=["created_at"], name="bulk_notify_pending",
                                condition=Q(notify=True, notified_at__isnull=True)),
                   # The mover and a user's next submission find what still waits in the intake.
                   models.Index(fields=["user", "created_at"], name="bulk_intake_pending", condition=Q(pending__gt=0)),
                   # The path filter reads the few submissions whose paths are not indexed yet.
                   models.Index(fields=["created_at"], name="bulk_paths_unsearchable",
                                condition=Q(paths_searchable=False))]

    def __str__(self):
        return str(self.id)


class JobState(models.TextChoices):
    PENDING = "pending"  # committed, not yet acknowledged by the stager
    SENT = "sent"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED_JOB_STATES = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


class Job(models.Model):
    """A batch of requests sent to the stager. Its id exists before it is sent, so sending is
    idempotent on it and a crash between commit and acknowledgement can be reconciled."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tape = models.ForeignKey(Tape, null=True, blank=True, on_delete=models.SET_NULL)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    backend_id = models.CharField(max_length=128, blank=True)
    files = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    # The policies' order among the jobs of one cycle: they are sent in it.
    rank = models.PositiveIntegerField(default=0)
    # The mount plan (carousel/loop/plan.py): the drive chain the job is on, the job it is sent
    # after (once that one is finished), and its mount's estimated drive time.
    chain = models.CharField(max_length=32, blank=True)
    after = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    estimate_s = models.FloatField(default=0.0)
    # A short mount put before the long ones of its chain: it may cut the one on the drive.
    jumps_queue = models.BooleanField(default=False)
    # The group whose drive time the mount is (most of its requests'): drive allocation.
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    sent_at = models.DateTimeField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)
    overdue_at = models.DateTimeField(null=True, blank=True,
                                      help_text="When the loop found it past its deadline (given up a cycle later).")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state"], name="job_open", condition=Q(state__in=["pending", "sent"])),
                   # The live page's mounts per hour read the jobs of the last hours.
                   models.Index(fields=["sent_at"], name="job_sent_at")]

    def __str__(self):
        return f"job {self.id}"


class StagerCall(models.Model):
    """A call the stager must receive: withdraw files from a job (a cancel, an expiry, a job
    given up) or release staged copies (a pin's end). Written in the same transaction as the
    change that needs it, sent by the loop (carousel/loop/withdrawals.py) and kept until the stager
    confirms, so a stager that is down or fails a call only delays it."""

    class Kind(models.TextChoices):
        CANCEL = "cancel"
        RELEASE = "release"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    backend_id = models.CharField(max_length=128, help_text="The stager's id of the job that holds the files.")
    paths = models.JSONField()
    created_at = models.DateTimeField()
    next_at = models.DateTimeField(help_text="Not sent before this (retries back off).")
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["next_at", "id"], name="stagercall_due")]

    def __str__(self):
        return f"{self.kind} {len(self.paths)} file(s) of {self.backend_id}"


class RestoreRequest(models.Model):
    """One file for one user."""

    # Indexed by (user, state) below. The user, group and submission (bulk) are checked by
    # statement triggers on PostgreSQL, not by constraints: a constraint checks each row at the
    # commit, about 2 s of a 100,000-file move for the three (migration 0014_request_refs).
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="restore_requests",
                             db_index=False, db_constraint=False)
    # Unindexed foreign keys: the scheduler's partial indexes below serve the reads, and every
    # index costs each claim and each of the 100,000 rows of a large submission.
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, db_index=False,
                              db_constraint=False)
    path = models.TextField()
    path_key = models.UUIDField()
    size = models.BigIntegerField(null=True, blank=True)
    tape = models.ForeignKey(Tape, null=True, blank=True, on_delete=models.SET_NULL, related_name="requests",
                             db_index=False)
    position = models.BigIntegerField(null=True, blank=True)
    priority = models.PositiveSmallIntegerField(default=0)
    # The activity whose share of its group's drive time the request draws on: a name of the
    # Activity table, or "default" (unknown names are resolved at submission).
    activity = models.CharField(max_length=128, default=DEFAULT_ACTIVITY, db_default=DEFAULT_ACTIVITY)
    # A directory: the file is delivered under it (carousel/domain/paths.py, delivery_target).
    destination = models.TextField(blank=True)
    # db_default: added without rewriting the table.
    destination_layout = models.CharField(max_length=8, choices=DestinationLayout.choices,
                                          default=DestinationLayout.PATH, db_default=DestinationLayout.PATH)
    deadline = models.DateTimeField(null=True, blank=True, help_text="Unfinished after this: expired.")
    pin_lifetime = models.DurationField(null=True, blank=True,
                                        help_text="How long the restored copy must stay on disk.")
    pin_until = models.DateTimeField(null=True, blank=True,
                                     help_text="The restored copy is pinned on the stager's disk until then "
                                               "(carousel/domain/pins.py); empty: no pin, or it has ended.")
    state = models.CharField(max_length=16, choices=RequestState.choices, default=RequestState.QUEUED)
    attempts = models.PositiveSmallIntegerField(default=0)
    error_class = models.CharField(max_length=16, choices=ErrorClass.choices, blank=True, default="")
    last_error = models.TextField(blank=True)
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="requests")
    # A request served from another request's pinned copy (carousel/domain/ondisk.py) is in no
    # job, and one done by another job's stage (waiting to retry, queued: loop/progress.py) is
    # not in that job: this names the job whose stage made the copy, so whichever pin ends last
    # has the stager release it (pins.py). Not a foreign key: retention prunes jobs freely.
    copy_job = models.UUIDField(null=True, blank=True, help_text="The job whose restored copy this request was "
                                                                 "served from (a file already on disk).")
    # The file's place in its job: the read order the sorting policy chose, which the stager
    # must receive as it is (db_default: submission's COPY does not name it).
    job_rank = models.PositiveIntegerField(db_default=0)
    # The submission that created the request, on the row itself: a large submission writes
    # no second row per file. A later submission asking for the same file again (same user,
    # still active) lists it with a BulkItem.
    bulk = models.ForeignKey(Bulk, null=True, blank=True, on_delete=models.SET_NULL, db_index=False,
                             related_name="created_requests", db_constraint=False)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    retry_at = models.DateTimeField(null=True, blank=True)
    # db_default: submission writes rows by COPY with the columns it knows.
    staged_path = models.TextField(blank=True, db_default="", help_text="Where the stager put the file, for delivery.")
    delivery_fs = models.CharField(max_length=255, blank=True, db_default="",
                                   help_text="The destination's file system.")
    delivery_started_at = models.DateTimeField(null=True, blank=True)
    delivery_attempts = models.PositiveSmallIntegerField(db_default=0)
    # Locates answered "try later" (or not answered), and when to ask again; empty until then
    # (nullable: added to a large table without rewriting it).
    locate_attempts = models.PositiveSmallIntegerField(null=True, blank=True)
    locate_after = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "path_key"], condition=Q(state__in=ACTIVE_STATES),
                                    name="one_active_request_per_user_and_file"),
            models.CheckConstraint(condition=Q(priority__lte=3), name="request_priority_0_to_3",
                                   violation_error_message="The priority is 0 to 3."),
            models.CheckConstraint(condition=Q(state__in=RequestState.values), name="request_state_known"),
            # Each state carries the timestamps it implies.
            models.CheckConstraint(condition=Q(state__in=TERMINAL_STATES, finished_at__isnull=False)
                                   | (~Q(state__in=TERMINAL_STATES) & Q(finished_at__isnull=True)),
                                   name="request_finished_iff_terminal"),
            models.CheckConstraint(condition=~Q(state__in=IN_FLIGHT_STATES)
                                   | Q(submitted_at__isnull=False, job__isnull=False),
                                   name="request_in_flight_has_job"),
            models.CheckConstraint(condition=~Q(state=S.STAGING) | Q(started_at__isnull=False),
                                   name="request_staging_has_started_at"),
            models.CheckConstraint(condition=~Q(state=S.RETRY) | Q(retry_at__isnull=False),
                                   name="request_retry_has_retry_at"),
            models.CheckConstraint(condition=~Q(state=S.DONE) | Q(error_class=""),
                                   name="request_done_has_no_error"),
        ]
        indexes = [
            models.Index(fields=["path_key"], name="request_active_path",
                         condition=Q(state__in=ACTIVE_STATES)),
            # A user's requests in a state, newest first (the API's list); the oldest active
            # one (the summary: one probe per active state).
            models.Index(fields=["user", "state", "created_at"], name="request_user_state_age"),
            # The list's tape filter. Partial: a submission's new rows have no tape yet, so
            # they cost this index nothing.
            models.Index(fields=["tape", "user"], name="request_tape", condition=Q(tape__isnull=False)),
            models.Index(fields=["bulk"], name="request_bulk", condition=Q(bulk__isnull=False)),
            models.Index(fields=["deadline"], name="request_active_deadline",
                         condition=Q(deadline__isnull=False, state__in=ACTIVE_STATES)),
            models.Index(fields=["retry_at"], name="request_retry_due", condition=Q(state=S.RETRY)),
            # Retention prunes finished requests oldest first, a batch at a time.
            models.Index(fields=["finished_at"], name="request_finished", condition=Q(state__in=TERMINAL_STATES)),
            models.Index(fields=["pin_until"], name="request_pin_due", condition=Q(pin_until__isnull=False)),
            # A file's live pins (a new request is served from a pinned copy; a release asks
            # whether another pin holds the copy). Partial: only done requests with a pin.
            models.Index(fields=["path_key", "pin_until"], name="request_pinned_path",
                         condition=Q(pin_until__isnull=False)),
            # The requests served from a job's copy: retention keeps a job they name (its release
            # is still to be sent when their pins end).
            models.Index(fields=["copy_job"], name="request_copy_job", condition=Q(copy_job__isnull=False)),
            models.Index(fields=["delivery_fs", "delivery_started_at"], name="request_delivering",
                         condition=Q(state=S.DELIVERING)),
            models.Index(fields=["created_at"], name="request_unlocated",
                         condition=Q(state=S.QUEUED, tape__isnull=True)),
            # The locate step's two queues: new requests, oldest first; those asked before, by due time.
            models.Index(fields=["created_at", "id"], name="request_locate_new",
                         condition=Q(state=S.QUEUED, tape__isnull=True, locate_attempts__isnull=True)),
            models.Index(fields=["locate_after"], name="request_locate_again",
                         condition=Q(state=S.QUEUED, tape__isnull=True, locate_attempts__isnull=False)),
            # The scheduler's reads, each bounded by what it takes (policies/selection.py).
            models.Index(fields=["user"], name="request_in_flight", condition=Q(state__in=IN_FLIGHT_STATES)),
            models.Index(fields=["user", "created_at", "id"], name="request_ready_user_age", condition=READY),
            models.Index(fields=["user", "tape", "position"], name="request_ready_user_tape", condition=READY),
            models.Index(fields=["tape", "created_at"], name="request_ready_tape_age", condition=READY),
            models.Index(fields=["user", "-priority", "created_at"], name="request_ready_user_priority",
                         condition=READY & Q(priority__gt=0)),
            # A user's queue per activity (policies/selection.py: which activities a user has
            # ready, each one's oldest).
            models.Index(fields=["user", "activity", "created_at", "id"], name="request_ready_lane_age",
                         condition=READY),
        ]

    def __str__(self):
        return f"{self.path} for {self.user_id} ({self.state})"


class RetryQueue(RestoreRequest):
    """The requests waiting for their retry time, as the admin lists them."""

    class Meta:
        proxy = True
        verbose_name = "retry queue entry"
        verbose_name_plural = "retry queue"


class BulkItem(models.Model):
    """Membership of a request in a submission that did not create it: the request was asked
    for again in a later submission (same user, still active) and belongs to both. The
    creating submission is RestoreRequest.bulk."""

    bulk = models.ForeignKey(Bulk, on_delete=models.CASCADE, related_name="items", db_index=False)
    request = models.ForeignKey(RestoreRequest, on_delete=models.CASCADE, related_name="bulk_items")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["bulk", "request"], name="bulkitem_unique")]


class Intake(models.Model):
    """A new file of a big submission, accepted and durable, not yet a RestoreRequest. The POST
    writes these narrow rows (one COPY, one index) and answers; carousel/domain/intake.py moves them into
    the queue, where each row enters the scheduler's indexes, triggers and foreign keys. No
    foreign key constraint in the database: the mover and Django's cascade from Bulk are the only
    writers, and a check per row would cost the POST what the intake saves."""

    pk = models.CompositePrimaryKey("bulk", "n")
    bulk = models.ForeignKey(Bulk, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False)
    n = models.PositiveIntegerField(help_text="The file's place among the submission's new files.")
    path = models.TextField()
    path_key = models.UUIDField()


class PathSearch(models.Model):
    """The path filter's index: each request's path, keyed by the request (PostgreSQL: a trigram
    index on it, and triggers that add a request's row when it is inserted and remove it when it
    is deleted; migration 0009). Apart from the request table because a trigram index costs
    each of a big submission's 100,000 new requests about 10 us (a second for the lot), which
    the move from the intake would pay before the files are queued: their rows are added after
    that move instead (carousel/domain/intake.py, index_paths), and until then the filter reads
    the paths of those submissions (Bulk.paths_searchable false) from the request table."""

    request_id = models.BigIntegerField(primary_key=True)
    path = models.TextField()


class Transition(models.Model):
    """One state change of one request. Written by a database trigger on every update of
    RestoreRequest.state, so no code path can change a state without leaving a trace."""

    request = models.ForeignKey(RestoreRequest, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16, choices=RequestState.choices)
    to_state = models.CharField(max_length=16, choices=RequestState.choices)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["at"], name="transition_at")]

    def __str__(self):
        return f"{self.request_id}: {self.from_state} -> {self.to_state}"


class HourlyStatsColumns(models.Model):
    files_done = models.BigIntegerField(default=0)
    bytes_done = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0, help_text="Requests failed or sent to retry.")

    class Meta:
        abstract = True


class HourlyStats(HourlyStatsColumns):
    """Requests finished per hour, kept by a database trigger on every state change (like the
    backlog counters), so the live page's plots read a dozen rows however long the history."""

    hour = models.DateTimeField(primary_key=True)

    class Meta:
        managed = False  # a view of HourlyStatsDelta
        verbose_name_plural = "hourly stats"


class HourlyStatsDelta(HourlyStatsColumns, CounterDelta):
    hour = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hour"], condition=Q(folded=True), name="hourlystatsdelta_base")]
        indexes = [models.Index(fields=["hour"], condition=Q(folded=False), name="hourlystatsdelta_new")]


class PathPrefix(models.Model):
    """A part of the namespace granted to a group: to restore from (read by the shipped path
    authorisation plugin, carousel.domain.authz.GroupPrefixes) or to deliver restored files into
    (destination roots, always checked). Prefixes match whole path components."""

    class Purpose(models.TextChoices):
        RESTORE = "restore", "restore files under it"
        DESTINATION = "destination", "deliver restored files into it"

    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="path_prefixes")
    prefix = models.CharField(max_length=1024, help_text="An absolute path: /star/data covers /star/data/x, "
                                                         "not /star/data2; / covers everything.")
    purpose = models.CharField(max_length=16, choices=Purpose.choices, default=Purpose.RESTORE)

    class Meta:
        verbose_name = "path prefix"
        verbose_name_plural = "path prefixes"
        constraints = [models.UniqueConstraint(fields=["group", "purpose", "prefix"], name="pathprefix_unique")]
        ordering = ["group", "purpose", "prefix"]

    def __str__(self):
        return f"{self.group}: {self.get_purpose_display()} {self.prefix}"

    def clean(self):
        from django.core.exceptions import ValidationError

        from carousel.domain.paths import check_place

        if not self.prefix:
            # Missing, or refused by the field itself (a NUL): that error is the one to show; an
            # "empty path" beside it (the field left unset) said the opposite of what was typed.
            return
        prefix, message = check_place(self.prefix, max_bytes=self._meta.get_field("prefix").max_length)
        if message:
            raise ValidationError({"prefix": message})
        self.prefix = prefix

    def save(self, *args, **kwargs):
        from carousel.domain.paths import check_place

        prefix, message = check_place(self.prefix or "", max_bytes=self._meta.get_field("prefix").max_length)
        if message:
            raise ValueError(f"prefix {self.prefix!r}: {message}")
        self.prefix = prefix
        super().save(*args, **kwargs)


# Rolled-up history (migrations/0002_triggers.py keeps them by database triggers, like the
# backlog counters): never pruned, so usage reports and the metrics' counters outlive the
# requests they count (carousel/ops/retention.py prunes those).

# A request's wait (submission to restored) falls in the first bucket whose bound it does not
# exceed; the last bucket has no bound. Fixed: the rolled-up rows count by these indices, and the
# migration's triggers carry a frozen copy (tests check they agree).
WAIT_BUCKETS_S = (60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 259200, 604800)


class UsageColumns(models.Model):
    day = models.DateTimeField(help_text="Midnight UTC.")
    user_id = models.BigIntegerField()  # no foreign key: a deleted user's usage stays counted
    group_key = models.BigIntegerField()
    requested_files = models.BigIntegerField(db_default=0)
    requested_bytes = models.BigIntegerField(db_default=0)
    restored_files = models.BigIntegerField(db_default=0)
    restored_bytes = models.BigIntegerField(db_default=0)
    failed_transient = models.BigIntegerField(db_default=0)
    failed_permanent = models.BigIntegerField(db_default=0)
    failed_user = models.BigIntegerField(db_default=0)
    failed_delivery = models.BigIntegerField(db_default=0)
    failed_other = models.BigIntegerField(db_default=0)
    retries = models.BigIntegerField(db_default=0, help_text="Transient failures sent to the retry queue.")
    cancelled = models.BigIntegerField(db_default=0)
    expired = models.BigIntegerField(db_default=0)
    wait_sum_s = models.FloatField(db_default=0.0)
    wait_max_s = models.FloatField(db_default=0.0)
    mounts = models.FloatField(db_default=0.0)
    drive_s = models.FloatField(db_default=0.0)

    class Meta:
        abstract = True


class UsageDay(UsageColumns):
    """What one user's requests did in one day (UTC), under one group (group_key: the group's
    id, 0 for none). Requested files count at submission, requested bytes once the size is known
    (on the submission's day); the rest on the day it happened. Days, not hours: a year's
    report reads users x 365 rows. Mounts and drive seconds are a
    job's, shared among the users by their files in it."""

    class Meta:
        managed = False  # a view of UsageDayDelta


class UsageDayDelta(UsageColumns, CounterDelta):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "user_id", "group_key"], condition=Q(folded=True),
                                               name="usagedaydelta_base")]
        indexes = [models.Index(fields=["day", "user_id", "group_key"], condition=Q(folded=False),
                                name="usagedaydelta_new")]


class UsageWaitColumns(models.Model):
    day = models.DateTimeField(help_text="Midnight UTC.")
    user_id = models.BigIntegerField()
    group_key = models.BigIntegerField()
    bucket = models.PositiveSmallIntegerField()
    files = models.BigIntegerField(db_default=0)

    class Meta:
        abstract = True


class UsageWait(UsageWaitColumns):
    """Restored requests per wait bucket (WAIT_BUCKETS_S), per day, user and group."""

    class Meta:
        managed = False  # a view of UsageWaitDelta


class UsageWaitDelta(UsageWaitColumns, CounterDelta):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "user_id", "group_key", "bucket"],
                                               condition=Q(folded=True), name="usagewaitdelta_base")]
        indexes = [models.Index(fields=["day", "user_id", "group_key", "bucket"], condition=Q(folded=False),
                                name="usagewaitdelta_new")]


class StateCountColumns(models.Model):
    state = models.CharField(max_length=16)
    group_key = models.BigIntegerField()
    files = models.BigIntegerField(db_default=0)
    bytes = models.BigIntegerField(db_default=0)

    class Meta:
        abstract = True


class StateCount(StateCountColumns):
    """Active requests per state and group (group_key 0: none), kept by trigger: the metrics
    read a few rows, not a million."""

    class Meta:
        managed = False  # a view of StateCountDelta


class StateCountDelta(StateCountColumns, CounterDelta):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["state", "group_key"], condition=Q(folded=True),
                                               name="statecountdelta_base")]
        indexes = [models.Index(fields=["state", "group_key"], condition=Q(folded=False), name="statecountdelta_new")]


class CounterTotalColumns(models.Model):
    name = models.CharField(max_length=32)
    label = models.CharField(max_length=32, blank=True)
    value = models.BigIntegerField(db_default=0)

    class Meta:
        abstract = True


class CounterTotal(CounterTotalColumns):
    """Monotonic totals since the database was created (the metrics' counters): requests,
    files and bytes restored, failures by class, retries, mounts, drive seconds."""

    class Meta:
        managed = False  # a view of CounterTotalDelta


class CounterTotalDelta(CounterTotalColumns, CounterDelta):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "label"], condition=Q(folded=True),
                                               name="countertotaldelta_base")]
        indexes = [models.Index(fields=["name", "label"], condition=Q(folded=False), name="countertotaldelta_new")]


class CycleBucket(models.Model):
    """The loop's cycle durations as a cumulative histogram (le: upper bound in seconds, the
    last one infinite) written by the worker, read by the web's /metrics."""

    le = models.FloatField(unique=True)
    count = models.BigIntegerField(default=0)
    sum_s = models.FloatField(default=0.0, help_text="On the infinite bucket only: the durations' sum.")
class WlcgIdentity(models.Model):
    """A WLCG token's subject at its issuer, and the Carousel user it is (made on first use)."""

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="wlcg_identity")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "WLCG identity"
        verbose_name_plural = "WLCG identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="wlcgidentity_issuer_subject")]

    def __str__(self):
        return f"{self.subject} at {self.issuer}"


class WlcgGroupMap(models.Model):
    """Which Carousel group a token's `wlcg.groups` entry stands for. Tokens without capability
    scopes are authorised through these groups (and the path-authorisation plugin's table of
    what each group may restore); a token's first mapped group is the one its work is accounted to."""

    issuer = models.CharField(max_length=255, blank=True, help_text="Empty: any trusted issuer.")
    wlcg_group = models.CharField("wlcg.groups entry", max_length=255, help_text="e.g. /atlas/production")
    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="wlcg_groups")

    class Meta:
        verbose_name = "WLCG group mapping"
        constraints = [models.UniqueConstraint(fields=["issuer", "wlcg_group"], name="wlcggroupmap_unique")]

    def __str__(self):
        return f"{self.wlcg_group} -> {self.group}"
