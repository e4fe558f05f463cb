"""The trigger-kept counters never make two writers wait for each other, so they cannot deadlock
them (issue 24): two transactions on two real connections to PostgreSQL move requests of two
groups in opposite orders, each holding its transaction open; both commit, and the counters
equal a recount. (When the triggers upserted shared counter rows, the second writer waited for
the first and PostgreSQL aborted one of them: DeadlockDetected on carousel_statecount.)"""
import threading

from django.db import connection, connections, transaction
from django.db.models import Count
from django.utils import timezone

from carousel.domain.counters import counters_fold
from carousel.domain.services import restore_submit
from carousel.models import ACTIVE_STATES, RestoreRequest, StateCount, UserStateCount

from .conftest import make_user


def end(request_id, state):
    RestoreRequest.objects.filter(id=request_id).update(state=state, finished_at=timezone.now())


def writer(name, moves, after_first, before_second, errors):
    """End the first request, say so, wait for the other writer's first, end the second, commit."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                # Waiting on a lock fails fast instead of hanging (a deadlock is found after 1 s).
                cursor.execute("SET LOCAL lock_timeout = '3s'")
            end(*moves[0])
            after_first.set()
            before_second.wait(10)
            end(*moves[1])
    except Exception as exc:  # noqa: BLE001 - the test reports what the writer met
        errors[name] = f"{type(exc).__name__}: {exc}"
        after_first.set()
    finally:
        connections.close_all()


def assert_counters_equal_a_recount():
    recount = {(s, g or 0): n for s, g, n in RestoreRequest.objects.filter(state__in=ACTIVE_STATES).order_by()
               .values_list("state", "group_id").annotate(n=Count("id")).values_list("state", "group_id", "n")}
    assert {(s, g): n for s, g, n in StateCount.objects.values_list("state", "group_key", "files") if n} == recount
    per_user = {(u, s): n for u, s, n in RestoreRequest.objects.order_by().values_list("user_id", "state")
                .annotate(n=Count("id")).values_list("user_id", "state", "n")}
    assert {(u, s): n for u, s, n in UserStateCount.objects.values_list("user_id", "state", "files") if n} == per_user


def test_two_writers_moving_requests_in_opposite_orders_both_commit(transactional_db, now):
    alice, bob = make_user("alice", "analysis"), make_user("bob", "physics")
    restore_submit(user=alice, paths=["/l/a1", "/l/a2"], now=now)
    restore_submit(user=bob, paths=["/l/b1", "/l/b2"], now=now)
    a1, a2 = RestoreRequest.objects.filter(user=alice).order_by("id").values_list("id", flat=True)
    b1, b2 = RestoreRequest.objects.filter(user=bob).order_by("id").values_list("id", flat=True)
    first_done, second_done, errors = threading.Event(), threading.Event(), {}
    # Like the cycle's expiry step and a user's cancel: alice's group then bob's, and the other way.
    one = threading.Thread(target=writer, args=("one", [(a1, "expired"), (b1, "expired")], first_done,
                                                second_done, errors))
    two = threading.Thread(target=writer, args=("two", [(b2, "cancelled"), (a2, "cancelled")], second_done,
                                                first_done, errors))
    one.start()
    assert first_done.wait(10)
    two.start()
    one.join(20)
    two.join(20)
    assert errors == {}
    assert dict(RestoreRequest.objects.filter(id__in=[a1, a2, b1, b2]).values_list("id", "state")) == {
        a1: "expired", b1: "expired", a2: "cancelled", b2: "cancelled"}
    assert_counters_equal_a_recount()
    counters_fold()
    assert_counters_equal_a_recount()
