"""While PostgreSQL or Redis is unreachable, every door answers 503 with Retry-After (the API in
its JSON error format), which the clients retry, never a 500 page (issue 24)."""
import pytest
from django.core.cache import caches
from django.db import OperationalError

from carousel.domain import selectors
from carousel.infra.localservices import free_port
from carousel.infra.outages import RETRY_AFTER_S

from .conftest import client_for


def database_gone(*args, **kwargs):
    raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')


def test_the_api_answers_503_in_its_format_while_the_database_is_unreachable(alice, monkeypatch):
    monkeypatch.setattr(selectors, "queue_summary", database_gone)
    r = client_for(alice).get("/api/v1/summary/")
    assert r.status_code == 503 and r["Retry-After"] == str(RETRY_AFTER_S)
    body = r.json()
    assert body["code"] == "unavailable" and "database is unreachable" in body["detail"]


def test_a_page_answers_503_with_retry_after_while_the_database_is_unreachable(alice, client, monkeypatch):
    client.force_login(alice)
    monkeypatch.setattr(selectors, "request_page", database_gone)
    r = client.get("/")
    assert r.status_code == 503 and r["Retry-After"] == str(RETRY_AFTER_S)
    assert "unavailable for a moment" in r.content.decode()


@pytest.fixture
def redis_down(settings):
    # A real Redis client against a port nobody listens on.
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
                                   "KEY_PREFIX": "down"}}
    caches["default"].close()
    yield
    caches["default"].close()


def test_the_api_works_on_while_redis_is_unreachable(alice, redis_down):
    """The token is looked up in the database and the throttle lets the call through: an outage
    of the cache alone does not stop the doors (issue 24)."""
    client = client_for(alice)
    assert client.get("/api/v1/summary/").status_code == 200
    r = client.post("/api/v1/requests/", {"paths": ["/while/redis/is/down"]}, format="json")
    assert r.status_code == 201, r.content


def test_a_submission_whose_copy_loses_the_database_answers_503(alice, monkeypatch):
    # COPY goes through psycopg's own cursor (carousel.infra.db.insert_rows): its errors are
    # psycopg's, not Django's wrapped ones. A PostgreSQL restart mid-COPY was a 500 page.
    import psycopg

    from carousel.infra import db

    def copy_cut(*args, **kwargs):
        raise psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")

    monkeypatch.setattr(db, "insert_rows", copy_cut)
    r = client_for(alice).post("/api/v1/requests/", {"paths": ["/o/a", "/o/b"]}, format="json")
    assert r.status_code == 503 and r["Retry-After"] == str(RETRY_AFTER_S)
    assert r.json()["code"] == "unavailable"
