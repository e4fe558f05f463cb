"""Jobs that never finish: a job still at the stager past its deadline (the larger of
Control.job_deadline_floor_s and its estimate times Control.job_deadline_factor) is marked
overdue; the stager is polled once more at the next cycle, and a job still unfinished after
that is given up (services.job_give_up): its files go back to the queue and are withdrawn, so
a lost stage request cannot block its drive's chain, nor, by making the stager look stalled,
every user's restores. A job on a chain (the mount plan) is read with the others of its
drive's mount (a mount over N files is sent as parts, read one after another): its deadline
runs from the mount's last sign of life, so no part is given up while the drive reads its
siblings. A job sent without a plan (every tape-rest job) waits in the stager's own queue
behind others, so its deadline runs from its own last sign of life (sent, or a file of it
moving): a long queue that moves is not given up, a lost request is. The step runs every
cycle, whatever the stager's health; while the stager is down jobs are only marked (they cannot
be polled once more), and a job sent without a plan that shows life after its mark (the first
answer after an outage counts as one) is unmarked. The open jobs number at most K: they are
read into Python."""
import logging
from datetime import timedelta

from carousel.models import Job, JobState
from carousel.domain.services import job_give_up

log = logging.getLogger("carousel.loop")


def sent():
    """The jobs at the stager."""
    return Job.objects.filter(state=JobState.SENT)


def chains_last_moved(jobs):
    """{chain: the last sign of life of its mount}: the latest progress of the jobs sent on the
    chain since its oldest one still at the stager (their files moving, or the job ending). The
    jobs a chain has at the stager are its drive's mount, read one after another (a mount over N
    files is sent as parts), so a part waits while its siblings are read: none is stuck while
    the drive reads any of them. Reads the jobs sent since then on these chains (job_sent_at)."""
    oldest = {}
    for _, chain, sent_at, *_ in jobs:
        if chain and sent_at and (chain not in oldest or sent_at < oldest[chain]):
            oldest[chain] = sent_at
    if not oldest:
        return {}
    moved = {}
    for chain, sent_at, progress_at in (Job.objects.filter(chain__in=list(oldest), sent_at__gte=min(oldest.values()))
                                        .values_list("chain", "sent_at", "progress_at")):
        if sent_at >= oldest[chain] and progress_at and (chain not in moved or progress_at > moved[chain]):
            moved[chain] = progress_at
    return moved


def end_overdue_jobs(*, now, control, give_up=True):
    """Mark the jobs past their deadline; give up those marked at an earlier cycle (polled once
    more since; give_up=False: the stager could not be polled, mark only); their files are
    withdrawn through stager calls. Returns the jobs given up."""
    sent_jobs = sent()
    columns = ("id", "chain", "sent_at", "progress_at", "estimate_s", "overdue_at")
    # The jobs in flight, read once; again only after some were given up (which may move others).
    jobs = list(sent_jobs.values_list(*columns))
    # A job sent without a plan that showed life after its mark (a file moved, or the first
    # answer after an outage, which counts as one) is not overdue any more: its deadline runs
    # again from then. Marked while the stager was down, it was given up at the first answer.
    revived = [row[0] for row in jobs if row[5] is not None and not row[1] and row[3] and row[3] > row[5]]
    if revived:
        Job.objects.filter(id__in=revived).update(overdue_at=None)
        jobs = [(*row[:5], None) if row[0] in revived else row for row in jobs]
    marked = [row[0] for row in jobs if row[5] is not None and row[5] < now] if give_up else []
    n = 0
    if marked:
        n, _ = job_give_up(queryset=Job.objects.filter(id__in=marked), now=now,
                           reason="its job was still unfinished at the stager past its deadline")
        log.warning("%d job(s) past their deadline given up: their unfinished files are back in the queue", n)
        jobs = list(sent_jobs.filter(overdue_at__isnull=True).values_list(*columns))
    moved = chains_last_moved(jobs)
    due = [job_id for job_id, chain, sent_at, progress_at, estimate, overdue in jobs
           if overdue is None and sent_at
           and now > max(sent_at, moved.get(chain) if chain else progress_at or sent_at)
           + timedelta(seconds=max(control.job_deadline_floor_s, control.job_deadline_factor * (estimate or 0)))]
    if due:
        Job.objects.filter(id__in=due).update(overdue_at=now)
    return n
