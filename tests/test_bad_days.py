"""The loop on bad days (issue 14): races with submission, outages, failures that say nothing
about the tape, nonsense in the control row, locates that never end, jobs that never finish,
withdrawals and releases that must reach the stager."""
import threading
from datetime import timedelta

from django.db import connections, transaction

from carousel.loop import run_cycle
from carousel.models import Control, RestoreRequest
from carousel.stagers.base import StagerUnavailable
from carousel.services import restore_submit
from tests.test_loop import ScriptedStager

SECOND = timedelta(seconds=1)


def test_a_request_that_joins_a_job_as_it_finishes_is_not_left_submitted(transactional_db, alice, bob, now):
    restore_submit(user=alice, now=now, paths=["/race/a"])
    stager = ScriptedStager()
    run_cycle(now=now, stager=stager)
    joined, go_on = threading.Event(), threading.Event()

    def bob_joins():
        # Bob's submission reads alice's request in flight and copies its job, but commits only
        # after the loop has finished that job.
        try:
            with transaction.atomic():
                restore_submit(user=bob, now=now + SECOND, paths=["/race/a"])
                joined.set()
                go_on.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=bob_joins)
    thread.start()
    try:
        assert joined.wait(10)
        run_cycle(now=now + 10 * SECOND, stager=stager)
        assert RestoreRequest.objects.get(user=alice).state == "done"
    finally:
        go_on.set()
        thread.join()
    assert RestoreRequest.objects.get(user=bob).state == "submitted"  # the race happened
    for i in range(3):
        run_cycle(now=now + (20 + 10 * i) * SECOND, stager=stager)
    assert RestoreRequest.objects.get(user=bob).state == "done"


class FlakyStager(ScriptedStager):
    """The scripted stager, unreachable while `down` is set."""

    def __init__(self):
        super().__init__()
        self.down = False
        self.cancelled = []
        self.released = []

    def _check(self):
        if self.down:
            raise StagerUnavailable("connection refused")

    def locate(self, paths):
        self._check()
        return super().locate(paths)

    def submit(self, job):
        self._check()
        return super().submit(job)

    def poll(self, jobs):
        self._check()
        return super().poll(jobs)

    def cancel(self, backend_id, paths):
        self._check()
        self.cancelled.append((backend_id, list(paths)))

    def release(self, backend_id, paths):
        self._check()
        self.released.append((backend_id, list(paths)))

    def status(self):
        self._check()
        return super().status()


def test_the_first_answer_after_a_long_outage_counts_as_progress(alice, now):
    Control.objects.update_or_create(id=1, defaults={"stall_after_s": 60})
    restore_submit(user=alice, now=now, paths=["/out/a"])
    stager = FlakyStager()
    stager.answer = "staging"
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + 10 * SECOND, stager=stager)
    stager.down = True
    for t in range(20, 200, 10):
        assert run_cycle(now=now + t * SECOND, stager=stager).health == "down"
    stager.down = False
    report = run_cycle(now=now + 200 * SECOND, stager=stager)
    assert report.health == "healthy"
    # The stall clock starts again from the answer: stalled only once nothing moves for 60 s.
    assert run_cycle(now=now + 250 * SECOND, stager=stager).health == "healthy"
    assert run_cycle(now=now + 270 * SECOND, stager=stager).health == "stalled"
