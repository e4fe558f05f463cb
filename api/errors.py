"""Every API error is data: {"status", "code", "detail", ...} with a message a person can act on."""
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from carousel.exceptions import CarouselError


def _flatten(detail, prefix=""):
    if isinstance(detail, dict):
        for key, value in detail.items():
            yield from _flatten(value, f"{prefix}{key}: " if key != "non_field_errors" else prefix)
    elif isinstance(detail, list):
        for value in detail:
            yield from _flatten(value, prefix)
    else:
        yield f"{prefix}{detail}"


def exception_handler(exc, context):
    if isinstance(exc, CarouselError):
        body = {"status": exc.status, "code": exc.code, "detail": exc.detail}
        if exc.errors:
            body["errors"] = exc.errors
        return Response(body, status=exc.status)
    response = drf_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        body = {"status": response.status_code, "code": "invalid", "detail": "; ".join(_flatten(exc.detail)),
                "fields": exc.detail}
    else:
        detail = getattr(exc, "detail", str(exc))
        code = detail.code if hasattr(detail, "code") else "error"
        body = {"status": response.status_code, "code": code, "detail": str(detail)}
    response.data = body
    return response


def error(status_code, code, detail):
    return Response({"status": status_code, "code": code, "detail": detail}, status=status_code)


__all__ = ["exception_handler", "error", "status"]
