"""Files already on disk are not read again (issue 23).

A new request for a file whose restored copy another request still pins (done, its pin_until
not passed) is answered by the submission itself: done at once with that copy's disk path, or,
when its submission names a destination and the delivery step moves files, handed to the normal
delivery step (delivering, from that copy). It holds a pin of its own (its own pin_lifetime,
from now; without one, until the pin it was served from would have ended: the user was told the
file is on disk, and that pin's early release must not take the copy away) and names the job whose stage made the copy (copy_job; it is in no job itself), so
that whichever pin ends last has the stager release the copy (carousel/domain/pins.py: a release waits while any pin on the file
lives). The pinning request is read, never changed: it is locked FOR SHARE for the rest of the
submission's transaction, so a release of it either commits first (and the file is read again)
or sees the new request (and keeps the copy).

The stager's own word works the same way at the locate step: a file it says is on its disk
(Location.on_disk: Tape REST archiveinfo's DISK or DISK_AND_TAPE) is completed without a tape
job (carousel/loop/locating.py, carousel/loop/progress.py's requests_on_disk).

The submission's side is in intake.py: queue_new (small submissions) and the intake's move
(_QUEUE_REST, in SQL, for the big ones), both through `pinned_copies` / its SQL twin."""
from datetime import timezone as dt_timezone

from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from carousel.infra import db, plugins
from carousel.models import RequestState as S, RestoreRequest

REQUESTS = RestoreRequest._meta.db_table


def arrival(destination, delivery=None):
    """(state, delivery file system) of a request whose file is on the stager's disk: to the
    delivery step when it names a destination and the configured delivery moves files, else done."""
    delivery = delivery or plugins.delivery()
    if not destination or not delivery.moves_files:
        return S.DONE, ""
    try:
        return S.DELIVERING, delivery.filesystem(destination)
    except OSError:
        return S.DELIVERING, "?"  # this process cannot see it; the worker delivering it judges


def pinned_copies(keys, *, now):
    """{path_key hex: (the copy's job id, staged path, size, tape id, position, pin_until)} of the files of `keys`
    (hex digests) whose restored copy a request still pins; the one pinned longest where
    several are. The pinning requests are locked FOR SHARE until the caller's transaction ends
    (see above). One statement, by the index request_pinned_path."""
    keys = list(keys)
    if not keys:
        return {}
    columns = "path_key, pin_until, COALESCE(copy_job, job_id), staged_path, size, tape_id, position"
    live = f"state = '{S.DONE}' AND pin_until > %s"  # the model's own constant, not input
    if db.is_postgres():
        # In id order, as pins._end_pins locks them: two lockers of the same rows never deadlock.
        sql = (f"SELECT {columns} FROM {REQUESTS} WHERE path_key = ANY(%s::uuid[]) AND {live} "
               "ORDER BY id FOR SHARE")
        params = ["{" + ",".join(map(str, keys)) + "}", now]
    else:  # SQLite: one writer at a time, nothing to lock; keys stored as hex
        sql = f"SELECT {columns} FROM {REQUESTS} WHERE path_key IN ({', '.join(['%s'] * len(keys))}) AND {live}"
        params = [*keys, connection.ops.adapt_datetimefield_value(now)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    longest = {}
    for key, pin_until, *copy in rows:
        key = key.hex if hasattr(key, "hex") else str(key).replace("-", "")
        if key not in longest or pin_until > longest[key][0]:  # (SQLite: ISO text, same order)
            longest[key] = (pin_until, tuple(copy))
    return {key: (*copy, _aware(pin_until)) for key, (pin_until, copy) in longest.items()}


def _aware(moment):
    """A pin's end as read by the raw statement: SQLite gives UTC as naive text (Django stores
    it so), which a new row's pin would otherwise take for the site's time zone."""
    if isinstance(moment, str):
        moment = parse_datetime(moment)
    return timezone.make_aware(moment, dt_timezone.utc) if timezone.is_naive(moment) else moment
