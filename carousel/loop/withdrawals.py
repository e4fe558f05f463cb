"""Taking files back from the stager and releasing staged copies, through the stager calls
recorded with the change that needs them (models.StagerCall): a user's cancel, the loop's
expiry of requests whose deadline passed, a job given up, a pin's end (carousel/domain/pins.py).

The loop sends them each cycle, after its own work and never while the stager is down: at
most CALLS_PER_CYCLE, and it waits at most CALLS_BUDGET_S for them, so a slow stager cannot
hold the cycle up. A call the stager fails is tried again later, backing off, until it is
confirmed. A user's cancel also asks the control queue to send at once (tasks.withdraw)."""
import logging
import threading
from datetime import timedelta

from django.db import transaction

from carousel.loop import health as h
from carousel.models import ACTIVE_STATES, RequestState as S, RestoreRequest, StagerCall, StagerHealth
from carousel.domain.services import request_cancel
from carousel.stagers.base import StagerUnavailable

log = logging.getLogger("carousel.loop")

CALLS_PER_CYCLE = 50
CALLS_BUDGET_S = 5.0
LEASE_S = 300.0  # a call being sent is not picked up by another sender meanwhile
RETRY_S = (10.0, 3600.0)  # the first retry's delay, doubled per failure up to the second


def expire_requests(*, now):
    """Requests whose deadline passed: expired, and their files withdrawn through stager calls."""
    count, _ = request_cancel(
        queryset=RestoreRequest.objects.filter(deadline__lt=now, state__in=ACTIVE_STATES), now=now,
        reason="deadline passed before the file was restored", to=S.EXPIRED, serialise=False)
    return count


def send_stager_calls(*, now, stager, limit=CALLS_PER_CYCLE, budget_s=CALLS_BUDGET_S):
    """Send the stager calls that are due, oldest first. Returns how many it confirmed."""
    if StagerHealth.get().state == h.DOWN:
        return 0  # the loop's probe says when it is back; until then the calls wait
    with transaction.atomic():
        calls = list(StagerCall.objects.filter(next_at__lte=now).order_by("next_at", "id")
                     .select_for_update(skip_locked=True)[:limit])
        StagerCall.objects.filter(id__in=[c.id for c in calls]).update(next_at=now + timedelta(seconds=LEASE_S))
    if not calls:
        return 0
    outcome = {}  # call id -> "" (confirmed) or the error

    def send():
        # No database here: this thread may outlive the wait below, and then only its answers are lost
        # (the calls are sent again once their lease ends; withdrawing or releasing twice is harmless).
        for call in calls:
            try:
                getattr(stager, call.kind)(call.backend_id, call.paths)
                outcome[call.id] = ""
            except Exception as exc:  # noqa: BLE001 - any failure: kept, tried again
                outcome[call.id] = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, StagerUnavailable):
                    break

    sender = threading.Thread(target=send, name="stager-calls", daemon=True)
    sender.start()
    sender.join(budget_s)
    outcome = dict(outcome)
    confirmed = [i for i, error in outcome.items() if not error]
    StagerCall.objects.filter(id__in=confirmed).delete()
    for call in calls:
        if outcome.get(call.id):
            delay = min(RETRY_S[0] * 2 ** min(call.attempts, 12), RETRY_S[1])
            StagerCall.objects.filter(id=call.id).update(attempts=call.attempts + 1, last_error=outcome[call.id],
                                                         next_at=now + timedelta(seconds=delay))
            log.warning("stager call %s failed (attempt %d): %s", call, call.attempts + 1, outcome[call.id])
        elif call.id not in outcome:  # not reached: the stager was slow or down; next cycle
            StagerCall.objects.filter(id=call.id).update(next_at=now)
    return len(confirmed)
