"""Writes of the core domain. Views, tasks and commands call these and hold no logic."""
import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import DateTimeField, Exists, ExpressionWrapper, F, OuterRef, Q, Value

from carousel.infra import db
from carousel.domain import activities, intake
from carousel.domain import selectors
from carousel.domain.exceptions import InvalidSubmission, NotAllowed, QueueCeilingReached
from carousel.models import (
    ACTIVE_STATES, ALLOWED_FROM, IN_FLIGHT_STATES, TERMINAL_STATES, Account, Bulk, BulkItem, Control,
    DestinationLayout, ErrorClass, Intake, Job, JobState, RequestState, RestoreRequest, StagerCall, path_key,
    path_keys,
)
from carousel.domain.paths import PathError, check_destination, check_path, target_collisions, validate_paths

S = RequestState
MAX_LISTED_ERRORS = 1000
# A pin holds disk space: it must end, and within a year (DataCarousel's pins were days).
MIN_PIN_LIFETIME = timedelta(seconds=1)
MAX_PIN_LIFETIME = timedelta(days=365)


def _stamps(to, now):
    """What a move to `to` writes beside the state (field -> value), and the fields it counts up by one."""
    stamps = {"updated_at": now}
    counted = ()
    if to == S.SUBMITTED:
        stamps["submitted_at"] = now
        counted = ("attempts",)
    elif to == S.STAGING:
        stamps["started_at"] = now
    elif to in TERMINAL_STATES:
        stamps["finished_at"] = now
    elif to == S.QUEUED:
        stamps.update(finished_at=None, retry_at=None, job=None, submitted_at=None, started_at=None,
                      staged_path="", delivery_fs="", delivery_started_at=None)
    if to == S.DONE:
        # A pin runs from the moment the copy is there (carousel/domain/pins.py); none without a lifetime.
        stamps.update(error_class=ErrorClass.NONE, last_error="",
                      pin_until=ExpressionWrapper(Value(now) + F("pin_lifetime"), output_field=DateTimeField()))
    return stamps, counted


def request_transition(queryset, to, *, now, **fields):
    """Move the requests of `queryset` to state `to`, guarded: only rows whose current state
    may lead to `to` change, in one UPDATE, so a lost race changes nothing. Returns the count.
    The history row is written by the database trigger on the state column."""
    stamps, counted = _stamps(to, now)
    counts = {name: F(name) + 1 for name in counted}
    return queryset.filter(state__in=ALLOWED_FROM[to]).update(state=to, **stamps, **counts, **fields)


def request_claim(placed, *, now):
    """The claim of a cycle: the queued requests for the files of `placed` (path_key, job id,
    rank in the job) move to SUBMITTED, each taking its file's job and rank, in one UPDATE
    (db.update_joined); another user's queued request for a claimed file rides in the same job.
    Guarded and recorded as request_transition's moves are. Returns the count."""
    stamps, counted = _stamps(S.SUBMITTED, now)
    return db.update_joined(RestoreRequest, placed, on=("path_key",), columns=("job_id", "job_rank"),
                            where={"state": ALLOWED_FROM[S.SUBMITTED]}, assign={"state": S.SUBMITTED, **stamps},
                            increment=counted)


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


def restore_submit(*, user, paths, now, priority=0, destination="", destination_layout=DestinationLayout.PATH,
                   deadline=None, pin_lifetime=None, notify=False, label="", group=None, activity=""):
    """Accept a whole submission or refuse it whole. Paths already active for this user give
    back the existing request; paths another user is already staging join that stage. `group`:
    the share the requests draw on when the submitter names one (a service's token), else the
    account's group. `destination`: a directory each file is delivered under, by its whole path
    or by its name (`destination_layout`); two files delivered to one place are refused.
    `activity`: the name the client gave; the Activity table turns it into the activity the
    requests draw on and a priority (the larger of it and `priority`: carousel/domain/activities.py)."""
    clean, errors = validate_paths(paths, max_count=settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION,
                                   max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
    if errors:
        if errors[0].index < 0:
            raise InvalidSubmission(errors[0].message)
        listed = [e.as_dict() for e in errors[:MAX_LISTED_ERRORS]]
        raise InvalidSubmission(
            f"{len(errors)} of {len(paths)} paths were rejected; nothing was stored. "
            "Fix or remove them and submit again.", errors=listed)
    if not isinstance(activity, str) or len(activity) > 128 or not activity.isprintable():
        raise InvalidSubmission("activity must be a name of at most 128 printable characters, e.g. \"Express\"")
    if destination_layout not in DestinationLayout.values:
        raise InvalidSubmission(f"destination_layout must be one of {', '.join(DestinationLayout.values)}")
    destination = request_options_check(user=user, now=now, priority=priority, deadline=deadline,
                                        pin_lifetime=pin_lifetime, destination=destination)
    _check_targets(paths, clean, destination, destination_layout)
    _check_authorised(user, paths, clean)

    keys = path_keys(clean)  # hex: the keys from the database below are compared by .hex
    with transaction.atomic():
        # One write on a user's active requests at a time (a submission, a cancel), so neither
        # the ceiling check nor the duplicates found below can be raced.
        (account,) = lock_accounts([user.id])
        # The user's earlier submissions still in the intake are queued first, so that this
        # one's duplicates and ceiling are judged against all of them.
        intake.settle_user(user)
        control = Control.get()
        joinable = intake.lock_joinable(keys, user.id)  # before the read below, which then sees them held
        active = list(
            RestoreRequest.objects.filter(db.in_keys("path_key", keys), state__in=ACTIVE_STATES)
            .values_list("id", "user_id", "path_key", "state", "job_id", "job_rank", "submitted_at", "started_at",
                         "size", "tape_id", "position")
        )
        own = {}
        in_flight = {}
        for id_, user_id, key, state, *joined in active:
            if user_id == user.id:
                own[key.hex] = id_
            elif state in IN_FLIGHT_STATES and (joinable is None or id_ in joinable):
                in_flight[key.hex] = (state, *joined)

        # (A submission of new files, the usual big one, skips hashing 100,000 keys twice.)
        new = [(p, k) for p, k in zip(clean, keys) if k not in own] if own else list(zip(clean, keys))
        ceiling = account.queued_ceiling if account.queued_ceiling is not None else control.default_queued_ceiling
        if new:
            active_now = selectors.active_count(user)
            if active_now + len(new) > ceiling:
                raise QueueCeilingReached(
                    f"you have {active_now} active requests and this submission adds {len(new)}; "
                    f"your ceiling is {ceiling}. Wait for some to finish or cancel some, then submit again.")

        group = group or account.group or user.groups.order_by("id").first()
        chosen = activities.resolve(group_id=group.id if group else None, name=activity, now=now)
        priority = max(priority, chosen.priority)
        big = intake.goes_through(len(new))
        bulk = Bulk.objects.create(user=user, created_at=now, files=len(clean), created=len(new), notify=notify,
                                   label=label, pending=len(new) if big else 0, paths_searchable=not big,
                                   priority=priority,
                                   destination=destination or "", destination_layout=destination_layout,
                                   deadline=deadline, pin_lifetime=pin_lifetime,
                                   group=group, activity=(activity or "").strip()[:128],
                                   resolved_activity=chosen.name)
        if big:
            intake.write(bulk, new)
        else:
            intake.queue_new(bulk, new, in_flight, now)
        # Only the files this user had already asked for get a BulkItem naming this submission too.
        if own:
            db.insert_rows(BulkItem, ("bulk_id", "request_id"), ((bulk.id, own[k]) for k in dict.fromkeys(keys)
                                                                 if k in own), ids=False)
    shared = sum(1 for _, k in new if k in in_flight) if in_flight else 0
    return SubmitResult(bulk=bulk, files=len(clean), created=len(new), existing=len(own), shared=shared)


def request_options_check(*, user, now, priority, deadline, pin_lifetime, destination):
    """The options a request carries, checked as a submission checks them, wherever they are set
    (restore_submit; the admin's edit of one request: a pin of 99,999,999 days stopped every
    cycle, a relative destination was reported delivered). Returns the destination as stored;
    raises InvalidSubmission or NotAllowed naming the option."""
    if not isinstance(priority, int) or not 0 <= priority <= 3:
        raise InvalidSubmission("priority must be an integer from 0 to 3")
    if deadline is not None and deadline <= now:
        raise InvalidSubmission("deadline is in the past")
    if pin_lifetime is not None and not (isinstance(pin_lifetime, timedelta)
                                         and MIN_PIN_LIFETIME <= pin_lifetime <= MAX_PIN_LIFETIME):
        raise InvalidSubmission(f"pin_lifetime must be a duration from {MIN_PIN_LIFETIME} to "
                                f"{MAX_PIN_LIFETIME.days} days")
    return _allowed_destination(user, destination or "")


def _allowed_destination(user, destination):
    """The destination as stored: normalised, under a root of the user's, its links inside the
    root resolved (authz.destination_place)."""
    from carousel.domain.authz import destination_place

    destination, message = check_destination(destination, max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
    if message:
        raise InvalidSubmission(f"destination: {message}")
    destination, refused = destination_place(user=user, destination=destination)
    if refused:
        raise NotAllowed(f"destination: {refused}; nothing was stored.")
    return destination


def _first_lines(paths):
    """{normalised path: its first index in the submission as the user gave it}."""
    first_index = {}
    for index, raw in enumerate(paths):
        first_index.setdefault(check_path(raw, max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)[0], index)
    return first_index


def _check_targets(paths, clean, destination, layout):
    """Two files of the submission delivered to one file (files delivered by their name), or one
    delivered where another needs a directory (/x/a and /x/a/b), are refused, listed with their
    lines as the user gave them."""
    collisions = target_collisions(clean, destination=destination, layout=layout)
    if collisions:
        first_index = _first_lines(paths)
        listed = [PathError(first_index.get(e.path, e.index), e.path, e.message).as_dict()
                  for e in collisions[:MAX_LISTED_ERRORS]]
        raise InvalidSubmission(
            f"{len(collisions)} files would be delivered to the same place under {destination[:200]} as another "
            "file of this submission, or where another needs a directory; nothing was stored. Deliver files "
            'that share a name by their whole path (destination_layout "path"), or submit them separately.',
            errors=listed)


def _check_authorised(user, paths, clean):
    """The path authorisation plugin's word on the whole submission; refused paths are listed
    with their lines as the user gave them."""
    from carousel.domain.authz import paths_refused

    refused = paths_refused(user=user, paths=clean, action="restore")
    if refused:
        first_index = _first_lines(paths)
        listed = [PathError(first_index.get(path, index), path, reason).as_dict()
                  for index, path, reason in refused[:MAX_LISTED_ERRORS]]
        raise NotAllowed(f"you may not restore {len(refused)} of the {len(clean)} paths; nothing was stored.",
                         errors=listed)


def lock_accounts(user_ids):
    """Take the account rows of these users, in user order, for the rest of the transaction.
    Every write that decides on a user's active requests takes them first (a submission, a
    cancel), so two such writes of one user are serialised: whichever commits second sees the
    first (a resubmission racing a cancel is either cancelled with it or queued anew, never
    answered as accepted and then lost). Returns the locked accounts, in user order."""
    ids = sorted(set(user_ids))
    # Accounts are made on first use: one INSERT for the missing ones, if any.
    missing = set(ids) - set(Account.objects.filter(user_id__in=ids).values_list("user_id", flat=True))
    if missing:
        Account.objects.bulk_create([Account(user_id=user_id) for user_id in sorted(missing)], ignore_conflicts=True)
    return list(Account.objects.select_for_update().filter(user_id__in=ids).order_by("user_id"))


def wanted_elsewhere(bulk):
    """The requests another submission not cancelled still asks for (as its own or again):
    cancelling `bulk` leaves them, so a resubmission of the same files, or a person's own
    request a service also asked for on their behalf, is not lost."""
    return ((Q(bulk__isnull=False) & Q(bulk__cancelled_at__isnull=True) & ~Q(bulk_id=bulk.pk))
            | Q(Exists(BulkItem.objects.filter(request=OuterRef("pk"), bulk__cancelled_at__isnull=True)
                       .exclude(bulk_id=bulk.pk))))


def bulk_cancel(*, bulk, now, reason="cancelled by the user", allowed=None, whole=True):
    """Cancel a submission: it is marked cancelled, and its active requests that no other
    submission still wants are cancelled. Returns (count, withdrawals) as request_cancel.
    allowed: the requests the caller may cancel (policy.actionable_requests; None: all); whole:
    whether the caller's cancel covers the whole submission (else it is not marked cancelled)."""
    with transaction.atomic():
        lock_accounts([bulk.user_id])
        intake.settle_if_pending(bulk)
        if whole:
            Bulk.objects.filter(pk=bulk.pk).update(cancelled_at=now)
        chosen = selectors.bulk_requests(bulk).exclude(wanted_elsewhere(bulk))
        if allowed is not None:
            chosen = chosen.filter(pk__in=allowed.values("pk"))
        return request_cancel(queryset=chosen, now=now, reason=reason)


def request_cancel_paths(*, requests, bulks, paths, now, reason="cancelled by the user", by=None):
    """Cancel the active requests of `requests` (policy.own_requests of the caller, or
    everyone's) for these paths, files still waiting in the intake included: the submissions
    of `bulks` (the caller's, or everyone's) holding them are queued first, in the same
    transaction, so that those files are cancelled before any cycle can claim them. Returns
    (count, withdrawals, the paths none of `requests` was active for)."""
    clean = []
    for index, raw in enumerate(paths):
        path, message = check_path(raw, max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
        if message:
            raise InvalidSubmission(f"paths[{index}]: {message}")
        clean.append(path)
    keys = [path_key(p) for p in clean]
    with transaction.atomic():
        waiting = (bulks.filter(pending__gt=0, pk__in=Intake.objects.filter(db.in_keys("path_key", keys))
                                .values("bulk_id"))
                   .order_by("created_at").values_list("pk", flat=True))
        for bulk_id in waiting:
            intake.settle(bulk_id, now=now)
        chosen = requests.filter(db.in_keys("path_key", keys))
        found = set(chosen.filter(state__in=ACTIVE_STATES).values_list("path_key", flat=True))
        count, withdraw = request_cancel(queryset=chosen, now=now, reason=reason, by=by)
    return count, withdraw, [p for p, k in zip(clean, keys) if k not in found]


def bulk_requests_to_act_on(bulk):
    """A submission's requests, for a write that acts on all of them (a cancel, a release): its
    files still waiting in the intake are queued first, so that none is left out. Reads use
    selectors.bulk_requests, which never moves anything."""
    intake.settle_if_pending(bulk)
    return selectors.bulk_requests(bulk)


def request_cancel(*, queryset, now, reason="cancelled by the user", to=S.CANCELLED, serialise=True, by=None):
    """Cancel (or, with to=EXPIRED, expire) the active requests of `queryset`. `by`: the user
    who asked; another user's requests among them (an operator's cancel, a service's) say who
    cancelled them instead of `reason`, so their owner is not told they did. Returns (count,
    withdrawals): the (job, path) pairs taken back from the stager, which leaves out any file
    that another user's request still shares. They are recorded as stager calls in the same
    transaction (the loop sends them); a caller may ask for an early send (tasks.withdraw_on_commit).
    serialise: take the owners' accounts first (lock_accounts); the loop's expiry does not, so
    that a cycle never waits behind a user's big submission."""
    with transaction.atomic():
        if serialise:
            lock_accounts(queryset.filter(state__in=ACTIVE_STATES).order_by().values_list("user_id", flat=True)
                          .distinct())
        # Locked first, so the loop cannot claim one of them between the two statements below
        # (it would then be cancelled here but never withdrawn from the stager). In id order, as
        # the loop locks a job's requests when the stager acknowledges it (mounts._acknowledge):
        # two lockers of the same rows in one order wait for each other, never deadlock.
        ids = list(queryset.filter(state__in=ACTIVE_STATES).order_by("id").select_for_update(of=("self",), no_key=True)
                   .values_list("id", flat=True))
        if not ids:
            return 0, []  # nothing active to cancel (the loop's expiry, most cycles)
        locked = RestoreRequest.objects.filter(id__in=ids)
        in_flight = list(
            locked.filter(state__in=IN_FLIGHT_STATES, job__isnull=False).values_list("job_id", "path_key", "path")
        )
        if by is None:
            count = request_transition(locked, to, now=now, last_error=reason)
        else:
            count = request_transition(locked.filter(user_id=by.pk), to, now=now, last_error=reason)
            count += request_transition(locked.exclude(user_id=by.pk), to, now=now,
                                        last_error=f"cancelled by {by.get_username()}")
        withdraw = []
        if in_flight:
            still_wanted = set(
                RestoreRequest.objects.filter(path_key__in=[k for _, k, _ in in_flight], state__in=IN_FLIGHT_STATES)
                .values_list("job_id", "path_key")
            )
            withdraw = [(job, path) for job, key, path in in_flight if (job, key) not in still_wanted]
        stager_call_record(kind=StagerCall.Kind.CANCEL, pairs=withdraw, now=now)
    return count, withdraw


def stager_call_record(*, kind, pairs, now):
    """Record the stager calls for (job id, path) pairs, one per job: sent by the loop until the
    stager confirms (carousel/loop/withdrawals.py). Call it inside the transaction that makes the
    change, so the change and its call are stored together or not at all. A job the stager never
    acknowledged has nothing there to withdraw or release: skipped."""
    by_job = {}
    for job, path in pairs:
        by_job.setdefault(job, []).append(path)
    backend_ids = dict(Job.objects.filter(id__in=list(by_job)).exclude(backend_id="").values_list("id", "backend_id"))
    StagerCall.objects.bulk_create([
        StagerCall(kind=kind, backend_id=backend_ids[job], paths=sorted(set(paths)), created_at=now, next_at=now)
        for job, paths in by_job.items() if job in backend_ids])


def job_give_up(*, queryset, now, reason):
    """Stop waiting for jobs at the stager (past their deadline, or an operator's word): their
    unfinished files go back to the queue with the attempt counted (failed once attempts run
    out), each job fails, and the job planned after it on its drive's chain may go. The files
    are withdrawn from the stager through recorded stager calls. Returns (jobs given up, the
    (job, path) pairs withdrawn)."""
    control = Control.get()
    with transaction.atomic():
        jobs = list(queryset.filter(state__in=(JobState.PENDING, JobState.SENT)).select_for_update()
                    .values_list("id", flat=True))
        files = RestoreRequest.objects.filter(job_id__in=jobs, state__in=IN_FLIGHT_STATES)
        withdraw = sorted(set(files.values_list("job_id", "path")))
        request_transition(files.filter(attempts__lt=control.max_attempts), S.QUEUED, now=now,
                           error_class=ErrorClass.TRANSIENT, last_error=reason)
        request_transition(files, S.FAILED, now=now, error_class=ErrorClass.TRANSIENT,
                           last_error=f"{reason} (gave up after {control.max_attempts} attempts)")
        Job.objects.filter(id__in=jobs).update(state=JobState.FAILED, finished_at=now)
        stager_call_record(kind=StagerCall.Kind.CANCEL, pairs=withdraw, now=now)
    return len(jobs), withdraw


def request_retry_now(*, queryset, now):
    """An operator's "retry now": failed or waiting requests go back to the queue, except where
    the same user already has another active request for the file."""
    duplicate = RestoreRequest.objects.filter(user=OuterRef("user"), path_key=OuterRef("path_key"),
                                              state__in=ACTIVE_STATES).exclude(pk=OuterRef("pk"))
    eligible = queryset.filter(state__in=(S.FAILED, S.RETRY)).exclude(Exists(duplicate))
    return request_transition(eligible, S.QUEUED, now=now, error_class=ErrorClass.NONE, last_error="",
                              locate_attempts=None, locate_after=None)


def tape_lift_quarantine(*, queryset):
    """An operator puts quarantined tapes back in service; their queued requests go out again."""
    return queryset.filter(quarantined_at__isnull=False).update(
        quarantined_at=None, quarantine_reason="", recent_failures=0, failures_since=None)


NOTICES_PER_CALL = 100
# Completion notices are mailed by their own task (carousel.tasks.send_notices, on the delivery
# queue), never inside the cycle: a mail server that hangs (EMAIL_TIMEOUT, 10 s a mail) would
# hold the cycle's lock. A run stops after NOTICE_BUDGET_S; a failed mail stops the run and
# holds notices back for NOTICE_BACKOFF_S, doubled at each failure in a row up to
# NOTICE_BACKOFF_MAX_S, so a dead mail server is asked about once an hour, not every cycle.
NOTICE_BUDGET_S = 60.0
NOTICE_BACKOFF_S, NOTICE_BACKOFF_MAX_S = 60.0, 3600.0
_NOTICE_BACKOFF_KEY = "notices:backoff"


def notices_waiting():
    """Submissions that asked for a notice and have had none, their files all queued."""
    return Bulk.objects.filter(notify=True, notified_at__isnull=True, pending=0)


def _finished_unannounced():
    active = RestoreRequest.objects.filter(bulk=OuterRef("pk"), state__in=ACTIVE_STATES)
    active_again = BulkItem.objects.filter(bulk=OuterRef("pk"), request__state__in=ACTIVE_STATES)
    return notices_waiting().exclude(Exists(active)).exclude(Exists(active_again))


def _notice_backoff():
    """(failures in a row, not before) of the mail server, from the shared cache."""
    return cache.get(_NOTICE_BACKOFF_KEY) or (0, None)


def notices_due(*, now):
    """Whether a finished submission waits for its notice and the mail server is not backed off
    (the cycle's test before it sends the task: one indexed probe)."""
    _, not_before = _notice_backoff()
    if not_before is not None and now < not_before:
        return False
    # The cycle asks only when a submission that asked for a notice has none yet (carousel/loop/due.py
    # asks notices_waiting(): a plain probe, before the finished test, whose two subqueries cost
    # several times as much to build).
    return _finished_unannounced().exists()


def bulk_notify_complete(*, now, budget_s=None):
    """E-mail the owners of finished submissions that asked to be told (notify): finished
    means none of the submission's requests is active any more. Each submission is claimed
    (notified_at set) before its mail goes out, so two senders never send it twice; a mail that
    could not be sent is unclaimed, ends the run and backs the notices off (above). Returns the
    mails sent."""
    from django.core.mail import send_mail

    failures, not_before = _notice_backoff()
    if not_before is not None and now < not_before:
        return 0
    stop_at = time.monotonic() + (NOTICE_BUDGET_S if budget_s is None else budget_s)
    sent = 0
    for bulk in _finished_unannounced().select_related("user").order_by("created_at")[:NOTICES_PER_CALL]:
        if time.monotonic() > stop_at:
            break  # the rest at the next run
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
        except Exception as exc:  # noqa: BLE001 - any mail failure: unclaim, back off, try again later
            Bulk.objects.filter(pk=bulk.pk).update(notified_at=None)
            wait = min(NOTICE_BACKOFF_MAX_S, NOTICE_BACKOFF_S * 2 ** failures)
            cache.set(_NOTICE_BACKOFF_KEY, (failures + 1, now + timedelta(seconds=wait)), timeout=int(wait) + 60)
            logging.getLogger("carousel.notice").warning(
                "notice for submission %s not sent (%s); notices wait %.0f s", bulk.id, exc, wait)
            return sent
        sent += 1
    if failures:
        cache.delete(_NOTICE_BACKOFF_KEY)
    return sent
