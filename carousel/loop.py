"""The server loop: one cycle is one call of run_cycle(now=...). The time is an argument, never
read inside, so tests and the replay simulator drive the same code with a simulated clock."""
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import groupby

from django.db import transaction
from django.db.models import Case, Exists, OuterRef, Subquery, UUIDField, Value, When

from policies.selection import select, share_policy, sort_policy
from policies.sorting import in_read_order

from . import db, plugins
from .models import (
    ACTIVE_STATES, IN_FLIGHT_STATES, Control, ErrorClass, FileLocation, Job, JobState, RequestState,
    RestoreRequest, Tape, path_key,
)
from .plugins import PluginError
from .services import request_cancel, request_transition
from .stagers.base import JobSpec

log = logging.getLogger("carousel.loop")
S = RequestState


@dataclass
class CycleReport:
    skipped: bool = False
    expired: int = 0
    requeued: int = 0
    located: int = 0
    done: int = 0
    failed: int = 0
    retrying: int = 0
    submitted: int = 0
    jobs_sent: list = field(default_factory=list)
    error: str = ""


def run_cycle(*, now, stager=None):
    """Run one cycle unless another process is running one; then skip."""
    with db.try_lock("carousel-cycle") as taken:
        if not taken:
            return CycleReport(skipped=True)
        stager = stager or plugins.stager()
        control = Control.get()
        report = CycleReport()
        report.expired = expire_requests(now=now, stager=stager)
        report.requeued = requeue_due_retries(now=now)
        collect_progress(now=now, stager=stager, control=control, report=report)
        report.located = locate_requests(now=now, stager=stager, limit=control.locate_batch)
        try:
            sort, share = sort_policy(control.sort_policy), share_policy(control.share_policy)
        except PluginError as exc:
            # An operator's policy name that no longer resolves: submit nothing, say why.
            report.error = f"scheduling stopped: {exc}"
            log.error(report.error)
        else:
            if not control.paused:
                jobs = claim_jobs(now=now, control=control, sort=sort, share=share)
                report.submitted = sum(len(j.paths) for j in jobs)
                report.jobs_sent = [j.id for j in jobs]
        # Jobs committed by this or an interrupted earlier cycle go out now.
        if not control.paused:
            send_jobs(now=now, stager=stager)
        Control.objects.filter(id=control.id).update(last_cycle_at=now, last_cycle_error=report.error)
        return report


def withdraw(stager, pairs):
    """Cancel (job, path) pairs at the stager, one call per job."""
    pairs = sorted((str(job), path) for job, path in pairs)
    jobs = Job.objects.filter(id__in={j for j, _ in pairs}).values_list("id", "backend_id")
    backend_ids = {str(job): backend_id for job, backend_id in jobs}
    for job_id, group in groupby(pairs, key=lambda p: p[0]):
        if backend_ids.get(job_id):
            stager.cancel(backend_ids[job_id], [path for _, path in group])


def expire_requests(*, now, stager):
    count, pairs = request_cancel(
        queryset=RestoreRequest.objects.filter(deadline__lt=now, state__in=ACTIVE_STATES), now=now,
        reason="deadline passed before the file was restored", to=S.EXPIRED)
    if pairs:
        withdraw(stager, pairs)
    return count


def requeue_due_retries(*, now):
    return request_transition(RestoreRequest.objects.filter(state=S.RETRY, retry_at__lte=now), S.QUEUED, now=now)


def _spec(job):
    paths = list(job.requests.filter(state__in=IN_FLIGHT_STATES).order_by("position", "id")
                 .values_list("path", flat=True).distinct())
    return JobSpec(id=str(job.id), paths=paths, tape=job.tape.label if job.tape else "", backend_id=job.backend_id)


def collect_progress(*, now, stager, control, report):
    """Poll the jobs in flight and move their requests on."""
    jobs = {str(j.id): j for j in Job.objects.filter(state=JobState.SENT).select_related("tape")}
    if not jobs:
        return
    specs = [_spec(j) for j in jobs.values()]
    answers = stager.poll(specs)
    for job_id, job in jobs.items():
        statuses = answers.get(job_id)
        in_job = RestoreRequest.objects.filter(job=job)
        if statuses is None:
            # The backend does not know this job: put its requests back in the queue.
            request_transition(in_job.filter(state__in=IN_FLIGHT_STATES), S.QUEUED, now=now)
            Job.objects.filter(id=job.id).update(state=JobState.FAILED, finished_at=now)
            continue
        by_state = {}
        for st in statuses:
            by_state.setdefault(st.state, []).append(st)
        with transaction.atomic():
            progressed = 0
            if "staging" in by_state:
                progressed += request_transition(
                    in_job.filter(path__in=[s.path for s in by_state["staging"]]), S.STAGING, now=now)
            if "done" in by_state:
                # Everyone's active request for a restored file is done: one stage serves all users.
                keys = list(in_job.filter(path__in=[s.path for s in by_state["done"]]).values_list("path_key", flat=True))
                n = request_transition(RestoreRequest.objects.filter(path_key__in=keys), S.DONE, now=now)
                report.done += n
                progressed += n
            for st in by_state.get("failed", []):
                progressed += _fail(in_job.filter(path=st.path), st, now=now, control=control, report=report)
            if progressed:
                Job.objects.filter(id=job.id).update(progress_at=now)
            if not in_job.filter(state__in=IN_FLIGHT_STATES).exists():
                Job.objects.filter(id=job.id).update(state=JobState.DONE, finished_at=now)


def _fail(queryset, status, *, now, control, report):
    """A transient failure waits for the next retry cycle until its attempts run out; any
    other class fails at once."""
    queryset = queryset.filter(state__in=IN_FLIGHT_STATES)
    n = 0
    message = status.message
    if status.error_class == ErrorClass.TRANSIENT:
        n = request_transition(queryset.filter(attempts__lt=control.max_attempts), S.RETRY, now=now,
                               retry_at=now + timedelta(seconds=control.retry_cycle_s),
                               error_class=status.error_class, last_error=message)
        report.retrying += n
        message = f"{message} (gave up after {control.max_attempts} attempts)"
    m = request_transition(queryset, S.FAILED, now=now, error_class=status.error_class or ErrorClass.PERMANENT,
                           last_error=message)
    report.failed += m
    return n + m


def locate_requests(*, now, stager, limit):
    """Learn the tape, position and size of queued requests not located yet, oldest first."""
    batch = list(RestoreRequest.objects.filter(state=S.QUEUED, tape__isnull=True)
                 .order_by("created_at", "id").values_list("id", "path", "path_key")[:limit])
    if not batch:
        return 0
    keys = {k for _, _, k in batch}
    known = set(FileLocation.objects.filter(path_key__in=keys).values_list("path_key", flat=True))
    unknown = sorted({p for _, p, k in batch if k not in known})
    if unknown:
        answers = stager.locate(unknown)
        found = [a for a in answers if hasattr(a, "tape")]
        missing = [a for a in answers if not hasattr(a, "tape")]
        _record_locations(found, now=now)
        for err in missing:
            request_transition(RestoreRequest.objects.filter(path=err.path, state=S.QUEUED), S.FAILED, now=now,
                               error_class=err.error_class, last_error=err.message)
    location = FileLocation.objects.filter(path_key=OuterRef("path_key"))
    return RestoreRequest.objects.filter(id__in=[i for i, _, _ in batch], state=S.QUEUED, tape__isnull=True).filter(
        Exists(location)).update(
        tape_id=Subquery(location.values("tape_id")[:1]),
        position=Subquery(location.values("position")[:1]),
        size=Subquery(location.values("size")[:1]),
    )


def _record_locations(found, *, now):
    labels = {loc.tape: loc.media for loc in found}
    Tape.objects.bulk_create([Tape(label=label, media=media) for label, media in labels.items()],
                             ignore_conflicts=True)
    tape_ids = dict(Tape.objects.filter(label__in=labels).values_list("label", "id"))
    FileLocation.objects.bulk_create(
        [FileLocation(path=loc.path, path_key=path_key(loc.path), tape_id=tape_ids[loc.tape],
                      position=loc.position, size=loc.size, located_at=now) for loc in found],
        update_conflicts=True, unique_fields=["path_key"], update_fields=["tape", "position", "size", "located_at"],
        batch_size=2000)


def claim_jobs(*, now, control, sort, share):
    """Choose this cycle's requests with the active policies, claim them, group them into
    jobs of at most N files per tape in read order, and commit jobs and claims together.
    Claiming locks with SKIP LOCKED and re-checks the state, so two cycles can never send the
    same request."""
    in_flight = RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).count()
    slots = control.files_per_job * control.jobs_in_flight - in_flight
    selection = select(now=now, control=control, sort=sort, share=share, slots=slots)
    if not selection.chosen:
        return []
    staged_elsewhere = RestoreRequest.objects.filter(path_key=OuterRef("path_key"), state__in=IN_FLIGHT_STATES)
    with transaction.atomic():
        claimed = dict(
            (i, (path, key)) for i, path, key in
            RestoreRequest.objects.filter(id__in=[c.id for c in selection.chosen], state=S.QUEUED)
            .exclude(Exists(staged_elsewhere))
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("id", "path", "path_key")
        )
        chosen = [c for c in selection.chosen if c.id in claimed]
        return _make_jobs(chosen, claimed, selection.tapes, now=now, files_per_job=control.files_per_job)


def _make_jobs(chosen, claimed, tapes, *, now, files_per_job):
    """Tapes in the order the policies chose them; each tape's files in read order, at most
    files_per_job distinct files per job. All jobs in one INSERT, all claims in one UPDATE."""
    by_tape = {}
    for c in chosen:
        by_tape.setdefault(c.tape, []).append(c)
    jobs, job_of_key = [], {}
    for tape_id, candidates in by_tape.items():
        files = list(dict.fromkeys(claimed[c.id] for c in in_read_order(candidates, tapes)))
        for start in range(0, len(files), files_per_job):
            part = files[start:start + files_per_job]
            job = Job(tape_id=tape_id, files=len(part), created_at=now)
            jobs.append((job, part))
            job_of_key.update((key, job.id) for _, key in part)
    Job.objects.bulk_create([job for job, _ in jobs])
    # Other users' queued requests for the same files ride along in the same stage.
    request_transition(RestoreRequest.objects.filter(path_key__in=list(job_of_key), state=S.QUEUED), S.SUBMITTED,
                       now=now, job_id=Case(*[When(path_key=k, then=Value(j)) for k, j in job_of_key.items()],
                                            output_field=UUIDField()))
    return [JobSpec(id=str(job.id), paths=[p for p, _ in part]) for job, part in jobs]


def send_jobs(*, now, stager):
    """Send every committed, unacknowledged job. A job left pending by a crash is sent again
    with the same id, which the stager treats as the same job."""
    for job in Job.objects.filter(state=JobState.PENDING).select_related("tape").order_by("created_at"):
        spec = _spec(job)
        if not spec.paths:
            Job.objects.filter(id=job.id).update(state=JobState.CANCELLED, finished_at=now)
            continue
        try:
            backend_id = stager.submit(spec)
        except Exception as exc:  # the stager is down: the job stays pending for the next cycle
            log.warning("submitting %s failed: %s", job.id, exc)
            break
        Job.objects.filter(id=job.id, state=JobState.PENDING).update(
            state=JobState.SENT, backend_id=backend_id, sent_at=now, progress_at=now)
