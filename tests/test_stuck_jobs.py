"""A job the stager never finishes (a stage request lost in a restart) with the shipped
defaults: it makes the stager look stalled, its deadline still comes, and the others' restores
go on (issue 24)."""
from datetime import timedelta

from carousel.domain.services import restore_submit
from carousel.loop.cycle import run_cycle
from carousel.models import Control, Job, RestoreRequest
from carousel.stagers.base import FileStatus, StagerUnavailable
from tests.test_loop import ScriptedStager

MINUTE = timedelta(minutes=1)


class LosesItsLostFiles(ScriptedStager):
    """Reads everything but the files under /lost/, which it reports as staging for ever."""

    def poll(self, jobs):
        return {j.id: [FileStatus(p, "staging" if p.startswith("/lost/") else "done") for p in j.paths]
                for j in jobs}


def run_for(stager, start, minutes, every=5, at=None):
    for minute in range(every, minutes + 1, every):
        if at and minute in at:
            at[minute](start + minute * MINUTE)
        run_cycle(now=start + minute * MINUTE, stager=stager)


def test_a_job_never_finished_is_given_up_with_the_shipped_defaults_and_the_others_go_on(alice, bob, now):
    control = Control.get()
    assert (control.stall_after_s, control.job_deadline_floor_s) == (1800.0, 6 * 3600.0)  # shipped
    restore_submit(user=alice, paths=["/lost/a"], now=now)
    stager = LosesItsLostFiles()
    run_cycle(now=now, stager=stager)
    lost = Job.objects.get()
    assert lost.chain == ""  # sent without a plan, as every tape-rest job is

    def bob_asks(at):
        restore_submit(user=bob, paths=["/bob/x", "/bob/y"], now=at)

    run_for(stager, now, 13 * 60, at={60: bob_asks})
    assert Job.objects.get(id=lost.id).state == "failed"
    assert "past its deadline" in RestoreRequest.objects.get(path="/lost/a").last_error
    assert set(RestoreRequest.objects.filter(user=bob).values_list("state", flat=True)) == {"done"}


def test_a_job_whose_files_keep_moving_is_not_given_up_however_long_it_waits(alice, now):
    restore_submit(user=alice, paths=[f"/slow/f{i}" for i in range(3)], now=now)
    moving = iter(range(1000))

    class OneFileAnHour(ScriptedStager):
        def poll(self, jobs):
            step = next(moving)
            return {j.id: [FileStatus(p, "done" if i < step // 60 else "staging") for i, p in enumerate(j.paths)]
                    for j in jobs}

    stager = OneFileAnHour()
    run_cycle(now=now, stager=stager)
    job = Job.objects.get()
    Control.objects.filter(id=1).update(job_deadline_floor_s=2 * 3600.0)
    run_for(stager, now, 3 * 60 + 30, every=1)
    assert Job.objects.get(id=job.id).state == "done"
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"done"}


def test_a_job_marked_while_the_stager_was_down_is_not_given_up_when_it_answers_again(alice, now):
    """While the stager is down a job sent without a plan is marked past its deadline (no sign of
    life can come); the first answer after the outage counts as one, and still the mark gave the
    job up at that very cycle, its files withdrawn and requeued with an attempt spent (a
    reviewer's finding). An answer after the mark clears it: the deadline runs again from there."""
    Control.get()
    Control.objects.filter(id=1).update(job_deadline_floor_s=3600.0)
    restore_submit(user=alice, paths=["/queue/a", "/queue/b"], now=now)

    class WaitsInItsQueue(ScriptedStager):
        down = False

        def _answer(self):
            if self.down:
                raise StagerUnavailable("the endpoint is down")

        def status(self):
            self._answer()
            return super().status()

        def poll(self, jobs):
            self._answer()
            return {j.id: [FileStatus(p, "queued") for p in j.paths] for j in jobs}

    stager = WaitsInItsQueue()
    run_cycle(now=now, stager=stager)
    job = Job.objects.get()
    assert job.chain == ""  # sent without a plan, as every tape-rest job is
    stager.down = True
    run_for(stager, now, 2 * 60)  # two hours down
    assert Job.objects.get(id=job.id).overdue_at is not None
    stager.down = False
    run_for(stager, now + 2 * 60 * MINUTE, 30)  # answering again, for half an hour
    assert Job.objects.get(id=job.id).state == "sent"
    assert set(RestoreRequest.objects.values_list("attempts", flat=True)) == {1}
    run_for(stager, now + 2 * 60 * MINUTE + 30 * MINUTE, 60)  # an hour more without a sign of life
    assert Job.objects.get(id=job.id).state == "failed"


def test_the_parts_of_a_long_mount_are_not_given_up_while_the_mount_reads(db, now):
    """A mount longer than N files is sent as parts, read one after another on one drive; each
    part's deadline ran from its sending with its own share of the estimate, so the last parts
    of a mount over the 6-hour floor (a whole LTO-8 tape is about 9 hours) were given up while
    the drive was reading their siblings (a reviewer's finding). A job on a chain is alive while
    its chain moves: its deadline runs from the chain's last sign of life."""
    from carousel.loop.deadlines import end_overdue_jobs

    control = Control.get()
    part_s = 1200.0  # 30 parts of 20 minutes: 10 hours on one drive
    parts = [Job.objects.create(created_at=now, rank=k, chain="LTO-8/0", state="sent", sent_at=now, progress_at=now,
                                estimate_s=part_s) for k in range(30)]
    # A stuck job alone on another drive is still given up at the floor.
    stuck = Job.objects.create(created_at=now, chain="LTO-8/1", state="sent", sent_at=now, progress_at=now,
                               estimate_s=part_s)

    def read_until(hours):
        at = now + timedelta(hours=hours)
        for k, part in enumerate(parts):
            finished = now + timedelta(seconds=part_s * (k + 1))
            if finished <= at:
                Job.objects.filter(id=part.id).update(state="done", finished_at=finished, progress_at=finished)
        return at

    for minutes in range(5, 10 * 60, 5):  # a cycle every 5 minutes, each asking about deadlines
        end_overdue_jobs(now=read_until(minutes / 60), control=control)
    assert set(Job.objects.filter(chain="LTO-8/0").values_list("state", flat=True)) == {"done", "sent"}
    assert not Job.objects.filter(chain="LTO-8/0", overdue_at__isnull=False).exists()
    assert Job.objects.get(id=stuck.id).state == "failed"
