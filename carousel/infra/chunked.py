"""Request bodies sent chunked (Transfer-Encoding: chunked, no Content-Length). Django reads a
body up to its Content-Length, so without one it reads nothing, and a chunked POST was taken as
an empty body ("paths: This field is required"). The WSGI server de-chunks the body and says
that reading it to its end is safe (`wsgi.input_terminated`, set by gunicorn); it is read here,
at most one byte past the body limit, and handed on with its length. A body past the limit
keeps a length past it, and both doors answer 413 without reading further."""
import io

from django.conf import settings


class ChunkedBodies:
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        if (not environ.get("CONTENT_LENGTH") and environ.get("wsgi.input_terminated")
                and "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()):
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            body = environ["wsgi.input"].read(-1 if limit is None else limit + 1)
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, start_response)
