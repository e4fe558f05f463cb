"""Writes of the core domain. Views, tasks and commands call these and hold no logic."""
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef

from . import db
from .exceptions import InvalidSubmission, QueueCeilingReached
from .models import (
    ACTIVE_STATES, ALLOWED_FROM, IN_FLIGHT_STATES, TERMINAL_STATES, Account, Bulk, BulkItem, Control,
    ErrorClass, RequestState, RestoreRequest, path_key,
)
from .paths import validate_paths

S = RequestState
MAX_LISTED_ERRORS = 1000


def request_transition(queryset, to, *, now, **fields):
    """Move the requests of `queryset` to state `to`, guarded: only rows whose current state
    may lead to `to` change, in one UPDATE, so a lost race changes nothing. Returns the count.
    The history row is written by the database trigger on the state column."""
    stamps = {"updated_at": now}
    if to == S.SUBMITTED:
        stamps.update(submitted_at=now, attempts=F("attempts") + 1)
    elif to == S.STAGING:
        stamps["started_at"] = now
    elif to in TERMINAL_STATES:
        stamps["finished_at"] = now
    elif to == S.QUEUED:
        stamps.update(finished_at=None, retry_at=None, job=None, submitted_at=None, started_at=None,
                      staged_path="", delivery_fs="", delivery_started_at=None)
    if to == S.DONE:
        stamps.update(error_class=ErrorClass.NONE, last_error="")
    return queryset.filter(state__in=ALLOWED_FROM[to]).update(state=to, **stamps, **fields)


def account_for(user):
    account, _ = Account.objects.get_or_create(user=user)
    return account


@dataclass(frozen=True)
class SubmitResult:
    bulk: Bulk
    files: int  # distinct paths in the submission
    created: int  # new requests, queued
    existing: int  # this user's requests already active, returned as they are
    shared: int  # new requests that joined another user's stage already in flight


def restore_submit(*, user, paths, now, priority=0, destination="", deadline=None, pin_lifetime=None,
                   notify=False, group=None):
    """Accept a whole submission or refuse it whole. Paths already active for this user give
    back the existing request; paths another user is already staging join that stage. `group`:
    the share the requests draw on when the submitter names one (a service's token), else the
    account's group."""
    clean, errors = validate_paths(paths, max_count=settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION,
                                   max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
    if errors:
        if errors[0].index < 0:
            raise InvalidSubmission(errors[0].message)
        listed = [e.as_dict() for e in errors[:MAX_LISTED_ERRORS]]
        raise InvalidSubmission(
            f"{len(errors)} of {len(paths)} paths were rejected; nothing was stored. "
            "Fix or remove them and submit again.", errors=listed)
    if not isinstance(priority, int) or not 0 <= priority <= 3:
        raise InvalidSubmission("priority must be an integer from 0 to 3")
    if deadline is not None and deadline <= now:
        raise InvalidSubmission("deadline is in the past")

    keys = [path_key(p) for p in clean]
    with transaction.atomic():
        # One submission per user at a time, so the ceiling check cannot be raced.
        Account.objects.get_or_create(user=user)
        account = Account.objects.select_for_update().get(user=user)
        control = Control.get()
        active = list(
            RestoreRequest.objects.filter(db.in_keys("path_key", keys), state__in=ACTIVE_STATES)
            .values_list("id", "user_id", "path_key", "state", "job_id", "job_rank", "submitted_at", "started_at")
        )
        own = {}
        in_flight = {}
        for id_, user_id, key, state, job_id, job_rank, submitted_at, started_at in active:
            if user_id == user.id:
                own[key] = id_
            elif state in IN_FLIGHT_STATES:
                in_flight[key] = (state, job_id, job_rank, submitted_at, started_at)

        new = [(p, k) for p, k in zip(clean, keys) if k not in own]
        ceiling = account.queued_ceiling if account.queued_ceiling is not None else control.default_queued_ceiling
        if new:
            active_now = RestoreRequest.objects.filter(user=user, state__in=ACTIVE_STATES).count()
            if active_now + len(new) > ceiling:
                raise QueueCeilingReached(
                    f"you have {active_now} active requests and this submission adds {len(new)}; "
                    f"your ceiling is {ceiling}. Wait for some to finish or cancel some, then submit again.")

        group = group or account.group or user.groups.order_by("id").first()
        bulk = Bulk.objects.create(user=user, created_at=now, files=len(clean), created=len(new), notify=notify)
        columns = ("user_id", "group_id", "path", "path_key", "priority", "destination", "deadline",
                   "pin_lifetime", "state", "attempts", "error_class", "last_error", "job_id", "job_rank",
                   "created_at", "updated_at", "submitted_at", "started_at")
        common = (priority, destination or "", deadline, pin_lifetime)

        def row(path, key):
            shared = in_flight.get(key)
            if shared:
                state, job_id, job_rank, submitted_at, started_at = shared
                return (user.id, group and group.id, path, key, *common, state, 0, "", "", job_id, job_rank,
                        now, now, submitted_at, started_at)
            return (user.id, group and group.id, path, key, *common, S.QUEUED, 0, "", "", None, 0,
                    now, now, None, None)

        new_ids = db.insert_rows(RestoreRequest, columns, (row(p, k) for p, k in new))
        ids_by_key = dict(own)
        ids_by_key.update(zip((k for _, k in new), new_ids))
        db.insert_rows(BulkItem, ("bulk_id", "request_id"), ((bulk.id, ids_by_key[k]) for k in keys), ids=False)
    shared = sum(1 for _, k in new if k in in_flight)
    return SubmitResult(bulk=bulk, files=len(clean), created=len(new), existing=len(own), shared=shared)


def request_cancel(*, queryset, now, reason="cancelled by the user", to=S.CANCELLED):
    """Cancel (or, with to=EXPIRED, expire) the active requests of `queryset`. Returns (count,
    withdrawals): the (job, path) pairs to take back from the stager, which leaves out any
    file that another user's request still shares."""
    with transaction.atomic():
        # Locked first, so the loop cannot claim one of them between the two statements below
        # (it would then be cancelled here but never withdrawn from the stager).
        ids = list(queryset.filter(state__in=ACTIVE_STATES).select_for_update(of=("self",))
                   .values_list("id", flat=True))
        locked = RestoreRequest.objects.filter(id__in=ids)
        in_flight = list(
            locked.filter(state__in=IN_FLIGHT_STATES, job__isnull=False).values_list("job_id", "path_key", "path")
        )
        count = request_transition(locked, to, now=now, last_error=reason)
        withdraw = []
        if in_flight:
            still_wanted = set(
                RestoreRequest.objects.filter(path_key__in=[k for _, k, _ in in_flight], state__in=IN_FLIGHT_STATES)
                .values_list("job_id", "path_key")
            )
            withdraw = [(job, path) for job, key, path in in_flight if (job, key) not in still_wanted]
    return count, withdraw


def request_retry_now(*, queryset, now):
    """An operator's "retry now": failed or waiting requests go back to the queue, except where
    the same user already has another active request for the file."""
    duplicate = RestoreRequest.objects.filter(user=OuterRef("user"), path_key=OuterRef("path_key"),
                                              state__in=ACTIVE_STATES).exclude(pk=OuterRef("pk"))
    eligible = queryset.filter(state__in=(S.FAILED, S.RETRY)).exclude(Exists(duplicate))
    return request_transition(eligible, S.QUEUED, now=now, error_class=ErrorClass.NONE, last_error="")


def tape_lift_quarantine(*, queryset):
    """An operator puts quarantined tapes back in service; their queued requests go out again."""
    return queryset.filter(quarantined_at__isnull=False).update(
        quarantined_at=None, quarantine_reason="", recent_failures=0, failures_since=None)


NOTICES_PER_CALL = 100


def bulk_notify_complete(*, now):
    """E-mail the owners of finished submissions that asked to be told (notify): finished
    means none of the submission's requests is active any more. Each submission is claimed
    (notified_at set) before its mail goes out, so two loops never send it twice; a mail that
    could not be sent is unclaimed and tried again at the next call. Returns the mails sent."""
    from django.core.mail import send_mail

    from . import selectors

    active = BulkItem.objects.filter(bulk=OuterRef("pk"), request__state__in=ACTIVE_STATES)
    finished = Bulk.objects.filter(notify=True, notified_at__isnull=True).exclude(Exists(active))
    sent = 0
    for bulk in finished.select_related("user").order_by("created_at")[:NOTICES_PER_CALL]:
        if not Bulk.objects.filter(pk=bulk.pk, notified_at__isnull=True).update(notified_at=now):
            continue  # another process took it
        if not bulk.user.email:
            continue  # nobody to tell; claimed all the same, so it is not looked at again
        counts = {state: n for state, n in selectors.state_counts(selectors.bulk_requests(bulk)).items() if n}
        link = f"{getattr(settings, 'CAROUSEL_SITE_URL', '').rstrip('/')}/?bulk={bulk.id}"
        body = (f"Your restore request of {bulk.files} file(s), submitted {bulk.created_at:%Y-%m-%d %H:%M} UTC, "
                "is complete:\n\n" + "".join(f"  {state}: {n}\n" for state, n in counts.items())
                + f"\nThe requests: {link}\nSubmission id: {bulk.id}\n")
        try:
            send_mail(f"Carousel: your restore of {bulk.files} file(s) is complete", body, None, [bulk.user.email])
        except Exception as exc:  # noqa: BLE001 - any mail failure: unclaim, try again next time
            Bulk.objects.filter(pk=bulk.pk).update(notified_at=None)
            logging.getLogger("carousel.notice").warning("notice for submission %s not sent: %s", bulk.id, exc)
            continue
        sent += 1
    return sent
