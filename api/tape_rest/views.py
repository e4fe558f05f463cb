"""The Tape REST API v1's views: parse the body, check the token's scopes, call carousel.grid.door,
render. Errors are RFC 7807 problem documents (application/problem+json)."""
import json
import uuid

from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_duration
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from api.auth import require_token_allows
from carousel.grid import door as grid
from carousel.domain.exceptions import CarouselError
from carousel.tasks import withdraw_on_commit

PROBLEM = "application/problem+json"
ENDPOINT = "/api/tape-rest/v1"
PLACEHOLDER_ID = "gfal2-placeholder-id"  # what gfal-evict sends when it has no request id


def problem(status, title, detail="", errors=None):
    body = {"status": status, "title": title}
    if detail:
        body["detail"] = detail
    if errors:
        body["errors"] = errors  # an extension member: every bad path, with its index
    return Response(body, status=status, content_type=PROBLEM)


def public_base(request):
    """The API's absolute base: the configured public URL (right behind a TLS proxy), else the
    address the request came to."""
    site = settings.CAROUSEL_SITE_URL.rstrip("/") or request.build_absolute_uri("/").rstrip("/")
    return site + ENDPOINT


class TapeRestView(APIView):
    # Parsed here, not by DRF: a client that sends no or another Content-Type still gets its
    # JSON read, and a bad body is a problem document.
    parser_classes = []

    def handle_exception(self, exc):
        if isinstance(exc, CarouselError):
            detail = exc.detail
            if exc.errors:
                first = exc.errors[0]
                detail += f" First: files[{first['index']}] {first['path']!r}: {first['message']}"
            response = problem(exc.status, exc.code.replace("_", " "), detail, exc.errors)
            for name, value in getattr(exc, "headers", {}).items():
                response[name] = value  # RFC 6750's insufficient_scope (carousel.domain.policy)
            return response
        if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
            response = problem(401, "unauthenticated", str(exc.detail))
            header = self.get_authenticate_header(self.request)
            if header:
                response["WWW-Authenticate"] = header
            return response
        if isinstance(exc, exceptions.APIException):
            return problem(exc.status_code, exc.default_code.replace("_", " "), str(exc.detail))
        return super().handle_exception(exc)

    def body(self, request):
        try:
            data = json.loads(request.body or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise grid.InvalidSubmission(f"the body is not JSON: {exc}")
        if not isinstance(data, dict):
            raise grid.InvalidSubmission("the body must be a JSON object")
        return data

    def stage_request(self, request, request_id):
        self.valid_id(request_id)
        bulk = grid.stage_requests_of(request.user).filter(pk=request_id).select_related("user").first()
        if bulk is None:
            raise exceptions.NotFound(f"no stage request {request_id}")
        return bulk

    @staticmethod
    def valid_id(request_id):
        try:
            uuid.UUID(request_id)
        except ValueError:
            raise exceptions.NotFound(f"no stage request {request_id}")

    def require(self, request, action, paths):
        require_token_allows(request, action, paths)


def _stage_files(body, sitename):
    files = body.get("files")
    if not isinstance(files, list) or not files:
        raise grid.InvalidSubmission('files: expected a non-empty list such as {"files": [{"path": "/a/b"}]}')
    paths, lifetimes, metadata, activity, behalf = [], [], {}, "", set()
    for index, f in enumerate(files):
        if not isinstance(f, dict) or "path" not in f:
            raise grid.InvalidSubmission(f'files[{index}]: expected an object with a "path"')
        paths.append(f["path"])
        lifetime = f.get("diskLifetime")
        if lifetime is not None:
            parsed = parse_duration(lifetime) if isinstance(lifetime, str) else None
            if parsed is None or parsed.total_seconds() < 0:
                raise grid.InvalidSubmission(f"files[{index}].diskLifetime: {lifetime!r} is not an ISO 8601 "
                                             "duration such as PT1H")
            lifetimes.append(parsed)
        meta = f.get("targetedMetadata")
        if meta is not None and not isinstance(meta, dict):
            raise grid.InvalidSubmission(f"files[{index}].targetedMetadata: expected an object")
        if meta:
            kept = {k: v for k, v in meta.items() if k in ("default", sitename)}
            metadata = metadata or kept
            for part in (meta.get(sitename), meta.get("default")):
                if isinstance(part, dict) and isinstance(part.get("activity"), str):
                    activity = activity or part["activity"]
            mine = meta.get(sitename)
            behalf.add(mine.get("on_behalf_of") if isinstance(mine, dict) else None)
    behalf.discard(None)
    if len(behalf) > 1 or any(not isinstance(b, str) for b in behalf):
        raise grid.InvalidSubmission(f"targetedMetadata.{sitename}.on_behalf_of: one user name for every file")
    return grid.StageFiles(paths=paths, pin_lifetime=max(lifetimes) if lifetimes else None, metadata=metadata,
                           activity=activity, on_behalf_of=behalf.pop() if behalf else "")


class Stage(TapeRestView):
    @extend_schema(request=None, responses=None, description="WLCG Tape REST v1: stage files (201, Location).")
    def post(self, request):
        files = _stage_files(self.body(request), settings.CAROUSEL_TAPE_REST_SITENAME)
        self.require(request, "stage", files.paths)
        group = getattr(request.auth, "group", None)
        result = grid.stage_submit(user=request.user, files=files, now=timezone.now(), group=group)
        response = Response({"requestId": str(result.bulk.id)}, status=201)
        response["Location"] = f"{public_base(request)}/stage/{result.bulk.id}"
        return response


class StageDetail(TapeRestView):
    @extend_schema(request=None, responses=None, description="WLCG Tape REST v1: a stage request's state.")
    def get(self, request, request_id):
        self.valid_id(request_id)
        body = grid.stage_status_json(user=request.user, request_id=request_id)
        if body is None:
            raise exceptions.NotFound(f"no stage request {request_id}")
        if getattr(request.auth, "allows", None):
            self.require(request, "poll", [f["path"] for f in json.loads(body)["files"]])
        return HttpResponse(body, content_type="application/json")

    @extend_schema(request=None, responses=None, description="WLCG Tape REST v1: cancel and forget a request.")
    def delete(self, request, request_id):
        bulk = self.stage_request(request, request_id)
        self.require(request, "stage", grid.stage_paths(bulk))
        withdraw_on_commit(grid.stage_delete(bulk=bulk, now=timezone.now()))
        return Response(status=200)


class StageCancel(TapeRestView):
    @extend_schema(request=None, responses=None, description="WLCG Tape REST v1: cancel some files.")
    def post(self, request, request_id):
        bulk = self.stage_request(request, request_id)
        paths = self.body(request).get("paths")
        self.require(request, "stage", paths if isinstance(paths, list) else [])
        withdraw_on_commit(grid.stage_cancel(bulk=bulk, paths=paths, now=timezone.now()))
        return Response(status=200)


class Release(TapeRestView):
    @extend_schema(request=None, responses=None, description="WLCG Tape REST v1: release pinned files.")
    def post(self, request, request_id):
        bulk = None if request_id == PLACEHOLDER_ID else self.stage_request(request, request_id)
        paths = self.body(request).get("paths")
        self.require(request, "stage", paths if isinstance(paths, list) else [])
        grid.stage_release(user=request.user, bulk=bulk, paths=paths, now=timezone.now())
        return Response(status=200)


class ArchiveInfo(TapeRestView):
    @extend_schema(request=None, responses=None, description="WLCG Tape REST v1: where files are.")
    def post(self, request):
        paths = self.body(request).get("paths")
        self.require(request, "poll", paths if isinstance(paths, list) else [])
        return Response(grid.archive_info(paths=paths, now=timezone.now()))


class Discovery(APIView):
    permission_classes = [AllowAny]
    authentication_classes = []

    @extend_schema(request=None, responses=None, description="WLCG Tape REST discovery.")
    def get(self, request):
        return Response({
            "sitename": settings.CAROUSEL_TAPE_REST_SITENAME,
            "description": settings.CAROUSEL_TAPE_REST_DESCRIPTION,
            "endpoints": [{"uri": public_base(request), "version": "v1", "metadata": {}}],
        })
