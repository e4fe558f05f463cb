"""Locating: learn each new request's tape, position and size from the stager.

A "try later" answer (or none at all) is asked again after a backoff that doubles, and after
`Control.locate_attempts` such answers the request fails with the reason. Each batch takes the
requests due to be asked again (at most half of it while new ones wait) and new ones, oldest
first: paths the stager never answers cannot keep new work from being located.

A backend that cannot tell a file's tape (Tape REST never does) answers with a stand-in
(Location.tape_known false): the site's tape map (TapeMapEntry, `manage.py load-tape-map`)
places such a file on its tape, so the mount plan sees whole tapes; a file the map lacks keeps
the stand-in."""
import dataclasses
from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, F, OuterRef, Q, Subquery

from carousel.models import (
    Control, ErrorClass, FileLocation, RequestState as S, RestoreRequest, Tape, TapeMapEntry, WantedLocation,
    path_key,
)
from carousel.domain.services import request_transition
from carousel.loop.progress import requests_on_disk
from carousel.tape import BEYOND_TAPE_END

UNLOCATED = Q(state=S.QUEUED, tape__isnull=True)
# A path archiveinfo asked for and the stager never answered is not asked for past this.
WANTED_FOR = timedelta(days=1)


def any_unlocated():
    """Whether queued requests wait to be located: work the backlog counters do not show yet,
    so the ready backlog is not the last there is (one indexed probe)."""
    return RestoreRequest.objects.filter(UNLOCATED).exists()


def locate_new_work(*, now, stager, control):
    """A cycle's locating: stager calls of `Control.locate_batch` paths until no new request
    waits, up to the largest submission (CAROUSEL_MAX_PATHS_PER_SUBMISSION) a cycle. A burst
    is then seen whole by the same cycle's sharing policy: located one batch a cycle, its first
    users' tapes would take every idle drive for a mount (an hour or more) before the others'
    requests were even known, and the drive time so spent is never given back (shares are of
    the drives' time from now on). The bound keeps a slow stager from holding one cycle for
    ever behind a backlog of millions."""
    located = 0
    # Most cycles nothing waits to be located: one probe instead of the batch's two reads.
    calls = max(1, -(-settings.CAROUSEL_MAX_PATHS_PER_SUBMISSION // control.locate_batch)) if any_unlocated() else 0
    for _ in range(calls):
        n, took_new = _locate_requests(now=now, stager=stager, limit=control.locate_batch, control=control)
        located += n
        # A batch that took no new request found none waiting: no need to look again.
        if not took_new or not RestoreRequest.objects.filter(UNLOCATED, locate_attempts__isnull=True).exists():
            break
    locate_wanted(now=now, stager=stager, limit=control.locate_batch)
    return located


def locate_wanted(*, now, stager, limit):
    """One stager call for the paths archiveinfo could not answer in time (WantedLocation),
    never-asked first, then oldest. What is found is recorded; a path answered at all (found, or an error that is
    not "try later") is no longer wanted; one the stager cannot tell yet goes to the back of the
    line, and is dropped a day after it was first asked for."""
    if not WantedLocation.objects.exists():
        return 0  # most cycles: nobody asked
    WantedLocation.objects.filter(wanted_at__lt=now - WANTED_FOR).delete()
    rows = list(WantedLocation.objects.order_by(F("asked_at").asc(nulls_first=True), "wanted_at", "id")
                .values_list("id", "path", "path_key")[:limit])
    if not rows:
        return 0
    known = set(FileLocation.objects.filter(path_key__in=[k for _, _, k in rows]).values_list("path_key", flat=True))
    unknown = sorted(p for _, p, k in rows if k not in known)
    answers = stager.locate(unknown) if unknown else []
    found = [a for a in answers if hasattr(a, "tape")]
    record_locations(found, now=now)
    later = {a.path for a in answers if not hasattr(a, "tape") and a.error_class == ErrorClass.TRANSIENT}
    later |= set(unknown) - {a.path for a in answers}
    WantedLocation.objects.filter(id__in=[i for i, p, _ in rows if p not in later]).delete()
    WantedLocation.objects.filter(id__in=[i for i, p, _ in rows if p in later]).update(asked_at=now)
    return len(found)


def locate_requests(*, now, stager, limit, control=None):
    """Learn the tape, position and size of queued requests not located yet (one stager call
    of at most `limit` paths). Returns how many were located."""
    return _locate_requests(now=now, stager=stager, limit=limit, control=control)[0]


def _locate_requests(*, now, stager, limit, control=None):
    """locate_requests, and whether its batch took any request never asked about before."""
    again = list(RestoreRequest.objects.filter(UNLOCATED, locate_attempts__isnull=False, locate_after__lte=now)
                 .order_by("locate_after").values_list("id", "path", "path_key")[:limit])
    room = limit - min(len(again), limit // 2)
    new = list(RestoreRequest.objects.filter(UNLOCATED, locate_attempts__isnull=True)
               .order_by("created_at", "id").values_list("id", "path", "path_key")[:room])
    batch = again[:limit - len(new)] + new
    if not batch:
        return 0, False
    keys = {k for _, _, k in batch}
    known = set(FileLocation.objects.filter(path_key__in=keys).values_list("path_key", flat=True))
    unknown = sorted({p for _, p, k in batch if k not in known})
    on_disk = {}
    if unknown:
        answers = stager.locate(unknown)
        found = [a for a in answers if hasattr(a, "tape")]
        record_locations(found, now=now)
        on_disk = {a.path: a.disk_path for a in found if a.on_disk}
        unsure = {p: "the stager gave no answer for this path" for p in unknown}
        for a in answers:
            unsure.pop(a.path, None)
            if hasattr(a, "tape"):
                continue
            if a.error_class == ErrorClass.TRANSIENT:
                unsure[a.path] = a.message  # the backend cannot tell now
                continue
            request_transition(RestoreRequest.objects.filter(path_key=path_key(a.path), state=S.QUEUED), S.FAILED,
                               now=now, error_class=a.error_class, last_error=a.message)
        if unsure:
            _ask_again_later(unsure, now=now, control=control)
    location = FileLocation.objects.filter(path_key=OuterRef("path_key"))
    located = RestoreRequest.objects.filter(id__in=[i for i, _, _ in batch], state=S.QUEUED, tape__isnull=True).filter(
        Exists(location)).update(
        tape_id=Subquery(location.values("tape_id")[:1]),
        position=Subquery(location.values("position")[:1]),
        size=Subquery(location.values("size")[:1]),
    )
    if on_disk:
        # On the stager's disk already: done (or to delivery) now, no tape job (domain/ondisk.py).
        requests_on_disk(RestoreRequest.objects.filter(id__in=[i for i, p, _ in batch if p in on_disk],
                                                       state=S.QUEUED), on_disk, now=now)
    return located, bool(new)


def _ask_again_later(unsure, *, now, control):
    """{path: the stager's message}: count the attempt; back off, or fail at the limit. One
    statement per (attempt, message), not per request."""
    control = control or Control.get()
    rows = RestoreRequest.objects.filter(UNLOCATED, path_key__in=[path_key(p) for p in unsure])
    groups = {}
    for rid, path, attempts in rows.values_list("id", "path", "locate_attempts"):
        groups.setdefault(((attempts or 0) + 1, unsure.get(path, "")), []).append(rid)
    for (attempts, message), ids in groups.items():
        these = RestoreRequest.objects.filter(id__in=ids)
        if attempts >= control.locate_attempts:
            request_transition(these, S.FAILED, now=now, locate_attempts=attempts, error_class=ErrorClass.TRANSIENT,
                               last_error=f"could not be located after {attempts} attempts; "
                                          f"the stager's last answer: {message}")
        else:
            delay = control.locate_backoff_s * 2 ** min(attempts - 1, 6)
            these.update(locate_attempts=attempts, locate_after=now + timedelta(seconds=delay))


def placed_by_map(found):
    """The locations, those whose tape the stager could not tell placed as the tape map says
    (one query). A map line without a position keeps the map's order: past the tape's end, as
    carousel.tape.BEYOND_TAPE_END says; without a size, the stager's."""
    hidden = {path_key(loc.path): loc for loc in found if not loc.tape_known}
    if not hidden:
        return found
    mapped = {key: row for key, *row in TapeMapEntry.objects.filter(path_key__in=list(hidden)).values_list(
        "path_key", "tape", "media", "position", "size", "ordinal")}
    placed = {}
    for key, (tape, media, position, size, ordinal) in mapped.items():
        loc = hidden[key]
        placed[loc.path] = dataclasses.replace(
            loc, tape=tape, media=media, position=position if position is not None else BEYOND_TAPE_END + ordinal,
            size=size if size is not None else loc.size, tape_known=True)
    return [placed.get(loc.path, loc) for loc in found]


def record_locations(found, *, now):
    found = placed_by_map(found)
    # A tape's technology from any of its lines that names one (the map may name it on some only).
    labels = {}
    for loc in found:
        labels[loc.tape] = labels.get(loc.tape) or loc.media
    Tape.objects.bulk_create([Tape(label=label, media=media) for label, media in labels.items()],
                             ignore_conflicts=True)
    # A tape first seen without its technology learns it from a later answer (a map loaded since).
    for media in {m for m in labels.values() if m}:
        Tape.objects.filter(label__in=[label for label, m in labels.items() if m == media], media="").update(media=media)
    tape_ids = dict(Tape.objects.filter(label__in=labels).values_list("label", "id"))
    FileLocation.objects.bulk_create(
        [FileLocation(path=loc.path, path_key=path_key(loc.path), tape_id=tape_ids[loc.tape],
                      position=loc.position, size=loc.size, located_at=now) for loc in found],
        update_conflicts=True, unique_fields=["path_key"], update_fields=["tape", "position", "size", "located_at"],
        batch_size=2000)
