"""The user name django-axes records a login attempt under (settings.AXES_USERNAME_CALLABLE)."""
from django.conf import settings


def attempt_username(request, credentials=None):
    """The name given, cut to the 255 characters of axes' column: a longer one (no account has
    one, Django's names stop at 150, but a form accepts any) failed the insert with a 500."""
    given = credentials if credentials else getattr(request, "data", request.POST)
    name = given.get(settings.AXES_USERNAME_FORM_FIELD)
    return name[:255] if isinstance(name, str) else name
