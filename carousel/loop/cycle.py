"""The server loop: one cycle is one call of run_cycle(now=...). The time is an argument, never
read inside, so tests and the replay simulator drive the same code with a simulated clock.

Each step lives in a module of its own, in the order run_cycle calls them, each only when
due.py's question (one statement before the steps, one after the work) says it has something to
do: withdrawals.py (expiry), failures.py (retries, quarantine), progress.py (polling, and requests
left in a finished job), health.py (the judgement); while healthy: deadlines.py (jobs that never
finish), locating.py, claiming.py (policies -> jobs), mounts.py with plan.py (the drives' chains,
preemption, sending); then pins.py (pins that ran out), withdrawals.py again (the recorded
stager calls: withdrawals and releases), delivery.py (copies to users)."""
import logging
import time
from dataclasses import dataclass

from django.db import InterfaceError, OperationalError
from django.db.models import F, Sum

from policies.selection import share_policy, sort_policy, turn_policy

from carousel.infra import db, queue
from carousel.loop import health as h
from carousel.domain import intake
from carousel.domain.counters import counters_fold
from carousel.ops import metrics
from carousel.infra import plugins
from carousel.loop.claiming import claim_jobs, files_at_stager
from carousel.loop.deadlines import end_overdue_jobs
from carousel.loop.delivery import dispatch_deliveries
from carousel.loop.due import AFTER, BEFORE, ask
from carousel.loop.failures import requeue_due_retries
from carousel.loop.locating import locate_new_work
from carousel.models import Control, StagerHealth
from carousel.loop.mounts import MountPlanner, preempt, send_jobs
from carousel.domain.pins import end_expired_pins
from carousel.infra.plugins import PluginError
from carousel.loop.progress import collect_progress, log_unexpected, requeue_orphans
from carousel.domain.services import notices_due
from carousel.stagers.base import StagerUnavailable
from carousel.loop.withdrawals import expire_requests, send_stager_calls

log = logging.getLogger("carousel.loop")


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
    stager_calls: int = 0  # withdrawals and releases the stager confirmed
    health: str = h.HEALTHY
    jobs_limit: int = 0
    error: str = ""


def run_cycle(*, now, stager=None):
    """Run one cycle unless another process is running one; then skip. An exception that
    escapes a step ends the cycle and is recorded on the control row, where the admin and
    /api/v1/stager/ show it, until a cycle runs through."""
    with db.try_lock("carousel-cycle") as taken:
        if not taken:
            return CycleReport(skipped=True)
        started = time.monotonic()  # the cycle's wall-clock duration, for the metrics
        control = Control.get()
        report = CycleReport()
        try:
            stager = stager or plugins.stager()
        except PluginError as exc:
            # Options the stager refuses (carousel.E007 says so at start): down, for that reason,
            # until they are fixed; no traceback, the reason is the whole story.
            report.error = f"the stager cannot be built: {exc}"
            state = judge_stager(now=now, seen=h.Observation(reachable=False, error=report.error), control=control)
            report.health, report.jobs_limit = state.state, state.limit
            log.error("%s%s", report.error, " (again)" if report.error == control.last_cycle_error else "")
        else:
            try:
                _steps(now=now, stager=stager, control=control, report=report)
            except (OperationalError, InterfaceError):
                raise  # the database itself is gone: nothing can be recorded; the caller says so once
            except Exception as exc:  # noqa: BLE001 - a bug or a broken plugin: shown, and the next cycle tries
                report.error = f"the cycle stopped: {type(exc).__name__}: {exc}"
                if report.error == control.last_cycle_error:
                    log.error("%s (again)", report.error)  # the traceback was logged the first time
                else:
                    log.exception(report.error)
        Control.objects.filter(id=control.id).update(last_cycle_at=now, last_cycle_error=report.error)
        metrics.record_cycle(time.monotonic() - started)
        return report


def _steps(*, now, stager, control, report):
    # What the steps have to do, asked at once (due.py): a step with nothing to do is not run.
    due = ask(BEFORE, now=now, with_deltas=True)
    # The counters' deltas since the last cycle join their base rows, so reads stay a few rows.
    counters_fold(new=due.deltas)
    # Big submissions whose files still wait in the intake (the task that queues them right
    # after their answer did not run: a worker down) join the queue first.
    # The requests they become were not there to be asked about: the steps they may concern run.
    settled = due["waiting"]
    if settled:
        intake.settle_pending(now=now)
    if due["unindexed"] or settled:
        intake.index_pending()
    # What changes with time alone: deadlines passed, retry times reached.
    if due["expiring"] or settled:
        report.expired = expire_requests(now=now)
    report.requeued = ((requeue_due_retries(now=now) if due["retries"] else 0)
                       + (requeue_orphans(now=now) if due["in_flight"] or settled else 0))
    # What the stager says: progress, and from it the judgement of its health.
    # The stager's health row, read once for both (only judge_stager writes its state).
    health = StagerHealth.get()
    seen = collect_progress(now=now, stager=stager, control=control, report=report,
                            was_down=health.state == h.DOWN)
    state = judge_stager(now=now, seen=seen, control=control, row=health)
    # Jobs past their deadline free their drives' chains before this cycle plans more, whatever
    # the judgement: a job the stager lost is what makes it look stalled, and a stalled stager
    # is sent nothing new, so a deadline that waited for health would never come. A job is given
    # up only once polled after its mark, so not while the stager is down.
    if due["sent"]:
        end_overdue_jobs(now=now, control=control, give_up=state.state != h.DOWN)
    if state.state == h.HEALTHY:
        state = _work(now=now, stager=stager, control=control, state=state, report=report,
                      preempting=due["short_waiting"])
    report.health, report.jobs_limit = state.state, state.limit
    # What the work may have changed, asked at once again.
    due = ask(AFTER, now=now)
    # Taking back and letting go: pins that ran out, then the recorded withdrawals and releases
    # (never while the stager is down, never holding the cycle up), those of the pins just ended
    # among them.
    ended = end_expired_pins(now=now) if due["pins"] else 0
    if due["calls"] or ended:
        report.stager_calls = send_stager_calls(now=now, stager=stager, down=state.state == h.DOWN)
    # Copies to users, and the notices of finished submissions (mailed by their own task: a mail
    # server that hangs never holds the cycle).
    if due["delivering"]:
        report.delivering = dispatch_deliveries(now=now, control=control)
    if due["notices"] and notices_due(now=now):
        queue.send_on_commit("carousel.tasks.send_notices", robust=True)


def _work(*, now, stager, control, state, report, preempting):
    """Locate, choose and send: only while the stager is healthy. A call that finds the
    stager unreachable ends the cycle's work and marks it down; the next cycle probes.
    preempting: whether a short mount waits behind a sent one (due.py), so preempt may cut."""
    try:
        report.located = locate_new_work(now=now, stager=stager, control=control)
        status = stager.status() or {}
        StagerHealth.objects.filter(id=1).update(status=status, status_at=now, disk_free_bytes=status.get(
            "disk_free_bytes"), disk_total_bytes=status.get("disk_total_bytes"))
        budget = disk_budget(status=status, control=control)
        sort, share = sort_policy(control.sort_policy), share_policy(control.share_policy)
        turns = turn_policy()
    except PluginError as exc:
        # An operator's policy name that no longer resolves: submit nothing, say why.
        report.error = f"scheduling stopped: {exc}"
        log.error(report.error)
        return state
    except (OperationalError, InterfaceError):
        raise  # the database is gone, not the stager: run_cycle's caller says so once
    except Exception as exc:  # noqa: BLE001 - judged as the stager down, and said with a traceback
        log_unexpected(exc, "locating or reading the disk buffer")
        return judge_stager(now=now, seen=h.Observation(reachable=False, error=str(exc)), control=control)
    if control.paused:
        return state
    if budget is not None and budget <= 0:
        report.error = f"disk buffer: no room below {control.disk_threshold:.0%} with what is on its way"
    else:
        jobs = claim_jobs(now=now, control=control, sort=sort, share=share, turns=turns, jobs_limit=state.limit,
                          byte_budget=budget, drives=MountPlanner.from_status(status, control))
        report.submitted = sum(len(j.paths) for j in jobs)
        if budget is not None and not jobs:
            report.error = "disk buffer: the next files do not fit below the threshold"
    try:
        report.preempted = preempt(now=now, stager=stager, control=control) if preempting else 0
    except StagerUnavailable as exc:
        return judge_stager(now=now, seen=h.Observation(reachable=False, error=f"cancel: {exc}"), control=control)
    except (OperationalError, InterfaceError):
        raise  # the database is gone: not a refused cut; run_cycle's caller logs the outage once
    except Exception:  # noqa: BLE001 - a cut refused or a bug: the long mount simply runs on
        log.exception("preempting a long mount failed")
    # Jobs committed by this or an interrupted earlier cycle go out now (planned ones once the
    # job before them on their drive's chain is finished).
    error = send_jobs(now=now, stager=stager)
    if error:
        return judge_stager(now=now, seen=h.Observation(reachable=False, error=f"submit: {error}"), control=control)
    return state


def judge_stager(*, now, seen, control, row=None):
    """Record what this cycle saw of the stager and return the judgement (carousel/loop/health.py).
    row: the StagerHealth row, if the caller has just read it."""
    row = row or StagerHealth.get()
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
    stager's status(), which the caller records on the StagerHealth row."""
    free, total = status.get("disk_free_bytes"), status.get("disk_total_bytes")
    if not total or free is None:
        return None
    # What was sent but is not on disk yet will take room there too.
    incoming = files_at_stager().aggregate(b=Sum("bytes"))["b"] or 0
    return int((control.disk_threshold - h.projected_disk_use(free=free, total=total, incoming=incoming)) * total)
