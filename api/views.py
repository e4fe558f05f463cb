"""REST API v1. Views parse, call a service or a selector, and render; nothing more."""
from django.conf import settings
from django.http import StreamingHttpResponse
from django.core.exceptions import ValidationError as DjangoValidationError
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, generics, serializers
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from carousel.grid import door as grid
from carousel.domain import pins
from carousel.domain import policy
from carousel.domain import selectors
from carousel.domain import services
from carousel.domain.paths import check_path
from carousel.models import Bulk, RestoreRequest
from carousel.outlook import estimates, shares
from carousel.outlook import submissions as submission_outlook
from carousel.tasks import withdraw_on_commit

from . import downloads
from . import serializers as s



class NewestFirst(CursorPagination):
    # Cursor pagination stays fast at any depth of a million-row queue.
    ordering = "-id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request):
        # DRF falls back to the default on a bad page_size; a client asking for page_size=null
        # or 5000 should hear that it did not get what it asked for.
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= self.max_page_size):
            raise serializers.ValidationError(
                {self.page_size_query_param: f"{raw[:50]!r} is not a whole number from 1 to {self.max_page_size}"})
        return int(raw)

    def paginate_queryset(self, queryset, request, view=None):
        self.model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        refused = serializers.ValidationError(
            {self.cursor_query_param: "not a cursor this API gave out: follow the next and previous links"})
        if request.query_params.get(self.cursor_query_param) == "":
            raise refused  # an empty filter is refused on every list (README), this one too
        try:
            cursor = super().decode_cursor(request)
        except exceptions.NotFound:
            raise refused
        # A cursor is base64 a client can forge: its position must be a value of the ordering's
        # first field, or filtering by it raises (a 500) instead of refusing.
        if cursor is not None and cursor.position is not None:
            field = self.model._meta.get_field(self.get_ordering(request, None, None)[0].lstrip("-"))
            try:
                field.to_python(cursor.position)
            except DjangoValidationError:
                raise refused
        return cursor


class RequestListCreate(generics.ListAPIView):
    serializer_class = s.RequestSerializer
    pagination_class = NewestFirst

    def get_queryset(self):
        query = s.RequestFilterSerializer(data=s.query_of(self.request))
        query.is_valid(raise_exception=True)
        filters = dict(query.validated_data)
        owner = self.request.user.pk if filters.pop("mine", False) else None
        return selectors.request_list(user=policy.identity(self.request), owner=owner, **filters)

    @extend_schema(parameters=[s.RequestFilterSerializer])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def list(self, request, *args, **kwargs):
        # Polled all day by clients: the page is read as values() rows (serializers.request_list_data).
        page = self.paginate_queryset(s.request_list_values(self.get_queryset()))
        return self.get_paginated_response(s.request_list_data(page))

    @extend_schema(request=s.SubmitSerializer, responses={201: s.SubmitResultSerializer},
                   description="Submit one or many paths. All-or-nothing: any bad path refuses the whole list.")
    def post(self, request):
        form = s.SubmitSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        paths = form.validated_data["paths"]
        policy.require_scope_covers(policy.identity(request), policy.SUBMIT, paths if isinstance(paths, list) else [])
        result = grid.submission_create(submitter=request.user, now=timezone.now(),
                                        group=getattr(request.auth, "group", None), **form.validated_data)
        body = {"bulk_id": result.bulk.id, "files": result.files, "created": result.created,
                "existing": result.existing, "shared": result.shared,
                "url": reverse("api:bulk-detail", args=[result.bulk.id], request=request)}
        return Response(body, status=201)


class RequestDetail(generics.RetrieveAPIView):
    serializer_class = s.RequestDetailSerializer

    def get_queryset(self):
        return selectors.visible_requests(self.request.user).select_related("tape", "user")

    def retrieve(self, request, *args, **kwargs):
        # One request also says where it stands and why not yet, as the web page does.
        req = _request_for(request, policy.READ, self.kwargs["pk"],
                           RestoreRequest.objects.select_related("tape", "user"))
        outlook = estimates.request_outlooks([req], user=req.user,
                                             ctx=estimates.queue_context(user=req.user, now=timezone.now()))[req.id]
        body = s.RequestSerializer(req, context=self.get_serializer_context()).data
        body["outlook"] = {"reasons": list(outlook.reasons), "eta_s": outlook.eta and list(outlook.eta),
                           "ahead": outlook.ahead}
        return Response(body)


def _request_for(request, action, pk, queryset=None):
    """The request `pk` if the caller may do `action` on it: else 404 (not visible) or 403."""
    req = get_object_or_404(queryset if queryset is not None else RestoreRequest.objects.all(), pk=pk)
    policy.check_request(policy.identity(request), action, req)
    return req


def _cancel(request, queryset):
    count, pairs = services.request_cancel(queryset=queryset, now=timezone.now(), by=request.user)
    withdraw_on_commit(pairs)
    return Response({"cancelled": count})


class RequestCancel(APIView):
    @extend_schema(request=None, responses=s.CancelResultSerializer, operation_id="v1_requests_cancel_one")
    def post(self, request, pk):
        req = _request_for(request, policy.CANCEL, pk)
        return _cancel(request, RestoreRequest.objects.filter(pk=req.pk))


class RequestCancelMany(APIView):
    @extend_schema(request=s.CancelManySerializer, responses=s.CancelResultSerializer,
                   description="Cancel several requests, by `ids` or by `paths`. By ids: ids you may not "
                               "cancel (not yours, unless you hold the change permission on restore requests; "
                               "outside your token's scopes) or not active are skipped. By paths: your own "
                               "active requests for them, files still being queued included; with "
                               "`all_users` (the change permission), every user's; `not_active` lists (up to "
                               "1,000) the paths none of them was active for.")
    def post(self, request):
        form = s.CancelManySerializer(data=request.data)
        form.is_valid(raise_exception=True)
        who = policy.identity(request)
        policy.require_scope(who, policy.CANCEL)
        data = form.validated_data
        if "ids" in data:
            return _cancel(request, policy.actionable_requests(who, policy.CANCEL).filter(pk__in=data["ids"]))
        if data["all_users"] and not policy.may_act_for_all_users(request.user):
            raise exceptions.PermissionDenied("cancelling every user's requests for these paths needs the change "
                                              "permission on restore requests")
        if data["all_users"]:
            requests, bulks = policy.actionable_requests(who, policy.CANCEL), Bulk.objects.all()
        else:
            requests, bulks = policy.own_requests(who, policy.CANCEL), policy.own_bulks(who)
        count, pairs, unmatched = services.request_cancel_paths(requests=requests, bulks=bulks, paths=data["paths"],
                                                                now=timezone.now(), by=request.user)
        withdraw_on_commit(pairs)
        return Response({"cancelled": count, "not_active": unmatched[:1000]})


class PathsSerializer(s.StrictSerializer):
    # As many as one submission may hold (and a cancel by paths takes): a release ends the pins of
    # a whole submission at once.
    paths = s.UpToASubmission(child=serializers.CharField(max_length=4096), allow_empty=False)

    def validate_paths(self, value):
        # CharField takes 1 for "1": each entry as sent is checked as every door checks a path.
        errors, clean = {}, []
        for index, raw in enumerate(self.initial_data["paths"]):
            path, message = check_path(raw, max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
            if message:
                errors[index] = [message]
            clean.append(path)
        if errors:
            raise serializers.ValidationError(errors)
        return clean


class RequestRelease(APIView):
    @extend_schema(request=PathsSerializer, responses={200: OpenApiTypes.OBJECT},
                   description="End your pins on these files (XRootD's evict; a service account's: also those "
                               "it made for a person): the stager may drop copies no one else pins. Paths "
                               "outside your token's scopes are skipped. Deletes nothing itself.")
    def post(self, request):
        form = PathsSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        who = policy.identity(request)
        policy.require_scope(who, policy.RELEASE)
        return Response({"released": pins.release_pins(requests=policy.own_requests(who, policy.RELEASE),
                                                       paths=form.validated_data["paths"], now=timezone.now())})


class BulksNewestFirst(NewestFirst):
    ordering = ("-created_at", "-id")  # bulk ids are random UUIDs


class BulkList(generics.ListAPIView):
    serializer_class = s.BulkSerializer
    pagination_class = BulksNewestFirst

    def get_queryset(self):
        # Those the identity may read: a token's, those whose every path its scopes let it read.
        qs = policy.readable_bulks(policy.identity(self.request)).select_related("user")
        # A plain dict, as for the requests: an empty filter (?label=) is refused, not ignored.
        query = s.BulkFilterSerializer(data=s.query_of(self.request))
        query.is_valid(raise_exception=True)
        if "label" in query.validated_data:
            qs = qs.filter(label=query.validated_data["label"])
        return qs.filter(user_id=self.request.user.pk) if query.validated_data.get("mine") else qs

    @extend_schema(parameters=[s.BulkFilterSerializer])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


class BulkDetail(APIView):
    @extend_schema(responses=s.BulkDetailSerializer)
    def get(self, request, pk):
        who = policy.identity(request)
        bulk = get_object_or_404(Bulk.objects.select_related("user"), pk=pk)
        policy.check_bulk(who, policy.READ, bulk)  # 404 where not visible
        policy.require_bulk_covered(who, policy.READ, bulk)  # 403 insufficient_scope, as the Tape REST poll
        body = s.BulkSerializer(bulk).data
        body["states"] = selectors.bulk_state_counts(bulk)
        body["requests_url"] = reverse("api:request-list", request=request) + f"?bulk={bulk.id}"
        body["summary_url"] = reverse("api:bulk-summary", args=[bulk.id], request=request)
        return Response(body)


def _readable_bulk(request, pk):
    """A submission the caller may read whole: 404 where not visible, 403 past a token's scopes."""
    who = policy.identity(request)
    bulk = get_object_or_404(Bulk.objects.select_related("user"), pk=pk)
    policy.check_bulk(who, policy.READ, bulk)
    policy.require_bulk_covered(who, policy.READ, bulk)
    return bulk


DOWNLOADS = (("restored", "txt"), ("restored", "csv"), ("failed", "txt"), ("failed", "csv"))


def summary_body(summary, bulk, request):
    """The summary's answer: the submission, its counts per step, estimate and why not yet."""
    fig = summary.figures
    estimate = None
    if summary.estimate:
        estimate = {"earliest": summary.estimate[0], "latest": summary.estimate[1]}
    body = {**s.BulkSerializer(bulk).data, "counts": fig.counts, "not_located": fig.not_located,
            "size": fig.bytes_known, "bytes_restored": fig.bytes_restored, "finished": summary.finished,
            "estimate": estimate, "why": list(summary.why),
            "restored_url": reverse("api:request-list", request=request) + f"?bulk={bulk.id}&state=done",
            "downloads": {f"{what}_{fmt}": reverse(f"api:bulk-{what}-{fmt}", args=[bulk.id], request=request)
                          for what, fmt in DOWNLOADS}}
    return body  # as BulkSummarySerializer declares it (tests/test_schemathesis.py checks the two agree)


class BulkSummary(APIView):
    @extend_schema(responses=s.BulkSummarySerializer,
                   description="A submission at a glance, however many files it holds: its files per step, "
                               "when the rest should be back, why not yet, and where to download the lists.")
    def get(self, request, pk):
        bulk = _readable_bulk(request, pk)
        summary = submission_outlook.submission_summary(bulk, now=timezone.now())
        return Response(summary_body(summary, bulk, request))


class BulkDownload(APIView):
    """A submission's restored files with where they are, or its failures with their reasons,
    as text or CSV, streamed: for the submission's owner (and the service that made it)."""

    what = fmt = ""

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR, (200, "text/csv"): OpenApiTypes.STR})
    def get(self, request, pk):
        who = policy.identity(request)
        bulk = get_object_or_404(policy.own_bulks(who).select_related("user"), pk=pk)  # the owner's only
        policy.require_bulk_covered(who, policy.READ, bulk)
        rows = (downloads.restored_rows if self.what == "restored" else downloads.failed_rows)(bulk, self.fmt)
        content_type = "text/csv; charset=utf-8" if self.fmt == "csv" else "text/plain; charset=utf-8"
        response = StreamingHttpResponse(downloads.stream(rows, self.fmt), content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="{bulk.id}-{self.what}.{self.fmt}"'
        return response


class BulkCancel(APIView):
    @extend_schema(request=None, responses=s.CancelResultSerializer)
    def post(self, request, pk):
        who = policy.identity(request)
        policy.require_scope(who, policy.CANCEL)
        bulk = get_object_or_404(Bulk.objects.all(), pk=pk)
        policy.check_bulk(who, policy.CANCEL, bulk)  # 404 where not visible, 403 where seen
        whole = policy.bulk_whole(who, bulk)
        count, pairs = services.bulk_cancel(bulk=bulk, now=timezone.now(), whole=whole,
                                            allowed=policy.actionable_requests(who, policy.CANCEL))
        withdraw_on_commit(pairs)
        return Response({"cancelled": count})


class Summary(APIView):
    @extend_schema(responses=s.SummarySerializer)
    def get(self, request):
        who = policy.identity(request)
        # A token's summary counts only the requests its scopes let it read.
        scoped = policy.visible_requests(who).filter(user=request.user) if who.grant else None
        body = selectors.queue_summary(user=request.user, requests=scoped)
        drive = shares.drive_time_share_of(request.user.id, now=timezone.now())
        body["drive_share"] = {"share": drive.of_user(request.user.id), "period": drive.period,
                               "since": drive.since, "until": drive.until}
        return Response(body)


class StagerHealthView(APIView):
    """The stager's health (healthy, stalled, down), the adaptive jobs-in-flight limit, the
    retry queue and quarantined tapes."""

    @extend_schema(responses=s.StagerHealthSerializer)
    def get(self, request):
        health = selectors.stager_health()
        if health["last_cycle_error"] and not policy.may_see_all(request.user):
            health["last_cycle_error"] = policy.HIDDEN_ERROR  # it can name any user's path
        return Response(health)


class NotFoundView(APIView):
    """Any other address under the API: a 404 in the API's error format, not an HTML page."""

    permission_classes = [AllowAny]
    authentication_classes = []
    schema = None  # not an operation of the API

    def initial(self, request, *args, **kwargs):
        # Before any method handler: every method answers the same 404.
        raise exceptions.NotFound(f"nothing at {request.path}: see /api/docs/ for the API's addresses")
