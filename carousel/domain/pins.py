"""Pins: a restored copy stays on the stager's disk for the request's pin_lifetime (the native
API's `pin_lifetime`, the Tape REST door's diskLifetime). The pin runs from the moment the file
is done (RestoreRequest.pin_until); when it runs out (the loop's end_expired_pins) or its user
releases it (release_pins), the broker asks the stager to release() the copy, through a
recorded stager call (carousel/loop/withdrawals.py), unless another request still wants the file:
one active, or done with a pin still running. A request without a pin_lifetime holds no pin:
the stager keeps or drops the copy by its own rules. A request served from another's pinned
copy (carousel/domain/ondisk.py), or done by another job's stage (loop/progress.py), names that
copy's job (copy_job) and holds a pin of its own: whichever pin ends last releases the copy."""

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce

from carousel.infra import db
from carousel.models import ACTIVE_STATES, RequestState as S, RestoreRequest, StagerCall, path_keys
from carousel.domain.services import stager_call_record

PINS_ENDED_PER_CYCLE = 10_000


def release_pins(*, user=None, paths, now, requests=None):
    """End the pins on these paths now of `requests` (policy.own_requests of the caller: a
    service account's include those it made for a person), or else of `user`'s requests.
    Returns the pins ended (0 for paths not pinned)."""
    requests = RestoreRequest.objects.filter(user=user) if requests is None else requests
    # By key (db.in_keys: one array parameter), as a cancel by paths looks them up: a list of
    # 100,000 paths as an IN list is 100,000 placeholders to compile and parse.
    return _end_pins(requests.filter(db.in_keys("path_key", path_keys(paths))), now=now)


def ran_out(now):
    """The requests whose pin has run out (and not yet ended)."""
    return RestoreRequest.objects.filter(pin_until__lte=now)


def end_expired_pins(*, now):
    """The loop's step: end the pins whose lifetime ran out (a bounded number per cycle)."""
    due = list(ran_out(now).order_by("pin_until")
               .values_list("id", flat=True)[:PINS_ENDED_PER_CYCLE])
    if not due:
        return 0  # most cycles: one indexed look (request_pin_due), no transaction
    return _end_pins(RestoreRequest.objects.filter(id__in=due), now=now)


def wanted_keys(keys, *, now):
    """The path keys of `keys` whose copy a request still wants: one active, or done with a pin
    still running. A release is recorded only for the others, and sent only for those still not
    wanted when it goes (the loop's send, carousel/loop/withdrawals.py): a release delayed by
    an outage must not free a copy that a request made since has pinned again."""
    return set(RestoreRequest.objects.filter(Q(state__in=ACTIVE_STATES) | Q(state=S.DONE, pin_until__gt=now),
                                             path_key__in=list(keys)).values_list("path_key", flat=True))


def _end_pins(queryset, *, now):
    with transaction.atomic():
        # In id order, as a submission served from a pinned copy locks it (domain/ondisk.py): no deadlock.
        ended = list(queryset.filter(state=S.DONE, pin_until__isnull=False).order_by("id")
                     .select_for_update(of=("self",), no_key=True).values_list("id", "path_key", "path", Coalesce("copy_job", "job_id")))
        if not ended:
            return 0
        RestoreRequest.objects.filter(id__in=[i for i, *_ in ended]).update(pin_until=None)
        still_wanted = wanted_keys({k for _, k, _, _ in ended}, now=now)
        released = {}
        for _, key, path, job in ended:
            if key not in still_wanted and job is not None:
                released[key] = (job, path)
        stager_call_record(kind=StagerCall.Kind.RELEASE, pairs=list(released.values()), now=now)
    return len(ended)
