import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")
application = get_wsgi_application()

from carousel.infra.chunked import ChunkedBodies  # noqa: E402 - after Django is set up

application = ChunkedBodies(application)
