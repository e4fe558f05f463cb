"""The loop on bad days (issue 14): races with submission, outages, failures that say nothing
about the tape, nonsense in the control row, locates that never end, jobs that never finish,
withdrawals and releases that must reach the stager."""
import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connections, transaction
from django.test import Client

from carousel.domain.exceptions import InvalidSubmission
from carousel.loop.cycle import run_cycle
from carousel.models import Control, Job, JobState, RestoreRequest, StagerCall, Tape
from carousel.stagers.base import LocateError, StagerUnavailable
from carousel.stagers.immediate import ImmediateStager
from carousel.domain.services import restore_submit
from tests.conftest import client_for
from tests.test_backpressure import GB, Backend, control
from tests.test_frontend import DrivesStager
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
        self.polls = 0
        self.calls = 0

    def _check(self):
        self.calls += 1
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
        self.polls += 1
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


@pytest.mark.parametrize("message", ["no such file in the HSM", "withdrawn from the simulated library",
                                     "cancelled at the tape system"])
def test_failures_that_say_nothing_about_the_tape_do_not_quarantine_it(alice, now, message):
    control(files_per_job=1, jobs_in_flight=4, quarantine_failures=2, retry_cycle_s=60)
    paths = [f"/nf/{i}" for i in range(3)]
    restore_submit(user=alice, now=now, paths=paths)
    backend = Backend({p: ("TNF", i * GB) for i, p in enumerate(paths)})
    run_cycle(now=now, stager=backend)
    for p in paths:
        backend.file_state[p] = f"failed:permanent:{message}"
    run_cycle(now=now + 10 * SECOND, stager=backend)
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"failed"}
    tape = Tape.objects.get(label="TNF")
    assert tape.quarantined_at is None and tape.recent_failures == 0


def test_an_exception_escaping_the_cycle_is_shown_in_the_admin_and_the_api(alice, operator, now, monkeypatch):
    import carousel.loop.cycle

    def broken(**kwargs):
        raise RuntimeError("delivery table on fire")

    # A step every cycle runs (one with nothing to do is not run: carousel/loop/due.py).
    monkeypatch.setattr(carousel.loop.cycle, "collect_progress", broken)
    restore_submit(user=alice, now=now, paths=["/x/a"])
    report = run_cycle(now=now, stager=FlakyStager())
    assert "RuntimeError: delivery table on fire" in report.error
    # the error may name another user's path: operators read it, a user is told there is one
    body = client_for(alice).get("/api/v1/stager/").json()
    assert body["last_cycle_error"] and "delivery table on fire" not in body["last_cycle_error"]
    assert "delivery table on fire" in client_for(operator).get("/api/v1/stager/").json()["last_cycle_error"]
    operator.is_superuser = True
    operator.save()
    admin = Client()
    admin.force_login(operator)
    assert "delivery table on fire" in admin.get("/admin/carousel/control/1/change/").content.decode()
    # The next cycle that runs through clears it.
    monkeypatch.undo()
    run_cycle(now=now + 10 * SECOND, stager=FlakyStager())
    assert client_for(alice).get("/api/v1/stager/").json()["last_cycle_error"] == ""


@pytest.mark.parametrize("field, value", [("files_per_job", 0), ("jobs_in_flight", 0), ("cycle_s", -1.0),
                                          ("disk_threshold", 1.5), ("failure_ratio", float("nan")),
                                          ("policy_params", {"slider_age_weight": "heavy"}),
                                          ("policy_params", [1, 2])])
def test_the_control_row_refuses_nonsense(db, field, value):
    control_row = Control.get()
    setattr(control_row, field, value)
    with pytest.raises(ValidationError):
        control_row.full_clean()
    if field != "policy_params":  # the database keeps numbers in range whoever writes them
        with pytest.raises(IntegrityError), transaction.atomic():
            Control.objects.filter(id=1).update(**{field: value})


def test_the_admin_refuses_zero_files_per_job_and_keeps_the_row(operator):
    operator.is_superuser = True
    operator.save()
    admin = Client()
    admin.force_login(operator)
    Control.get()
    url = "/admin/carousel/control/1/change/"
    form = admin.get(url).context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None and name in form.fields}
    data.update(files_per_job=0, policy_params="{}")
    response = admin.post(url, data)
    assert response.status_code == 200
    assert "Ensure this value is greater than or equal to 1" in response.content.decode()
    assert Control.get().files_per_job == 100
    data.update(files_per_job=7)  # the same form with a sane number is saved
    assert admin.post(url, data).status_code == 302 and Control.get().files_per_job == 7


class UnsureStager(FlakyStager):
    """Answers "try again later" for the paths in `unsure`, and nothing at all for `silent`."""

    def __init__(self):
        super().__init__()
        self.unsure, self.silent, self.asked = set(), set(), []

    def locate(self, paths):
        self.asked.append(list(paths))
        known = [p for p in paths if p not in self.unsure | self.silent]
        return super().locate(known) + [LocateError(p, "transient", "catalogue busy") for p in paths
                                        if p in self.unsure]


def test_locates_back_off_give_up_with_a_reason_and_new_requests_do_not_wait(alice, bob, now):
    control(locate_batch=4, locate_attempts=3, locate_backoff_s=60)
    hopeless = [f"/hopeless/{i}" for i in range(3)] + ["/silent/0"]
    restore_submit(user=alice, now=now - 100 * SECOND, paths=hopeless)
    restore_submit(user=bob, now=now, paths=["/fresh/a", "/fresh/b"])
    stager = UnsureStager()
    stager.unsure, stager.silent = set(hopeless[:3]), {"/silent/0"}
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + 10 * SECOND, stager=stager)
    # The old hopeless ones wait for their backoff: the new ones are located and sent.
    assert set(RestoreRequest.objects.filter(user=bob).values_list("state", flat=True)) <= {"submitted", "done"}
    assert all(set(batch) <= set(hopeless) for batch in stager.asked[:1])
    assert not any(set(batch) & set(hopeless) for batch in stager.asked[1:])
    # Asked again after 60 s, then after 120 s more; the third "try later" fails them.
    for t in (30, 61, 100, 181):
        run_cycle(now=now + t * SECOND, stager=stager)
    assert sum(1 for batch in stager.asked if "/hopeless/0" in batch) == 3
    failed = RestoreRequest.objects.filter(user=alice)
    assert set(failed.values_list("state", flat=True)) == {"failed"}
    assert "could not be located after 3 attempts" in failed.get(path="/hopeless/0").last_error
    assert "catalogue busy" in failed.get(path="/hopeless/0").last_error
    assert "no answer" in failed.get(path="/silent/0").last_error


def test_a_burst_larger_than_a_locate_call_is_located_and_shared_in_its_first_cycle(alice, bob, now):
    # Located one call a cycle, alice's earlier submission would fill every drive before bob's
    # requests were known: bob's tape would wait a whole mount (an hour on real tapes).
    control(locate_batch=4, files_per_job=20, jobs_in_flight=2)
    restore_submit(user=alice, now=now, paths=[f"/burst/alice/{i}" for i in range(10)])
    restore_submit(user=bob, now=now, paths=[f"/burst/bob/{i}" for i in range(6)])
    stager = UnsureStager()
    run_cycle(now=now, stager=stager)
    assert [len(batch) for batch in stager.asked] == [4, 4, 4, 4]  # calls of locate_batch paths
    assert not RestoreRequest.objects.filter(tape__isnull=True).exists()
    sent = {r.user.username for j in stager.submitted for r in RestoreRequest.objects.filter(job_id=j.id)}
    assert sent == {"alice", "bob"}


def test_a_job_past_its_deadline_is_asked_once_more_then_given_up_and_frees_its_chain(alice, now):
    control(files_per_job=2, jobs_in_flight=4, drives=1, job_deadline_floor_s=600, job_deadline_factor=1,
            max_attempts=5)
    restore_submit(user=alice, now=now, paths=["/stuck/a", "/stuck/b", "/next/c"])
    stager = FlakyStager()
    stager.answer = "staging"  # for ever
    run_cycle(now=now, stager=stager)
    assert len(stager.submitted) == 1  # one drive: the second tape's job waits behind the first
    first = Job.objects.get(state="sent")
    stuck = set(stager.submitted[0].paths)
    for t in range(10, 600, 100):
        run_cycle(now=now + t * SECOND, stager=stager)
    assert len(stager.submitted) == 1 and Job.objects.get(id=first.id).state == "sent"
    run_cycle(now=now + 700 * SECOND, stager=stager)  # past the deadline: polled once more
    assert Job.objects.get(id=first.id).state == "sent" and Job.objects.get(id=first.id).overdue_at
    polls = stager.polls
    run_cycle(now=now + 710 * SECOND, stager=stager)
    assert stager.polls > polls
    assert Job.objects.get(id=first.id).state == "failed"
    assert [p for _, paths in stager.cancelled for p in paths] == sorted(stuck)
    # The chain goes on: the drive gets its next mount in the same cycle (whichever tape the plan
    # puts first: the stuck files are queued again with their first attempt counted, and sent
    # again they are on their second), and /next/c is still on its way.
    assert len(stager.submitted) >= 2
    assert RestoreRequest.objects.get(path="/next/c").state in ("queued", "submitted")
    for req in RestoreRequest.objects.filter(path__in=stuck):
        assert "past its deadline" in req.last_error
        assert (req.state, req.attempts) in {("queued", 1), ("submitted", 2)}


def test_an_operator_gives_up_a_job_from_the_admin_with_the_change_permission(alice, now):
    from django.contrib.auth.models import Permission

    from tests.conftest import make_user

    restore_submit(user=alice, now=now, paths=["/op/a"])
    stager = FlakyStager()
    stager.answer = "staging"
    run_cycle(now=now, stager=stager)
    job = Job.objects.get()
    url = "/admin/carousel/job/"
    viewer, changer = make_user("viewer", staff=True), make_user("changer", staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    changer.user_permissions.add(*Permission.objects.filter(codename__in=["view_job", "change_job"]))
    for user in (viewer, changer):
        web = Client()
        web.force_login(user)
        web.post(url, {"action": "give_up", "_selected_action": [job.id]})
        job.refresh_from_db()
        assert job.state == ("sent" if user is viewer else "failed")
    req = RestoreRequest.objects.get()
    assert req.state == "queued" and req.attempts == 1 and "operator changer" in req.last_error


def test_an_expiry_while_the_stager_is_down_is_withdrawn_once_it_is_back(alice, now):
    restore_submit(user=alice, now=now, paths=["/exp/a"], deadline=now + 60 * SECOND)
    stager = FlakyStager()
    stager.answer = "staging"
    run_cycle(now=now, stager=stager)
    stager.down = True
    run_cycle(now=now + 30 * SECOND, stager=stager)
    calls_before = stager.calls
    run_cycle(now=now + 70 * SECOND, stager=stager)
    assert RestoreRequest.objects.get().state == "expired"
    # While down, the cycle makes its one probe and no cancel call: the withdrawal waits, recorded.
    assert stager.calls - calls_before == 1 and stager.cancelled == []
    assert StagerCall.objects.get().paths == ["/exp/a"]
    stager.down = False
    run_cycle(now=now + 80 * SECOND, stager=stager)
    assert [paths for _, paths in stager.cancelled] == [["/exp/a"]]
    assert not StagerCall.objects.exists()


def test_a_withdrawal_the_stager_fails_is_retried_until_it_confirms(transactional_db, alice, now, settings):
    restore_submit(user=alice, now=now, paths=["/w/a", "/w/b"])
    stager = FlakyStager()
    stager.answer = "staging"
    run_cycle(now=now, stager=stager)
    refusals = []

    def refuse(backend_id, paths):
        refusals.append(paths)
        raise RuntimeError("cancel script exited 1")

    stager.cancel = refuse
    settings.CAROUSEL_STAGERS = {**settings.CAROUSEL_STAGERS, "refusing": "tests.test_bad_days.RefusingStager"}
    settings.CAROUSEL_STAGER = "refusing"
    # The user's cancel through the API: the control queue's task tries at once and fails.
    response = client_for(alice).post("/api/v1/requests/cancel/", {"ids": list(
        RestoreRequest.objects.values_list("id", flat=True))}, format="json")
    assert response.json() == {"cancelled": 2}
    call = StagerCall.objects.get()
    assert call.attempts == 1 and "cancel script exited 1" in call.last_error
    # The cycle tries again once the backoff has passed, and stops once the stager confirms.
    later = call.next_at
    run_cycle(now=later - SECOND, stager=stager)
    assert len(refusals) == 0 and StagerCall.objects.get().attempts == 1
    run_cycle(now=later, stager=stager)
    assert len(refusals) == 1 and StagerCall.objects.get().attempts == 2
    del stager.cancel
    run_cycle(now=StagerCall.objects.get().next_at, stager=stager)
    assert [sorted(paths) for _, paths in stager.cancelled] == [["/w/a", "/w/b"]]
    assert not StagerCall.objects.exists()


class RefusingStager(ImmediateStager):
    def cancel(self, backend_id, paths):
        raise RuntimeError("cancel script exited 1")


def test_stager_calls_are_bounded_per_cycle_and_a_slow_stager_does_not_hold_the_cycle(alice, now):
    from carousel.loop.withdrawals import send_stager_calls

    StagerCall.objects.bulk_create([StagerCall(kind="cancel", backend_id=f"b{i}", paths=[f"/s/{i}"], created_at=now,
                                               next_at=now) for i in range(5)])
    stager = FlakyStager()
    assert send_stager_calls(now=now, stager=stager, limit=2) == 2
    assert StagerCall.objects.count() == 3
    release = threading.Event()
    stager.cancel = lambda backend_id, paths: release.wait(10)  # hangs
    started = time.monotonic()
    assert send_stager_calls(now=now, stager=stager, limit=2, budget_s=0.2) == 0
    assert time.monotonic() - started < 5
    release.set()
    for thread in threading.enumerate():  # the sender ends: the next send in this process may start
        if thread.name == "stager-calls":
            thread.join(10)
    assert StagerCall.objects.count() == 3  # kept, sent again once their lease ends


HOUR = timedelta(hours=1)


def restored(stager, now):
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + 10 * SECOND, stager=stager)
    return now + 10 * SECOND


def released_paths(stager):
    return sorted(p for _, paths in stager.released for p in paths)


def test_a_pin_ends_when_its_lifetime_runs_out_and_the_stager_releases_the_copy(alice, now):
    restore_submit(user=alice, now=now, paths=["/pin/a", "/pin/b"], pin_lifetime=HOUR)
    restore_submit(user=alice, now=now, paths=["/pin/unpinned"])
    stager = FlakyStager()
    done_at = restored(stager, now)
    req = RestoreRequest.objects.get(path="/pin/a")
    assert req.state == "done" and req.pin_until == done_at + HOUR
    assert RestoreRequest.objects.get(path="/pin/unpinned").pin_until is None
    run_cycle(now=done_at + HOUR - SECOND, stager=stager)
    assert stager.released == []
    run_cycle(now=done_at + HOUR, stager=stager)
    assert released_paths(stager) == ["/pin/a", "/pin/b"]
    assert not RestoreRequest.objects.filter(pin_until__isnull=False).exists()
    assert not StagerCall.objects.exists()
    run_cycle(now=done_at + 2 * HOUR, stager=stager)
    assert len(stager.released) == 1  # once


def test_a_copy_another_request_still_pins_is_not_released(alice, bob, now):
    restore_submit(user=alice, now=now, paths=["/pin/shared"], pin_lifetime=HOUR)
    restore_submit(user=bob, now=now, paths=["/pin/shared"], pin_lifetime=3 * HOUR)
    stager = FlakyStager()
    done_at = restored(stager, now)
    run_cycle(now=done_at + HOUR, stager=stager)
    assert stager.released == []
    assert RestoreRequest.objects.get(user=alice).pin_until is None
    run_cycle(now=done_at + 3 * HOUR, stager=stager)
    assert released_paths(stager) == ["/pin/shared"]


def test_release_pins_ends_the_users_own_pins_at_once(alice, bob, now):
    from carousel.domain.pins import release_pins

    restore_submit(user=alice, now=now, paths=["/rel/a", "/rel/b"], pin_lifetime=HOUR)
    restore_submit(user=bob, now=now, paths=["/rel/b"], pin_lifetime=HOUR)
    stager = FlakyStager()
    done_at = restored(stager, now)
    assert release_pins(user=alice, paths=["/rel/a", "/rel/b", "/rel/never"], now=done_at) == 2
    assert release_pins(user=alice, paths=["/rel/a"], now=done_at) == 0
    run_cycle(now=done_at + SECOND, stager=stager)
    assert released_paths(stager) == ["/rel/a"]  # bob still pins /rel/b
    assert release_pins(user=bob, paths=["/rel/b"], now=done_at + 2 * SECOND) == 1
    run_cycle(now=done_at + 3 * SECOND, stager=stager)
    assert released_paths(stager) == ["/rel/a", "/rel/b"]


@pytest.mark.parametrize("lifetime", [timedelta(hours=-1), timedelta(0), timedelta(days=999_999), "PT1H"])
def test_a_pin_lifetime_must_be_positive_and_bounded(alice, now, lifetime):
    with pytest.raises(InvalidSubmission, match="pin_lifetime"):
        restore_submit(user=alice, now=now, paths=["/p/x"], pin_lifetime=lifetime)
    assert not RestoreRequest.objects.exists()


class CountingDrivesStager(DrivesStager):
    """Two drives; counts status() calls across instances (the web process builds its own)."""

    status_calls = 0

    def status(self):
        CountingDrivesStager.status_calls += 1
        return super().status()


def test_the_live_page_and_the_api_read_what_the_loop_recorded_and_never_call_the_stager(
        alice, now, settings, client):
    settings.CAROUSEL_STAGERS = {**settings.CAROUSEL_STAGERS, "counting": "tests.test_bad_days.CountingDrivesStager"}
    settings.CAROUSEL_STAGER = "counting"
    restore_submit(user=alice, now=now, paths=["/live/a"])
    run_cycle(now=now)
    assert CountingDrivesStager.status_calls >= 1
    calls = CountingDrivesStager.status_calls
    client.force_login(alice)
    for _ in range(3):
        html = client.get("/live/fragment/").content.decode()
        assert "LTO-7 #1" in html and "Files queued at the stager: 12" in html
    assert client.get("/live/").status_code == 200
    assert client_for(alice).get("/api/v1/stager/").status_code == 200
    assert CountingDrivesStager.status_calls == calls


def test_a_job_carries_its_files_pin_lifetimes_to_the_stager(alice, bob, now):
    restore_submit(user=alice, now=now, paths=["/life/a", "/life/b"], pin_lifetime=2 * HOUR)
    restore_submit(user=bob, now=now, paths=["/life/a"], pin_lifetime=3 * HOUR)
    restore_submit(user=bob, now=now, paths=["/life/c"])
    stager = FlakyStager()
    run_cycle(now=now, stager=stager)
    lifetimes = {}
    for job in stager.submitted:
        lifetimes.update(job.lifetimes)
    # The longest pin of the users who want a file; none for a file nobody pins.
    assert lifetimes == {"/life/a": 3 * 3600, "/life/b": 2 * 3600}


@pytest.mark.parametrize("step", ["preempt", "locate_new_work"])
def test_the_database_going_away_mid_cycle_is_an_outage_not_a_stager_or_preemption_failure(alice, now, monkeypatch,
                                                                                         step):
    """A PostgreSQL restart during a step that catches the stager's failures: the cycle ends as a
    database outage (logged once by the task), not as a refused cut logged with its traceback or
    a stager judged down (seen as a flaky tests/test_reliability.py run)."""
    from django.db import OperationalError

    from carousel.loop import cycle

    restore_submit(user=alice, now=now, paths=["/db/a"])
    if step == "preempt":  # a cycle runs it only while a short mount waits behind a sent one (due.py)
        sent = Job.objects.create(created_at=now, state=JobState.SENT, sent_at=now)
        Job.objects.create(created_at=now, state=JobState.PENDING, jumps_queue=True, after=sent)

    def gone(**kwargs):
        raise OperationalError("the connection is closed")

    monkeypatch.setattr(cycle, step, gone)
    with pytest.raises(OperationalError):
        run_cycle(now=now, stager=ImmediateStager())


class GarbageStager(FlakyStager):
    """Polls answered with something that is not a mapping of jobs while `garbage` is set."""

    garbage = False

    def poll(self, jobs):
        answers = super().poll(jobs)
        return [answers] if self.garbage else answers


def test_a_poll_answer_that_is_not_a_mapping_is_no_answer_and_the_cycle_goes_on(alice, now):
    """A backend that answered a list (the fault simulator's garbage) stopped the whole cycle
    ("the cycle stopped: AttributeError"), every step after the poll with it, each cycle while it
    lasted. It is now taken as no answer, as an exception from the backend is."""
    restore_submit(user=alice, now=now, paths=["/garbage/a"])
    stager = GarbageStager()
    stager.answer = "staging"
    run_cycle(now=now, stager=stager)
    request = RestoreRequest.objects.get(path="/garbage/a")
    assert request.job_id is not None
    stager.garbage = True
    report = run_cycle(now=now + 10 * SECOND, stager=stager)
    assert not report.error and report.health == "down", report.error
    assert RestoreRequest.objects.get(path="/garbage/a").job_id == request.job_id  # not lost, not requeued
    stager.garbage, stager.answer = False, "done"
    run_cycle(now=now + 20 * SECOND, stager=stager)
    assert RestoreRequest.objects.get(path="/garbage/a").state == "done"


def test_the_native_release_takes_as_many_paths_as_a_cancel(alice, as_alice, now):
    """requests/release/ refused more than 10,000 paths (400) where requests/cancel/ and the
    Tape REST release take a whole submission's (CAROUSEL_MAX_PATHS_PER_SUBMISSION): an evict of a
    big stage request through the native API had to be cut in pieces nobody documented."""
    restore_submit(user=alice, now=now, paths=["/rel/many/0", "/rel/many/1"], pin_lifetime=HOUR)
    restored(FlakyStager(), now)
    paths = [f"/rel/many/{i}" for i in range(12_000)]
    answer = as_alice.post("/api/v1/requests/release/", {"paths": paths}, format="json")
    assert answer.status_code == 200, answer.content[:300]
    assert answer.json() == {"released": 2}
    assert not RestoreRequest.objects.filter(pin_until__isnull=False).exists()


def test_a_cancel_and_a_release_take_as_many_entries_as_the_sites_submission_limit(alice, as_alice, now, settings):
    """requests/cancel/ took 100,000 ids or paths whatever CAROUSEL_MAX_PATHS_PER_SUBMISSION said
    (written into the serializer), and release read the setting once, at import: a site that
    raised the limit could not cancel a whole submission in one call, nor one that lowered it be
    sure of its bound."""
    settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION = 3
    restore_submit(user=alice, now=now, paths=["/lim/a", "/lim/b", "/lim/c"])
    ids = list(RestoreRequest.objects.filter(path__startswith="/lim/").values_list("id", flat=True))
    for url, body in [("/api/v1/requests/cancel/", {"ids": [*ids, ids[0] + 1000]}),
                      ("/api/v1/requests/cancel/", {"paths": ["/lim/a", "/lim/b", "/lim/c", "/lim/d"]}),
                      ("/api/v1/requests/release/", {"paths": ["/lim/a", "/lim/b", "/lim/c", "/lim/d"]})]:
        answer = as_alice.post(url, body, format="json")
        assert answer.status_code == 400, (url, answer.content[:300])
        assert "at most 3 entries in one call" in answer.content.decode(), answer.content[:300]
    assert RestoreRequest.objects.filter(path__startswith="/lim/", state="queued").count() == 3  # nothing done
    assert as_alice.post("/api/v1/requests/cancel/", {"ids": ids}, format="json").json()["cancelled"] == 3
    schema = as_alice.get("/api/schema/?format=json").json()["components"]["schemas"]
    assert schema["CancelMany"]["properties"]["paths"]["maxItems"] == 3  # what the schema says too
