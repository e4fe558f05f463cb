"""Progress: poll the jobs in flight and move their requests on (staging, delivering, done,
retry, failed); tell the health judgement what was seen of the stager."""
import logging
from collections.abc import Mapping

from django.db import transaction
from django.db.models import Case, F, Max, TextField, Value, When

from carousel.loop import health as h
from carousel.infra import db, plugins
from carousel.loop.failures import count_tape_failures, fail_requests, says_about_tape
from carousel.models import (
    ACTIVE_STATES, FINISHED_JOB_STATES, IN_FLIGHT_STATES, ErrorClass, Job, JobState, RequestState as S,
    RestoreRequest, StagerHealth, Tape,
)
from carousel.domain import ondisk
from carousel.domain.services import job_give_up, request_transition
from carousel.stagers.base import JobSpec, StagerUnavailable

log = logging.getLogger("carousel.loop")


def log_unexpected(exc, doing):
    """An exception other than StagerUnavailable is a bug (ours or the backend's): the cycle
    carries on as if the stager were down, and the traceback goes to the log."""
    if not isinstance(exc, StagerUnavailable):
        log.exception("unexpected error while %s", doing, exc_info=exc)


def files_in_flight(jobs):
    """{job id: {path: the states of its requests}} for these jobs' files in flight, each job's
    in the read order the policy chose (several users' requests for one file are one path);
    one query for all."""
    files = {job_id: {} for job_id in jobs}
    for job_id, path, state in (RestoreRequest.objects.filter(job_id__in=list(jobs), state__in=IN_FLIGHT_STATES)
                                .order_by("job_id", "job_rank", "id").values_list("job_id", "path", "state")):
        files[str(job_id)].setdefault(path, set()).add(state)
    return files


def job_spec(job, files):
    spec = JobSpec(id=str(job.id), paths=list(files), tape=job.tape.label if job.tape else "",
                   backend_id=job.backend_id)
    if not job.backend_id:
        # Being sent: the pins its files should get on the stager's disk (stagers that take them),
        # the longest any of their users asked for, in seconds. One query per job sent.
        spec.lifetimes = {path: seconds.total_seconds() for path, seconds in (
            RestoreRequest.objects.filter(job_id=job.id, state__in=IN_FLIGHT_STATES, pin_lifetime__isnull=False)
            .order_by().values_list("path").annotate(longest=Max("pin_lifetime")).values_list("path", "longest"))}
    return spec


def in_flight():
    """The requests in flight (in a job at the stager)."""
    return RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES)


def requeue_orphans(*, now):
    """Requests in flight in a job that has already finished go back to the queue. Submission
    joins another user's job in flight without waiting for the loop; if the loop finishes that
    job before the submission commits, nothing would ever poll the copy again. Rare, and
    found here by two small queries a cycle rather than a lock every submission would take:
    the jobs of the requests in flight (at most N x K of them), then which of those finished.
    Not one join: on a table the planner believes empty (fresh, or in a test's transaction) it
    loops over every finished job for each request in flight. The jobs go as one array
    parameter (db.in_keys): a window of one-file jobs is thousands of them."""
    in_flight_jobs = list(in_flight().order_by().values_list("job_id", flat=True).distinct())
    finished = list(Job.objects.filter(db.in_keys("id", in_flight_jobs), state__in=FINISHED_JOB_STATES)
                    .values_list("id", flat=True))
    if not finished:
        return 0
    n = request_transition(RestoreRequest.objects.filter(job_id__in=finished, state__in=IN_FLIGHT_STATES),
                           S.QUEUED, now=now)
    if n:
        log.info("%d requests joined a job as it finished: back in the queue", n)
    return n


def collect_progress(*, now, stager, control, report, was_down=None):
    """Poll the jobs in flight and move their requests on; return what was seen of the
    stager. While it is down, one job is polled as a probe: one call a cycle, however many
    jobs wait, and the full poll follows in the same cycle once it answers. A cycle costs one
    query for all the jobs' files, and writes only for the files whose state changed.
    was_down: whether the stager is judged down (read here when not given)."""
    if was_down is None:
        was_down = StagerHealth.get().state == h.DOWN
    jobs = {str(j.id): j for j in Job.objects.filter(state=JobState.SENT).select_related("tape")
            .order_by("sent_at")}
    if not jobs:
        if not was_down:
            return h.Observation()
        try:  # down with nothing in flight: one cheap call tells whether it is back
            stager.status()
        except Exception as exc:  # noqa: BLE001
            log_unexpected(exc, "probing")
            return h.Observation(reachable=False, error=f"status: {exc}")
        return h.Observation()
    files = files_in_flight(jobs)
    for job_id in [j for j in jobs if not files[j]]:  # every file cancelled or restored elsewhere
        Job.objects.filter(id=job_id, state=JobState.SENT).update(state=JobState.DONE, finished_at=now)
        del jobs[job_id]
    specs = [job_spec(job, files[job_id]) for job_id, job in jobs.items()]
    try:
        if specs and was_down:
            stager.poll(specs[:1])
        answers = stager.poll(specs) if specs else {}
        if not isinstance(answers, Mapping):  # a broken backend's answer: not one it gave
            raise TypeError(f"poll answered a {type(answers).__name__}, not jobs and their files")
    except Exception as exc:  # noqa: BLE001 - whatever the backend raised, it did not answer
        log_unexpected(exc, "polling")
        return h.Observation(reachable=False, error=f"poll: {exc}")
    if was_down:
        # The first answer after an outage counts as progress: the jobs could not be seen
        # moving while the stager was down, so the stall clock starts again from here.
        Job.objects.filter(id__in=list(jobs)).update(progress_at=now)
    results = failures = 0
    tape_failures = {}
    # What moved, gathered over all jobs and written in one statement each: a path in flight
    # belongs to one job only, so (job in these, path in those) picks exactly these files.
    starting, done, failed, moved_jobs, ended_jobs = [], [], [], [], []
    for job_id, job in jobs.items():
        statuses = answers.get(job_id)
        if statuses is None:
            # The backend does not know this job (lost in its restart, or a replica that has
            # not heard of it): given up as a job past its deadline is, its files back in the
            # queue with the attempt counted, so a stager that keeps forgetting is not sent them
            # at every cycle for ever, and withdrawn, in case it knows the job again later.
            job_give_up(queryset=Job.objects.filter(id=job.id), now=now,
                        reason="the stager did not know its job any more")
            continue
        current = files[job_id]
        ended = set()
        moved = False
        for st in statuses:
            if st.path not in current:
                continue
            if st.state == "staging" and S.SUBMITTED in current[st.path]:
                starting.append(st.path)
                moved = True
            elif st.state in ("done", "failed"):
                (done if st.state == "done" else failed).append((job, st))
                ended.add(st.path)
                moved = True
        if moved:
            moved_jobs.append(job.id)
        if ended >= set(current):
            ended_jobs.append(job.id)
    if moved_jobs:
        with transaction.atomic():
            in_jobs = RestoreRequest.objects.filter(job_id__in=moved_jobs)
            if starting:
                request_transition(in_jobs.filter(path__in=starting), S.STAGING, now=now)
            if done:
                report.done += _staged(in_jobs, done, now=now)
                results += len(done)
            for job, st in failed:
                fail_requests(in_jobs.filter(job=job, path=st.path), st, now=now, control=control, report=report)
                results += 1
                # Only the stager's own trouble throttles it; a user's missing files do not.
                failures += st.error_class == ErrorClass.TRANSIENT
                if job.tape_id and says_about_tape(st):
                    tape_failures.setdefault(job.tape_id, []).append(st.message)
            Job.objects.filter(id__in=moved_jobs).update(progress_at=now)
            # Still sent: one given up meanwhile (an operator's word) stays given up.
            Job.objects.filter(id__in=ended_jobs, state=JobState.SENT).update(state=JobState.DONE, finished_at=now)
    count_tape_failures(tape_failures, now=now, control=control)
    progressed = bool(moved_jobs)
    # Stalled: jobs wait at the stager, and none has moved for the stall time.
    latest = None if progressed else Job.objects.filter(state=JobState.SENT).aggregate(p=Max("progress_at"))["p"]
    stalled = latest is not None and (now - latest).total_seconds() > control.stall_after_s
    return h.Observation(results=results, failures=failures, progressed=progressed, stalled=stalled)


def _staged(in_job, done, *, now):
    """Files on the stager's disk ((job, status) pairs): every user's active request for them
    moves on, one stage serving all users; those with a destination go to delivery, the others
    are done."""
    disk_path = {st.path: st.disk_path for _, st in done}
    rows = list(in_job.filter(path__in=list(disk_path)).values_list("job_id", "path_key"))
    if not rows:
        return 0
    keys = [k for _, k in rows]
    # The requests of these files outside the job that read them (waiting to retry with their
    # failed job, queued) are served by its copy and name it, as a request served from a pinned
    # copy does (copy_job): the end of their pin releases the copy where it is. They kept their
    # own job, and the release went to it (a failed job), the copy staying pinned.
    by_job = {}
    for job_id, key in rows:
        by_job.setdefault(job_id, []).append(key)
    for job_id, job_keys in by_job.items():
        RestoreRequest.objects.filter(path_key__in=job_keys, state__in=ACTIVE_STATES).exclude(job_id=job_id).update(
            copy_job=job_id)
    n = requests_on_disk(RestoreRequest.objects.filter(path_key__in=keys), disk_path, now=now)
    Tape.objects.filter(requests__path_key__in=keys, recent_failures__gt=0).update(recent_failures=0)
    return n


def requests_on_disk(requests, disk_path, *, now):
    """The active requests of `requests` whose files are on the stager's disk ({path: where,
    "" when at its own path}) move on: to the delivery step when they name a destination and the
    delivery moves files (ondisk.arrival), else done, with where the copy lies (API: disk_path).
    A finished stage (above), or a file the stager says is on disk already (the locate step)."""
    delivery = plugins.delivery()
    n = 0
    requests = requests.filter(state__in=ACTIVE_STATES)
    if delivery.moves_files:
        to_deliver = requests.exclude(state=S.DELIVERING).exclude(destination="")
        by_fs = {}
        for rid, path, destination in to_deliver.values_list("id", "path", "destination"):
            _, fs = ondisk.arrival(destination, delivery)
            by_fs.setdefault(fs, []).append((rid, path))
        for fs, members in by_fs.items():
            staged = Case(*[When(path=p, then=Value(disk_path.get(p) or p)) for p in {p for _, p in members}])
            n += request_transition(RestoreRequest.objects.filter(id__in=[r for r, _ in members]), S.DELIVERING,
                                    now=now, delivery_fs=fs, staged_path=staged, delivery_started_at=None)
        keys_left = requests.filter(destination="")
    else:
        keys_left = requests
    on_disk = {p: d for p, d in disk_path.items() if d}
    staged = {}
    if on_disk:
        staged["staged_path"] = Case(*[When(path=p, then=Value(d)) for p, d in on_disk.items()],
                                     default=F("staged_path"), output_field=TextField())
    n += request_transition(keys_left.exclude(state=S.DELIVERING), S.DONE, now=now, **staged)
    return n
