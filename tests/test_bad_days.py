"""The loop on bad days (issue 14): races with submission, outages, failures that say nothing
about the tape, nonsense in the control row, locates that never end, jobs that never finish,
withdrawals and releases that must reach the stager."""
import threading
from datetime import timedelta

from django.db import connections, transaction

from carousel.loop import run_cycle
from carousel.models import RestoreRequest
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
