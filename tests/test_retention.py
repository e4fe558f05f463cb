"""Retention prunes old history in batches and leaves the rolled-up rows (usage, counters)."""
from datetime import timedelta

from django.db.models import Sum

from carousel.celery import app
from carousel.loop.cycle import run_cycle
from carousel.models import (Bulk, CounterTotal, Job, RestoreRequest, Transition, UsageDay, UsageWait)
from carousel.ops.retention import prune
from carousel.domain.services import restore_submit
from carousel.stagers.immediate import ImmediateStager


def _restore(user, paths, at):
    """Submit at `at` and let the loop restore them (finished 10 s later)."""
    restore_submit(user=user, now=at, paths=paths)
    stager = ImmediateStager()
    run_cycle(now=at, stager=stager)
    run_cycle(now=at + timedelta(seconds=10), stager=stager)


def _rolled_up():
    usage = UsageDay.objects.aggregate(*(Sum(f) for f in ("requested_files", "restored_files", "restored_bytes",
                                                           "mounts", "drive_s")))
    return (usage, dict(UsageWait.objects.values_list("bucket").annotate(Sum("files"))),
            sorted(CounterTotal.objects.values_list("name", "label", "value")))


def test_prune_removes_old_finished_history_in_batches_and_keeps_rolled_up_rows(alice, bob, now):
    old = now - timedelta(days=20)
    _restore(alice, [f"/old/a{i}" for i in range(5)], old)
    _restore(bob, ["/recent/b0", "/recent/b1"], now - timedelta(days=2))
    # Queued three weeks ago and still waiting: kept, though its old transitions may go.
    restore_submit(user=alice, now=old, paths=["/old/still-waiting"])
    assert RestoreRequest.objects.filter(state="done").count() == 7
    before = _rolled_up()
    old_jobs = set(Job.objects.filter(requests__path__startswith="/old/a").values_list("id", flat=True))
    assert old_jobs

    pruned = prune(now=now, older_than=timedelta(days=14), batch=2)

    assert pruned.complete and pruned.requests == 5 and pruned.jobs == len(old_jobs)
    assert sorted(RestoreRequest.objects.values_list("path", flat=True)) == [
        "/old/still-waiting", "/recent/b0", "/recent/b1"]
    assert not Transition.objects.filter(at__lt=now - timedelta(days=14)).exists()
    assert Transition.objects.filter(request__user=bob).count() == 4  # queued->submitted->done, twice
    assert not Job.objects.filter(id__in=old_jobs).exists()
    assert Job.objects.count() >= 1  # bob's
    # alice's old submission still has its waiting request: kept; bob's recent one: kept.
    assert Bulk.objects.count() == 2
    # The submission that created the waiting request is the one kept (pruning it would have
    # cut the request from it: the link is on the request row, set to null on delete).
    assert RestoreRequest.objects.get(path="/old/still-waiting").bulk.created_at == old
    # Nothing that reports and counters are made of moved.
    assert _rolled_up() == before
    assert dict(CounterTotal.objects.filter(label="").values_list("name", "value"))["files_restored"] == 7


def test_a_submission_goes_when_its_last_request_does(alice, now):
    old = now - timedelta(days=30)
    _restore(alice, ["/x/1", "/x/2"], old)
    pruned = prune(now=now, older_than=timedelta(days=14))
    assert (pruned.requests, pruned.submissions) == (2, 1)
    assert not Bulk.objects.exists() and not Job.objects.exists()
    assert prune(now=now, older_than=timedelta(days=14)) == type(pruned)()  # nothing left: idempotent


def test_the_age_is_a_setting_and_the_time_budget_stops_a_run(settings, alice, now):
    _restore(alice, ["/y/1"], now - timedelta(days=3))
    settings.CAROUSEL_RETENTION_DAYS = 7
    assert prune(now=now).requests == 0
    settings.CAROUSEL_RETENTION_DAYS = 2
    assert not prune(now=now, budget_s=-1).complete  # out of time before the first batch
    assert RestoreRequest.objects.count() == 1
    assert prune(now=now).requests == 1


def test_beat_runs_the_prune_task():
    app.loader.import_default_modules()
    app.finalize()
    schedule = {entry["task"]: entry for entry in app.conf.beat_schedule.values()}
    assert "carousel.retention.prune_history" in schedule
    assert "carousel.retention.prune_history" in app.tasks


def test_a_request_whose_pin_is_live_is_kept_until_the_pin_ends(alice, bob, now):
    """Finished 20 days ago with a 60-day pin: pruned, its release would never be sent and bob's
    release would free the copy alice still pins (issue 24)."""
    old = now - timedelta(days=20)
    restore_submit(user=alice, now=old, paths=["/pinned/a"], pin_lifetime=timedelta(days=60))
    stager = ImmediateStager()
    run_cycle(now=old, stager=stager)
    run_cycle(now=old + timedelta(seconds=10), stager=stager)
    pinned = RestoreRequest.objects.get(path="/pinned/a")
    assert pinned.state == "done" and pinned.pin_until > now

    assert prune(now=now, older_than=timedelta(days=14)).requests == 0
    assert RestoreRequest.objects.filter(pk=pinned.pk).exists()
    # Once the pin has ended (here run out, and ended by the loop) the request is history.
    later = old + timedelta(days=61)
    run_cycle(now=later, stager=stager)
    assert RestoreRequest.objects.get(pk=pinned.pk).pin_until is None
    assert prune(now=later, older_than=timedelta(days=14)).requests == 1
