"""The loop on bad days, on a simulated clock: outages, stalls, failures clustering on a tape,
a full disk buffer, and crashes between committing a job and its acknowledgement."""
from datetime import timedelta

from django.test import Client

from carousel.loop.claiming import claim_jobs
from carousel.loop.cycle import run_cycle
from carousel.models import Control, Job, RestoreRequest, StagerHealth, Tape
from carousel.domain.services import restore_submit
from carousel.stagers.base import FileStatus, StagerUnavailable
from policies.selection import share_policy, sort_policy
from tests.site_plugins import MapStager

GB = 10**9


class Backend(MapStager):
    """A stager with a switch for each bad day. It counts every call, stages a job id once
    however often it is sent, and reports files in flight as the test sets them."""

    def __init__(self, where=None):
        super().__init__(where)
        self.down = False
        self.calls = 0
        self.staged = {}  # job id -> paths, once per id
        self.file_state = {}  # path -> "staging" (default), "done", "failed:<class>:<message>"
        self.disk = None
        self.disk_paths = {}  # path -> where a done file lies on the stager's disk

    def _call(self):
        self.calls += 1
        if self.down:
            raise StagerUnavailable("connection refused")

    def locate(self, paths):
        self._call()
        return super().locate(paths)

    def submit(self, job):
        self._call()
        self.staged.setdefault(job.id, list(job.paths))
        self.sent.append(job)
        return f"be-{job.id}"

    def poll(self, jobs):
        self._call()
        out = {}
        for job in jobs:
            if job.id not in self.staged:
                continue
            out[job.id] = []
            for path in job.paths:
                state = self.file_state.get(path, "staging")
                if state.startswith("failed:"):
                    _, error_class, message = state.split(":", 2)
                    out[job.id].append(FileStatus(path, "failed", error_class, message))
                else:
                    out[job.id].append(FileStatus(path, state, disk_path=self.disk_paths.get(path, "")))
        return out

    def status(self):
        self._call()
        return self.disk or {}

    def finish_everything(self):
        for paths in self.staged.values():
            for path in paths:
                self.file_state[path] = "done"


def control(**fields):
    defaults = {"files_per_job": 5, "jobs_in_flight": 4, "cycle_s": 120, "stall_after_s": 1800,
                "retry_cycle_s": 600, "mount_min_files": 1}
    Control.objects.update_or_create(id=1, defaults={**defaults, **fields})
    return Control.get()


def open_jobs():
    return Job.objects.filter(state__in=["pending", "sent"]).count()


def test_an_outage_of_hours_is_probed_once_a_cycle_and_work_resumes_within_two_cycles(alice, now):
    control()
    restore_submit(user=alice, now=now, paths=[f"/o/{i}" for i in range(200)])
    backend = Backend({f"/o/{i}": (f"T{i // 10}", i * GB) for i in range(200)})
    run_cycle(now=now, stager=backend)
    assert open_jobs() == 4

    backend.down = True
    backend.calls = 0
    cycles = 0
    t = now
    for _ in range(90):  # three hours, one cycle every 120 s
        t += timedelta(seconds=120)
        report = run_cycle(now=t, stager=backend)
        cycles += 1
    health = StagerHealth.get()
    assert health.state == "down" and "connection refused" in health.reason
    assert health.since == now + timedelta(seconds=120)  # down since the outage began, all along
    # One probe a cycle, however many jobs and requests wait: no storm.
    assert backend.calls == cycles
    assert RestoreRequest.objects.filter(state="failed").count() == 0
    assert report.submitted == 0

    # The outage ends; the jobs that were in flight finished meanwhile.
    backend.down = False
    backend.finish_everything()
    for k in (1, 2):
        report = run_cycle(now=t + timedelta(seconds=120 * k), stager=backend)
        if open_jobs() == 4:
            break
    assert k <= 2 and open_jobs() == 4, "the drives are not busy again within two cycles"
    assert StagerHealth.get().state == "healthy" and StagerHealth.get().jobs_limit == 4
    assert RestoreRequest.objects.filter(state="done").count() == 20


def test_a_failed_submission_keeps_the_job_and_marks_the_stager_down_until_it_answers(alice, now):
    control()
    restore_submit(user=alice, now=now, paths=["/s/a", "/s/b"])
    backend = Backend()
    real_submit = backend.submit
    backend.submit = lambda job: (_ for _ in ()).throw(StagerUnavailable("timeout"))
    run_cycle(now=now, stager=backend)
    assert Job.objects.get().state == "pending"
    assert StagerHealth.get().state == "down"
    # Still down: one probe (status) a cycle, no locate, no submission.
    backend.down, backend.calls = True, 0
    run_cycle(now=now + timedelta(seconds=120), stager=backend)
    assert backend.calls == 1 and StagerHealth.get().state == "down"
    backend.down, backend.submit = False, real_submit
    run_cycle(now=now + timedelta(seconds=240), stager=backend)
    assert StagerHealth.get().state == "healthy" and Job.objects.get().state == "sent"


def test_a_job_the_stager_refuses_does_not_block_the_others(alice, now):
    control(files_per_job=1)
    restore_submit(user=alice, now=now, paths=["/bad", "/good"])
    backend = Backend({"/bad": ("TA", 0), "/good": ("TB", 0)})
    real_submit = backend.submit

    def submit(job):
        if job.paths == ["/bad"]:
            raise ValueError("no such storage class")
        return real_submit(job)

    backend.submit = submit
    run_cycle(now=now, stager=backend)
    assert [j.paths for j in backend.sent] == [["/good"]]
    bad = RestoreRequest.objects.get(path="/bad")
    assert bad.state == "retry" and "refused the job: no such storage class" in bad.last_error
    assert StagerHealth.get().state == "healthy"


def test_a_stall_stops_submission_until_progress_returns(alice, now):
    control(files_per_job=2, jobs_in_flight=2, stall_after_s=600)
    restore_submit(user=alice, now=now, paths=[f"/st/{i}" for i in range(20)])
    backend = Backend({f"/st/{i}": (f"T{i}", 0) for i in range(20)})
    run_cycle(now=now, stager=backend)
    run_cycle(now=now + timedelta(seconds=100), stager=backend)  # the files start staging
    # Room for more: the stall, not the limit, must be what holds the next jobs back.
    Control.objects.filter(id=1).update(jobs_in_flight=10)
    sent_before = len(backend.sent)
    # Then nothing moves for longer than the stall time: stalled, and nothing new goes out.
    run_cycle(now=now + timedelta(seconds=800), stager=backend)
    assert StagerHealth.get().state == "stalled"
    assert len(backend.sent) == sent_before
    backend.file_state[backend.sent[0].paths[0]] = "done"  # progress returns
    run_cycle(now=now + timedelta(seconds=900), stager=backend)
    assert StagerHealth.get().state == "healthy"
    assert len(backend.sent) > sent_before


def test_many_failures_halve_the_jobs_in_flight(alice, now):
    control(files_per_job=2, jobs_in_flight=8)
    restore_submit(user=alice, now=now, paths=[f"/h/{i}" for i in range(16)])
    backend = Backend({f"/h/{i}": (f"T{i}", 0) for i in range(16)})
    run_cycle(now=now, stager=backend)
    for i in range(16):
        backend.file_state[f"/h/{i}"] = "failed:transient:drive error"
    report = run_cycle(now=now + timedelta(seconds=120), stager=backend)
    assert report.jobs_limit == 4 and StagerHealth.get().jobs_limit == 4
    # Retried on the retry cycle, not at once.
    assert RestoreRequest.objects.filter(state="retry").count() == 16


def test_failures_clustering_on_a_tape_quarantine_it_and_its_requests_wait(alice, operator, now):
    control(files_per_job=1, jobs_in_flight=4, quarantine_failures=3, retry_cycle_s=60)
    bad = [f"/bad/{i}" for i in range(3)]
    restore_submit(user=alice, now=now, paths=bad + ["/good/1"])
    backend = Backend({**{p: ("TBAD", i * GB) for i, p in enumerate(bad)}, "/good/1": ("TGOOD", 0)})
    run_cycle(now=now, stager=backend)
    for p in bad:
        backend.file_state[p] = "failed:transient:medium error on TBAD"
    backend.file_state["/good/1"] = "done"
    run_cycle(now=now + timedelta(seconds=120), stager=backend)
    tape = Tape.objects.get(label="TBAD")
    assert tape.quarantined_at is not None and "3 failures" in tape.quarantine_reason
    assert "medium error" in tape.quarantine_reason
    # After the retry time the requests are queued again, but none goes back to the bad tape.
    sent = len(backend.sent)
    for k in range(2, 5):
        run_cycle(now=now + timedelta(seconds=120 * k), stager=backend)
    assert len(backend.sent) == sent
    assert set(RestoreRequest.objects.filter(path__in=bad).values_list("state", flat=True)) == {"queued"}
    # The operator lifts the quarantine in the admin: the requests go out again.
    client = Client()
    client.force_login(operator)
    operator.is_superuser = True
    operator.save()
    response = client.post("/admin/carousel/tape/", {"action": "lift_quarantine", "_selected_action": [tape.id]})
    assert response.status_code == 302
    run_cycle(now=now + timedelta(seconds=720), stager=backend)
    assert len(backend.sent) > sent


def test_the_disk_buffer_holds_new_jobs_back(alice, now):
    control(files_per_job=1, jobs_in_flight=10, disk_threshold=0.9)
    restore_submit(user=alice, now=now, paths=[f"/d/{i}" for i in range(10)])
    backend = Backend({f"/d/{i}": (f"T{i}", 0) for i in range(10)})  # 1 GB each
    backend.disk = {"disk_free_bytes": 1 * GB, "disk_total_bytes": 10 * GB}
    report = run_cycle(now=now, stager=backend)
    assert report.submitted == 0 and "disk buffer" in report.error
    # 5 GB free: 4 GB fit below 90%; the rest waits for room.
    backend.disk = {"disk_free_bytes": 5 * GB, "disk_total_bytes": 10 * GB}
    report = run_cycle(now=now + timedelta(seconds=120), stager=backend)
    assert report.submitted == 4
    report = run_cycle(now=now + timedelta(seconds=240), stager=backend)
    assert report.submitted == 0 and "disk buffer" in report.error
    # The staged files were copied away and released: room again.
    backend.disk = {"disk_free_bytes": 10 * GB, "disk_total_bytes": 10 * GB}
    backend.finish_everything()
    report = run_cycle(now=now + timedelta(seconds=360), stager=backend)
    assert report.submitted == 6


def test_a_job_committed_before_a_crash_is_sent_with_its_own_id_once(alice, now):
    ctl = control()
    restore_submit(user=alice, now=now, paths=[f"/c/{i}" for i in range(8)])
    backend = Backend({f"/c/{i}": ("TC", i * GB) for i in range(8)})
    run_cycle(now=now, stager=backend)  # located and sent
    RestoreRequest.objects.update(state="queued", job=None, submitted_at=None)
    Job.objects.all().delete()
    backend.sent.clear()
    backend.staged.clear()
    # A cycle commits its jobs and dies before sending them.
    jobs = claim_jobs(now=now, control=ctl, sort=sort_policy("TAPEID"), share=share_policy("GRPW"))
    assert jobs and set(Job.objects.values_list("state", flat=True)) == {"pending"}
    # The next cycle sends them, with their own ids.
    run_cycle(now=now + timedelta(seconds=120), stager=backend)
    assert sorted(j.id for j in backend.sent) == sorted(j.id for j in jobs)
    # The stager acknowledged, but the broker died before recording it: sent again, same id,
    # staged once.
    Job.objects.update(state="pending", backend_id="")
    run_cycle(now=now + timedelta(seconds=240), stager=backend)
    assert len(backend.sent) == 2 * len(jobs)
    assert len(backend.staged) == len(jobs)
    staged_paths = [p for paths in backend.staged.values() for p in paths]
    assert len(staged_paths) == len(set(staged_paths)) == 8
    assert set(Job.objects.values_list("state", flat=True)) == {"sent"}


def test_cancelling_withdraws_from_the_stager_unless_another_user_shares_the_stage(alice, bob, now):
    control()
    restore_submit(user=alice, now=now, paths=["/x/shared", "/x/own"])
    restore_submit(user=bob, now=now, paths=["/x/shared"])
    cancelled = []
    backend = Backend()
    backend.cancel = lambda backend_id, paths: cancelled.extend(paths)
    run_cycle(now=now, stager=backend)
    from carousel.domain.services import request_cancel
    from carousel.loop.withdrawals import send_stager_calls

    request_cancel(queryset=RestoreRequest.objects.filter(user=alice), now=now)
    send_stager_calls(now=now, stager=backend)
    assert cancelled == ["/x/own"]
    assert RestoreRequest.objects.get(user=bob).state == "submitted"
