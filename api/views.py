"""REST API v1. Views parse, call a service or a selector, and render; nothing more."""
import uuid

from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from carousel import selectors, services
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
        result = services.restore_submit(user=request.user, now=timezone.now(), **form.validated_data)
        body = {"bulk_id": result.bulk.id, "files": result.files, "created": result.created,
                "existing": result.existing, "shared": result.shared,
                "url": reverse("api:bulk-detail", args=[result.bulk.id], request=request)}
        return Response(body, status=201)


class RequestDetail(generics.RetrieveAPIView):
    serializer_class = s.RequestSerializer

    def get_queryset(self):
        return selectors.visible_requests(self.request.user).select_related("tape", "user")

    def retrieve(self, request, *args, **kwargs):
        # One request also says where it stands and why not yet, as the web page does.
        req = self.get_object()
        outlook = selectors.request_outlooks([req], user=req.user,
                                             ctx=selectors.queue_context(user=req.user, now=timezone.now()))[req.id]
        body = self.get_serializer(req).data
        body["outlook"] = {"reasons": list(outlook.reasons), "eta_s": outlook.eta and list(outlook.eta),
                           "ahead": outlook.ahead}
        return Response(body)


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


class PathsSerializer(s.StrictSerializer):
    paths = serializers.ListField(child=serializers.CharField(max_length=4096), allow_empty=False, max_length=10_000)


class RequestRelease(APIView):
    @extend_schema(request=PathsSerializer, responses={200: OpenApiTypes.OBJECT},
                   description="End your pins on these files (XRootD's evict): the stager may drop copies no "
                               "one else pins. Deletes nothing itself.")
    def post(self, request):
        form = PathsSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            from carousel.pins import release_pins  # issue 10's pins (helper c)
        except ImportError:
            return Response({"status": 501, "code": "not_implemented",
                             "detail": "this Carousel has no pins to release"}, status=501)
        return Response({"released": release_pins(user=request.user, paths=form.validated_data["paths"],
                                                  now=timezone.now())})


class BulksNewestFirst(NewestFirst):
    ordering = ("-created_at", "-id")  # bulk ids are random UUIDs


class BulkList(generics.ListAPIView):
    serializer_class = s.BulkSerializer
    pagination_class = BulksNewestFirst

    def get_queryset(self):
        qs = selectors.visible_bulks(self.request.user).select_related("user")
        label = self.request.query_params.get("label")
        return qs.filter(label=label) if label else qs

    @extend_schema(parameters=[OpenApiParameter("label", OpenApiTypes.STR, description="only this label")])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


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
