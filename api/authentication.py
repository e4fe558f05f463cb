"""API token authentication that costs a poll one small query.

DRF's TokenAuthentication reads the token and its user (one query) on every request, the
views' permission checks then read the user's permissions (two more) and the list asks whether
the user acts for others (one more). Here the token, its user, the user's permissions (as
Django's ModelBackend keeps them on the user object) and whether it acts for others are kept in
the shared cache for CAROUSEL_TOKEN_CACHE_SECONDS (30 by default), under a digest of the key
(never the key itself) and of every row the answer was read from, which each request reads
again in one query (STATE): the token, its user, its account, and the ids of its permission
links, its group links and its groups' permission links (a link is only ever added or removed,
and an id never reused, so any change of them changes the ids). Whatever changes one of those
rows, the admin, QuerySet.update() or SQL, changes the digest, and the next request reads the
database. Only successful look-ups are kept: an unknown key or an inactive user gets DRF's
errors."""
import hashlib

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from carousel.domain.selectors import acts_for_others

PREFIX = "authtoken:"

STATE = """
SELECT t.created, u.*, a.acts_for_others, link.kind, link.id
FROM authtoken_token t
JOIN auth_user u ON u.id = t.user_id
LEFT JOIN carousel_account a ON a.user_id = t.user_id
LEFT JOIN (
    SELECT 'permission' AS kind, id, user_id FROM auth_user_user_permissions
    UNION ALL SELECT 'group', id, user_id FROM auth_user_groups
    UNION ALL SELECT 'group permission', gp.id, ug.user_id
              FROM auth_user_groups ug JOIN auth_group_permissions gp ON gp.group_id = ug.group_id
) link ON link.user_id = t.user_id
WHERE t.key = %s"""


def _seconds():
    return getattr(settings, "CAROUSEL_TOKEN_CACHE_SECONDS", 30)


def _cache_key(key):
    """Where the look-up of `key` is kept: a digest of the key and of the rows the look-up is
    read from, as they are now. None if no token has that key."""
    with connection.cursor() as cursor:
        cursor.execute(STATE, [key])
        rows = sorted(repr(row) for row in cursor.fetchall())
    if not rows:
        return None
    digest = hashlib.sha256("\n".join([key, *rows]).encode()).hexdigest()
    return PREFIX + digest


class CachedTokenAuthentication(TokenAuthentication):
    """TokenAuthentication (header "Token <key>") with the look-up cached; same answers."""

    def authenticate_credentials(self, key):
        if "\x00" in key:
            # No key holds one, and PostgreSQL refuses it in a query (a 500): an unknown key.
            raise exceptions.AuthenticationFailed("Invalid token.")
        if _seconds() <= 0:
            return super().authenticate_credentials(key)
        # Read before the look-up it names: a change in between gives the next request another key.
        cache_key = _cache_key(key)
        token = cache.get(cache_key) if cache_key else None
        # The key compared again: a digest collision, however unlikely, must not log anyone in.
        if token is not None and token.key == key:
            return token.user, token
        user, token = super().authenticate_credentials(key)
        # Computed now so the cached user carries them (ModelBackend's _perm_cache and kin), and
        # whether it is a service account (every list of its requests asks).
        user.get_all_permissions()
        user.carousel_acts_for_others = acts_for_others(user, cached=False)
        if cache_key:
            cache.set(cache_key, token, timeout=_seconds())
        return user, token
