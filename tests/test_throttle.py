"""Per-account throttling: counted in the shared cache (Redis here), per account, answered 429
in the API's error format with Retry-After."""
import pytest
from django.core.cache import cache
from django_redis import get_redis_connection

from carousel.models import RestoreRequest

from .conftest import client_for

SUMMARY = "/api/v1/summary/"


@pytest.fixture
def three_a_minute(settings):
    rest = dict(settings.REST_FRAMEWORK)
    rest["DEFAULT_THROTTLE_RATES"] = {"account": "3/minute"}
    # No cache.clear(): the Redis database is Celery's broker too. Counts are per user id,
    # and every test's users are new rows with new ids.
    settings.REST_FRAMEWORK = rest


def test_an_account_past_its_rate_gets_429_with_retry_after(three_a_minute, as_alice):
    for _ in range(3):
        assert as_alice.get(SUMMARY).status_code == 200
    r = as_alice.get(SUMMARY)
    assert r.status_code == 429
    body = r.json()
    assert body["status"] == 429 and body["code"] == "throttled" and "throttled" in body["detail"].lower()
    assert 1 <= int(r["Retry-After"]) <= 60
    # A submission past the rate is refused too, and stores nothing.
    r = as_alice.post("/api/v1/requests/", {"paths": ["/a"]}, format="json")
    assert r.status_code == 429 and not RestoreRequest.objects.exists()


def test_each_account_has_its_own_count(three_a_minute, as_alice, as_bob):
    for _ in range(3):
        as_alice.get(SUMMARY)
    assert as_alice.get(SUMMARY).status_code == 429
    assert as_bob.get(SUMMARY).status_code == 200


def test_the_count_is_shared_by_every_process(three_a_minute, alice, as_alice):
    """Another process (another gunicorn worker) sees the same count: it lives in the shared
    cache, not in the process. A second client and a fresh throttle object stand for it."""
    from django.conf import settings

    assert settings.CACHES["default"]["BACKEND"].endswith("RedisCache")
    for _ in range(3):
        assert as_alice.get(SUMMARY).status_code == 200
    assert client_for(alice).get(SUMMARY).status_code == 429
    keys = get_redis_connection().keys(f"*throttle_account_{alice.pk}_*")
    assert len(keys) == 1 and int(get_redis_connection().get(keys[0])) == 4
    assert cache.get(keys[0].decode().split(":", 2)[2]) == 4  # the key as the cache API writes it


def test_the_shipped_rate_does_not_answer_ordinary_use(as_alice):
    for _ in range(20):
        assert as_alice.get(SUMMARY).status_code == 200


def test_a_request_counts_in_one_round_trip_to_redis(as_alice, monkeypatch):
    """INCR and EXPIRE in one pipeline: one round trip per request for the throttle."""
    from redis.client import Pipeline

    as_alice.get(SUMMARY)  # the token look-up cached: what remains is the throttle
    calls = []
    original = Pipeline.execute
    monkeypatch.setattr(Pipeline, "execute", lambda self, *a, **k: calls.append(len(self.command_stack))
                        or original(self, *a, **k))
    client = get_redis_connection()
    sent = []
    send = type(client).execute_command
    monkeypatch.setattr(type(client), "execute_command", lambda self, *a, **k: sent.append(a[0]) or send(self, *a, **k))
    assert as_alice.get(SUMMARY).status_code == 200
    assert calls == [2] and sent == ["GET"]  # the pipeline; GET: the cached token
