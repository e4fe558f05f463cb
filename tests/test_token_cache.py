"""API tokens are looked up in the shared cache (api/authentication.py): a poll costs one
small query (the state of the rows the look-up depends on) and no permission query, and
whatever changes who the token's owner is or what it may do takes effect at the next request,
not when the cache entry runs out, however it was changed (signals or none)."""
import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token

from api.authentication import STATE
from carousel.models import Account, RestoreRequest
from carousel.domain.services import restore_submit

from .conftest import client_for

SUMMARY = "/api/v1/summary/"
LIST = "/api/v1/requests/"
AUTH_TABLES = ("authtoken_token", "auth_user", "auth_permission", "auth_group", "carousel_account")  # read FROM them


def auth_queries(client, url):
    with CaptureQueriesContext(connection) as queries:
        r = client.get(url)
    assert r.status_code == 200, r.content
    return ["STATE" if q["sql"].startswith(STATE.split("WHERE")[0]) else q["sql"] for q in queries
            if any(f'FROM "{t}" ' in q["sql"] or f"FROM {t} " in q["sql"] for t in AUTH_TABLES)]


def test_a_second_poll_reads_one_query_and_not_the_permissions(as_alice):
    assert len(auth_queries(as_alice, LIST)) >= 4  # the first request reads the token, permissions, account
    assert auth_queries(as_alice, LIST) == ["STATE"]
    assert auth_queries(as_alice, SUMMARY) == ["STATE"]


def test_a_deleted_token_is_refused_at_once(alice, as_alice):
    assert as_alice.get(SUMMARY).status_code == 200
    Token.objects.filter(user=alice).get().delete()
    r = as_alice.get(SUMMARY)
    assert r.status_code == 401 and r.json()["code"] == "authentication_failed"


def test_a_deactivated_user_is_refused_at_once(alice, as_alice):
    assert as_alice.get(SUMMARY).status_code == 200
    alice.is_active = False
    alice.save()
    assert as_alice.get(SUMMARY).status_code == 401


def test_an_unknown_token_is_refused_every_time(alice, as_alice):
    as_alice.get(SUMMARY)
    wrong = client_for(alice)
    wrong.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    assert wrong.get(SUMMARY).status_code == 401
    assert wrong.get(SUMMARY).status_code == 401


@pytest.mark.parametrize("keyword", ["Token", "Bearer"])
@pytest.mark.parametrize("cache_seconds", [30, 0])
def test_a_key_with_a_nul_is_an_unknown_token_not_a_database_error(settings, db, keyword, cache_seconds):
    """PostgreSQL refuses a NUL in the look-up: it was a 500 on both doors (issue 25)."""
    from rest_framework.test import APIClient

    settings.CAROUSEL_TOKEN_CACHE_SECONDS = cache_seconds
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} a\x00b")
    for url in (SUMMARY, "/api/tape-rest/v1/stage/some-id"):
        answer = client.get(url)
        assert answer.status_code == 401 and "Invalid token" in answer.json()["detail"]


@pytest.fixture
def bobs_request(bob, now):
    restore_submit(user=bob, now=now, paths=["/b/1"])
    return RestoreRequest.objects.get(user=bob)


def seen(client):
    return {r["path"] for r in client.get(LIST).json()["results"]}


def view_all():
    return Permission.objects.get(content_type__app_label="carousel", codename="view_restorerequest")


def test_a_permission_given_or_taken_counts_at_once(alice, as_alice, bobs_request):
    assert seen(as_alice) == set()
    alice.user_permissions.add(view_all())
    assert seen(as_alice) == {"/b/1"}
    alice.user_permissions.remove(view_all())
    assert seen(as_alice) == set()


def test_a_groups_permission_and_membership_count_at_once(alice, as_alice, bobs_request):
    operators = Group.objects.create(name="operators")
    alice.groups.add(operators)
    assert seen(as_alice) == set()
    operators.permissions.add(view_all())           # the group gains it
    assert seen(as_alice) == {"/b/1"}
    operators.user_set.remove(alice)                # alice leaves the group (from its side)
    assert seen(as_alice) == set()
    view_all().group_set.add(operators)             # from the permission's side
    operators.user_set.add(alice)
    assert seen(as_alice) == {"/b/1"}
    view_all().group_set.remove(operators)
    assert seen(as_alice) == set()
    operators.permissions.add(view_all())
    assert seen(as_alice) == {"/b/1"}
    operators.delete()                              # the group goes
    assert seen(as_alice) == set()


def test_changes_made_without_signals_count_at_once(alice, as_alice, bobs_request, now):
    """QuerySet.update(), bulk_create and SQL send no model signals: the cached look-up must
    still not outlive what it was read from."""
    from carousel.grid.door import submission_create

    assert as_alice.get(SUMMARY).status_code == 200
    User.objects.filter(pk=alice.pk).update(is_active=False)
    assert as_alice.get(SUMMARY).status_code == 401
    User.objects.filter(pk=alice.pk).update(is_active=True)
    assert seen(as_alice) == set()
    User.user_permissions.through.objects.bulk_create([User.user_permissions.through(user=alice, permission=view_all())])
    assert seen(as_alice) == {"/b/1"}
    User.user_permissions.through.objects.filter(user=alice).delete()
    assert seen(as_alice) == set()
    operators = Group.objects.create(name="operators")
    User.groups.through.objects.bulk_create([User.groups.through(user=alice, group=operators)])
    Group.permissions.through.objects.bulk_create([Group.permissions.through(group=operators, permission=view_all())])
    assert seen(as_alice) == {"/b/1"}
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM auth_group_permissions WHERE group_id = %s", [operators.pk])
    assert seen(as_alice) == set()
    Account.objects.update_or_create(user=alice, defaults={"acts_for_others": True})
    submission_create(submitter=alice, on_behalf_of="bob", paths=["/b/for-bob"], now=now)
    assert seen(as_alice) == {"/b/for-bob"}
    Account.objects.filter(user=alice).update(acts_for_others=False)
    assert seen(as_alice) == set()
    assert auth_queries(as_alice, LIST) == ["STATE"]  # and then cached again
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM authtoken_token WHERE user_id = %s", [alice.pk])
    assert as_alice.get(SUMMARY).status_code == 401


def test_without_the_cache_the_database_answers_every_time(settings, as_alice):
    settings.CAROUSEL_TOKEN_CACHE_SECONDS = 0
    as_alice.get(SUMMARY)
    assert auth_queries(as_alice, SUMMARY)


def test_a_service_account_made_or_unmade_counts_at_once(alice, bob, as_alice, now):
    """Whether the token's owner acts for others is cached with it: a service account lists
    the requests it submitted for others, and the change of the flag is seen at the next poll."""
    from carousel.grid.door import submission_create
    from carousel.models import Account

    restore_submit(user=alice, now=now, paths=["/a/1"])
    assert seen(as_alice) == {"/a/1"}
    account, _ = Account.objects.get_or_create(user=alice)
    account.acts_for_others = True
    account.save()
    submission_create(submitter=alice, on_behalf_of="bob", paths=["/b/for-bob"], now=now)
    assert seen(as_alice) == {"/a/1", "/b/for-bob"}
    assert auth_queries(as_alice, LIST) == ["STATE"]  # and then cached again
    account.acts_for_others = False
    account.save()
    assert seen(as_alice) == {"/a/1"}


def test_the_redis_cache_builds_one_client_per_process(settings):
    """Django's own Redis backend builds a redis.Redis per call (a table of ~170 callbacks each
    time); django-redis keeps one, which the throttles' pipeline uses too."""
    from django.core.cache import cache
    from django_redis import get_redis_connection

    if settings.CACHES["default"]["BACKEND"] != "django_redis.cache.RedisCache":
        pytest.skip("the embedded default has no Redis")
    cache.set("carousel-test-client", 1)
    client = get_redis_connection()
    assert cache.get("carousel-test-client") == 1
    assert get_redis_connection() is client and get_redis_connection(write=False) is client
