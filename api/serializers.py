from types import SimpleNamespace
from typing import NamedTuple

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.relations import PKOnlyObject
from rest_framework.settings import ISO_8601, api_settings

from django.conf import settings
from django.db import connection
from django.db.models import CharField, F, Func
from django.utils import timezone

from carousel.models import Bulk, RequestState, RestoreRequest
from carousel.domain.paths import check_destination
from carousel.domain.services import MAX_PIN_LIFETIME, MIN_PIN_LIFETIME

# Ids are PostgreSQL bigints: a larger number names no request, and is refused as input.
MAX_ID = 2**63 - 1


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
    "items": {"type": "string", "minLength": 2, "maxLength": 4096, "pattern": "^/[^\\x00-\\x1f\\x7f]*[^/]$"},
    "description": "absolute paths of files: no control characters, no '.' or '..' components"})
class PathListField(serializers.ListField):
    """The schema says what the service accepts; the field itself takes any list (see below)."""


class SubmitSerializer(StrictSerializer):
    # Each path is checked by carousel.domain.paths.validate_paths, which reports every bad line at once.
    paths = PathListField(child=serializers.JSONField(), allow_empty=True)
    priority = serializers.IntegerField(min_value=0, max_value=3, default=0)
    destination = serializers.CharField(max_length=4096, required=False, allow_blank=True, default="")
    deadline = serializers.DateTimeField(required=False, allow_null=True, default=None)
    pin_lifetime = serializers.DurationField(required=False, allow_null=True, default=None,
                                             min_value=MIN_PIN_LIFETIME, max_value=MAX_PIN_LIFETIME,
                                             help_text="How long the restored copy stays on disk: "
                                                       "ISO 8601 (PT1H) or seconds; from 1 second to 365 days.")
    notify = serializers.BooleanField(default=False)
    label = serializers.CharField(max_length=255, required=False, allow_blank=True, default="",
                                  help_text="Your own name for the submission (list bulks with ?label=).")
    on_behalf_of = serializers.CharField(required=False, allow_blank=True, default="", max_length=150,
                                         help_text="Service accounts only: the user the request is for.")

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


def _fast_converter(field):
    """A function giving what field.to_representation(value) gives for a value that is not
    None, for the exact DRF field classes whose rule is a one-liner; None for any other field
    (it keeps its own to_representation). Read once per serializer, i.e. once per page."""
    kind = type(field)
    if kind is serializers.IntegerField:
        return int
    if kind is serializers.CharField:
        return str
    if kind is serializers.ChoiceField:
        choices = field.choice_strings_to_values
        return lambda value: value if value == "" else choices.get(str(value), value)
    if (kind is serializers.DateTimeField and getattr(field, "format", api_settings.DATETIME_FORMAT) == ISO_8601
            and field.default_timezone() is not None and not hasattr(field, "timezone")):
        zone = field.default_timezone()  # the request's time zone, as DRF reads it per value

        def iso(value):
            if isinstance(value, str) or not value:
                return field.to_representation(value)
            if not timezone.is_aware(value):
                return field.to_representation(value)  # make_aware and its checks: DRF's own way
            try:
                text = value.astimezone(zone).isoformat()
            except OverflowError:
                return field.to_representation(value)  # DRF's error for it
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        return iso
    return None


def _same(value):
    return value


_ROW_PLANS = {}  # (serializer class, time zone, database vendor) -> PlainFieldsFirst.row_plan


class _RowPlan(NamedTuple):
    fields: list  # (name, key, convert)
    names: list  # values() field names
    annotations: dict  # values() annotations


# A timestamptz as DRF writes it in UTC (2026-11-23T18:35:59.860975Z), by the server.
_UTC_TEXT = "to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"


def _utc_text(text):
    # isoformat() leaves out a zero fraction of a second; to_char always writes six digits.
    return text[:-8] + "Z" if text.endswith(".000000Z") else text


# DRF fields whose to_representation reads only the value and the field's own options (not the
# request, not the time zone): a plan kept across requests may hold them.
_CONTEXT_FREE = {serializers.BigIntegerField, serializers.DurationField, serializers.UUIDField,
                 serializers.BooleanField, serializers.FloatField, serializers.DecimalField}


class PlainFieldsFirst:
    """Serializer.to_representation with DRF's own rules, minus its per-value look-ups for
    fields that are a model column of the instance (no dotted source, no relation): they are
    read with one getattr, and converted by a one-line rule equal to the field's own for the
    plain field types (integers, text, choices, ISO date-times; _fast_converter). A page of 100
    requests is rendered on every poll of the list, and DRF's generic attribute walk (a
    callable check per field per row) and its per-value time zone look-up were most of its
    cost. Every other field goes through DRF's get_attribute and to_representation, as before."""

    def _plan(self):
        plan = getattr(self, "_fast_plan", None)
        if plan is None:
            columns = {f.attname for f in self.Meta.model._meta.concrete_fields if not f.is_relation}
            plan = []
            for field in self._readable_fields:
                column = (field.source_attrs[0] if len(field.source_attrs) == 1 and field.source_attrs[0] in columns
                          and not isinstance(field, serializers.RelatedField) else None)
                plan.append((field, field.field_name, column,
                             (_fast_converter(field) or field.to_representation) if column else None))
            self._fast_plan = plan
        return plan

    def row_plan(self):
        """The plan of rows_representation: (name, key, convert) per field, key the name values()
        gives its value under (a column; `fk__column` for a dotted source through a forward
        foreign key, as user.username; the key column for a primary key related field; the
        annotation of a date-time formatted by PostgreSQL, see below) or, for a method field,
        None and the method's name. None if a field has no such value or no one-line rule (the
        caller then renders model instances). Worked out once per class, time zone and database,
        not per page: building a ModelSerializer's fields costs more than rendering the rows.
        So only rules that read nothing of the request are kept.

        In UTC on PostgreSQL a date-time column is read as the text DRF would write, formatted by
        the server: parsing a page's time stamps into aware datetimes (Django's time zone
        loader over psycopg's) and writing them back was the largest cost of the page."""
        utc = settings.USE_TZ and timezone.get_current_timezone_name() == "UTC"
        key = (type(self), timezone.get_current_timezone() if settings.USE_TZ else None, connection.vendor)
        plan = _ROW_PLANS.get(key, False)
        if plan is not False:
            return plan
        columns = {f.attname: f for f in self.Meta.model._meta.concrete_fields}
        fields, annotations, reads = [], {}, set()
        for field, name, column, _ in self._plan():
            attrs = field.source_attrs
            relation = columns.get(f"{attrs[0]}_id") if attrs else None
            if isinstance(field, serializers.SerializerMethodField):
                fields.append((name, None, field.method_name))
                # What the method reads of the row (Meta.row_method_reads), else every column.
                reads |= set(getattr(self.Meta, "row_method_reads", {}).get(name, columns))
            elif (isinstance(field, serializers.PrimaryKeyRelatedField) and len(attrs) == 1 and relation
                  and field.pk_field is None):
                fields.append((name, relation.attname, _same))
            elif column is not None or (len(attrs) == 2 and relation and not isinstance(field, serializers.RelatedField)
                                        and not relation.related_model._meta.get_field(attrs[1]).is_relation):
                convert = _fast_converter(field) or (field.to_representation if type(field) in _CONTEXT_FREE else None)
                if convert is None:
                    _ROW_PLANS[key] = None
                    return None
                if (utc and connection.vendor == "postgresql" and column is not None
                        and type(field) is serializers.DateTimeField):
                    alias = f"{column}_utc_text"
                    annotations[alias] = Func(F(column), template=_UTC_TEXT, output_field=CharField())
                    fields.append((name, alias, _utc_text))
                else:
                    fields.append((name, column or "__".join(attrs), convert))
            else:
                _ROW_PLANS[key] = None
                return None
        pk = self.Meta.model._meta.pk.attname  # the cursor pagination's position
        names = list(dict.fromkeys([pk, *(k for _, k, _ in fields if k is not None and k not in annotations),
                                    *sorted(reads)]))
        plan = _ROW_PLANS[key] = _RowPlan(fields, names, annotations)
        return plan

    def row_query(self):
        """values() arguments (names, annotations) giving every value rows_representation reads."""
        plan = self.row_plan()
        return plan.names, plan.annotations

    def rows_representation(self, rows):
        """What to_representation gives for each model instance, from values() rows: a page of
        the list without building a model instance (and its related ones) per row."""
        plan = self.row_plan().fields
        out = []
        for row in rows:
            ret = {}
            instance = None
            for name, key, convert in plan:
                if key is not None:
                    value = row[key]
                    ret[name] = None if value is None else convert(value)
                else:
                    instance = instance or SimpleNamespace(**row)
                    ret[name] = getattr(self, convert)(instance)
            out.append(ret)
        return out

    def to_representation(self, instance):
        ret = {}
        for field, name, column, convert in self._plan():
            if column is not None:
                attribute = getattr(instance, column)
                ret[name] = None if attribute is None else convert(attribute)
                continue
            try:
                attribute = field.get_attribute(instance)
            except serializers.SkipField:
                continue
            check = attribute.pk if isinstance(attribute, PKOnlyObject) else attribute
            ret[name] = None if check is None else field.to_representation(attribute)
        return ret


class RequestSerializer(PlainFieldsFirst, serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    tape = serializers.CharField(source="tape.label", read_only=True, default=None, allow_null=True,
                                 help_text="the tape's label, null until the file is located")
    disk_path = serializers.SerializerMethodField(help_text="Where the restored copy lies on the stager's disk "
                                                            "(done requests whose stager says so); else null.")

    class Meta:
        model = RestoreRequest
        fields = ["id", "path", "user", "state", "priority", "size", "tape", "position", "destination", "disk_path",
                  "deadline", "pin_lifetime", "attempts", "error_class", "last_error", "job",
                  "created_at", "submitted_at", "started_at", "finished_at", "retry_at", "updated_at"]
        read_only_fields = fields
        row_method_reads = {"disk_path": ("state", "staged_path")}  # the list renders from rows

    def get_disk_path(self, obj) -> str | None:
        return obj.staged_path or None if obj.state == RequestState.DONE else None


class BulkSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Bulk
        fields = ["id", "user", "created_at", "files", "created", "notify", "label"]
        read_only_fields = fields


class IdsSerializer(StrictSerializer):
    ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=MAX_ID), allow_empty=False,
                                max_length=100_000)


class CancelResultSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField()


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

    def validate_state(self, value):
        return _states(value)


# Response bodies built from dicts, declared for the schema (and so checked by schemathesis).

class StateCountsSerializer(serializers.Serializer):
    def get_fields(self):
        return {state: serializers.IntegerField() for state in RequestState.values}


class BulkDetailSerializer(BulkSerializer):
    states = StateCountsSerializer(read_only=True, help_text="the submission's requests per state")
    requests_url = serializers.CharField(read_only=True, help_text="its requests, in the request list")

    class Meta(BulkSerializer.Meta):
        fields = [*BulkSerializer.Meta.fields, "states", "requests_url"]
        read_only_fields = fields


class SummarySerializer(serializers.Serializer):
    states = StateCountsSerializer(help_text="your requests per state")
    active = serializers.IntegerField(help_text="your requests not finished yet")
    bytes_done = serializers.IntegerField()
    bytes_active_known = serializers.IntegerField(help_text="bytes of your active requests whose size is known")
    oldest_active_at = serializers.DateTimeField(allow_null=True)


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
    retry_queue = serializers.IntegerField()
    quarantined_tapes = QuarantinedTapeSerializer(many=True)
