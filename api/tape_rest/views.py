"""The Tape REST API v1's views: parse the body, check the caller may, call carousel.grid.door,
render. Errors are RFC 7807 problem documents (application/problem+json). The shapes are
described for /api/schema/ by api/tape_rest/schema.py; docs/tape-rest.md says where Carousel
reads the v1 document one way rather than another."""
import json
import re
import uuid
from datetime import timedelta

from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from api.auth import require_token_allows
from api.errors import ServiceUnavailable, as_api_exception
from api.parsers import JSONParser
from carousel.domain import policy
from carousel.domain.services import MAX_PIN_LIFETIME, MIN_PIN_LIFETIME
from carousel.grid import door as grid
from carousel.infra import outages
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


class InsufficientScope(exceptions.PermissionDenied):
    """A token whose scopes do not cover the call (RFC 6750 section 3.1)."""

    default_code = "insufficient_scope"


def poll_refused(request, paths):
    """{path: why} for the (normalised) paths the caller may not poll: the one policy's answer
    (carousel/domain/policy.py: the token's scopes, then the path authorisation)."""
    refusals = policy.poll_refusals(policy.identity(request), paths)
    return {paths[i]: why for i, why in refusals.items()}


class AnyTypeJSONParser(JSONParser):
    """The native API's parser (its size and depth limits, its refusal of text that is not
    text), for any Content-Type: gfal2 and curl users send none, or another."""

    media_type = "*/*"


class TapeRestView(APIView):
    parser_classes = [AnyTypeJSONParser]

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
                # RFC 6750: a credential that was sent and refused is an invalid_token.
                bad = isinstance(exc, exceptions.AuthenticationFailed) and header.startswith("Bearer")
                response["WWW-Authenticate"] = 'Bearer error="invalid_token"' if bad else header
            return response
        # Django's own (a body past the size limit, a database outage), as the native API words them.
        exc = as_api_exception(exc, {"request": self.request})
        if isinstance(exc, exceptions.APIException):
            code = exc.get_codes() if isinstance(exc.detail, str) else exc.default_code
            response = problem(exc.status_code, str(code).replace("_", " "), str(exc.detail))
            if code == "insufficient_scope":
                response["WWW-Authenticate"] = 'Bearer error="insufficient_scope"'
            if isinstance(exc, ServiceUnavailable):
                response["Retry-After"] = str(outages.RETRY_AFTER_S)
            elif exc.status_code == 429 and getattr(exc, "wait", None):
                response["Retry-After"] = str(int(exc.wait))
            return response
        return super().handle_exception(exc)

    def body(self, request, example='{"paths": ["/a/b"]}'):
        """The JSON object sent; `example`: this call's shape, for the error (the stage call's
        said the other calls' shape, which a grid client following it then sent)."""
        data = request.data
        if not isinstance(data, dict):
            raise grid.InvalidSubmission(f"the body must be a JSON object, such as {example}")
        return data

    def stage_request(self, request, request_id, action):
        """The caller's stage request (policy.stage_requests: 404 otherwise), if the policy lets
        it do `action` on it (403 otherwise; insufficient_scope for a token without the scope)."""
        self.valid_id(request_id)
        who = policy.identity(request)
        bulk = grid.stage_requests_of(who).filter(pk=request_id).select_related("user").first()
        if bulk is None:
            raise exceptions.NotFound(f"no stage request {request_id}")
        policy.check_bulk(who, action, bulk)
        return bulk

    @staticmethod
    def valid_id(request_id):
        try:
            uuid.UUID(request_id)
        except ValueError:
            raise exceptions.NotFound(f"no stage request {request_id}")

    def require(self, request, action, paths):
        try:
            require_token_allows(request, action, paths)
        except exceptions.PermissionDenied as exc:
            raise InsufficientScope(str(exc.detail)) from exc


# An ISO 8601 duration of days and times, or weeks (the spec's diskLifetime): "P1W", "P2DT12H",
# "PT1H30M", "PT0.5S". Years and months have no fixed length.
ISO_DURATION = re.compile(r"(?P<sign>-?)P(?:(?P<w>[0-9]+)W|(?:(?P<d>[0-9]+)D)?(?:T(?=[0-9])(?:(?P<h>[0-9]+)H)?"
                          r"(?:(?P<m>[0-9]+)M)?(?:(?P<s>[0-9]+(?:[.,][0-9]+)?)S)?)?)")


def _iso_duration(value):
    """timedelta of an ISO 8601 duration string, or None. Django's parse_duration also took
    "1 day" and "86400" (not ISO) and refused "P1W" (ISO)."""
    match = ISO_DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    found = {k: v for k, v in match.groupdict().items() if k != "sign"}
    if not any(found.values()):
        return None  # "P", "PT": no component
    parts = {k: float((v or "0").replace(",", ".")) for k, v in found.items()}
    span = timedelta(weeks=parts["w"], days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"])
    return -span if match["sign"] else span


def _disk_lifetime(index, value):
    """A file's diskLifetime, with the native API's bounds on pin_lifetime."""
    try:
        parsed = _iso_duration(value)
    except (OverflowError, ValueError):
        parsed = None
    where = f"files[{index}].diskLifetime: {str(value)[:50]!r}"
    if parsed is None:
        years = isinstance(value, str) and re.fullmatch(r"P[0-9YMDTHS.,]*[YM][0-9DTHS.,]*", value.split("T")[0])
        raise grid.InvalidSubmission(f"{where} is not an ISO 8601 duration such as PT1H, P2D or P1W"
                                     + (" (years and months have no fixed length: give days)" if years else ""))
    if not MIN_PIN_LIFETIME <= parsed <= MAX_PIN_LIFETIME:
        raise grid.InvalidSubmission(f"{where} is out of range: from {MIN_PIN_LIFETIME.total_seconds():.0f} "
                                     f"second to {MAX_PIN_LIFETIME.days} days (leave it out for the site's default)")
    return parsed


# The targetedMetadata kept with a stage request (Rucio's activity and kin are a few dozen bytes).
METADATA_KEPT_MAX = 16 * 1024


def _stage_files(body, sitename):
    files = body.get("files")
    if not isinstance(files, list) or not files:
        raise grid.InvalidSubmission('files: expected a non-empty list such as {"files": [{"path": "/a/b"}]}')
    paths, lifetimes, metadata, activity, behalf = [], [], {}, None, set()
    for index, f in enumerate(files):
        if not isinstance(f, dict) or "path" not in f:
            raise grid.InvalidSubmission(f'files[{index}]: expected an object with a "path"')
        paths.append(f["path"])
        lifetime = f.get("diskLifetime")
        if lifetime is not None:
            lifetimes.append(_disk_lifetime(index, lifetime))
        meta = f.get("targetedMetadata")
        if meta is not None and not isinstance(meta, dict):
            raise grid.InvalidSubmission(f"files[{index}].targetedMetadata: expected an object")
        if meta:
            kept = {k: v for k, v in meta.items() if k in ("default", sitename)}
            if not metadata and len(json.dumps(kept)) > METADATA_KEPT_MAX:
                # It is stored with the request: 20 MB of it were, from any user.
                raise grid.InvalidSubmission(
                    f"files[{index}].targetedMetadata: what is kept (this site's key and 'default') is more than "
                    f"{METADATA_KEPT_MAX:,} bytes as JSON")
            metadata = metadata or kept
            named = _file_activity(index, meta, sitename)
            if named and activity and named != activity[1]:
                # One submission has one activity; the first file's was applied to all.
                raise grid.InvalidSubmission(
                    f"files[{index}]: activity {named[:50]!r} differs from files[{activity[0]}]'s "
                    f"{activity[1][:50]!r}: one activity for every file of a stage request (send one "
                    "request per activity)")
            activity = activity or ((index, named) if named else None)
            mine = meta.get(sitename)
            who = mine.get("on_behalf_of") if isinstance(mine, dict) else None
            if who is not None and not (isinstance(who, str) and who):
                raise grid.InvalidSubmission(f"files[{index}].targetedMetadata.{sitename}.on_behalf_of: expected a "
                                             "user name (a non-empty string)")
            behalf.add(who)
    behalf.discard(None)
    if len(behalf) > 1:
        raise grid.InvalidSubmission(f"targetedMetadata.{sitename}.on_behalf_of: one user name for every file")
    return grid.StageFiles(paths=paths, pin_lifetime=max(lifetimes) if lifetimes else None, metadata=metadata,
                           activity=activity[1] if activity else "", on_behalf_of=behalf.pop() if behalf else "")


def _file_activity(index, meta, sitename):
    """The activity one file's targetedMetadata names (this site's key first, then Rucio's
    "default"), or ""; a file without one takes the request's."""
    for key in (sitename, "default"):
        part = meta.get(key)
        if not isinstance(part, dict) or part.get("activity") is None:
            continue
        name = part["activity"]
        if isinstance(name, str) and not name.strip():
            continue  # empty: none given, as the native API takes "" (the default activity)
        if not (isinstance(name, str) and len(name) <= 128 and name.isprintable()):
            # It was cut to 128 characters, or left out when not a string, without a word.
            raise grid.InvalidSubmission(f"files[{index}].targetedMetadata.{key}.activity: expected an activity "
                                         "name of at most 128 printable characters, e.g. \"Express\"")
        return name
    return ""


class Stage(TapeRestView):
    def post(self, request):
        files = _stage_files(self.body(request, '{"files": [{"path": "/a/b"}]}'), settings.CAROUSEL_TAPE_REST_SITENAME)
        self.require(request, "stage", files.paths)
        group = getattr(request.auth, "group", None)
        result = grid.stage_submit(user=request.user, files=files, now=timezone.now(), group=group)
        response = Response({"requestId": str(result.bulk.id)}, status=201)
        response["Location"] = f"{public_base(request)}/stage/{result.bulk.id}"
        return response


class StageDetail(TapeRestView):
    def get(self, request, request_id):
        self.valid_id(request_id)
        body = grid.stage_status_json(user=request.user, request_id=request_id)
        if body is None:
            raise exceptions.NotFound(f"no stage request {request_id}")
        if getattr(request.auth, "allows", None):
            self.require(request, "poll", [f["path"] for f in json.loads(body)["files"]])
        return HttpResponse(body, content_type="application/json")

    def delete(self, request, request_id):
        bulk = self.stage_request(request, request_id, policy.CANCEL)
        # One object, forgotten whole: the token must cover every path of it (a list form skips).
        who = policy.identity(request)
        policy.require_bulk_covered(who, policy.CANCEL, bulk)
        withdraw_on_commit(grid.stage_delete(who=who, bulk=bulk, now=timezone.now()))
        return Response(status=200)


class StageCancel(TapeRestView):
    def post(self, request, request_id):
        bulk = self.stage_request(request, request_id, policy.CANCEL)
        # A list form: paths outside the token's scopes are skipped, not refused whole (the
        # document's all-or-nothing is for paths not in the request: grid.stage_cancel).
        withdraw_on_commit(grid.stage_cancel(who=policy.identity(request), bulk=bulk,
                                             paths=self.body(request).get("paths"), now=timezone.now()))
        return Response(status=200)


class Release(TapeRestView):
    def post(self, request, request_id):
        who = policy.identity(request)
        # Refused whole only for a token that may release nothing; otherwise a list form: what
        # the caller may not release (outside its scopes, not its own) is skipped.
        policy.require_scope(who, policy.RELEASE)
        bulk = None if request_id == PLACEHOLDER_ID else self.stage_request(request, request_id, policy.RELEASE)
        grid.stage_release(who=who, bulk=bulk, paths=self.body(request).get("paths"), now=timezone.now())
        return Response(status=200)


class ArchiveInfo(TapeRestView):
    def post(self, request):
        paths = self.body(request).get("paths")
        return Response(grid.archive_info(paths=paths, now=timezone.now(),
                                          refused=lambda clean: poll_refused(request, clean)))


class NotFound(TapeRestView):
    """Any other address under the door: a 404 problem document, not an HTML page."""

    permission_classes = [AllowAny]
    authentication_classes = []

    def initial(self, request, *args, **kwargs):
        raise exceptions.NotFound(f"nothing at {request.path}: the WLCG Tape REST API v1 has stage, stage/{{id}}, "
                                  "stage/{id}/cancel, release/{id} and archiveinfo")


class Discovery(TapeRestView):
    permission_classes = [AllowAny]
    authentication_classes = []

    def get(self, request):
        return Response({
            "sitename": settings.CAROUSEL_TAPE_REST_SITENAME,
            "description": settings.CAROUSEL_TAPE_REST_DESCRIPTION,
            "endpoints": [{"uri": public_base(request), "version": "v1", "metadata": {}}],
        })
