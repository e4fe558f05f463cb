"""Jobs that never finish: a job still at the stager past its deadline (the larger of
Control.job_deadline_floor_s and its estimate times Control.job_deadline_factor, from when it
was sent) is marked overdue; the stager is polled once more at the next cycle, and a job still
unfinished after that is given up (services.job_give_up), so it cannot block its drive's chain
for ever. Only jobs on a chain (the mount plan) have a deadline: alone on their drive, their
estimate means something, and the job after them waits for them. Jobs sent without a plan wait
in the stager's own queue for as long as it takes, block no chain, and a stager that moves
none of them is judged stalled. The open jobs number at most K: they are read into Python."""
import logging
from datetime import timedelta

from carousel.models import Job, JobState
from carousel.domain.services import job_give_up

log = logging.getLogger("carousel.loop")


def end_overdue_jobs(*, now, control):
    """Mark the jobs past their deadline; give up those marked at an earlier cycle (polled once
    more since); their files are withdrawn through stager calls. Returns the jobs given up."""
    sent = Job.objects.filter(state=JobState.SENT).exclude(chain="")
    marked = list(sent.filter(overdue_at__lt=now).values_list("id", flat=True))
    n = 0
    if marked:
        n, _ = job_give_up(queryset=Job.objects.filter(id__in=marked), now=now,
                           reason="its job was still unfinished at the stager past its deadline")
        log.warning("%d job(s) past their deadline given up: their unfinished files are back in the queue", n)
    due = [job_id for job_id, sent_at, estimate in sent.filter(overdue_at__isnull=True)
           .values_list("id", "sent_at", "estimate_s")
           if sent_at and now > sent_at + timedelta(seconds=max(control.job_deadline_floor_s,
                                                                 control.job_deadline_factor * estimate))]
    if due:
        Job.objects.filter(id__in=due).update(overdue_at=now)
    return n
