"""REST API v1. Views parse, call a service or a selector, and render; nothing more."""
import uuid

from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, generics, serializers
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from carousel import grid, selectors, services
from carousel.tasks import withdraw_on_commit
from carousel.models import RequestState

from . import serializers as s



class NewestFirst(CursorPagination):
    # Cursor pagination stays fast at any depth of a million-row queue.
    ordering = "-id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000


def _parse_time(name, value):
    if not value:
        return None
    parsed = parse_datetime(value)
    if parsed is None:
        raise serializers.ValidationError({name: f"{value!r} is not an ISO 8601 date-time"})
    return parsed


LIST_PARAMS = [
    OpenApiParameter("state", OpenApiTypes.STR, description="comma-separated states: " + ", ".join(RequestState.values)),
    OpenApiParameter("bulk", OpenApiTypes.UUID, description="only requests of this submission"),
    OpenApiParameter("tape", OpenApiTypes.STR, description="tape label"),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="created at or after"),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="created before"),
    OpenApiParameter("path", OpenApiTypes.STR, description="path contains this text"),
]


class RequestListCreate(generics.ListAPIView):
    serializer_class = s.RequestSerializer
    pagination_class = NewestFirst

    def get_queryset(self):
        q = self.request.query_params
        states = [x for x in q.get("state", "").split(",") if x]
        unknown = sorted(set(states) - set(RequestState.values))
        if unknown:
            raise serializers.ValidationError(
                {"state": f"unknown state(s) {', '.join(unknown)}; known: {', '.join(RequestState.values)}"})
        bulk = q.get("bulk")
        if bulk:
            try:
                uuid.UUID(bulk)
            except ValueError:
                raise serializers.ValidationError({"bulk": f"{bulk!r} is not a submission id (a UUID)"})
        return selectors.request_list(user=self.request.user, state=states, bulk=bulk, tape=q.get("tape"),
                                      since=_parse_time("since", q.get("since")),
                                      until=_parse_time("until", q.get("until")), path=q.get("path"))

    @extend_schema(parameters=LIST_PARAMS)
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    @extend_schema(request=s.SubmitSerializer, responses={201: s.SubmitResultSerializer},
                   description="Submit one or many paths. All-or-nothing: any bad path refuses the whole list.")
    def post(self, request):
        form = s.SubmitSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        allows = getattr(request.auth, "allows", None)  # a WLCG token's scopes
        if allows and isinstance(form.validated_data["paths"], list) and not all(
                allows("stage", p) for p in form.validated_data["paths"]):
            raise exceptions.PermissionDenied("the token's scopes do not allow staging all of these paths")
        result = grid.submission_create(submitter=request.user, now=timezone.now(),
                                        group=getattr(request.auth, "group", None), **form.validated_data)
        body = {"bulk_id": result.bulk.id, "files": result.files, "created": result.created,
                "existing": result.existing, "shared": result.shared,
                "url": reverse("api:bulk-detail", args=[result.bulk.id], request=request)}
        return Response(body, status=201)


class RequestDetail(generics.RetrieveAPIView):
    serializer_class = s.RequestSerializer

    def get_queryset(self):
        return selectors.visible_requests(self.request.user).select_related("tape", "user")


def _cancel(queryset):
    count, pairs = services.request_cancel(queryset=queryset, now=timezone.now())
    withdraw_on_commit(pairs)
    return Response({"cancelled": count})


class RequestCancel(APIView):
    @extend_schema(request=None, responses=s.CancelResultSerializer)
    def post(self, request, pk):
        req = get_object_or_404(selectors.visible_requests(request.user), pk=pk)
        return _cancel(selectors.visible_requests(request.user).filter(pk=req.pk))


class RequestCancelMany(APIView):
    @extend_schema(request=s.IdsSerializer, responses=s.CancelResultSerializer,
                   description="Cancel several requests; ids that are not yours or not active are skipped.")
    def post(self, request):
        form = s.IdsSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        return _cancel(selectors.visible_requests(request.user).filter(pk__in=form.validated_data["ids"]))


class BulkList(generics.ListAPIView):
    serializer_class = s.BulkSerializer
    pagination_class = NewestFirst

    def get_queryset(self):
        return selectors.visible_bulks(self.request.user).select_related("user")


class BulkDetail(APIView):
    def get(self, request, pk):
        bulk = get_object_or_404(selectors.visible_bulks(request.user).select_related("user"), pk=pk)
        body = s.BulkSerializer(bulk).data
        body["states"] = selectors.state_counts(selectors.bulk_requests(bulk))
        body["requests_url"] = reverse("api:request-list", request=request) + f"?bulk={bulk.id}"
        return Response(body)


class BulkCancel(APIView):
    @extend_schema(request=None, responses=s.CancelResultSerializer)
    def post(self, request, pk):
        bulk = get_object_or_404(selectors.visible_bulks(request.user), pk=pk)
        return _cancel(selectors.bulk_requests(bulk))


class Summary(APIView):
    def get(self, request):
        return Response(selectors.queue_summary(user=request.user))


class StagerHealthView(APIView):
    """The stager's health (healthy, stalled, down), the adaptive jobs-in-flight limit, the
    retry queue and quarantined tapes."""

    def get(self, request):
        return Response(selectors.stager_health())
