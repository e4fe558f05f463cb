"""A cancel of a submission and a resubmission of the same files, on two real connections to
PostgreSQL: whichever commits second sees the first, and a resubmission answered as accepted
is never lost (issue 24). Cancelling a submission leaves the requests another submission not
cancelled still asks for (a person's own request a service also asked for them: issue 25)."""
import threading
import time
from datetime import timedelta

from django.db import connections, transaction

from carousel.domain import services
from carousel.domain.services import bulk_cancel, restore_submit
from carousel.models import Account, RestoreRequest

from .conftest import client_for, make_user

PATHS = [f"/race/f{i}" for i in range(50)]


def states(bulk):
    return sorted(set(RestoreRequest.objects.filter(services.selectors.in_bulk(bulk)).values_list("state", flat=True)))


def test_a_resubmission_committed_before_a_racing_cancel_keeps_its_files(transactional_db, alice, now):
    first = restore_submit(user=alice, paths=PATHS, now=now).bulk
    answered, commit = threading.Event(), threading.Event()
    result = {}

    def resubmit():
        try:
            with transaction.atomic():
                result["again"] = restore_submit(user=alice, paths=PATHS, now=now + timedelta(seconds=1))
                answered.set()
                commit.wait(10)
        finally:
            connections.close_all()

    def cancel():
        try:
            result["cancelled"] = bulk_cancel(bulk=first, now=now + timedelta(seconds=2))[0]
        finally:
            connections.close_all()

    submitter = threading.Thread(target=resubmit)
    submitter.start()
    assert answered.wait(10)
    canceller = threading.Thread(target=cancel)
    canceller.start()
    time.sleep(0.5)
    assert canceller.is_alive()  # the cancel waits for the resubmission to commit
    commit.set()
    submitter.join(10)
    canceller.join(10)
    again = result["again"]
    assert (again.created, again.existing) == (0, len(PATHS))
    assert result["cancelled"] == 0  # the resubmission still asks for every file
    assert states(again.bulk) == ["queued"]


def test_a_resubmission_after_a_cancel_queues_the_files_anew(transactional_db, alice, now):
    first = restore_submit(user=alice, paths=PATHS, now=now).bulk
    assert bulk_cancel(bulk=first, now=now + timedelta(seconds=1))[0] == len(PATHS)
    again = restore_submit(user=alice, paths=PATHS, now=now + timedelta(seconds=2))
    assert (again.created, again.existing) == (len(PATHS), 0)
    assert states(again.bulk) == ["queued"] and states(first) == ["cancelled"]


def test_cancelling_both_submissions_cancels_the_files(alice, now):
    first = restore_submit(user=alice, paths=PATHS[:3], now=now).bulk
    second = restore_submit(user=alice, paths=PATHS[:3], now=now + timedelta(seconds=1)).bulk
    assert bulk_cancel(bulk=first, now=now + timedelta(seconds=2))[0] == 0
    assert bulk_cancel(bulk=second, now=now + timedelta(seconds=3))[0] == 3
    assert states(first) == states(second) == ["cancelled"]


def test_a_services_bulk_cancel_leaves_the_persons_own_request(alice, now):
    xrootd = make_user("xrootd", "analysis")
    Account.objects.filter(user=xrootd).update(acts_for_others=True)
    own = restore_submit(user=alice, paths=["/x/a"], now=now)
    r = client_for(xrootd).post("/api/v1/requests/", {"paths": ["/x/a", "/x/b"], "on_behalf_of": "alice"},
                                format="json")
    assert r.status_code == 201, r.content
    bulk = r.json()["bulk_id"]
    r = client_for(xrootd).post(f"/api/v1/bulks/{bulk}/cancel/")
    assert r.status_code == 200 and r.json() == {"cancelled": 1}
    assert RestoreRequest.objects.get(path="/x/a").state == "queued"  # alice's own submission wants it
    assert RestoreRequest.objects.get(path="/x/b").state == "cancelled"
    assert states(own.bulk) == ["queued"]


def _joins_while_the_owner_cancels(alice, bob, now, paths):
    """bob submits `paths` (alice's, in flight at the stager) in a transaction held open; alice
    cancels hers meanwhile. Returns whether the cancel waited for bob's commit and the paths it
    withdrew from the stager."""
    from carousel.loop.cycle import run_cycle
    from carousel.models import Control, StagerCall
    from tests.test_loop import ScriptedStager

    Control.objects.update_or_create(id=1, defaults={"files_per_job": 1000})
    stager = ScriptedStager()
    stager.answer = "staging"
    first = restore_submit(user=alice, paths=paths, now=now).bulk
    services.intake.settle(first.id)
    run_cycle(now=now, stager=stager)
    assert states(first) == ["submitted"]
    cancelled = threading.Event()

    def cancel():
        try:
            bulk_cancel(bulk=first, now=now + timedelta(seconds=2))
            cancelled.set()
        finally:
            connections.close_all()

    from .conftest import a_backend_waits_for_a_lock

    with transaction.atomic():
        joined = restore_submit(user=bob, paths=paths, now=now + timedelta(seconds=1)).bulk
        services.intake.settle(joined.id)
        canceller = threading.Thread(target=cancel)
        canceller.start()
        waited = a_backend_waits_for_a_lock(timeout=3) and not cancelled.is_set()
    canceller.join(10)
    withdrawn = {p for call in StagerCall.objects.filter(kind=StagerCall.Kind.CANCEL) for p in call.paths}
    return waited, withdrawn, joined


def test_a_cancel_does_not_withdraw_a_file_another_user_is_joining(transactional_db, alice, bob, now):
    """bob's submission joined alice's request at the stager without locking it: alice's cancel,
    committed first, could not see bob's row and withdrew the file, and bob's request failed as
    withdrawn (a reviewer's finding). The joined rows are locked FOR SHARE: the cancel waits,
    then sees bob's request and leaves the file at the stager."""
    waited, withdrawn, joined = _joins_while_the_owner_cancels(alice, bob, now, ["/join/a", "/join/b"])
    assert waited
    assert withdrawn == set()
    assert states(joined) == ["submitted"]


def test_a_cancel_does_not_withdraw_a_file_a_big_submission_is_joining(transactional_db, alice, bob, now, settings):
    """The same through the intake (a submission of more than CAROUSEL_INTAKE_ABOVE files)."""
    settings.CAROUSEL_INTAKE_ABOVE = 1
    waited, withdrawn, joined = _joins_while_the_owner_cancels(alice, bob, now, ["/join/c", "/join/d"])
    assert waited
    assert withdrawn == set()
    assert states(joined) == ["submitted"]
