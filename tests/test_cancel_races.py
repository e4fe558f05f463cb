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
