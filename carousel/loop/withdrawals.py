"""Taking files back from the stager and releasing staged copies, through the stager calls
recorded with the change that needs them (models.StagerCall): a user's cancel, the loop's
expiry of requests whose deadline passed, a job given up, a pin's end (carousel/domain/pins.py).

The loop sends them each cycle, after its own work and never while the stager is down: at
most CALLS_PER_CYCLE, and it waits at most CALLS_BUDGET_S for them, so a slow stager cannot
hold the cycle up. One send at a time per process: while the stager is still busy with a call
of an earlier send, a later one sends nothing, and the calls that send did not reach wait
RETRY_S[0] (not counted as an attempt). A call the stager fails is tried again later, backing
off, until it is confirmed. A user's cancel also asks the control queue to send at once (tasks.withdraw)."""
import logging
import threading
from datetime import timedelta

from django.db import transaction

from carousel.loop import health as h
from carousel.models import ACTIVE_STATES, RequestState as S, RestoreRequest, StagerCall, StagerHealth, path_key
from carousel.domain import pins
from carousel.domain.services import request_cancel
from carousel.stagers.base import StagerUnavailable

log = logging.getLogger("carousel.loop")

CALLS_PER_CYCLE = 50
CALLS_BUDGET_S = 5.0
LEASE_S = 300.0  # a call being sent is not picked up by another sender meanwhile
RETRY_S = (10.0, 3600.0)  # the first retry's delay, doubled per failure up to the second


def expiring(now):
    """The active requests whose deadline has passed."""
    return RestoreRequest.objects.filter(deadline__lt=now, state__in=ACTIVE_STATES)


def calls_due(now):
    """The stager calls due to be sent."""
    return StagerCall.objects.filter(next_at__lte=now)


def expire_requests(*, now):
    """Requests whose deadline passed: expired, and their files withdrawn through stager calls."""
    count, _ = request_cancel(
        queryset=expiring(now), now=now,
        reason="deadline passed before the file was restored", to=S.EXPIRED, serialise=False)
    return count


# One sender at a time in a process: a cycle or a withdraw task that finds the previous send
# still waiting on the stager sends nothing, so a slow stager never gets the same call twice at
# once, nor a growing number of threads.
_sending = threading.Lock()


def _unwanted_only(calls, *, now):
    """The calls to send, a release without the paths a request wants again since it was
    recorded (pins.wanted_keys: the stager would free the copy that request now relies on);
    a release left with none is done. Withdrawals go as they are."""
    releases = [c for c in calls if c.kind == StagerCall.Kind.RELEASE]
    if not releases:
        return calls
    wanted = pins.wanted_keys({path_key(p) for c in releases for p in c.paths}, now=now)
    if not wanted:
        return calls
    kept, done = [], []
    for call in calls:
        if call.kind == StagerCall.Kind.RELEASE:
            paths = [p for p in call.paths if path_key(p) not in wanted]
            if not paths:
                done.append(call.id)
                continue
            if len(paths) < len(call.paths):
                call.paths = paths
                StagerCall.objects.filter(id=call.id).update(paths=paths)
        kept.append(call)
    StagerCall.objects.filter(id__in=done).delete()
    if done:
        log.info("%d release(s) not sent: their files are wanted again", len(done))
    return kept


def send_stager_calls(*, now, stager, limit=CALLS_PER_CYCLE, budget_s=CALLS_BUDGET_S, down=None):
    """Send the stager calls that are due, oldest first. Returns how many it confirmed.
    down: whether the stager is judged down (the cycle has just judged it; else read here)."""
    if down is None:
        down = StagerHealth.get().state == h.DOWN
    if down:
        return 0  # the loop's probe says when it is back; until then the calls wait
    if not _sending.acquire(blocking=False):
        return 0  # the previous send is still waiting on the stager; its calls stay leased
    try:
        with transaction.atomic():
            calls = list(calls_due(now).order_by("next_at", "id")
                         .select_for_update(skip_locked=True)[:limit])
            StagerCall.objects.filter(id__in=[c.id for c in calls]).update(next_at=now + timedelta(seconds=LEASE_S))
        # Inside the try: a database error here must not leave this process's sender taken.
        calls = _unwanted_only(calls, now=now)
    except BaseException:
        _sending.release()
        raise
    if not calls:
        _sending.release()
        return 0
    outcome = {}  # call id -> "" (confirmed) or the error
    begun = set()  # calls handed to the stager
    turn = threading.Lock()  # a call is begun, or the wait is over: never both unseen
    over = threading.Event()

    def send():
        # No database here: this thread may outlive the wait below, and then only its answers are lost
        # (the call it is in is sent again once its lease ends; withdrawing or releasing twice is harmless).
        try:
            for call in calls:
                with turn:
                    if over.is_set():
                        return  # past the wait: the calls not begun are the next send's
                    begun.add(call.id)
                try:
                    getattr(stager, call.kind)(call.backend_id, call.paths)
                    outcome[call.id] = ""
                except Exception as exc:  # noqa: BLE001 - any failure: kept, tried again
                    outcome[call.id] = f"{type(exc).__name__}: {exc}"
                    if isinstance(exc, StagerUnavailable):
                        return
        finally:
            _sending.release()

    sender = threading.Thread(target=send, name="stager-calls", daemon=True)
    sender.start()
    sender.join(budget_s)
    with turn:
        over.set()
        begun = set(begun)
    outcome = dict(outcome)
    confirmed = [i for i, error in outcome.items() if not error]
    StagerCall.objects.filter(id__in=confirmed).delete()
    not_reached = []
    for call in calls:
        if outcome.get(call.id):
            delay = min(RETRY_S[0] * 2 ** min(call.attempts, 12), RETRY_S[1])
            StagerCall.objects.filter(id=call.id).update(attempts=call.attempts + 1, last_error=outcome[call.id],
                                                         next_at=now + timedelta(seconds=delay))
            log.warning("stager call %s failed (attempt %d): %s", call, call.attempts + 1, outcome[call.id])
        elif call.id not in begun:
            not_reached.append(call.id)
        # A call begun and not answered is still with the stager: it keeps its lease.
    # Not reached (the stager was slow or down): not tried, so no attempt counted, but not due
    # again at once either, while the stager is still busy with the call before them.
    StagerCall.objects.filter(id__in=not_reached).update(next_at=now + timedelta(seconds=RETRY_S[0]))
    return len(confirmed)
