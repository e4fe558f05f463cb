"""Locating: learn each new request's tape, position and size from the stager."""
from django.db.models import Exists, OuterRef, Subquery

from .models import ErrorClass, FileLocation, RequestState as S, RestoreRequest, Tape, path_key
from .services import request_transition


def locate_requests(*, now, stager, limit):
    """Learn the tape, position and size of queued requests not located yet, oldest first."""
    batch = list(RestoreRequest.objects.filter(state=S.QUEUED, tape__isnull=True)
                 .order_by("created_at", "id").values_list("id", "path", "path_key")[:limit])
    if not batch:
        return 0
    keys = {k for _, _, k in batch}
    known = set(FileLocation.objects.filter(path_key__in=keys).values_list("path_key", flat=True))
    unknown = sorted({p for _, p, k in batch if k not in known})
    if unknown:
        answers = stager.locate(unknown)
        found = [a for a in answers if hasattr(a, "tape")]
        missing = [a for a in answers if not hasattr(a, "tape")]
        _record_locations(found, now=now)
        for err in missing:
            if err.error_class == ErrorClass.TRANSIENT:
                continue  # the backend cannot tell now: asked again at a later cycle
            request_transition(RestoreRequest.objects.filter(path_key=path_key(err.path), state=S.QUEUED), S.FAILED,
                               now=now,
                               error_class=err.error_class, last_error=err.message)
    location = FileLocation.objects.filter(path_key=OuterRef("path_key"))
    return RestoreRequest.objects.filter(id__in=[i for i, _, _ in batch], state=S.QUEUED, tape__isnull=True).filter(
        Exists(location)).update(
        tape_id=Subquery(location.values("tape_id")[:1]),
        position=Subquery(location.values("position")[:1]),
        size=Subquery(location.values("size")[:1]),
    )


def _record_locations(found, *, now):
    labels = {loc.tape: loc.media for loc in found}
    Tape.objects.bulk_create([Tape(label=label, media=media) for label, media in labels.items()],
                             ignore_conflicts=True)
    tape_ids = dict(Tape.objects.filter(label__in=labels).values_list("label", "id"))
    FileLocation.objects.bulk_create(
        [FileLocation(path=loc.path, path_key=path_key(loc.path), tape_id=tape_ids[loc.tape],
                      position=loc.position, size=loc.size, located_at=now) for loc in found],
        update_conflicts=True, unique_fields=["path_key"], update_fields=["tape", "position", "size", "located_at"],
        batch_size=2000)
