from rest_framework import serializers

from carousel.models import Bulk, RestoreRequest


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, so a misspelt option is not silently ignored."""

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                f"unknown field(s): {', '.join(unknown)}; known: {', '.join(sorted(self.fields))}")
        return attrs


class SubmitSerializer(StrictSerializer):
    # Each path is checked by carousel.paths.validate_paths, which reports every bad line at once.
    paths = serializers.ListField(child=serializers.JSONField(), allow_empty=True)
    priority = serializers.IntegerField(min_value=0, max_value=3, default=0)
    destination = serializers.CharField(max_length=4096, required=False, allow_blank=True, default="")
    deadline = serializers.DateTimeField(required=False, allow_null=True, default=None)
    pin_lifetime = serializers.DurationField(required=False, allow_null=True, default=None,
                                             help_text="How long the restored copy stays on disk: "
                                                       "ISO 8601 (PT1H) or seconds.")
    notify = serializers.BooleanField(default=False)
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
        if "\x00" in value:
            raise serializers.ValidationError("contains a NUL byte")
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
    tape = serializers.CharField(source="tape.label", read_only=True, default=None)

    class Meta:
        model = RestoreRequest
        fields = ["id", "path", "user", "state", "priority", "size", "tape", "position", "destination",
                  "deadline", "pin_lifetime", "attempts", "error_class", "last_error", "job",
                  "created_at", "submitted_at", "started_at", "finished_at", "retry_at", "updated_at"]
        read_only_fields = fields


class BulkSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Bulk
        fields = ["id", "user", "created_at", "files", "created", "notify"]
        read_only_fields = fields


class IdsSerializer(StrictSerializer):
    ids = serializers.ListField(child=serializers.IntegerField(min_value=1), allow_empty=False, max_length=100_000)


class CancelResultSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField()
