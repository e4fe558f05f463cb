"""The grid door's services and selectors: stage requests of the WLCG Tape REST API v1 mapped
onto what Carousel already is (a stage request is a submission, each file a restore request),
and service accounts that submit for other users. The views in api/tape_rest/ only parse and
render; the words of every refusal are written here."""
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import connections, transaction

from carousel.infra import db
from carousel.domain import policy
from carousel.domain import selectors
from carousel.domain import services
from carousel.domain.exceptions import CarouselError, InvalidSubmission, NotAllowed
from carousel.models import (
    ACTIVE_STATES, Bulk, BulkItem, ErrorClass, FileLocation, Intake, RequestState, RestoreRequest, WantedLocation,
    path_key,
)
from carousel.domain.paths import check_path

S = RequestState
log = logging.getLogger(__name__)

# Carousel's states as the Tape REST API names them. Handed to the stager (in a job), staging,
# waiting to retry after a transient failure, or being delivered: the tape side has started.
TAPE_REST_STATE = {
    S.QUEUED: "SUBMITTED",
    S.SUBMITTED: "STARTED",
    S.STAGING: "STARTED",
    S.RETRY: "STARTED",
    S.DELIVERING: "STARTED",
    S.DONE: "COMPLETED",
    S.FAILED: "FAILED",
    S.CANCELLED: "CANCELLED",
    S.EXPIRED: "FAILED",
}
TERMINAL_TAPE_STATES = {"COMPLETED", "FAILED", "CANCELLED"}


class TooLarge(CarouselError):
    status = 413
    code = "too_many_files"


class TooManyRequests(CarouselError):
    status = 429
    code = "too_many_requests"


def _seconds(moment):
    return int(moment.timestamp()) if moment else None


# --- service accounts --------------------------------------------------------------------------

def acting_user(*, user, on_behalf_of):
    """The user a submission is for: the caller, or the one a service account names."""
    if not on_behalf_of:
        return user
    if not selectors.acts_for_others(user, cached=False):
        raise NotAllowed(f"{user.username} is not a service account: only accounts an operator marks as acting "
                           "for others may submit on_behalf_of another user")
    target = get_user_model().objects.filter(username=on_behalf_of, is_active=True).first()
    if target is None:
        raise InvalidSubmission(f"on_behalf_of: no active user named {on_behalf_of!r}")
    return target


@transaction.atomic
def submission_create(*, submitter, on_behalf_of=None, paths, now, group=None, metadata=None, activity="",
                      **options):
    """A submission through either door: restore_submit for the user it is for, remembering the
    service account that sent it and what the grid said of it (one transaction)."""
    user = acting_user(user=submitter, on_behalf_of=on_behalf_of)
    result = services.restore_submit(user=user, paths=paths, now=now, group=group, activity=activity,
                                     **options)
    extra = {}
    if user.pk != submitter.pk:
        extra["submitter"] = submitter
    if metadata:
        extra["metadata"] = metadata
    if extra:
        Bulk.objects.filter(pk=result.bulk.pk).update(**extra)
    return result


# --- stage requests ----------------------------------------------------------------------------

def stage_requests_of(who):
    """The stage requests a caller may poll and act on (policy.stage_requests)."""
    return policy.stage_requests(who)


def unfinished_stage_requests(user, limit):
    """How many of the user's submissions still have active files, counted up to `limit`.
    Read from the user's active requests (the request_user_state_age index) and the submissions
    still in the intake, never from the user's past submissions: its cost does not grow with
    history (asking each past submission whether it had an active file took 17 s at 149)."""
    active = RestoreRequest.objects.filter(user=user, state__in=ACTIVE_STATES)
    created = active.filter(bulk__user=user).values_list("bulk_id", flat=True)
    asked_again = BulkItem.objects.filter(request__in=active.values("id"), bulk__user=user).values_list(
        "bulk_id", flat=True)
    waiting = Bulk.objects.filter(user=user, pending__gt=0).values_list("pk", flat=True)
    return len(created.union(asked_again, waiting)[:limit])


@dataclass(frozen=True)
class StageFiles:
    paths: list  # as sent, in order (the service normalises and collapses them)
    pin_lifetime: timedelta | None
    metadata: dict  # targetedMetadata kept: Rucio's "default" and this site's key
    activity: str
    on_behalf_of: str


def stage_submit(*, user, files: StageFiles, now, group=None):
    """POST stage: one submission for the files; N files mean the same as N stages of one."""
    limit = settings.CAROUSEL_TAPE_REST_MAX_FILES
    if len(files.paths) > limit:
        raise TooLarge(f"{len(files.paths)} files in one stage request; the limit is {limit}: split it")
    target = acting_user(user=user, on_behalf_of=files.on_behalf_of)
    most = settings.CAROUSEL_TAPE_REST_MAX_UNFINISHED
    if unfinished_stage_requests(target, most) >= most:
        raise TooManyRequests(f"{target.username} has {most} unfinished stage requests, the most allowed: "
                              "wait for some to finish or cancel some")
    lifetime = files.pin_lifetime or timedelta(seconds=settings.CAROUSEL_TAPE_REST_DISK_LIFETIME_S)
    return submission_create(submitter=user, on_behalf_of=files.on_behalf_of, paths=files.paths, now=now,
                             group=group, metadata=files.metadata, activity=files.activity, pin_lifetime=lifetime)


def _status_key(bulk_id):
    return f"tape-rest:stage:{bulk_id}"


def stage_status_json(*, user, request_id):
    """stage_status as JSON bytes for a caller who may see it (else None), kept in the shared
    cache for CAROUSEL_TAPE_REST_POLL_CACHE_S with who may see it: FTS and gfal2 poll big
    requests from many clients, and one rendering of 10,000 files (and one look-up of its
    owner) serves them all for that long. The caller's own cancel and delete drop it at once."""
    ttl = settings.CAROUSEL_TAPE_REST_POLL_CACHE_S
    request_id = uuid.UUID(str(request_id))
    kept = cache.get(_status_key(request_id)) if ttl > 0 else None
    if kept is None:
        bulk = stage_requests_of(user).filter(pk=request_id).first()
        if bulk is None:
            return None
        kept = (bulk.user_id, bulk.submitter_id, json.dumps(stage_status(bulk), separators=(",", ":")).encode())
        if ttl > 0:
            cache.set(_status_key(request_id), kept, timeout=ttl)
    owner, submitter, body = kept
    return body if policy.shows_stage_request(user, owner, submitter) else None


def _forget_status(bulk_id):
    # Now, and again once committed: a poll in between may have kept the old state.
    cache.delete(_status_key(bulk_id))
    transaction.on_commit(lambda: cache.delete(_status_key(bulk_id)))


def stage_paths(bulk):
    return selectors.bulk_paths(bulk)


def stage_status(bulk):
    """GET stage/{id}: the request and every file, in the API's words."""
    # Read, not settled: a poll right after a big POST shows the files still in the intake as
    # SUBMITTED rather than waiting for them to be queued. Read first, so that a move committed
    # between the two reads shows a file twice (the request wins) rather than not at all.
    waiting = list(Intake.objects.filter(bulk_id=bulk.pk).values_list("path", flat=True)) if bulk.pending else []
    rows = (RestoreRequest.objects.filter(selectors.in_bulk(bulk)).order_by("id")
            .values_list("path", "state", "submitted_at", "started_at", "finished_at", "last_error"))
    files = []
    last_finish = None
    unfinished = False
    for path, state, submitted_at, started_at, finished_at, last_error in rows:
        tape_state = TAPE_REST_STATE[state]
        entry = {"path": path, "state": tape_state}
        began = submitted_at or started_at
        if tape_state == "STARTED" or (tape_state in TERMINAL_TAPE_STATES and began):
            entry["startedAt"] = _seconds(began or finished_at)
        if tape_state in TERMINAL_TAPE_STATES:
            entry["finishedAt"] = _seconds(finished_at)
            last_finish = max(last_finish or finished_at, finished_at)
        else:
            unfinished = True
        if tape_state == "FAILED":
            entry["error"] = last_error or ("deadline passed before the file was restored" if state == S.EXPIRED
                                            else "the file could not be restored")
        files.append(entry)
    if waiting:
        listed = {f["path"] for f in files}
        files.extend({"path": path, "state": "SUBMITTED"} for path in waiting if path not in listed)
        unfinished = True
    body = {"id": str(bulk.id), "createdAt": _seconds(bulk.created_at),
            # Carousel takes a request in hand as it arrives: queued is already started. (Its
            # files' first moment at the stager moved it, and a file sent anew moved it again.)
            "startedAt": _seconds(bulk.created_at)}
    if files and not unfinished:
        body["completedAt"] = _seconds(last_finish)
    body["files"] = files
    return body


def path_list(paths, what="paths"):
    """The list of a cancel, release or archiveinfo body, checked whole: a non-empty list of
    strings, no longer than a stage request may be (413, as for a stage request)."""
    limit = settings.CAROUSEL_TAPE_REST_MAX_FILES
    if isinstance(paths, list) and len(paths) > limit:
        raise TooLarge(f"{len(paths)} paths in one call; the limit is {limit}, as for a stage request: split it")
    if not isinstance(paths, list) or not paths:
        raise InvalidSubmission(f'{what}: expected a non-empty list of paths, such as {{"{what}": ["/a/b"]}}')
    for index, raw in enumerate(paths):
        if not isinstance(raw, str):
            raise InvalidSubmission(f"{what}[{index}]: {check_path(raw, max_bytes=0)[1]}")
    return paths


def normalised(paths, what="paths"):
    """[(path as sent, normalised path)] of a cancel or release body; a bad entry refuses the
    whole call, with the words the native API uses (carousel.domain.paths.check_path)."""
    out = []
    for index, raw in enumerate(path_list(paths, what)):
        path, message = check_path(raw, max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
        if message:
            raise InvalidSubmission(f"{what}[{index}]: {message}")
        out.append((raw, path))
    return out


def _members(bulk, paths):
    """The requests of `bulk` for these paths; any path not in it refuses the call."""
    wanted = {path_key(p): p for _, p in normalised(paths)}
    found = dict(services.bulk_requests_to_act_on(bulk).filter(db.in_keys("path_key", wanted)).values_list("path_key", "id"))
    foreign = [p for k, p in wanted.items() if k not in found]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InvalidSubmission(f"{len(foreign)} path(s) are not in stage request {bulk.id}: {shown}; "
                                "nothing was changed")
    return RestoreRequest.objects.filter(id__in=list(found.values())), list(wanted.values())


def stage_cancel(*, who, bulk, paths, now):
    """POST stage/{id}/cancel: all the paths must be in the request, or nothing changes. Of
    those, the caller cancels what it may (policy.actionable_requests: its token's scopes; a
    service never the person's own request its stage request holds); the rest is skipped. Files
    already finished stay as they are. Returns the (job, path) pairs to withdraw."""
    requests, _ = _members(bulk, paths)
    requests = requests.filter(pk__in=policy.actionable_requests(who, policy.CANCEL).values("pk"))
    _forget_status(bulk.pk)
    # Files another of the user's stage requests still asks for stay (services.wanted_elsewhere).
    return services.request_cancel(queryset=requests.exclude(services.wanted_elsewhere(bulk)), now=now)[1]


@transaction.atomic
def stage_delete(*, who, bulk, now):
    """DELETE stage/{id}: its unfinished files the caller may cancel (policy.actionable_requests:
    a service never the person's own request its stage request holds) are cancelled, and the
    request is forgotten."""
    _, withdraw = services.bulk_cancel(bulk=bulk, now=now, reason="stage request deleted",
                                       allowed=policy.actionable_requests(who, policy.CANCEL))
    Bulk.objects.filter(pk=bulk.pk).delete()
    _forget_status(bulk.pk)
    return withdraw


def stage_release(*, who, bulk, paths, now):
    """POST release/{id}: the pins of these paths that this stage request holds end, of those
    the caller may release (policy.actionable_requests: its token's scopes; a service never the
    person's own pin, whatever submission made it). release/gfal2-placeholder-id (bulk None):
    by path, the caller's own pins (policy.own_requests), what it may not release skipped."""
    from carousel.domain import pins  # carousel/domain/pins.py: the real pins (helper c)

    if bulk is None:
        return pins.release_pins(requests=policy.own_requests(who, policy.RELEASE),
                                 paths=[p for _, p in normalised(paths)], now=now)
    _, clean = _members(bulk, paths)
    held = policy.actionable_requests(who, policy.RELEASE).filter(selectors.in_bulk(bulk))
    return pins.release_pins(requests=held, paths=clean, now=now)


# --- archiveinfo ---------------------------------------------------------------------------------

NOT_KNOWN_YET = "not known yet, being located; ask again"
# How long archiveinfo waits for the stager, for the whole call: a web worker is not a place to
# wait for a tape system (hsi takes up to two minutes; gunicorn gives a worker 30 s).
ARCHIVEINFO_WAIT_S = 1.0
# One stager question of archiveinfo's out at a time per process: a stager that hangs holds one
# thread, not one per call. While it is out, other calls' new paths are left to the loop.
_asking = threading.Lock()


def archive_info(*, paths, now, refused=None, stager=None, wait_s=ARCHIVEINFO_WAIT_S):
    """POST archiveinfo, path by path: locality from what Carousel knows (TAPE; DISK_AND_TAPE
    while a restored copy is pinned; an error for a file the stager said does not exist). Paths
    never located are asked of the stager in one batch, waiting at most `wait_s`: what it finds
    in time is recorded (FileLocation), the rest is answered NOT_KNOWN_YET and left to the loop
    (WantedLocation). `refused(normalised paths)` gives {path: reason} for those the caller may
    not poll: they get that error and are not looked up. Every entry has `locality` or `error`."""
    # Each entry names the path as it was sent (a client matches the answers to its paths by
    # their text: "//a//b" answered as "/a/b" was found by none); the lookups use it normalised.
    answers = []
    keys = {}
    for raw in path_list(paths):
        path, message = check_path(raw, max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
        answers.append(({"path": raw, "error": message}, None) if message else ({"path": raw}, path))
        if not message:
            keys[path_key(path)] = path
    not_yours = refused(list(dict.fromkeys(keys.values()))) if refused and keys else {}
    for key, path in list(keys.items()):
        if path in not_yours:
            del keys[key]
    located = set(FileLocation.objects.filter(db.in_keys("path_key", keys)).values_list("path_key", flat=True))
    # Pinned: done, and its pin (carousel/domain/pins.py) neither ran out nor was released.
    pinned = set(RestoreRequest.objects.filter(db.in_keys("path_key", keys), state=S.DONE, pin_until__gt=now)
                 .values_list("path_key", flat=True))
    missing = dict(RestoreRequest.objects.filter(db.in_keys("path_key", set(keys) - located), state=S.FAILED,
                                                 error_class=ErrorClass.PERMANENT)
                   .values_list("path_key", "last_error"))
    never_seen = sorted(p for k, p in keys.items() if k not in located and k not in missing)
    asked = _ask_stager(never_seen, now=now, stager=stager, wait_s=wait_s) if never_seen else {}
    for entry, path in answers:
        if "error" in entry:
            continue
        key = path_key(path)
        if path in not_yours:
            entry["error"] = not_yours[path]
        elif key in located:
            entry["locality"] = "DISK_AND_TAPE" if key in pinned else "TAPE"
        elif key in missing:
            entry["error"] = missing[key] or "no such file"
        else:
            entry.update(asked.get(path) or {"error": NOT_KNOWN_YET})
    return [entry for entry, _ in answers]


def _ask_stager(paths, *, now, stager, wait_s):
    """{path: {"locality"} or {"error"}} for the paths the stager answered within `wait_s`; the
    others are recorded as wanted, for the loop to locate."""
    from carousel.loop.locating import record_locations  # the loop's own way to keep a location
    from carousel.infra.plugins import stager as configured

    results = _locate_within(stager or configured(), paths, wait_s)
    found = [r for r in results if hasattr(r, "tape")]
    record_locations(found, now=now)
    out = {r.path: {"locality": "TAPE"} for r in found}
    for r in results:
        if not hasattr(r, "tape") and r.error_class != ErrorClass.TRANSIENT:
            out[r.path] = {"error": r.message or "no such file"}
    WantedLocation.objects.bulk_create([WantedLocation(path=p, path_key=path_key(p), wanted_at=now)
                                        for p in paths if p not in out], ignore_conflicts=True)
    return out


def _locate_within(stager, paths, wait_s):
    """stager.locate(paths) if it answers within `wait_s`, else []. The call runs in a thread of
    its own that is not waited for past that: it ends when the stager answers (or its own
    timeout fires), and until then no other archiveinfo of this process asks the stager."""
    if not _asking.acquire(blocking=False):
        return []
    box = []

    def ask():
        try:
            box.extend(stager.locate(paths))
        except Exception:  # the stager down or failing: the loop asks again, and judges it
            log.warning("archiveinfo: the stager's locate failed", exc_info=True)
        finally:
            _asking.release()
            connections.close_all()  # this thread's own, if the stager used the database

    thread = threading.Thread(target=ask, name="archiveinfo-locate", daemon=True)
    thread.start()
    thread.join(wait_s)
    return [] if thread.is_alive() else list(box)
