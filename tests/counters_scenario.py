"""A run through every write path of requests (submit, a shared stage, the loop's locate,
claim and finish, cancel, failure, retry now, delete, a user's deletion) that checks after
each step that the trigger-kept per-user state counters equal a count of the rows, and that
the summary a client polls says the same as the rows. Plain code, no pytest: test_counters
runs it on PostgreSQL in the test database and on SQLite in a subprocess."""
from datetime import timedelta

from django.contrib.auth.models import User
from django.db.models import Count, Min, Sum
from django.db.models.functions import Coalesce

from django.test import override_settings

from carousel.domain import intake, selectors
from carousel.domain import services
from carousel.loop.cycle import run_cycle
from carousel.models import ACTIVE_STATES, RequestState, RestoreRequest, UserStateCount
from carousel.stagers.immediate import ImmediateStager


def counted():
    """{(user, state): (files, bytes)} as the rows say."""
    return {(u, s): (n, b) for u, s, n, b in RestoreRequest.objects.order_by().values_list("user_id", "state")
            .annotate(n=Count("id"), b=Coalesce(Sum("size"), 0)).values_list("user_id", "state", "n", "b")}


def kept():
    """{(user, state): (files, bytes)} as the counters say (rows at zero left out)."""
    return {(u, s): (n, b) for u, s, n, b in UserStateCount.objects.values_list("user_id", "state", "files", "bytes")
            if n or b}


def check(step, users):
    rows, counters = counted(), kept()
    assert counters == rows, f"after {step}: counters {counters} != rows {rows}"
    for user in users:
        mine = RestoreRequest.objects.filter(user=user)
        active = mine.filter(state__in=ACTIVE_STATES)
        expected = {
            "states": {s: mine.filter(state=s).count() for s in RequestState.values},
            "active": active.count(),
            "bytes_done": mine.filter(state="done").aggregate(b=Coalesce(Sum("size"), 0))["b"],
            "bytes_active_known": active.aggregate(b=Coalesce(Sum("size"), 0))["b"],
            "oldest_active_at": active.aggregate(m=Min("created_at"))["m"],
        }
        got = selectors.queue_summary(user=user)
        assert got == expected, f"after {step}: summary of {user} {got} != {expected}"
    return rows


def run(now):
    alice = User.objects.create_user("counters-alice")
    bob = User.objects.create_user("counters-bob")
    users = (alice, bob)
    stager = ImmediateStager()
    check("nothing", users)
    services.restore_submit(user=alice, paths=["/c/a", "/c/b", "/c/c"], now=now)
    check("a submission", users)
    services.restore_submit(user=alice, paths=["/c/a", "/c/x"], now=now + timedelta(seconds=1))
    check("a submission asking again", users)
    run_cycle(now=now + timedelta(seconds=2), stager=stager)  # locates (sizes known), sends
    rows = check("a cycle that locates and sends", users)
    assert any(b for _, b in rows.values()), "the cycle should have located files (sizes)"
    services.restore_submit(user=bob, paths=["/c/a", "/c/d"], now=now + timedelta(seconds=3))
    check("a submission joining a stage in flight", users)
    run_cycle(now=now + timedelta(seconds=12), stager=stager)
    run_cycle(now=now + timedelta(seconds=22), stager=stager)
    rows = check("cycles that finish", users)
    assert rows.get((alice.id, "done")), "alice's files should be done"
    services.restore_submit(user=alice, paths=["/c/p1", "/c/p2"], now=now + timedelta(seconds=23),
                            pin_lifetime=timedelta(hours=1))
    run_cycle(now=now + timedelta(seconds=24), stager=stager)
    run_cycle(now=now + timedelta(seconds=26), stager=stager)
    services.restore_submit(user=bob, paths=["/c/p1"], now=now + timedelta(seconds=27))
    check("a submission served from a pinned copy", users)
    with override_settings(CAROUSEL_INTAKE_ABOVE=0):
        big = services.restore_submit(user=bob, paths=["/c/p2", "/c/q"], now=now + timedelta(seconds=28))
    intake.settle(big.bulk.pk, now=now + timedelta(seconds=28))
    check("an intake's move served from a pinned copy", users)
    assert RestoreRequest.objects.filter(user=bob, path__in=["/c/p1", "/c/p2"], state="done").count() == 2
    services.restore_submit(user=alice, paths=["/c/e", "/c/f", "/c/g"], now=now + timedelta(seconds=30))
    services.request_cancel(queryset=RestoreRequest.objects.filter(user=alice, path="/c/e"),
                            now=now + timedelta(seconds=31))
    check("a cancel", users)
    services.request_transition(RestoreRequest.objects.filter(user=alice, path="/c/f"), RequestState.FAILED,
                                now=now + timedelta(seconds=32), error_class="permanent", last_error="test")
    check("a failure", users)
    services.request_retry_now(queryset=RestoreRequest.objects.filter(user=alice, path="/c/f"),
                               now=now + timedelta(seconds=33))
    check("a retry now", users)
    RestoreRequest.objects.filter(user=alice, path="/c/g").delete()
    check("a delete", users)
    bob.delete()
    check("a user's deletion", (alice,))
    assert not UserStateCount.objects.filter(user_id=bob.id).exclude(files=0, bytes=0).exists()
