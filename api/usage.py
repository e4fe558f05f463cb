"""GET /api/v1/usage/ and /api/v1/usage/csv/: the usage report (carousel/ops/usage.py) of a period,
per user or per group. Those with the view permission on usage see every line; others their own (or their groups')."""
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from carousel.ops import usage
from carousel.outlook.shares import period_name

from .serializers import query_of

PARAMS = [
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="start (ISO 8601; default: the 7 whole UTC days "
                                                                  "ending with until's, as the usage page)"),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="end, excluded (default: now)"),
    OpenApiParameter("by", OpenApiTypes.STR, enum=list(usage.BY), description="lines per user (default), group or activity"),
]


class PeriodSerializer(serializers.Serializer):
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)
    by = serializers.ChoiceField(choices=usage.BY, default="user")

    def validate_since(self, value):
        return _in_range(value)

    def validate_until(self, value):
        return _in_range(value)

    def validate(self, data):
        data.setdefault("until", timezone.now())
        data.setdefault("since", usage.default_since(data["until"]))
        if data["since"] >= data["until"]:
            raise serializers.ValidationError({"since": "must be before until"})
        return data


def _in_range(value):
    message = usage.out_of_range(value)
    if message:
        raise serializers.ValidationError(message)
    return value


def report_for(request):
    """Parse the period (400 on bad input) and build the report the user may see."""
    params = PeriodSerializer(data=query_of(request))
    params.is_valid(raise_exception=True)
    return usage.usage_report(viewer=request.user, now=timezone.now(), **params.validated_data)


class LineSerializer(serializers.Serializer):
    name = serializers.CharField()
    requested_files = serializers.IntegerField()
    requested_bytes = serializers.IntegerField()
    restored_files = serializers.IntegerField()
    restored_bytes = serializers.IntegerField()
    failed = serializers.DictField(child=serializers.IntegerField(), help_text="requests failed for good, by class")
    retries = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    expired = serializers.IntegerField()
    wait_p50_s = serializers.FloatField(allow_null=True, help_text="upper bound of the median's wait bucket")
    wait_p95_s = serializers.FloatField(allow_null=True, help_text="upper bound of the 95th percentile's bucket")
    wait_max_s = serializers.FloatField(allow_null=True)
    mounts = serializers.FloatField()
    drive_s = serializers.FloatField()
    drive_share = serializers.FloatField(help_text="share of the drives' time over the period (share_period): the "
                                         "figure every page shows as the share")


class ReportSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    by = serializers.CharField()
    share_period = serializers.CharField(help_text="the period of drive_share, as the pages name it")
    wait_buckets_s = serializers.ListField(child=serializers.FloatField())
    lines = LineSerializer(many=True)


class UsageView(APIView):
    @extend_schema(parameters=PARAMS, responses=ReportSerializer)
    def get(self, request):
        report = report_for(request)
        return Response(ReportSerializer({**vars(report), "wait_buckets_s": usage.WAIT_BUCKETS_S,
                                          "share_period": period_name(report.since, report.until,
                                                                      timezone.now())}).data)


class UsageCsvView(APIView):
    @extend_schema(parameters=PARAMS, responses={(200, "text/csv"): OpenApiTypes.STR})
    def get(self, request):
        report = report_for(request)
        response = HttpResponse(usage.usage_csv(report), content_type="text/csv; charset=utf-8")
        name = f"carousel-usage-{report.by}-{report.since:%Y%m%dT%H}-{report.until:%Y%m%dT%H}.csv"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
