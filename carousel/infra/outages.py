"""What a web request answers while PostgreSQL or Redis is unreachable: 503 with Retry-After,
which the `carousel` client and the XRootD hooks retry (as they retry 429), instead of a 500
page that makes them give up at once. The API says it in its JSON error format (api/errors.py);
pages and other addresses through OutageMiddleware."""
import json

import psycopg
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# How long clients wait before asking again: a PostgreSQL or Redis restart takes seconds, a
# failover tens of seconds; the client's own backoff grows from here if it lasts longer.
RETRY_AFTER_S = 30


def outage(exc):
    """What is unreachable, in words for a person, when `exc` says a service is down; else None.
    psycopg's own errors count too: COPY goes through psycopg's cursor (carousel/infra/db.py),
    whose errors Django does not wrap."""
    if isinstance(exc, (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)):
        return "the database is unreachable or overloaded"
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        return "the shared cache (Redis) is unreachable"
    return None


def detail(what):
    return f"{what}: try again in {RETRY_AFTER_S} s; nothing was changed by this call unless it said so"


class OutageMiddleware:
    """503 with Retry-After for an outage that escapes a view (the pages, /metrics, the admin)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exc):
        what = outage(exc)
        if what is None:
            return None
        if request.path.startswith("/api/"):
            body = json.dumps({"status": 503, "code": "unavailable", "detail": detail(what)})
            response = HttpResponse(body, status=503, content_type="application/json")
        else:
            response = HttpResponse(f"Carousel is unavailable for a moment: {detail(what)}.\n", status=503,
                                    content_type="text/plain; charset=utf-8")
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
