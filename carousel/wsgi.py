import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")
application = get_wsgi_application()

# gunicorn runs no system checks: refuse here what carousel.E006 refuses for manage.py (a worker
# that cannot load the application stops gunicorn).
from carousel.infra.deploy import refuse_unsafe_production  # noqa: E402 - after Django is set up
from carousel.infra.chunked import ChunkedBodies  # noqa: E402 - after Django is set up

refuse_unsafe_production()
application = ChunkedBodies(application)
