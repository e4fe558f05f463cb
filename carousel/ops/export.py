"""What really happened, as a workload (`carousel-workload/1`, tests/workloads/README.md) that
`manage.py simulate` replays under another policy before production changes: the requests
submitted in a period with their arrival times and users, the tapes that held them with the
media, positions and sizes the stager reported, the users' groups, weights and caps, and the
library's drives.

A stager that reports no positions (tape-rest) leaves the files' places on their tapes unknown:
they are then laid end to end in path order, and the workload says it is only good for
questions of sharing, not of mounts or read order."""
import gzip
import json
from collections import Counter

from carousel.models import Account, GroupShare, RestoreRequest, Tape
from carousel.tape import MEDIA

FORMAT = "carousel-workload/1"


class ExportError(ValueError):
    pass


def drives_from_stager():
    """{technology: count} from the configured stager's status(), or {} when it lists none."""
    from carousel.infra import plugins

    try:
        status = plugins.stager().status() or {}
    except Exception:  # noqa: BLE001 - an unreachable stager: the operator passes --drives
        return {}
    return dict(Counter(d.get("media") for d in status.get("drives", []) if d.get("media") in MEDIA))


def export_workload(*, since, until, drives=None, media=None, name=None):
    """The workload dict of the requests created in [since, until)."""
    drives = drives or drives_from_stager()
    if not drives:
        raise ExportError("the stager reports no drives: say which with --drives, e.g. --drives LTO-8=10")
    unknown = sorted(set(drives) - set(MEDIA))
    if unknown:
        raise ExportError(f"unknown drive technology {', '.join(unknown)}; known: {', '.join(MEDIA)}")
    if media is None and len(drives) == 1:
        media = next(iter(drives))
    rows = (RestoreRequest.objects.filter(created_at__gte=since, created_at__lt=until)
            .values_list("created_at", "user_id", "user__username", "path", "tape_id", "position", "size")
            .order_by("created_at", "id"))
    requests, files, users, skipped, unplaced = [], {}, {}, 0, 0
    first = None
    for created, user_id, username, path, tape_id, position, size in rows.iterator(chunk_size=5000):
        if tape_id is None or size is None:
            skipped += 1  # never located (no such file, or still waiting): nothing to replay
            continue
        first = first or created
        users[username] = user_id
        files.setdefault(path, (tape_id, position, size))
        requests.append({"t": round((created - first).total_seconds(), 3), "user": username, "path": path})
    if not requests:
        raise ExportError(f"no located request was created between {since.isoformat()} and {until.isoformat()}")

    tapes = {t.id: t for t in Tape.objects.filter(id__in={f[0] for f in files.values()})}
    per_tape = {}
    for path, (tape_id, position, size) in files.items():
        per_tape.setdefault(tape_id, []).append([path, size, position])
    tape_list = []
    for tape_id, entries in sorted(per_tape.items(), key=lambda item: tapes[item[0]].label):
        tape = tapes[tape_id]
        technology = tape.media if tape.media in MEDIA else media
        if technology is None:
            raise ExportError(f"tape {tape.label} has no known media ({tape.media!r}): say which with --media")
        if technology not in drives:
            raise ExportError(f"tape {tape.label} is {technology}, and no drive of --drives reads it")
        if any(e[2] is None for e in entries):
            unplaced += len(entries)
            entries.sort()
            offset = 0
            for e in entries:  # unknown places: end to end, in path order
                e[2], offset = offset, offset + e[1]
        entries.sort(key=lambda e: (e[2], e[0]))
        used = max([tape.used_bytes or 0] + [e[1] + e[2] for e in entries])
        tape_list.append({"label": tape.label, "media": technology, "used_bytes": used, "files": entries})

    accounts = {a.user_id: a for a in Account.objects.filter(user_id__in=users.values()).select_related("group")}
    user_specs, group_ids = {}, {}
    for username, user_id in sorted(users.items()):
        account = accounts.get(user_id)
        spec = {}
        if account and account.group:
            spec["group"] = account.group.name
            group_ids[account.group.name] = account.group_id
        if account and account.inflight_cap:
            spec["cap"] = account.inflight_cap
        user_specs[username] = spec
    weights = dict(GroupShare.objects.filter(group_id__in=group_ids.values()).values_list("group__name", "weight"))
    notes = [f"Exported from Carousel: requests created from {since.isoformat()} to {until.isoformat()}."]
    if skipped:
        notes.append(f"{skipped} requests never located (no such file, or not yet located) are left out.")
    if unplaced:
        notes.append(f"The stager reported no positions for {unplaced} files: they are laid end to end, so this "
                     "workload is only good for questions of sharing, not of mounts or read order.")
    return {
        "format": FORMAT,
        "name": name or f"export-{since:%Y%m%dT%H%M}-{until:%Y%m%dT%H%M}",
        "description": " ".join(notes),
        "library": {"drives": drives},
        "groups": {g: {"weight": weights.get(g, 1.0)} for g in sorted(group_ids)},
        "users": user_specs,
        "tapes": tape_list,
        "requests": requests,
        "positions_known": not unplaced,
    }


def write_workload(data, path):
    path = str(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as handle:
        json.dump(data, handle, separators=(",", ":"))
