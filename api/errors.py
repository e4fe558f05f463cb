"""Every API error is data: {"status", "code", "detail", ...} with a message a person can act on.
Validation errors add "fields" ({field: [messages]}), so a program can tell where."""
from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from carousel.domain.exceptions import CarouselError, NotFound
from carousel.infra import outages


class PayloadTooLarge(exceptions.APIException):
    status_code = 413
    default_code = "too_large"
    default_detail = "the request body is too large"


class ServiceUnavailable(exceptions.APIException):
    status_code = 503
    default_code = "unavailable"
    default_detail = "a service Carousel needs is unreachable"


def body_limit_message(limit):
    return (f"the request body is larger than {limit:,} bytes, the limit of one request; "
            "split the paths into several submissions")


def _flatten(detail, prefix=""):
    if isinstance(detail, dict):
        for key, value in detail.items():
            yield from _flatten(value, f"{prefix}{key}: " if key != "non_field_errors" else prefix)
    elif isinstance(detail, list):
        for value in detail:
            yield from _flatten(value, prefix)
    else:
        yield f"{prefix}{detail}"


def as_api_exception(exc, context):
    """Django's own exceptions, as DRF's, with words that say what was not found or refused."""
    request = context.get("request")
    if isinstance(exc, Http404):
        where = f" at {request.path}" if request is not None else ""
        return exceptions.NotFound(f"nothing{where}: no such address, or no such object visible to you")
    if isinstance(exc, PermissionDenied):
        return exceptions.PermissionDenied()
    what = outages.outage(exc)
    if what is not None:
        return ServiceUnavailable(outages.detail(what))
    if isinstance(exc, RequestDataTooBig):
        return PayloadTooLarge(body_limit_message(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))
    return exc


def exception_handler(exc, context):
    if isinstance(exc, NotFound):
        # Another user's request or submission is answered as one that does not exist, in the
        # same words: different ones told a caller which ids exist (and how fast they grow).
        exc = Http404()
    if isinstance(exc, CarouselError):
        body = {"status": exc.status, "code": exc.code, "detail": exc.detail}
        if exc.errors:
            body["errors"] = exc.errors
        return Response(body, status=exc.status, headers=getattr(exc, "headers", None))
    exc = as_api_exception(exc, context)
    response = drf_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        # A field's errors are a list, whoever raised them (one raised as a plain text was
        # answered as a string, unlike every other field's).
        fields = {name: [errors] if isinstance(errors, str) else errors for name, errors in fields.items()}
        body = {"status": response.status_code, "code": "invalid", "detail": "; ".join(_flatten(exc.detail)),
                "fields": fields}
    else:
        detail = getattr(exc, "detail", str(exc))
        code = detail.code if hasattr(detail, "code") else "error"
        body = {"status": response.status_code, "code": code, "detail": str(detail)}
    response.data = body
    if isinstance(exc, ServiceUnavailable):
        response["Retry-After"] = str(outages.RETRY_AFTER_S)
    return response


def error(status_code, code, detail):
    return Response({"status": status_code, "code": code, "detail": detail}, status=status_code)


class ErrorSerializer(serializers.Serializer):
    """The body of every error answer (for the schema)."""

    status = serializers.IntegerField(help_text="the HTTP status, repeated")
    code = serializers.CharField(help_text="a stable word for programs: invalid, invalid_submission, not_found, "
                                           "not_authenticated, permission_denied, too_large, throttled, ...")
    detail = serializers.CharField(help_text="what was wrong, and where, for a person")
    fields = serializers.DictField(required=False, help_text="invalid input: {field: [messages]}")
    errors = serializers.ListField(child=serializers.DictField(), required=False,
                                   help_text="refused paths of a submission: index, line, path, message")


__all__ = ["exception_handler", "error", "status", "PayloadTooLarge", "ErrorSerializer"]


BAD_HOST = "the request's Host header names no address this server answers to (ALLOWED_HOSTS)"
BAD_REQUEST = "the request could not be read: its headers or body are malformed"


def bad_request(request, exception):
    """Django's 400 (a Host header not in ALLOWED_HOSTS, a malformed request, before any view) in
    each door's error format: the Tape REST door's clients read problem documents, the API's
    its error body; the pages keep Django's. The detail never echoes the request."""
    from django.core.exceptions import DisallowedHost
    from django.http import HttpResponse
    from django.views import defaults

    from carousel.infra import doors

    if doors.door(request.path) == "pages":
        return defaults.bad_request(request, exception)
    detail = BAD_HOST if isinstance(exception, DisallowedHost) else BAD_REQUEST
    media, body = doors.error(request.path, 400, title="bad request", code="bad_request", detail=detail)
    return HttpResponse(body, status=400, content_type=media)
