"""The loop's calls to the stager racing users and each other (issue 24): a cancel committed
while a job's submit() is under way is withdrawn; stager calls are sent by one sender at a time
in a process, and the calls a slow stager did not reach are not due again at once."""
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from carousel.domain.services import request_cancel, restore_submit
from carousel.loop import withdrawals
from carousel.loop.cycle import run_cycle
from carousel.loop.withdrawals import LEASE_S, send_stager_calls
from carousel.models import Job, JobState, RestoreRequest, StagerCall
from carousel.stagers.immediate import ImmediateStager
from tests.conftest import a_backend_waits_for_a_lock

SECOND = timedelta(seconds=1)


class CancelDuringSubmit(ImmediateStager):
    """A stager whose submit() lets a user's cancel of `path` commit first (the files of the job
    were already read by the loop), and that records the withdrawals it is sent."""

    def __init__(self, path, now):
        super().__init__()
        self.path, self.now, self.cancelled = path, now, []

    def submit(self, job):
        if self.path in job.paths:
            request_cancel(queryset=RestoreRequest.objects.filter(path=self.path), now=self.now)
        return super().submit(job)

    def poll(self, jobs):
        return {}  # still at the stager

    def cancel(self, backend_id, paths):
        self.cancelled.append((backend_id, sorted(paths)))


def test_a_cancel_committed_while_its_job_is_submitted_is_withdrawn(alice, now):
    restore_submit(user=alice, now=now, paths=["/sub/a", "/sub/b"])
    stager = CancelDuringSubmit("/sub/a", now)
    run_cycle(now=now, stager=stager)
    job = Job.objects.get()
    assert job.state == JobState.SENT and job.backend_id == f"im-{job.id}"
    assert RestoreRequest.objects.get(path="/sub/a").state == "cancelled"
    # The cycle recorded the withdrawal and sent it (step 10) ...
    assert stager.cancelled == [(job.backend_id, ["/sub/a"])]
    assert not StagerCall.objects.exists()
    # ... and nothing of the file still wanted.
    assert RestoreRequest.objects.get(path="/sub/b").state in ("submitted", "staging")


class SlowStager(ImmediateStager):
    """cancel() waits for `go`; counts the calls under way at once."""

    def __init__(self):
        super().__init__()
        self.go = threading.Event()
        self.lock = threading.Lock()
        self.under_way = self.most_at_once = 0
        self.sent = []

    def cancel(self, backend_id, paths):
        with self.lock:
            self.under_way += 1
            self.most_at_once = max(self.most_at_once, self.under_way)
            self.sent.append(backend_id)
        self.go.wait(10)
        with self.lock:
            self.under_way -= 1


def _wait_for_sender():
    for thread in threading.enumerate():
        if thread.name == "stager-calls":
            thread.join(10)


def test_a_slow_stager_gets_one_call_at_a_time_and_calls_not_reached_wait(db, now):
    StagerCall.objects.bulk_create([StagerCall(kind="cancel", backend_id=f"b{i}", paths=[f"/s/{i}"], created_at=now,
                                               next_at=now) for i in range(3)])
    stager = SlowStager()
    try:
        assert send_stager_calls(now=now, stager=stager, budget_s=0.2) == 0
        next_at = dict(StagerCall.objects.values_list("backend_id", "next_at"))
        assert next_at["b0"] == now + timedelta(seconds=LEASE_S)  # with the stager still: leased
        assert now < next_at["b1"] == next_at["b2"] < now + timedelta(seconds=LEASE_S)  # not due at once
        # The next cycle comes while b0 hangs: it sends nothing, and no second thread waits.
        later = now + timedelta(seconds=60)
        assert send_stager_calls(now=later, stager=stager, budget_s=0.2) == 0
        assert stager.sent == ["b0"] and stager.most_at_once == 1
    finally:
        stager.go.set()
        _wait_for_sender()
    # Once the stager answers, the calls not reached go; b0's answer came too late: it waits
    # for its lease to end.
    assert not withdrawals._sending.locked()
    assert send_stager_calls(now=now + timedelta(seconds=60), stager=stager) == 2
    assert sorted(stager.sent) == ["b0", "b1", "b2"] and stager.most_at_once == 1
    assert list(StagerCall.objects.values_list("backend_id", flat=True)) == ["b0"]


class CancelWhileAcknowledged(ImmediateStager):
    """On PostgreSQL: while the loop records the stager's id of the job, a user's cancel on
    another connection holds the job's request and then changes it (which, like the job's
    update, writes the usage counters' row of the day)."""

    def __init__(self, path):
        super().__init__()
        self.path, self.cancel_error, self.cancelled = path, None, []
        self.canceller = None

    def submit(self, job):
        locked = threading.Event()

        def cancel():
            try:
                with transaction.atomic():
                    list(RestoreRequest.objects.filter(path=self.path).select_for_update())
                    locked.set()
                    a_backend_waits_for_a_lock()
                    RestoreRequest.objects.filter(path=self.path).update(
                        state="cancelled", finished_at=timezone.now(), updated_at=timezone.now())
            except Exception as exc:  # noqa: BLE001 - the test reads it
                self.cancel_error = exc
            finally:
                connections.close_all()

        self.canceller = threading.Thread(target=cancel)
        self.canceller.start()
        assert locked.wait(10)
        return super().submit(job)

    def poll(self, jobs):
        return {}

    def cancel(self, backend_id, paths):
        self.cancelled.append(sorted(paths))


def test_a_cancel_holding_the_jobs_request_neither_deadlocks_nor_escapes_withdrawal(transactional_db, alice):
    if connection.vendor != "postgresql":
        pytest.skip("two real connections to PostgreSQL")
    now = timezone.now()
    restore_submit(user=alice, now=now, paths=["/dl/a"])
    stager = CancelWhileAcknowledged("/dl/a")
    run_cycle(now=now, stager=stager)
    stager.canceller.join(10)
    assert stager.cancel_error is None
    job = Job.objects.get()
    assert job.state == JobState.SENT and RestoreRequest.objects.get().state == "cancelled"
    # Withdrawn by the cycle (its calls step) or waiting as a recorded call.
    assert stager.cancelled == [["/dl/a"]] or list(StagerCall.objects.values_list("paths", flat=True)) == [["/dl/a"]]
