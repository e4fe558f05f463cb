"""Activities: the name a request carries (Tape REST targetedMetadata's `activity`, the native
API's `activity`, the CLI's --activity), and what the operator's Activity table makes of it: the
request's priority, and its weight within its group's share of drive time (policies/turns.py).

A name is looked up for the request's group, then among the rows of every group (group empty);
a name neither knows, or none, is the activity "default", whose row is looked up the same way
(none: priority 0, weight 1). An unknown name is listed for the operator (UnknownActivity)."""
import time
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from carousel.models import DEFAULT_ACTIVITY, Activity, UnknownActivity

# An unknown name is written at most once an hour per (group, name) in a process: a client
# sending one name on every request must not make each submission write the same row.
RECORD_EVERY_S = 3600.0
_recorded = {}


@dataclass(frozen=True)
class Setting:
    name: str  # the activity the requests draw on: a name the table knows, or "default"
    priority: int
    weight: float
    known: bool  # the name sent is in the table (or none was sent)


BUILT_IN = Setting(DEFAULT_ACTIVITY, 0, 1.0, True)


def table():
    """{(group id or None, name): (priority, weight)}: the whole table (an operator's few rows)."""
    return {(g, n): (p, w) for g, n, p, w in Activity.objects.values_list("group_id", "name", "priority", "weight")}


def setting(rows, group_id, name):
    """The Setting of activity `name` for a request of group `group_id`, from table()'s `rows`."""
    name = (name or "").strip()[:128] or DEFAULT_ACTIVITY
    for key in ((group_id, name), (None, name)):
        if key in rows:
            return Setting(name, *rows[key], known=True)
    for key in ((group_id, DEFAULT_ACTIVITY), (None, DEFAULT_ACTIVITY)):
        if key in rows:
            return Setting(DEFAULT_ACTIVITY, *rows[key], known=name == DEFAULT_ACTIVITY)
    return Setting(DEFAULT_ACTIVITY, BUILT_IN.priority, BUILT_IN.weight, known=name == DEFAULT_ACTIVITY)


def resolve(*, group_id, name, now):
    """The Setting a submission of group `group_id` naming `name` gets; an unknown name is
    recorded for the operator (at most once an hour per process)."""
    rows = {k: v for k, v in table().items() if k[0] in (group_id, None)}
    found = setting(rows, group_id, name)
    if not found.known:
        unknown_record(group_id=group_id, name=name.strip()[:128], now=now)
    return found


def unknown_record(*, group_id, name, now):
    key = (group_id, name)
    last = _recorded.get(key)
    if last is not None and time.monotonic() - last < RECORD_EVERY_S:
        return
    # Remembered once the submission commits: a rolled-back one leaves nothing recorded.
    transaction.on_commit(lambda: _recorded.__setitem__(key, time.monotonic()))
    updated = UnknownActivity.objects.filter(group_id=group_id, name=name).update(last_seen=now)
    if not updated:
        try:
            with transaction.atomic():
                UnknownActivity.objects.create(group_id=group_id, name=name, first_seen=now, last_seen=now)
        except IntegrityError:
            pass  # another process recorded it first


def unknown_adopt(unknown):
    """Add the UnknownActivity rows `unknown` to the table, each with its group's default
    priority and weight (the operator then edits them); returns how many rows were added."""
    rows = table()
    added = 0
    for entry in unknown:
        if (entry.group_id, entry.name) in rows:
            continue
        default = setting(rows, entry.group_id, DEFAULT_ACTIVITY)
        Activity.objects.create(group_id=entry.group_id, name=entry.name, priority=default.priority,
                                weight=default.weight)
        rows[(entry.group_id, entry.name)] = (default.priority, default.weight)
        added += 1
    return added
