from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from django.conf import settings
from django.db import connections
from django.db.models import CharField, F, Func
from django.utils import timezone
from django.utils.duration import duration_string

from carousel.models import Bulk, DestinationLayout, RequestState, RestoreRequest
from carousel.domain.paths import check_destination
from carousel.domain.selectors.submissions import STEPS, restored_where
from carousel.domain.services import MAX_PIN_LIFETIME, MIN_PIN_LIFETIME

# Ids are PostgreSQL bigints: a larger number names no request, and is refused as input.
MAX_ID = 2**63 - 1


def query_of(request):
    """The query parameters as a plain dict (DRF reads an empty value of a QueryDict as not
    given, and ?until= must be refused, not ignored), each given once: `?state=done&state=failed`
    was read as `state=failed` alone, and listed none of the done ones."""
    repeated = {name: [f"given {len(values)} times: give it once (a list is comma-separated, e.g. "
                       f"{name}=a,b)"] for name, values in request.query_params.lists() if len(values) > 1}
    if repeated:
        raise serializers.ValidationError(repeated)
    return request.query_params.dict()


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, so a misspelt option is not silently ignored."""

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                f"unknown field(s): {', '.join(unknown)}; known: {', '.join(sorted(self.fields))}")
        return attrs


@extend_schema_field({
    "type": "array", "minItems": 1, "maxItems": 100_000,
    "items": {"type": "string", "minLength": 2, "maxLength": 4096, "pattern": "^/[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*[^/]$"},
    "description": "absolute paths of files: no control characters, no '.' or '..' components"})
class PathListField(serializers.ListField):
    """The schema says what the service accepts; the field itself takes any list (see below)."""


class SubmitSerializer(StrictSerializer):
    # Each path is checked by carousel.domain.paths.validate_paths, which reports every bad line at once.
    paths = PathListField(child=serializers.JSONField(), allow_empty=True)
    priority = serializers.IntegerField(min_value=0, max_value=3, default=0)
    destination = serializers.CharField(
        max_length=4096, required=False, allow_blank=True, default="",
        help_text="A directory, under a destination root you may deliver to, that each restored file is "
                  "copied under (see destination_layout); empty: the files stay where the tape system puts "
                  "them. Symbolic links below the root are never followed.")
    destination_layout = serializers.ChoiceField(
        choices=DestinationLayout.choices, default=DestinationLayout.PATH,
        help_text="Where under the destination each file goes: 'path' (the default) by its whole path "
                  "(/star/run1/a.root to DESTINATION/star/run1/a.root), 'name' by its name alone "
                  "(DESTINATION/a.root); two files of one submission delivered to the same place (one name "
                  "twice, with 'name'), or one where another needs a directory (/x/a and /x/a/b), are "
                  "refused (400, listed in errors) and nothing is stored.")
    deadline = serializers.DateTimeField(required=False, allow_null=True, default=None)
    pin_lifetime = serializers.DurationField(required=False, allow_null=True, default=None,
                                             min_value=MIN_PIN_LIFETIME, max_value=MAX_PIN_LIFETIME,
                                             help_text="How long the restored copy stays on disk: "
                                                       "ISO 8601 (PT1H) or seconds; from 1 second to 365 days.",
                                             # DRF's own message names only Django's "[DD] [HH:[MM:]]ss" form.
                                             error_messages={"invalid": "not a duration: give one in ISO 8601, "
                                                             "such as PT12H or P7D, or in seconds, such as 3600."})
    notify = serializers.BooleanField(default=False)
    label = serializers.CharField(max_length=255, required=False, allow_blank=True, default="",
                                  help_text="Your own name for the submission (list bulks with ?label=).")
    on_behalf_of = serializers.CharField(required=False, allow_blank=True, default="", max_length=150,
                                         help_text="Service accounts only: the user the request is for.")
    activity = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=128,
        help_text="The activity the files are for (as FTS sends it, e.g. \"Express\"): the site's activity "
                  "table gives it a priority and a share of your group's drive time; a name the table does "
                  "not know gets your group's default (and is listed for the operators).")

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ['expected a JSON object such as {"paths": ["/a/b"]}']})
        paths = data.get("paths")
        # ListField would run a child field per path: 100,000 of them cost seconds. The list's
        # contents are validated once, in the service.
        rest = {k: v for k, v in data.items() if k != "paths"}
        value = super().to_internal_value({**rest, "paths": []} if isinstance(paths, list) else data)
        value["paths"] = paths
        return value

    def validate_destination(self, value):
        # The form of it here (a field error); whether this user may deliver there, in the service.
        value, message = check_destination(value, max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
        if message:
            raise serializers.ValidationError(message)
        return value

    def validate_label(self, value):
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise serializers.ValidationError("contains a control character")
        return value


class SubmitResultSerializer(serializers.Serializer):
    bulk_id = serializers.UUIDField()
    files = serializers.IntegerField(help_text="distinct paths in the submission")
    created = serializers.IntegerField(help_text="new requests queued")
    existing = serializers.IntegerField(help_text="your requests for these files that were already active")
    shared = serializers.IntegerField(help_text="new requests that joined another user's stage in flight")
    url = serializers.CharField()


class RequestSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    tape = serializers.CharField(source="tape.label", read_only=True, default=None, allow_null=True,
                                 help_text="the tape's label, null until the file is located")
    disk_path = serializers.SerializerMethodField(help_text="Where the restored copy lies on the stager's disk "
                                                            "(done requests whose stager says so); else null.")
    where = serializers.SerializerMethodField(help_text="Where the restored file is (done requests; else null): "
                                                        "the file it was delivered to, or its copy on the stager's "
                                                        "disk, or its own path (used in place); see where_kind.")
    where_kind = serializers.SerializerMethodField(help_text="'delivered', 'disk' or 'in_place' (done requests); "
                                                             "else null.")

    class Meta:
        model = RestoreRequest
        fields = ["id", "path", "user", "state", "priority", "activity", "size", "tape", "position", "destination", "disk_path",
                  "deadline", "pin_lifetime", "attempts", "error_class", "last_error", "job",
                  "created_at", "submitted_at", "started_at", "finished_at", "retry_at", "updated_at",
                  "where", "where_kind", "pin_until"]
        read_only_fields = fields

    def get_disk_path(self, obj) -> str | None:
        return obj.staged_path or None if obj.state == RequestState.DONE else None

    def get_where(self, obj) -> str | None:
        return _where(obj.state, obj.path, obj.staged_path, obj.destination, obj.destination_layout,
                      obj.delivery_fs)[1]

    def get_where_kind(self, obj) -> str | None:
        return _where(obj.state, obj.path, obj.staged_path, obj.destination, obj.destination_layout,
                      obj.delivery_fs)[0]


class OutlookSerializer(serializers.Serializer):
    reasons = serializers.ListField(child=serializers.CharField(), help_text="why not yet, as the pages say it")
    eta_s = serializers.ListField(child=serializers.FloatField(allow_null=True), min_length=2, max_length=2,
                                  allow_null=True, help_text=(
                                      "[earliest, latest] seconds from now until it should be back (latest null: "
                                      "no upper bound yet); null: no basis (not located, or finished)"))
    ahead = serializers.IntegerField(allow_null=True, help_text="about how many files go before it; null: unknown")


class RequestDetailSerializer(RequestSerializer):
    outlook = OutlookSerializer(read_only=True, help_text="where it stands and why not yet, as its page shows")

    class Meta(RequestSerializer.Meta):
        fields = [*RequestSerializer.Meta.fields, "outlook"]
        read_only_fields = fields


def _where(state, path, staged_path, destination, layout, delivery_fs):
    """(kind, place) of a restored file, (None, None) for any other."""
    if state != RequestState.DONE:
        return None, None
    return restored_where(path=path, staged_path=staged_path, destination=destination, destination_layout=layout,
                          delivery_fs=delivery_fs)


# The list of requests is polled all day. A page is read as values() rows and written by
# request_list_data with RequestSerializer's rules, field by field: a model instance per row
# (with its user and tape) and DRF's generic field walk were most of a poll's cost.
# tests/test_list_reads.py checks that both give the same, in UTC and in another time zone.
_REQUEST_DATES = ("deadline", "created_at", "submitted_at", "started_at", "finished_at", "retry_at", "updated_at",
                  "pin_until")
# A timestamptz as DRF writes it in UTC (2026-11-23T18:35:59.860975Z), written by PostgreSQL.
_UTC_TEXT = "to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"


def request_list_values(queryset):
    """The values() rows of `queryset` that request_list_data renders. In UTC on PostgreSQL the
    date-times come as text, formatted by the server: parsing a page's time stamps into aware
    datetimes and writing them back was the largest cost of the page."""
    if connections[queryset.db].vendor == "postgresql" and timezone.get_current_timezone_name() == "UTC":
        dates = {f"shown_{name}": Func(F(name), template=_UTC_TEXT, output_field=CharField())
                 for name in _REQUEST_DATES}
    else:
        dates = {f"shown_{name}": F(name) for name in _REQUEST_DATES}
    return queryset.values("id", "path", "user__username", "state", "priority", "activity", "size", "tape__label", "position",
                           "destination", "destination_layout", "delivery_fs", "staged_path", "pin_lifetime", "attempts",
                           "error_class", "last_error", "job_id", **dates)


def _date_text(value, zone):
    """DateTimeField.to_representation: ISO 8601 in the current time zone, UTC written Z."""
    if value is None:
        return None
    if isinstance(value, str):  # by PostgreSQL, which writes a zero fraction that isoformat() leaves out
        return value[:-8] + "Z" if value.endswith(".000000Z") else value
    text = value.astimezone(zone).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def request_list_data(rows):
    """RequestSerializer(instance).data for the request of each row of request_list_values."""
    zone = timezone.get_current_timezone()
    return [_with_where({
        "id": row["id"],
        "path": row["path"],
        "user": row["user__username"],
        "state": row["state"],
        "priority": row["priority"],
        "activity": row["activity"],
        "size": row["size"],
        "tape": row["tape__label"],
        "position": row["position"],
        "destination": row["destination"],
        "disk_path": row["staged_path"] or None if row["state"] == RequestState.DONE else None,
        "deadline": _date_text(row["shown_deadline"], zone),
        "pin_lifetime": None if row["pin_lifetime"] is None else duration_string(row["pin_lifetime"]),
        "attempts": row["attempts"],
        "error_class": row["error_class"],
        "last_error": row["last_error"],
        "job": row["job_id"],
        "created_at": _date_text(row["shown_created_at"], zone),
        "submitted_at": _date_text(row["shown_submitted_at"], zone),
        "started_at": _date_text(row["shown_started_at"], zone),
        "finished_at": _date_text(row["shown_finished_at"], zone),
        "retry_at": _date_text(row["shown_retry_at"], zone),
        "updated_at": _date_text(row["shown_updated_at"], zone),
    }, row, zone) for row in rows]


def _with_where(data, row, zone):
    data["where_kind"], data["where"] = _where(row["state"], row["path"], row["staged_path"], row["destination"],
                                               row["destination_layout"], row["delivery_fs"])
    data["pin_until"] = _date_text(row["shown_pin_until"], zone)
    return data


class BulkSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Bulk
        fields = ["id", "user", "created_at", "files", "created", "notify", "label"]
        read_only_fields = fields


class UpToASubmission(serializers.ListField):
    """A list of at most as many entries as one submission may hold
    (CAROUSEL_MAX_PATHS_PER_SUBMISSION): a cancel or a release covers a whole submission in one
    call. Read each time a serializer is made (DRF makes its fields anew from their arguments for
    each one), so the limit, the check and the schema's maxItems are the setting's."""

    def __init__(self, **kwargs):
        limit = settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION
        kwargs["error_messages"] = {**kwargs.get("error_messages", {}), "max_length": (
            f"at most {limit:,} entries in one call (as many as one submission may hold); send the rest in "
            "another call")}
        super().__init__(max_length=limit, **kwargs)


class CancelManySerializer(StrictSerializer):
    """Either `ids` or `paths`; `all_users` (by path only) needs the change permission."""

    ids = UpToASubmission(child=serializers.IntegerField(min_value=1, max_value=MAX_ID), allow_empty=False,
                          required=False)
    paths = UpToASubmission(child=serializers.CharField(max_length=4096, trim_whitespace=False),
                            allow_empty=False, required=False,
                            help_text="cancel your active requests for these paths, files still being queued "
                                      "included")
    all_users = serializers.BooleanField(default=False, help_text="with paths: every user's requests for them "
                                                                  "(needs the change permission)")

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if ("ids" in attrs) == ("paths" in attrs):
            raise serializers.ValidationError('give either "ids" or "paths"')
        if attrs["all_users"] and "paths" not in attrs:
            raise serializers.ValidationError({"all_users": 'only with "paths"'})
        return attrs


class CancelResultSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField()
    not_active = serializers.ListField(child=serializers.CharField(), required=False,
                                       help_text="by paths: those none of the requests acted on was active for")


def _states(value):
    states = [x for x in value.split(",") if x]
    unknown = sorted(set(states) - set(RequestState.values))
    if unknown or not states:
        raise serializers.ValidationError(
            f"unknown state(s) {', '.join(unknown) or repr(value)}; known: {', '.join(RequestState.values)}")
    return states


class RequestFilterSerializer(serializers.Serializer):
    """The list's query parameters. A parameter given must make sense: an empty or malformed
    one is refused rather than silently ignored (?until= would otherwise list everything)."""

    state = serializers.CharField(required=False, max_length=1000,
                                  help_text="comma-separated states: " + ", ".join(RequestState.values))
    bulk = serializers.UUIDField(required=False, help_text="only requests of this submission")
    tape = serializers.CharField(required=False, max_length=64, help_text="tape label")
    since = serializers.DateTimeField(required=False, help_text="created at or after")
    until = serializers.DateTimeField(required=False, help_text="created before")
    path = serializers.CharField(required=False, max_length=4096, help_text="path contains this text")
    mine = serializers.BooleanField(required=False, help_text="true: only the caller's own requests (an operator "
                                                               "or a service sees others' too)")

    def validate_state(self, value):
        return _states(value)


class BulkFilterSerializer(serializers.Serializer):
    """The submissions list's query parameters, refused when empty or malformed as the requests'."""

    label = serializers.CharField(required=False, max_length=255, help_text="only this label")
    mine = serializers.BooleanField(required=False, help_text="true: only the caller's own submissions (an "
                                                               "operator or a service sees others' too)")


# Response bodies built from dicts, declared for the schema (and so checked by schemathesis).

class StateCountsSerializer(serializers.Serializer):
    def get_fields(self):
        return {state: serializers.IntegerField() for state in RequestState.values}


class BulkDetailSerializer(BulkSerializer):
    states = StateCountsSerializer(read_only=True, help_text="the submission's requests per state")
    requests_url = serializers.CharField(read_only=True, help_text="its requests, in the request list")
    summary_url = serializers.CharField(read_only=True, help_text="its progress, estimate and reasons in one answer")

    class Meta(BulkSerializer.Meta):
        fields = [*BulkSerializer.Meta.fields, "states", "requests_url", "summary_url"]
        read_only_fields = fields


class StepCountsSerializer(serializers.Serializer):
    def get_fields(self):
        return {step: serializers.IntegerField() for step in STEPS}


class EstimateSerializer(serializers.Serializer):
    earliest = serializers.DateTimeField(help_text="unfinished: when the first of the rest may be back; "
                                                   "finished: when its first file was restored")
    latest = serializers.DateTimeField(allow_null=True, help_text="unfinished: when the last of the rest should be "
                                                                  "back (null: no upper bound yet); finished: when "
                                                                  "its last file was restored")


class BulkSummarySerializer(BulkSerializer):
    counts = StepCountsSerializer(read_only=True, help_text=(
        "the submission's files per step: restored, delivering, being_read (on a drive or read), planned (in the "
        "mount plan, not sent yet), queued, waiting_to_retry, failed, cancelled, expired; they add up to files"))
    not_located = serializers.IntegerField(read_only=True, help_text="queued files whose tape is not known yet")
    size = serializers.IntegerField(read_only=True, help_text="bytes of the files whose size is known")
    bytes_restored = serializers.IntegerField(read_only=True)
    finished = serializers.BooleanField(read_only=True, help_text="no file still active")
    estimate = EstimateSerializer(read_only=True, allow_null=True, help_text=(
        "null only when there is no basis: no file located (and none restored)"))
    why = serializers.ListField(child=serializers.CharField(), read_only=True,
                                help_text="why not yet, summarised over the submission's files")
    restored_url = serializers.CharField(read_only=True, help_text="restored files with where they are (JSON "
                                                                   "pages: the request list)")
    downloads = serializers.DictField(child=serializers.CharField(), read_only=True, help_text=(
        "the restored paths with where they are (text, CSV) and the failures with their reasons (text, CSV)"))

    class Meta(BulkSerializer.Meta):
        fields = [*BulkSerializer.Meta.fields, "counts", "not_located", "size", "bytes_restored", "finished",
                  "estimate", "why", "restored_url", "downloads"]
        read_only_fields = fields


class DriveShareSerializer(serializers.Serializer):
    share = serializers.FloatField(help_text="your share of the drives' time over the period (the usage report's "
                                             "drive_share for the same period)")
    period = serializers.CharField(help_text="the period, as the pages name it")
    since = serializers.DateTimeField()
    until = serializers.DateTimeField(help_text="excluded")


class SummarySerializer(serializers.Serializer):
    states = StateCountsSerializer(help_text="your requests per state")
    active = serializers.IntegerField(help_text="your requests not finished yet")
    bytes_done = serializers.IntegerField()
    bytes_active_known = serializers.IntegerField(help_text="bytes of your active requests whose size is known")
    oldest_active_at = serializers.DateTimeField(allow_null=True)
    drive_share = DriveShareSerializer(help_text="your share of drive time today (UTC, so far)")


class QuarantinedTapeSerializer(serializers.Serializer):
    label = serializers.CharField()
    quarantined_at = serializers.DateTimeField(allow_null=True)
    quarantine_reason = serializers.CharField(allow_blank=True)


class StagerHealthSerializer(serializers.Serializer):
    state = serializers.CharField(help_text="healthy, stalled or down")
    reason = serializers.CharField(allow_blank=True)
    since = serializers.DateTimeField(allow_null=True)
    checked_at = serializers.DateTimeField(allow_null=True)
    jobs_limit = serializers.IntegerField(allow_null=True, help_text="the adaptive limit of jobs in flight")
    healthy_limit = serializers.IntegerField(allow_null=True)
    jobs_in_flight_max = serializers.IntegerField(help_text="K, from the control row")
    jobs_open = serializers.IntegerField()
    last_progress_at = serializers.DateTimeField(allow_null=True)
    disk_free_bytes = serializers.IntegerField(allow_null=True)
    disk_total_bytes = serializers.IntegerField(allow_null=True)
    paused = serializers.BooleanField()
    last_cycle_at = serializers.DateTimeField(allow_null=True, help_text="when the loop last ran a cycle")
    last_cycle_error = serializers.CharField(allow_blank=True, help_text=(
        "why the last cycle failed (empty: it did not); to a user who may not see every request, only that it "
        "failed"))
    retry_queue = serializers.IntegerField()
    quarantined_tapes = QuarantinedTapeSerializer(many=True)
