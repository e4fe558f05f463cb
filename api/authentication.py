"""API token authentication that costs a poll no database query.

DRF's TokenAuthentication reads the token and its user (one query) on every request, and the
views' permission checks then read the user's permissions (two more): three round trips to
PostgreSQL before a poll reads anything it asked for. Here the token, its user and the user's
permissions (as Django's ModelBackend keeps them on the user object) are kept in the shared
cache for CAROUSEL_TOKEN_CACHE_SECONDS (30 by default) under a digest of the key, never the key
itself. Whatever could change the answer removes the entries it touches at once: a token
deleted, a user saved or deleted (deactivated, made superuser), a user's groups or permissions
changed, a group's permissions changed or the group deleted, the user's Account saved or deleted
(whether it acts for others is cached on the user too). What bypasses model signals
(QuerySet.update() on users, a Permission row deleted, SQL by hand) takes effect within the TTL.
Only successful look-ups are kept: an unknown key or an inactive user is read from the database
every time, with DRF's errors."""
import hashlib

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

from carousel.models import Account
from carousel.domain.selectors import acts_for_others

PREFIX = "authtoken:"


def _cache_key(key):
    return PREFIX + hashlib.sha256(key.encode()).hexdigest()


def _seconds():
    return getattr(settings, "CAROUSEL_TOKEN_CACHE_SECONDS", 30)


class CachedTokenAuthentication(TokenAuthentication):
    """TokenAuthentication (header "Token <key>") with the look-up cached; same answers."""

    def authenticate_credentials(self, key):
        if _seconds() <= 0:
            return super().authenticate_credentials(key)
        cache_key = _cache_key(key)
        token = cache.get(cache_key)
        # The key compared again: a digest collision, however unlikely, must not log anyone in.
        if token is not None and token.key == key:
            return token.user, token
        user, token = super().authenticate_credentials(key)
        # Computed now so the cached user carries them (ModelBackend's _perm_cache and kin), and
        # whether it is a service account (every list of its requests asks).
        user.get_all_permissions()
        user.carousel_acts_for_others = acts_for_others(user, cached=False)
        cache.set(cache_key, token, timeout=_seconds())
        return user, token


def forget_keys(keys):
    """Forgets the look-ups now, and again when the transaction commits: a request that read the
    database before the commit may have cached what it saw in between."""
    if keys:
        names = [_cache_key(k) for k in keys]
        cache.delete_many(names)
        transaction.on_commit(lambda: cache.delete_many(names))


def forget_users(users):
    forget_keys(list(Token.objects.filter(user__in=users).values_list("key", flat=True)))


def _token_deleted(sender, instance, **kwargs):
    forget_keys([instance.key])


def _user_changed(sender, instance, **kwargs):
    # The user's tokens may already be gone (a cascade deletes them first, and each one's
    # post_delete forgets it); a save (is_active, is_superuser) forgets every token it has.
    forget_users([instance.pk])


def _account_changed(sender, instance, **kwargs):
    forget_users([instance.user_id])


def _everyone():
    return get_user_model().objects.values_list("pk", flat=True)


def _user_m2m_changed(sender, instance, action, reverse, pk_set, **kwargs):
    """A user's groups or own permissions changed (either side of the relation)."""
    if not action.startswith("post_"):
        return
    if not reverse:
        forget_users([instance.pk])
    else:  # group.user_set.add(...), permission.user_set.remove(...): the users are in pk_set
        forget_users(list(pk_set) if pk_set is not None else _everyone())


def _group_changed(sender, instance, action=None, reverse=False, pk_set=None, **kwargs):
    """A group's permissions changed (either side), or the group is about to be deleted."""
    if action is not None and not action.startswith("post_"):
        return
    User = get_user_model()
    if not reverse:
        forget_users(User.objects.filter(groups=instance).values_list("pk", flat=True))
    else:  # permission.group_set.add(...): the groups are in pk_set (none after a clear: everyone)
        forget_users(User.objects.filter(groups__in=pk_set).values_list("pk", flat=True)
                     if pk_set is not None else _everyone())


def connect():
    User = get_user_model()
    post_delete.connect(_token_deleted, sender=Token, dispatch_uid="api.auth.token_deleted")
    post_save.connect(_user_changed, sender=User, dispatch_uid="api.auth.user_saved")
    post_delete.connect(_user_changed, sender=User, dispatch_uid="api.auth.user_deleted")
    # Whether the user is a service account (acts_for_others) is cached with it too.
    post_save.connect(_account_changed, sender=Account, dispatch_uid="api.auth.account_saved")
    post_delete.connect(_account_changed, sender=Account, dispatch_uid="api.auth.account_deleted")
    m2m_changed.connect(_user_m2m_changed, sender=User.groups.through, dispatch_uid="api.auth.user_groups")
    m2m_changed.connect(_user_m2m_changed, sender=User.user_permissions.through, dispatch_uid="api.auth.user_perms")
    m2m_changed.connect(_group_changed, sender=Group.permissions.through, dispatch_uid="api.auth.group_perms")
    # A group deleted: its users lose its permissions (their rows in the m2m go without a signal).
    pre_delete.connect(_group_changed, sender=Group, dispatch_uid="api.auth.group_deleted")
