"""A NUL in a query parameter names nothing Carousel holds (PostgreSQL text cannot contain one),
and reaching the database it was a 500 wherever a parameter filters a list: the API's
`?label=`, the admin's column filters (`?state=`, `?label=`, of every model). Refused here,
before any view, with 400 saying which parameter: the API in its JSON error format
(api/errors.py; RFC 7807 on the Tape REST door), pages as text."""
from django.http import HttpResponse

from carousel.infra import doors


def nul_parameter(query):
    """The name of the first query parameter whose name or value holds a NUL, or None."""
    for name, values in query.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            return name
    return None


class QueryNulMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        name = nul_parameter(request.GET)
        if name is None:
            return self.get_response(request)
        shown = name.replace("\x00", "\\0")[:50]
        message = "contains a NUL byte"
        media, body = doors.error(request.path, 400, title="bad request", code="invalid",
                                  detail=f"the query parameter {shown!r} {message}", api_detail=f"{shown}: {message}",
                                  fields={shown: [message]})
        return HttpResponse(body, status=400, content_type=media)
