"""The server loop: one cycle is one call of run_cycle(now=...). The time is an argument, never
read inside, so tests and the replay simulator drive the same code with a simulated clock."""
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import groupby

from django.db import transaction
from django.db.models import (
    Case, Count, Exists, F, Max, OuterRef, PositiveIntegerField, Q, Subquery, Sum, UUIDField, Value, When,
)

from policies.selection import select, share_policy, sort_policy
from policies.sorting import in_read_order

from . import db, health as h, plan, plugins
from .delivery import DeliveryError
from .models import (
    ACTIVE_STATES, IN_FLIGHT_STATES, READY, Control, ErrorClass, FileLocation, Job, JobState, RequestState,
    RestoreRequest, StagerHealth, Tape, path_key,
)
from .plugins import PluginError
from .services import bulk_notify_complete, request_cancel, request_transition
from .stagers.base import JobSpec, StagerUnavailable
from .tape import MEDIA, mount_profile

log = logging.getLogger("carousel.loop")
# Longer than any copy may take (the site command's own timeout is an hour): a delivery still
# marked started after this lost its worker and is started again.
DELIVERY_LEASE_S = 6 * 3600
S = RequestState
FINISHED_JOBS = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


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
    preempted: int = 0
    delivering: int = 0
    health: str = h.HEALTHY
    jobs_limit: int = 0
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
        seen = collect_progress(now=now, stager=stager, control=control, report=report)
        state = judge_stager(now=now, seen=seen, control=control)
        if state.state == h.HEALTHY:
            state = _work(now=now, stager=stager, control=control, state=state, report=report)
        report.health, report.jobs_limit = state.state, state.limit
        report.delivering = dispatch_deliveries(now=now, control=control)
        bulk_notify_complete(now=now)
        Control.objects.filter(id=control.id).update(last_cycle_at=now, last_cycle_error=report.error)
        return report


def _work(*, now, stager, control, state, report):
    """Locate, choose and send: only while the stager is healthy. A call that finds the
    stager unreachable ends the cycle's work and marks it down; the next cycle probes."""
    try:
        report.located = locate_requests(now=now, stager=stager, limit=control.locate_batch)
        status = stager.status() or {}
        budget = disk_budget(status=status, control=control)
        sort, share = sort_policy(control.sort_policy), share_policy(control.share_policy)
    except PluginError as exc:
        # An operator's policy name that no longer resolves: submit nothing, say why.
        report.error = f"scheduling stopped: {exc}"
        log.error(report.error)
        return state
    except Exception as exc:  # noqa: BLE001 - judged as the stager down, and said with a traceback
        _unexpected(exc, "locating or reading the disk buffer")
        return judge_stager(now=now, seen=h.Observation(reachable=False, error=str(exc)), control=control)
    if control.paused:
        return state
    if budget is not None and budget <= 0:
        report.error = f"disk buffer: no room below {control.disk_threshold:.0%} with what is on its way"
    else:
        jobs = claim_jobs(now=now, control=control, sort=sort, share=share, jobs_limit=state.limit,
                          byte_budget=budget, drives=MountPlanner.from_status(status, control))
        report.submitted = sum(len(j.paths) for j in jobs)
        if budget is not None and not jobs:
            report.error = "disk buffer: the next files do not fit below the threshold"
    try:
        report.preempted = preempt(now=now, stager=stager, control=control)
    except StagerUnavailable as exc:
        return judge_stager(now=now, seen=h.Observation(reachable=False, error=f"cancel: {exc}"), control=control)
    except Exception:  # noqa: BLE001 - a cut refused or a bug: the long mount simply runs on
        log.exception("preempting a long mount failed")
    # Jobs committed by this or an interrupted earlier cycle go out now (planned ones once the
    # job before them on their drive's chain is finished).
    error = send_jobs(now=now, stager=stager)
    if error:
        return judge_stager(now=now, seen=h.Observation(reachable=False, error=f"submit: {error}"), control=control)
    return state


def _unexpected(exc, doing):
    """An exception other than StagerUnavailable is a bug (ours or the backend's): the cycle
    carries on as if the stager were down, and the traceback goes to the log."""
    if not isinstance(exc, StagerUnavailable):
        log.exception("unexpected error while %s", doing, exc_info=exc)


def judge_stager(*, now, seen, control):
    """Record what this cycle saw of the stager and return the judgement (carousel/health.py)."""
    row = StagerHealth.get()
    before = h.Health(state=row.state, limit=row.jobs_limit or 0, healthy_limit=row.healthy_limit or 0,
                      reason=row.reason)
    after = h.judge(before, seen, ceiling=control.jobs_in_flight, failure_ratio=control.failure_ratio)
    if after.state != before.state:
        log.warning("stager %s -> %s: %s", before.state, after.state, after.reason or "progress returned")
    StagerHealth.objects.filter(id=row.id).update(
        state=after.state, reason=after.reason, jobs_limit=after.limit, healthy_limit=after.healthy_limit,
        since=now if after.state != before.state else row.since or now, checked_at=now,
        probes=0 if after.state == h.HEALTHY else F("probes") + 1,
        last_progress_at=now if seen.progressed else row.last_progress_at)
    return after


def disk_budget(*, status, control):
    """The bytes new jobs may still bring to the stager's disk buffer before its projected
    use reaches the threshold (None: the stager does not report its buffer). `status`: the
    stager's status()."""
    free, total = status.get("disk_free_bytes"), status.get("disk_total_bytes")
    StagerHealth.objects.filter(id=1).update(disk_free_bytes=free, disk_total_bytes=total)
    if not total or free is None:
        return None
    # What was sent but is not on disk yet will take room there too.
    incoming = (RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).aggregate(b=Sum("size"))["b"] or 0)
    return int((control.disk_threshold - h.projected_disk_use(free=free, total=total, incoming=incoming)) * total)


def withdraw(stager, pairs):
    """Cancel (job, path) pairs at the stager, one call per job."""
    pairs = sorted((str(job), path) for job, path in pairs)
    jobs = Job.objects.filter(id__in={j for j, _ in pairs}).values_list("id", "backend_id")
    backend_ids = {str(job): backend_id for job, backend_id in jobs}
    for job_id, group in groupby(pairs, key=lambda p: p[0]):
        if backend_ids.get(job_id):
            try:
                stager.cancel(backend_ids[job_id], [path for _, path in group])
            except Exception as exc:  # noqa: BLE001 - the file is cancelled here; the stager's copy is moot
                log.warning("withdrawing from job %s failed: %s", job_id, exc)


def expire_requests(*, now, stager):
    count, pairs = request_cancel(
        queryset=RestoreRequest.objects.filter(deadline__lt=now, state__in=ACTIVE_STATES), now=now,
        reason="deadline passed before the file was restored", to=S.EXPIRED)
    if pairs:
        withdraw(stager, pairs)
    return count


def requeue_due_retries(*, now):
    return request_transition(RestoreRequest.objects.filter(state=S.RETRY, retry_at__lte=now), S.QUEUED, now=now)


def _files_in_flight(jobs):
    """{job id: {path: the states of its requests}} for these jobs' files in flight, each job's
    in the read order the policy chose (several users' requests for one file are one path);
    one query for all."""
    files = {job_id: {} for job_id in jobs}
    for job_id, path, state in (RestoreRequest.objects.filter(job_id__in=list(jobs), state__in=IN_FLIGHT_STATES)
                                .order_by("job_id", "job_rank", "id").values_list("job_id", "path", "state")):
        files[str(job_id)].setdefault(path, set()).add(state)
    return files


def _spec(job, files):
    return JobSpec(id=str(job.id), paths=list(files), tape=job.tape.label if job.tape else "",
                   backend_id=job.backend_id)


def collect_progress(*, now, stager, control, report):
    """Poll the jobs in flight and move their requests on; return what was seen of the
    stager. While it is down, one job is polled as a probe: one call a cycle, however many
    jobs wait, and the full poll follows in the same cycle once it answers. A cycle costs one
    query for all the jobs' files, and writes only for the files whose state changed."""
    jobs = {str(j.id): j for j in Job.objects.filter(state=JobState.SENT).select_related("tape")
            .order_by("sent_at")}
    if not jobs:
        if StagerHealth.get().state != h.DOWN:
            return h.Observation()
        try:  # down with nothing in flight: one cheap call tells whether it is back
            stager.status()
        except Exception as exc:  # noqa: BLE001
            _unexpected(exc, "probing")
            return h.Observation(reachable=False, error=f"status: {exc}")
        return h.Observation()
    files = _files_in_flight(jobs)
    for job_id in [j for j in jobs if not files[j]]:  # every file cancelled or restored elsewhere
        Job.objects.filter(id=job_id).update(state=JobState.DONE, finished_at=now)
        del jobs[job_id]
    specs = [_spec(job, files[job_id]) for job_id, job in jobs.items()]
    try:
        if specs and StagerHealth.get().state == h.DOWN:
            stager.poll(specs[:1])
        answers = stager.poll(specs) if specs else {}
    except Exception as exc:  # noqa: BLE001 - whatever the backend raised, it did not answer
        _unexpected(exc, "polling")
        return h.Observation(reachable=False, error=f"poll: {exc}")
    results = failures = 0
    tape_failures = {}
    # What moved, gathered over all jobs and written in one statement each: a path in flight
    # belongs to one job only, so (job in these, path in those) picks exactly these files.
    starting, done, failed, moved_jobs, ended_jobs = [], [], [], [], []
    for job_id, job in jobs.items():
        statuses = answers.get(job_id)
        if statuses is None:
            # The backend does not know this job: put its requests back in the queue.
            request_transition(RestoreRequest.objects.filter(job=job, state__in=IN_FLIGHT_STATES), S.QUEUED, now=now)
            Job.objects.filter(id=job.id).update(state=JobState.FAILED, finished_at=now)
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
                report.done += _staged(in_jobs, [st for _, st in done], now=now)
                results += len(done)
            for job, st in failed:
                _fail(in_jobs.filter(job=job, path=st.path), st, now=now, control=control, report=report)
                results += 1
                # Only the stager's own trouble throttles it; a user's missing files do not.
                failures += st.error_class == ErrorClass.TRANSIENT
                if job.tape_id and st.error_class in (ErrorClass.TRANSIENT, ErrorClass.PERMANENT):
                    tape_failures.setdefault(job.tape_id, []).append(st.message)
            Job.objects.filter(id__in=moved_jobs).update(progress_at=now)
            Job.objects.filter(id__in=ended_jobs).update(state=JobState.DONE, finished_at=now)
    count_tape_failures(tape_failures, now=now, control=control)
    progressed = bool(moved_jobs)
    # Stalled: jobs wait at the stager, and none has moved for the stall time.
    latest = None if progressed else Job.objects.filter(state=JobState.SENT).aggregate(p=Max("progress_at"))["p"]
    stalled = latest is not None and (now - latest).total_seconds() > control.stall_after_s
    return h.Observation(results=results, failures=failures, progressed=progressed, stalled=stalled)


def _staged(in_job, statuses, *, now):
    """Files on the stager's disk: every user's active request for them moves on, one stage
    serving all users; those with a destination go to delivery, the others are done."""
    disk_path = {st.path: st.disk_path for st in statuses}
    rows = list(in_job.filter(path__in=list(disk_path)).values_list("path", "path_key"))
    if not rows:
        return 0
    keys = [k for _, k in rows]
    delivery = plugins.delivery()
    n = 0
    if delivery.moves_files:
        to_deliver = RestoreRequest.objects.filter(path_key__in=keys, state__in=ACTIVE_STATES).exclude(
            state=S.DELIVERING).exclude(destination="")
        by_fs = {}
        for rid, path, destination in to_deliver.values_list("id", "path", "destination"):
            try:
                fs = delivery.filesystem(destination)
            except OSError:
                fs = "?"
            by_fs.setdefault(fs, []).append((rid, path))
        for fs, members in by_fs.items():
            staged = Case(*[When(path=p, then=Value(disk_path.get(p) or p)) for p in {p for _, p in members}])
            n += request_transition(RestoreRequest.objects.filter(id__in=[r for r, _ in members]), S.DELIVERING,
                                    now=now, delivery_fs=fs, staged_path=staged, delivery_started_at=None)
        keys_left = RestoreRequest.objects.filter(path_key__in=keys, destination="")
    else:
        keys_left = RestoreRequest.objects.filter(path_key__in=keys)
    n += request_transition(keys_left.exclude(state=S.DELIVERING), S.DONE, now=now)
    Tape.objects.filter(requests__path_key__in=keys, recent_failures__gt=0).update(recent_failures=0)
    return n


def count_tape_failures(failures, *, now, control):
    """Failures that cluster on one tape quarantine it: its requests wait instead of being
    retried against a bad cartridge, and the operator sees why. Conditional updates, so an
    operator lifting a quarantine meanwhile is never overwritten."""
    window_start = now - timedelta(seconds=control.quarantine_window_s)
    for tape_id, messages in failures.items():
        tapes = Tape.objects.filter(id=tape_id)
        tapes.filter(Q(failures_since__isnull=True) | Q(failures_since__lt=window_start)).update(
            recent_failures=0, failures_since=now)
        tapes.update(recent_failures=F("recent_failures") + len(messages))
        count = tapes.values_list("recent_failures", flat=True).first() or 0
        reason = f"{count} failures within {control.quarantine_window_s:.0f} s; last: {messages[-1]}"
        if count >= control.quarantine_failures and tapes.filter(quarantined_at__isnull=True).update(
                quarantined_at=now, quarantine_reason=reason):
            log.warning("tape %s quarantined: %s", tape_id, reason)


def _fail(queryset, status, *, now, control, report):
    """Transient and delivery failures wait for the next retry cycle until their attempts
    run out; permanent and user errors fail at once."""
    queryset = queryset.filter(state__in=(*IN_FLIGHT_STATES, S.DELIVERING))
    n = 0
    message = status.message
    # Tape attempts count submissions; delivery attempts count copies.
    counter, limit = {ErrorClass.TRANSIENT: ("attempts", control.max_attempts),
                      ErrorClass.DELIVERY: ("delivery_attempts", control.max_delivery_attempts)}.get(
        status.error_class, ("", 0))
    if limit:
        n = request_transition(queryset.filter(**{f"{counter}__lt": limit}), S.RETRY, now=now,
                               retry_at=now + timedelta(seconds=control.retry_cycle_s),
                               error_class=status.error_class, last_error=message)
        report.retrying += n
        message = f"{message} (gave up after {limit} attempts)"
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
            if err.error_class == ErrorClass.TRANSIENT:
                continue  # the backend cannot tell now: asked again at a later cycle
            request_transition(RestoreRequest.objects.filter(path_key=path_key(err.path), state=S.QUEUED), S.FAILED,
                               now=now,
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


def claim_jobs(*, now, control, sort, share, jobs_limit=None, byte_budget=None, drives=None):
    """Choose this cycle's requests with the active policies, claim them, group them into
    jobs of at most N files per tape in read order, and commit jobs and claims together.
    Claiming locks with SKIP LOCKED and re-checks the state, so two cycles can never send the
    same request. Slots: N files times the jobs allowed in flight (the adaptive limit, K by
    default), less the files planned or in flight, at most `choose_per_cycle`; and no more
    bytes than `byte_budget`, when given. With `drives` (a MountPlanner), the jobs are laid
    out on the drives' chains (carousel/plan.py)."""
    jobs_limit = control.jobs_in_flight if jobs_limit is None else jobs_limit
    in_flight = RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).count()
    slots = min(control.files_per_job * jobs_limit - in_flight, control.choose_per_cycle)
    selection = select(now=now, control=control, sort=sort, share=share, slots=slots)
    if byte_budget is not None:
        selection.chosen = _within(selection.chosen, byte_budget)
    if not selection.chosen:
        return []
    staged_elsewhere = RestoreRequest.objects.filter(path_key=OuterRef("path_key"), state__in=IN_FLIGHT_STATES)
    with transaction.atomic():
        claimed = dict(
            (i, (path, key)) for i, path, key in
            RestoreRequest.objects.filter(id__in=[c.id for c in selection.chosen], state=S.QUEUED)
            .exclude(Exists(staged_elsewhere)).exclude(tape__quarantined_at__isnull=False)
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("id", "path", "path_key")
        )
        chosen = [c for c in selection.chosen if c.id in claimed]
        return _make_jobs(chosen, claimed, selection.tapes, now=now, control=control, drives=drives)


def _within(chosen, byte_budget):
    """The first chosen requests, in sending order, whose sizes fit in the budget."""
    kept, used = [], 0
    for c in chosen:
        used += c.size
        if used > byte_budget:
            break
        kept.append(c)
    return kept


def _make_jobs(chosen, claimed, tapes, *, now, control, drives=None):
    """Tapes in the order the policies chose them; each tape's files in read order, at most
    N (control.files_per_job) distinct files per job. With `drives`, each tape's work is a piece of a
    drive's chain (MountPlanner); a piece longer than N files is several jobs sent together.
    All jobs in one INSERT, all claims in one UPDATE."""
    by_tape = {}
    for c in chosen:
        by_tape.setdefault(c.tape, []).append(c)
    ordered = {}  # tape -> [(path, key, position, size)] in read order, one per file
    users = {tape_id: Counter(c.user for c in candidates) for tape_id, candidates in by_tape.items()}
    for tape_id, candidates in by_tape.items():
        files = {}
        for c in in_read_order(candidates, tapes):
            files.setdefault(claimed[c.id], (*claimed[c.id], c.position or 0, c.size or 0))
        ordered[tape_id] = list(files.values())
    if drives is not None:
        pieces = drives.lay_out(ordered, tapes, users, control=control)
    else:
        pieces = [_Planned(tape_id, files) for tape_id, files in ordered.items()]
    files_per_job = control.files_per_job
    jobs, job_of_key, rank_of_key = [], {}, {}
    for piece in pieces:
        # A piece after another one planned in this cycle follows that one's last job.
        after = piece.after.last_job if isinstance(piece.after, _Planned) else piece.after
        for start in range(0, len(piece.files), files_per_job):
            part = piece.files[start:start + files_per_job]
            job = Job(tape_id=piece.tape, files=len(part), created_at=now, rank=len(jobs), chain=piece.chain,
                      after_id=after, jumps_queue=piece.jumps, estimate_s=piece.estimate_s * len(part) / len(piece.files))
            jobs.append((job, part))
            job_of_key.update((f[1], job.id) for f in part)
            rank_of_key.update((f[1], rank) for rank, f in enumerate(part))
            piece.last_job = job.id
    if not jobs:
        return []
    Job.objects.bulk_create([job for job, _ in jobs])
    for piece in pieces:
        if piece.jumps and piece.after is not None:
            # A short mount put before the long ones: the long ones that followed what it
            # follows now follow it.
            before = piece.after.last_job if isinstance(piece.after, _Planned) else piece.after
            Job.objects.filter(state=JobState.PENDING, after_id=before, chain=piece.chain,
                               jumps_queue=False).exclude(created_at=now).update(after_id=piece.last_job)
    # Other users' queued requests for the same files ride along in the same stage.
    request_transition(RestoreRequest.objects.filter(path_key__in=list(job_of_key), state=S.QUEUED), S.SUBMITTED,
                       now=now, job_id=Case(*[When(path_key=k, then=Value(j)) for k, j in job_of_key.items()],
                                            output_field=UUIDField()),
                       job_rank=Case(*[When(path_key=k, then=Value(r)) for k, r in rank_of_key.items()],
                                     output_field=PositiveIntegerField()))
    return [JobSpec(id=str(job.id), paths=[f[0] for f in part]) for job, part in jobs]


@dataclass
class _Planned:
    """A piece of work for one tape, as the jobs that carry it: its files (path, key, position,
    size) in read order; its drive chain ("" when unplanned) and the job it follows."""

    tape: int
    files: list
    chain: str = ""
    after: object = None  # a Job id, or an earlier _Planned of this cycle
    estimate_s: float = 0.0
    jumps: bool = False  # a short mount put before the long ones
    last_job: object = None  # set once its jobs exist


@dataclass
class MountPlanner:
    """Lays a cycle's new work out on the drives' chains (carousel/plan.py) from what is
    already planned or in flight. `drives`: media -> drives to plan for."""

    drives: dict
    read_rate_mb_s: float | None = None
    exchange_s: float = 11.0

    @classmethod
    def from_status(cls, status, control):
        """From the stager's status() and the control row; None (no plan) when neither gives a
        drive count."""
        counts = {}
        for drive in status.get("drives") or []:
            media = drive.get("media") or ""
            counts[media] = counts.get(media, 0) + 1
        if control.drives:
            counts = {(next(iter(counts)) if len(counts) == 1 else ""): control.drives}
        if not counts:
            return None
        return cls(drives=counts, read_rate_mb_s=status.get("read_rate_mb_s"),
                   exchange_s=float(status.get("exchange_s") or 11.0))

    def lay_out(self, ordered, tapes, users, *, control):
        """[_Planned] for {tape id: [(path, key, position, size)] in read order}; `users`: tape
        id -> Counter of the users whose requests these are."""
        chains = self._chains()
        # Short mounts of users with little in flight go first: one analyst's file does not wait
        # behind hours of someone's backlog. (A short remnant of a big backlog does not jump.)
        # This cycle's claims count too: a backlog's first cycle is not "little in flight".
        load = Counter(user for tape_users in users.values() for user in tape_users.elements())
        load.update(dict(RestoreRequest.objects.filter(user_id__in=list(load), state__in=IN_FLIGHT_STATES)
                         .order_by().values_list("user_id").annotate(n=Count("id")).values_list("user_id", "n")))
        busy = {user for user, n in load.items() if n >= control.files_per_job}
        pending_tape = {tape: rest for tape, *rest in Job.objects.filter(
            state=JobState.PENDING, tape_id__in=list(ordered)).exclude(chain="").order_by("created_at", "rank")
            .values_list("tape_id", "chain", "after_id", "jumps_queue")}
        pieces, work = [], {}
        for tape_id, files in ordered.items():
            media = tapes[tape_id].media if tape_id in tapes else None
            group = media if media in self.drives else ("" if "" in self.drives else None)
            if group is None or media not in MEDIA:
                pieces.append(_Planned(tape_id, files))  # no drive or no model for it: sent at once
                continue
            pre, suf = mount_profile(media, [(f[2], f[3]) for f in files], read_rate_mb_s=self.read_rate_mb_s,
                                     exchange_s=self.exchange_s)
            if tape_id in pending_tape:  # joins the tape's planned mount: sent with it
                chain, after, jumps = pending_tape[tape_id]
                pieces.append(_Planned(tape_id, files, chain=chain, after=after, estimate_s=pre[-1], jumps=jumps))
            elif pre[-1] <= control.short_mount_s and not set(users[tape_id]) & busy:
                pieces.append(self._short(tape_id, files, pre[-1], chains, group, control))
            else:
                work.setdefault(group, []).append(plan.TapeWork(tape_id, tuple(range(len(files))), tuple(pre),
                                                                tuple(suf)))
        # Cut tapes across drives only for the last of the backlog: while more waits, whole
        # tapes keep every drive busy with one mount each.
        # (This cycle's claims are still queued until its jobs are made.)
        keys = [f[1] for files in ordered.values() for f in files]
        split = not RestoreRequest.objects.filter(READY).exclude(path_key__in=keys).exists()
        for group, tape_work in work.items():
            ends = {name: c.end_s for name, c in chains.items() if name.startswith(f"{group}/")}
            layout, _ = plan.plan(ends, tape_work, split=split)
            for name, new in layout.items():
                after = chains[name].tail
                for p in new:
                    files = [ordered[p.tape][i] for i in p.keys]
                    after = _Planned(p.tape, files, chain=name, after=after, estimate_s=p.seconds)
                    pieces.append(after)
        return pieces

    def _short(self, tape_id, files, estimate, chains, group, control):
        """A short mount goes on the drive where it would start first: after that drive's
        current mount and the short ones already waiting there, first come first served; the
        long mounts planned on it follow. Behind a long mount a short one waits about the time
        it takes to cut it (see preempt)."""
        mine = {name: c for name, c in chains.items() if name.startswith(f"{group}/")}

        def start(name):
            c = mine[name]
            head = c.head_left_s
            if c.head_long and control.preempt_after_s > 0:
                head = min(head, control.preempt_after_s + PREEMPT_FREES_S)
            return head + c.shorts_s

        name = min(mine, key=lambda n: (start(n), n))
        chain = mine[name]
        chain.shorts_s += estimate
        front = chain.front
        planned = _Planned(tape_id, files, chain=name, after=front, estimate_s=estimate, jumps=True)
        if chain.tail == front:  # nothing long waits on this drive: this cycle's long work follows it
            chain.tail = planned
        chain.front = planned
        return planned

    def _chains(self):
        """{chain name: _Chain} for every drive, from the unfinished jobs on the chains."""
        chains = {f"{media}/{i}": _Chain() for media, n in self.drives.items() for i in range(n)}
        jobs = list(Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT)).exclude(chain="")
                    .order_by("created_at", "rank").values_list("id", "chain", "state", "after_id", "estimate_s",
                                                                "files", "jumps_queue"))
        sent = [j[0] for j in jobs if j[2] == JobState.SENT]
        left = dict(RestoreRequest.objects.filter(job_id__in=sent, state__in=IN_FLIGHT_STATES).order_by()
                    .values_list("job_id").annotate(n=Count("path_key", distinct=True)).values_list("job_id", "n"))
        followed = {j[3] for j in jobs}
        for job_id, name, state, after, estimate, files, jumps in jobs:
            chain = chains.setdefault(name, _Chain())
            share = estimate * (left.get(job_id, 0) / files if state == JobState.SENT and files else 1.0)
            chain.end_s += share
            if state == JobState.SENT:
                chain.front = job_id
                chain.head_left_s += share
                chain.head_long = chain.head_long or not jumps and estimate > 0
            elif jumps:  # a short mount waiting at the front
                chain.front = job_id
                chain.shorts_s += share
            if job_id not in followed:
                chain.tail = job_id
        return chains


@dataclass
class _Chain:
    end_s: float = 0.0  # until its planned and sent work is done (estimated)
    head_left_s: float = 0.0  # until the mount now on its drive (its jobs sent) is done
    head_long: bool = False  # that mount is a long one (a short one waiting may cut it)
    front: object = None  # the job a new short mount follows: the last one sent, or the last short one waiting
    shorts_s: float = 0.0  # the short mounts waiting at the front
    tail: object = None  # the job that new long work follows


# Roughly what a cut long mount still takes before its drive is free: the file being read, the
# rewind and unload, the robot's put-back.
PREEMPT_FREES_S = 300.0


def send_jobs(*, now, stager):
    """Send every committed, unacknowledged job. A job left pending by a crash is sent again
    with the same id, which the stager treats as the same job. Returns the error that stopped
    sending, or ""."""
    ready = Q(after__isnull=True) | Q(after__state__in=FINISHED_JOBS)
    pending = {str(j.id): j for j in Job.objects.filter(ready, state=JobState.PENDING).select_related("tape")
               .order_by("created_at", "rank")}
    if not pending:
        return ""
    files = _files_in_flight(pending)
    for job_id, job in pending.items():
        spec = _spec(job, files[job_id])
        if not spec.paths:
            Job.objects.filter(id=job.id).update(state=JobState.CANCELLED, finished_at=now)
            continue
        try:
            backend_id = stager.submit(spec)
        except StagerUnavailable as exc:  # the job stays pending for a later cycle
            log.warning("submitting %s failed: %s", job.id, exc)
            return str(exc) or type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - the stager refused this job: the others still go
            log.exception("the stager refused job %s", job.id)
            _refused(job, exc, now=now)
            continue
        Job.objects.filter(id=job.id, state=JobState.PENDING).update(
            state=JobState.SENT, backend_id=backend_id, sent_at=now, progress_at=now)
    return ""


def preempt(*, now, stager, control):
    """A short mount that has waited `preempt_after_s` behind a long one on its drive's chain
    cuts that one short: the long mount's files after the one on the drive are withdrawn from
    the stager and go back to the queue (not counted as an attempt), so the drive comes free
    after the file it is reading. At most one per `preempt_gap_s`, so long mounts are not cut
    to pieces. Returns the files withdrawn."""
    if control.preempt_after_s <= 0:
        return 0
    last = StagerHealth.objects.values_list("preempted_at", flat=True).first()
    if last is not None and (now - last).total_seconds() < control.preempt_gap_s:
        return 0
    candidates = (Job.objects.filter(state=JobState.PENDING, jumps_queue=True, after__state=JobState.SENT,
                                     created_at__lte=now - timedelta(seconds=control.preempt_after_s))
                  .select_related("after").order_by("created_at", "rank")[:20])
    for waiting in candidates:
        # The mount it waits for is the piece its predecessor belongs to: that tape's jobs sent
        # on that chain. Only a long one is cut.
        piece = list(Job.objects.filter(state=JobState.SENT, chain=waiting.after.chain,
                                        tape_id=waiting.after.tape_id).order_by("created_at", "rank"))
        if sum(j.estimate_s for j in piece) > control.short_mount_s:
            break
    else:
        return 0
    rank = {j.id: i for i, j in enumerate(piece)}
    rows = sorted(RestoreRequest.objects.filter(job__in=piece, state__in=IN_FLIGHT_STATES)
                  .values_list("job_id", "job_rank", "path"), key=lambda r: (rank[r[0]], r[1]))
    # The first of them in read order is on the drive (or next to be): it finishes.
    withdrawn = {}
    for job_id, _, path in rows[1:]:
        if path != rows[0][2]:
            withdrawn.setdefault(job_id, []).append(path)
    if not withdrawn:
        return 0
    backend = {j.id: j.backend_id for j in piece}
    n = 0
    for job_id, paths in withdrawn.items():
        stager.cancel(backend[job_id], paths)
        # Back in the queue as soon as the stager let them go: were a later cancel to fail,
        # these must not come back from the poll as failures.
        n += request_transition(RestoreRequest.objects.filter(job_id=job_id, path__in=paths,
                                                              state__in=IN_FLIGHT_STATES),
                                S.QUEUED, now=now, attempts=F("attempts") - 1)
        StagerHealth.objects.filter(id=1).update(preempted_at=now)
    log.info("the mount of tape %s cut after its current file for short job %s: %d requests back in the queue",
             waiting.after.tape_id, waiting.id, n)
    return sum(len(paths) for paths in withdrawn.values())


def _refused(job, exc, *, now):
    """A job the stager refuses (not "unavailable": an error of its own) fails transiently, so
    its requests wait for the retry cycle, bounded by their attempts, instead of blocking every
    later job."""
    control = Control.get()
    failure = _Failure(f"the stager refused the job: {exc}", ErrorClass.TRANSIENT)
    _fail(RestoreRequest.objects.filter(job=job), failure, now=now, control=control, report=CycleReport())
    Job.objects.filter(id=job.id).update(state=JobState.FAILED, finished_at=now)


def dispatch_deliveries(*, now, control):
    """Start deliveries of staged files, at most `deliveries_per_fs` at once per destination
    file system; each batch runs in a worker task. A delivery started longer ago than its lease
    (its worker died) is started again."""
    waiting = RestoreRequest.objects.filter(state=S.DELIVERING)
    waiting.filter(delivery_started_at__lt=now - timedelta(seconds=DELIVERY_LEASE_S)).update(
        delivery_started_at=None)
    running = dict(waiting.filter(delivery_started_at__isnull=False).order_by().values_list("delivery_fs")
                   .annotate(n=Count("id")).values_list("delivery_fs", "n"))
    started = []
    for fs in waiting.filter(delivery_started_at__isnull=True).order_by().values_list(
            "delivery_fs", flat=True).distinct():
        room = control.deliveries_per_fs - running.get(fs, 0)
        if room <= 0:
            continue
        ids = list(waiting.filter(delivery_fs=fs, delivery_started_at__isnull=True).order_by("id")
                   .values_list("id", flat=True)[:room])
        waiting.filter(id__in=ids, delivery_started_at__isnull=True).update(delivery_started_at=now)
        started.extend(ids)
    if started:
        from .tasks import deliver_on_commit

        deliver_on_commit(started)
    return len(started)


def deliver_requests(ids, *, now, control=None):
    """Deliver these staged requests (a worker task): done, or failed with class DELIVERY
    (retried on the retry cycle) or USER (a destination the user must fix)."""
    control = control or Control.get()
    delivery = plugins.delivery()
    report = CycleReport()
    for rid, source, destination in RestoreRequest.objects.filter(id__in=ids, state=S.DELIVERING).values_list(
            "id", "staged_path", "destination"):
        one = RestoreRequest.objects.filter(id=rid)
        one.update(delivery_attempts=F("delivery_attempts") + 1)
        try:
            delivery.deliver(source, destination)
        except DeliveryError as exc:
            status_class = ErrorClass.USER if exc.user_error else ErrorClass.DELIVERY
            _fail(one, _Failure(str(exc), status_class), now=now, control=control, report=report)
            continue
        request_transition(one, S.DONE, now=now)
    return report


@dataclass(frozen=True)
class _Failure:
    message: str
    error_class: str
