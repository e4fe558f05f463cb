import threading
from datetime import timedelta

from django.db import connections

from carousel.infra import db
from carousel.loop.cycle import run_cycle
from carousel.models import Control, Job, RestoreRequest, Tape
from carousel.domain.services import restore_submit
from carousel.stagers.base import FileStatus, LocateError
from carousel.stagers.immediate import ImmediateStager


class ScriptedStager(ImmediateStager):
    """The immediate stager, with poll answers and locate failures set by the test."""

    def __init__(self):
        super().__init__()
        self.answer = "done"
        self.error_class = ""
        self.missing = set()
        self.forget = False
        self.submitted = []

    def locate(self, paths):
        found = super().locate([p for p in paths if p not in self.missing])
        return found + [LocateError(p, "permanent", "no such file in the HSM") for p in paths if p in self.missing]

    def submit(self, job):
        self.submitted.append(job)
        return super().submit(job)

    def poll(self, jobs):
        if self.forget:
            return {}
        return {j.id: [FileStatus(p, self.answer, self.error_class, "drive error" if self.error_class else "")
                       for p in j.paths] for j in jobs}


def states(user):
    return sorted(RestoreRequest.objects.filter(user=user).values_list("state", flat=True))


def test_a_cycle_locates_batches_by_tape_and_restores(alice, now):
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 2})
    restore_submit(user=alice, now=now, paths=["/run1/a", "/run1/b", "/run1/c", "/run2/d"])
    stager = ScriptedStager()
    report = run_cycle(now=now, stager=stager)
    assert report.located == 4 and report.submitted == 4
    # Files of one tape travel together, at most N=2 per job, in position order.
    for job in stager.submitted:
        tapes = set(RestoreRequest.objects.filter(path__in=job.paths).values_list("tape__label", flat=True))
        assert len(tapes) == 1 and len(job.paths) <= 2
        positions = [RestoreRequest.objects.get(path=p).position for p in job.paths]
        assert positions == sorted(positions)
    assert Tape.objects.count() == 2
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert states(alice) == ["done"] * 4
    assert set(Job.objects.values_list("state", flat=True)) == {"done"}


def test_in_flight_is_bounded_by_n_times_k(alice, now):
    Control.objects.update_or_create(id=1, defaults={"files_per_job": 2, "jobs_in_flight": 2})
    restore_submit(user=alice, now=now, paths=[f"/d/{i}" for i in range(10)])
    stager = ScriptedStager()
    stager.answer = "staging"
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert RestoreRequest.objects.filter(state__in=["submitted", "staging"]).count() == 4


def test_transient_failures_wait_for_the_retry_cycle_then_fail(alice, now):
    Control.objects.update_or_create(id=1, defaults={"retry_cycle_s": 600, "max_attempts": 2})
    restore_submit(user=alice, now=now, paths=["/t/a"])
    stager = ScriptedStager()
    stager.answer, stager.error_class = "failed", "transient"
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    req = RestoreRequest.objects.get()
    assert req.state == "retry" and req.retry_at == now + timedelta(seconds=610)
    # Not before its time: no storm of resubmissions.
    run_cycle(now=now + timedelta(seconds=20), stager=stager)
    assert len(stager.submitted) == 1
    run_cycle(now=now + timedelta(seconds=611), stager=stager)
    assert len(stager.submitted) == 2
    run_cycle(now=now + timedelta(seconds=620), stager=stager)
    req.refresh_from_db()
    assert req.state == "failed" and req.attempts == 2 and "gave up after 2 attempts" in req.last_error


def test_a_permanent_failure_fails_at_once(alice, now):
    restore_submit(user=alice, now=now, paths=["/p/a"])
    stager = ScriptedStager()
    stager.answer, stager.error_class = "failed", "permanent"
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    req = RestoreRequest.objects.get()
    assert req.state == "failed" and req.error_class == "permanent" and req.attempts == 1


def test_a_file_the_stager_cannot_find_fails_at_locate(alice, now):
    restore_submit(user=alice, now=now, paths=["/gone", "/here"])
    stager = ScriptedStager()
    stager.missing = {"/gone"}
    run_cycle(now=now, stager=stager)
    gone = RestoreRequest.objects.get(path="/gone")
    assert gone.state == "failed" and gone.last_error == "no such file in the HSM"
    assert RestoreRequest.objects.get(path="/here").state == "submitted"


def test_requests_past_their_deadline_expire(alice, now):
    restore_submit(user=alice, now=now, paths=["/e/a"], deadline=now + timedelta(minutes=5))
    stager = ScriptedStager()
    stager.answer = "staging"
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + timedelta(minutes=6), stager=stager)
    req = RestoreRequest.objects.get()
    assert req.state == "expired" and req.finished_at == now + timedelta(minutes=6)


def test_a_job_the_stager_forgot_goes_back_to_the_queue(alice, now):
    restore_submit(user=alice, now=now, paths=["/f/a"])
    stager = ScriptedStager()
    run_cycle(now=now, stager=stager)
    stager.forget = True
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    # Requeued, then sent again in the same cycle's submission step.
    assert len(stager.submitted) == 2
    assert RestoreRequest.objects.get().state == "submitted"



def test_a_stager_that_keeps_forgetting_a_job_is_not_sent_it_for_ever(alice, now):
    """A job the stager does not know went back to the queue without counting an attempt nor
    withdrawing it (a stager that knew it again later, a load-balanced replica, read it twice):
    a stager that always forgot was sent the file at every cycle, for ever (a reviewer's
    finding). Now each time is an attempt, and the forgotten job is withdrawn."""
    Control.objects.update_or_create(id=1, defaults={"max_attempts": 3})
    restore_submit(user=alice, now=now, paths=["/f/a"])

    class Withdraws(ScriptedStager):
        withdrawn = []

        def cancel(self, backend_id, paths):
            self.withdrawn.append((backend_id, list(paths)))

    stager = Withdraws()
    run_cycle(now=now, stager=stager)
    first = Job.objects.get()
    stager.forget = True
    for cycle in range(1, 10):
        run_cycle(now=now + timedelta(seconds=10 * cycle), stager=stager)
    assert len(stager.submitted) == 3
    request = RestoreRequest.objects.get()
    assert request.state == "failed" and "gave up after 3 attempts" in request.last_error
    assert (first.backend_id, ["/f/a"]) in stager.withdrawn


def test_a_paused_broker_submits_nothing(alice, now):
    Control.objects.update_or_create(id=1, defaults={"paused": True})
    restore_submit(user=alice, now=now, paths=["/q/a"])
    stager = ScriptedStager()
    run_cycle(now=now, stager=stager)
    assert stager.submitted == [] and RestoreRequest.objects.get().state == "queued"


def test_a_second_concurrent_cycle_skips(transactional_db, now):
    taken = threading.Event()
    release = threading.Event()

    def hold():
        with db.try_lock("carousel-cycle") as got:
            assert got
            taken.set()
            release.wait(10)
        connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(10)
        assert run_cycle(now=now, stager=ScriptedStager()).skipped
    finally:
        release.set()
        thread.join()
    assert not run_cycle(now=now, stager=ScriptedStager()).skipped


def test_a_job_an_operator_gives_up_during_a_poll_stays_given_up(alice, now):
    """The poll's answer that a job's files are done marked the job done whatever had happened
    to it meanwhile: an operator's give-up (its files requeued, withdrawn) was overwritten, the
    job shown done with none of its requests in it (a reviewer's finding)."""
    from carousel.domain.services import job_give_up

    restore_submit(user=alice, now=now, paths=["/g/a"])

    class GivenUpMeanwhile(ScriptedStager):
        def poll(self, jobs):
            answer = super().poll(jobs)
            job_give_up(queryset=Job.objects.all(), now=now, reason="given up by an operator")
            return answer

    stager = GivenUpMeanwhile()
    stager.answer = "staging"
    run_cycle(now=now, stager=stager)
    job = Job.objects.get()
    stager.answer = "done"
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert Job.objects.get(id=job.id).state == "failed"
