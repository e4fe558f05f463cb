"""A cycle with nothing to do asks the database little (issue 24: the fault simulator runs
thousands of cycles a minute; a loop at rest runs one every few seconds for ever)."""
from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext

from carousel.domain.counters import DELTAS, counters_fold
from carousel.domain.services import restore_submit
from carousel.loop.cycle import run_cycle
from carousel.models import RestoreRequest, UserStateCount
from carousel.stagers.immediate import ImmediateStager


def _unfolded():
    return sum(model.objects.filter(folded=False).count() for model in DELTAS)


def test_an_idle_cycle_folds_nothing_and_ends_no_pin(alice, now):
    restore_submit(user=alice, now=now, paths=["/run1/a", "/run1/b"])
    stager = ImmediateStager()
    t = now
    for _ in range(4):  # located, sent, done; then a cycle folds the last changes' deltas
        t += timedelta(seconds=10)
        run_cycle(now=t, stager=stager)
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"done"}
    assert _unfolded() == 0
    with CaptureQueriesContext(connection) as idle:
        run_cycle(now=t + timedelta(seconds=10), stager=stager)
    sql = [q["sql"] for q in idle.captured_queries]
    assert not [s for s in sql if "folded" in s and "EXISTS" not in s], "an idle cycle folded counters"
    assert not [s for s in sql if "FOR" in s and "UPDATE" in s and "pin_until" in s], "an idle cycle locked pins"
    assert not [s for s in sql if "advisory_xact_lock" in s], "an idle cycle took the fold's lock"
    # One cycle's whole conversation with the database, when nothing is due (it was about 70,
    # then 34 before the steps with nothing to do were asked about at once: carousel/loop/due.py).
    assert len(sql) <= 20, "\n".join(sql)


def test_a_fold_after_an_idle_one_still_folds(alice, now):
    counters_fold()  # nothing to fold: one look
    restore_submit(user=alice, now=now, paths=["/run1/a", "/run1/b", "/run2/c"])
    assert _unfolded() > 0
    with CaptureQueriesContext(connection) as one:
        counters_fold()
    assert _unfolded() == 0
    # Only the counters with new deltas were folded (a submission touches a few, not all).
    folded_tables = {model._meta.db_table for model in DELTAS
                     if any(f"INTO {model._meta.db_table}" in q["sql"] or f"FROM {model._meta.db_table} WHERE NOT"
                            in q["sql"] and "DELETE" in q["sql"] for q in one.captured_queries)}
    assert 0 < len(folded_tables) < len(DELTAS)
    # On PostgreSQL every counter's fold is one statement, the lock one more (a transaction's,
    # freed by its end): the look, the lock, the fold, and the per-user counts at zero dropped.
    folds = [q["sql"] for q in one.captured_queries if "DELETE FROM" in q["sql"] and "WHERE NOT folded" in q["sql"]]
    assert len(folds) == 1 and len(folded_tables) > 1, folds
    locks = [q["sql"] for q in one.captured_queries if "advisory" in q["sql"]]
    assert len(locks) == 1 and locks[0].startswith("SELECT pg_try_advisory_xact_lock("), locks
    said = [q["sql"] for q in one.captured_queries if "SAVEPOINT" not in q["sql"]]  # the test's transaction
    assert len(said) == 4, said
    assert list(UserStateCount.objects.filter(user=alice).values_list("state", "files")) == [("queued", 3)]
    with CaptureQueriesContext(connection) as again:
        counters_fold()
    assert len(again.captured_queries) == 1
