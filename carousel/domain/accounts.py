"""Users, groups and API tokens from the command line (manage.py user, group, token): each
call states what should be, and running it again changes nothing, so a site can keep its
accounts in a script."""
import math

from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from rest_framework.authtoken.models import Token

from carousel.models import Account, GroupShare


class AccountError(ValueError):
    pass


def _check_name(what, name):
    """A user's or group's name as the admin takes it: not empty, at most 150 characters, no
    control character (the commands stored "", 300 characters and a tab)."""
    if not name.strip() or len(name) > 150 or not name.isprintable():
        raise AccountError(f"{what} must be 1 to 150 printable characters, got {name[:60]!r}")


MAX_WEIGHT = 1e6  # GroupShare's constraint, as an activity's weight
MAX_COUNT = 2**31 - 1  # a PositiveIntegerField's largest value on every database Django supports


def _check_count(what, value):
    # (Larger: SQLite's OverflowError or PostgreSQL's out-of-range error, with a traceback.)
    if value is not None and not 0 <= value <= MAX_COUNT:
        raise AccountError(f"{what} must be from 0 to {MAX_COUNT:,}, got {value}")


@transaction.atomic
def ensure_group(name, *, weight=None, inflight_cap=None):
    """The group `name` with its share row; given values replace the stored ones."""
    _check_name("a group's name", name)
    # inf stopped every cycle (the sharing policy's arithmetic), nan was a database error.
    if weight is not None and not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise AccountError(f"weight must be a number greater than 0 and at most {MAX_WEIGHT:,.0f}, got {weight}")
    _check_count("--inflight-cap", inflight_cap)
    group, _ = Group.objects.get_or_create(name=name)
    share, _ = GroupShare.objects.get_or_create(group=group)
    changes = {k: v for k, v in (("weight", weight), ("inflight_cap", inflight_cap)) if v is not None}
    if changes:
        GroupShare.objects.filter(pk=share.pk).update(**changes)
    return group


@transaction.atomic
def ensure_user(username, *, email=None, groups=None, staff=None, superuser=None, password=None,
                inflight_cap=None, queued_ceiling=None):
    """The user `username`. `groups` (names, existing ones) become exactly the user's groups,
    the first being the one whose share the user's requests draw on. Only what is given is
    changed; a new user without a password can log in with an API token only."""
    _check_name("a user name", username)
    try:
        User.username_validator(username)  # what the admin and the login form take
        if email is not None and email != "":
            validate_email(email)
    except ValidationError as exc:
        raise AccountError(f"{username[:60]!r} / {email!r}: {' '.join(exc.messages)}") from None
    _check_count("--inflight-cap", inflight_cap)
    _check_count("--queued-ceiling", queued_ceiling)
    user, created = User.objects.get_or_create(username=username)
    if created and password is None:
        user.set_unusable_password()
    if password is not None:
        user.set_password(password)
    if email is not None:
        user.email = email
    if staff is not None:
        user.is_staff = staff
    if superuser is not None:
        user.is_superuser = superuser
        user.is_staff = user.is_staff or superuser
    user.save()
    account, _ = Account.objects.get_or_create(user=user)
    if groups is not None:
        found = {g.name: g for g in Group.objects.filter(name__in=groups)}
        missing = [name for name in groups if name not in found]
        if missing:
            raise AccountError(f"no such group: {', '.join(missing)} (create it with `manage.py group NAME`)")
        user.groups.set(found.values())
        account.group = found[groups[0]] if groups else None
    if inflight_cap is not None:
        account.inflight_cap = inflight_cap or None
    if queued_ceiling is not None:
        account.queued_ceiling = queued_ceiling or None
    account.save()
    return user


def api_token(username, *, rotate=False):
    """The user's API token key, created when missing; `rotate` replaces it."""
    try:
        user = User.objects.get(username=username)
    except User.DoesNotExist:
        raise AccountError(f"no such user: {username} (create it with `manage.py user {username}`)") from None
    with transaction.atomic():
        if rotate:
            Token.objects.filter(user=user).delete()
        token, _ = Token.objects.get_or_create(user=user)
    return token.key
