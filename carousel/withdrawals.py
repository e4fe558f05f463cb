"""Taking files back from the stager: a user's cancel (through the control queue) and the
loop's expiry of requests whose deadline passed."""
import logging
from itertools import groupby

from .models import ACTIVE_STATES, Job, RequestState as S, RestoreRequest
from .services import request_cancel

log = logging.getLogger("carousel.loop")


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
