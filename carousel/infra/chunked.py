"""Request bodies sent chunked (Transfer-Encoding: chunked, no Content-Length). Django reads a
body up to its Content-Length, so without one it reads nothing, and a chunked POST was taken as
an empty body ("paths: This field is required"). The WSGI server de-chunks the body and says
that reading it to its end is safe (`wsgi.input_terminated`, set by gunicorn); it is read here,
at most one byte past the body limit, and handed on with its length. A body past the limit
keeps a length past it, and both doors answer 413 without reading further."""
import io

from django.conf import settings

from carousel.infra import doors


LENGTH_REQUIRED = ("this server cannot read a body sent chunked: send it with a Content-Length (the development "
                   "server of `make run` does not de-chunk; gunicorn, as docker-compose.yml runs it, does)")


class ChunkedBodies:
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        if not environ.get("CONTENT_LENGTH") and "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            if not environ.get("wsgi.input_terminated"):
                # A server that does not de-chunk (Django's runserver): the body was read as
                # empty ("files: expected a non-empty list"). 411 says what to do instead.
                return _length_required(environ, start_response)
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            body = environ["wsgi.input"].read(-1 if limit is None else limit + 1)
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, start_response)


def _length_required(environ, start_response):
    """411 in the door's words (carousel/infra/doors.py)."""
    media, data = doors.error(environ.get("PATH_INFO", ""), 411, title="length required", code="length_required",
                              detail=LENGTH_REQUIRED)
    start_response("411 Length Required", [("Content-Type", media), ("Content-Length", str(len(data)))])
    return [data]
