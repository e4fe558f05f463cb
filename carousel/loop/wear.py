"""Mounts worth their wear (issue 23): the two rules the mount planner (mounts.MountPlanner)
applies between the candidate mounts of a cycle. Pure: plain numbers in, a rule's name or a
moment out, so the planner, the fault simulator and the estimates (carousel/outlook/) all ask
the same code.

- **min_mount**: a mount is started only for a run of at least `min_mount_files` files or
  `min_mount_bytes` bytes (CTA's mount criteria: 500 GB or 10,000 files), unless its oldest
  request has waited `mount_max_wait_s` or it is of priority 1 or more;
- **remount_delay**: a tape is not mounted again within `remount_delay_s` of its last unmount
  (ENDIT waits two hours), unless a request on it has waited `mount_max_wait_s`.

A rule only chooses between candidates: it holds a run back while other work can use the
drive (min_mount: while a run big enough for it, of this cycle or on the drives' chains,
waits; remount_delay: while any other work does), never while a drive would otherwise idle.
So a lone small request on an idle library goes at once, as without the rules.

For a request's estimate (carousel/outlook/estimates.py): `mountable_at(now=..., files=,
nbytes=` the tape's ready requests and bytes (TapeBacklog summed over users), `oldest_at=` its
oldest ready request's arrival, `priority=` their highest, `last_unmount_at=`
`selectors.last_unmounts([tape], since=now - remount_delay_s).get(tape)`, `rules=
WearRules.of(control))` is the earliest moment the tape's mount may start while the drives are
busy with other work; the estimate takes the later of it and when a drive frees.
"""
from dataclasses import dataclass
from datetime import timedelta

MIN_MOUNT = "min_mount"
REMOUNT_DELAY = "remount_delay"


@dataclass(frozen=True)
class WearRules:
    """The control row's four wear settings; a threshold of 0 turns its rule off."""

    min_mount_files: int = 0
    min_mount_bytes: int = 0
    mount_max_wait_s: float = 0.0
    remount_delay_s: float = 0.0

    @classmethod
    def of(cls, control):
        return cls(min_mount_files=control.min_mount_files, min_mount_bytes=control.min_mount_bytes,
                   mount_max_wait_s=control.mount_max_wait_s, remount_delay_s=control.remount_delay_s)

    def big_enough(self, files, nbytes):
        """Whether a run of `files` files and `nbytes` bytes is worth a mount by size alone."""
        return files >= self.min_mount_files or nbytes >= self.min_mount_bytes


def hold(*, files, nbytes, oldest_age_s, priority, unmounted_s_ago, rules):
    """The rule that holds this run's mount back while other work can use the drive, or "":
    `files`, `nbytes` what the mount would read, `oldest_age_s` how long its oldest request has
    waited, `priority` its highest priority, `unmounted_s_ago` seconds since the tape's last
    unmount (None: not recently)."""
    if oldest_age_s >= rules.mount_max_wait_s:
        return ""
    if unmounted_s_ago is not None and unmounted_s_ago < rules.remount_delay_s:
        return REMOUNT_DELAY
    if priority < 1 and not rules.big_enough(files, nbytes):
        return MIN_MOUNT
    return ""


def mountable_at(*, now, files, nbytes, oldest_at, priority, last_unmount_at, rules):
    """The earliest moment the rules let this run's mount start while other work can use the
    drives (the estimate adds it to a request's outlook): `now` when no rule holds it. A drive
    that would otherwise idle takes it at once whatever this says. `oldest_at`: its oldest
    request's arrival; `last_unmount_at`: the tape's last unmount, or None."""
    since_unmount = None if last_unmount_at is None else (now - last_unmount_at).total_seconds()
    rule = hold(files=files, nbytes=nbytes, oldest_age_s=(now - oldest_at).total_seconds(), priority=priority,
                unmounted_s_ago=since_unmount, rules=rules)
    if not rule:
        return now
    overdue = oldest_at + timedelta(seconds=rules.mount_max_wait_s)
    if priority < 1 and not rules.big_enough(files, nbytes):
        return overdue  # small: only the wait frees it (the remount delay ends before or after)
    return min(overdue, last_unmount_at + timedelta(seconds=rules.remount_delay_s))
