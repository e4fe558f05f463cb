"""Looking requests up by many path keys at once (db.in_keys): a submission's active-request
look-up, the intake's, the Tape REST door's. Issue 24: a 12,000-path submission's look-up once
took 76 s under load. On PostgreSQL it is one scan of the table, never a join whose plan could
walk the keys once per row."""
import pytest
from django.db import connection

from carousel.domain.services import restore_submit
from carousel.infra import db
from carousel.models import ACTIVE_STATES, RestoreRequest, path_key


def test_many_keys_find_exactly_their_active_requests(alice, bob, now):
    restore_submit(user=alice, now=now, paths=[f"/k/a{i}" for i in range(30)])
    restore_submit(user=bob, now=now, paths=["/k/a0", "/k/b"])
    keys = [path_key(p) for p in ["/k/a0", "/k/a29", "/k/b", "/k/none"]]
    found = RestoreRequest.objects.filter(db.in_keys("path_key", keys), state__in=ACTIVE_STATES)
    assert sorted(found.values_list("user__username", "path")) == [
        ("alice", "/k/a0"), ("alice", "/k/a29"), ("bob", "/k/a0"), ("bob", "/k/b")]
    assert not RestoreRequest.objects.filter(db.in_keys("path_key", [])).exists()


def test_the_look_up_of_12000_keys_is_one_scan_not_a_join(alice, now):
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    restore_submit(user=alice, now=now, paths=[f"/k/f{i}" for i in range(100)])
    keys = [path_key(f"/k/f{i}") for i in range(12_000)]
    plan = RestoreRequest.objects.filter(db.in_keys("path_key", keys), state__in=ACTIVE_STATES).explain()
    assert "Join" not in plan and "Nested Loop" not in plan and "SubPlan" not in plan, plan[:2000]
