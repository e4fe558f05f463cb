"""Shares, for the pages.

The share of a user or a group, wherever a page, the API or the CLI shows one, is one quantity:
their part of the drives' time over a stated period, as the sharing policy counts it (drive
time held: each mount's time shared among the users by their files on it; the mounts on the
drives now count for the time they have had so far). drive_time_shares() gives it, with the
period's name to show next to the figure; the usage report's drive_share is the same figure
(carousel.ops.usage.drive_seconds computes both; the ops layer is below this one). The pages'
"now" is the current UTC day so far (SHARE_PERIOD); the usage page and API name a period.

throughput_shares() is something else, kept for the queue positions of carousel/outlook/
estimates.py: how the policy would split the stager's slots among the users waiting now.
"""
from dataclasses import dataclass
from datetime import datetime, timedelta

from carousel.models import Account, GroupShare, UserBacklog
from carousel.ops import usage
from policies.selection import share_policy
from policies.sharing import GroupLimit, UserDemand

# allocate() deals whole slots; scaled up, a user's share is not rounded away among many users.
SHARE_SCALE = 1000


def caps_and_weights(control, user_ids):
    """({user: (group, in-flight cap)}, {group: (weight, in-flight cap)}) with the defaults
    applied, as the selection step reads them."""
    found = {u: (g, cap) for u, g, cap in
             Account.objects.filter(user_id__in=user_ids).values_list("user_id", "group_id", "inflight_cap")}
    users = {}
    for u in user_ids:
        group, cap = found.get(u, (None, None))
        users[u] = (group, control.default_user_cap if cap is None else cap)
    found = {g: (w, cap) for g, w, cap in GroupShare.objects.filter(
        group_id__in={g for g, _ in users.values() if g is not None}).values_list("group_id", "weight", "inflight_cap")}
    groups = {}
    for group in {g for g, _ in users.values() if g is not None}:
        weight, cap = found.get(group, (1.0, None))
        groups[group] = (weight, control.default_group_cap if cap is None else cap)
    return users, groups


@dataclass(frozen=True)
class Shares:
    """How the active sharing policy splits the stager's slots between the users with work."""

    users: dict  # user id -> fraction of what is handed out
    groups: dict  # group id (None: ungrouped) -> fraction of what is handed out
    group_slots: dict  # group id -> slots (files in flight) the group is given
    group_of: dict  # user id -> group id


def throughput_shares(*, control, eager=None):
    """Each user's and group's part of the stager's slots under the active sharing policy,
    for the users with located queued requests; the user `eager`, if given, counted as
    wanting all it may take. The policy's own allocate() on the trigger-kept backlog
    counters: no queue is read."""
    backlog = dict(UserBacklog.objects.filter(files__gt=0).values_list("user_id", "files"))
    if eager is not None:
        backlog.setdefault(eager, 0)
    users, groups = caps_and_weights(control, list(backlog))
    demands = [UserDemand(user=u, group=users[u][0], room=users[u][1] * SHARE_SCALE,
                          pending=(users[u][1] if u == eager else files) * SHARE_SCALE)
               for u, files in backlog.items()]
    limits = {g: GroupLimit(weight=w, room=cap * SHARE_SCALE) for g, (w, cap) in groups.items()}
    slots = control.files_per_job * control.jobs_in_flight * SHARE_SCALE
    grants = share_policy(control.share_policy).allocate(demands, limits, slots) if demands else {}
    total = sum(grants.values())
    group_grants = {}
    for u, n in grants.items():
        group_grants[users[u][0]] = group_grants.get(users[u][0], 0) + n
    return Shares(users={u: n / total for u, n in grants.items() if n},
                  groups={g: n / total for g, n in group_grants.items() if n},
                  group_slots={g: n / SHARE_SCALE for g, n in group_grants.items()},
                  group_of={u: g for u, (g, _) in users.items()})


@dataclass(frozen=True)
class PeriodShare:
    """Shares of drive time over one period (whole UTC days, until excluded)."""

    since: datetime
    until: datetime
    period: str  # its name, shown next to every figure
    users: dict  # user id -> fraction (drive_time_share_of: that user's only)
    groups: dict | None  # group id (None: no group) -> fraction; None: not read (drive_time_share_of)
    total_s: float  # drive seconds in the period, everyone's

    def of_user(self, user_id):
        return self.users.get(user_id, 0.0)

    def of_group(self, group_id):
        if self.groups is None:
            raise ValueError("the groups' shares were not read (drive_time_share_of)")
        return self.groups.get(group_id, 0.0)


SHARE_PERIOD = "today"


def period_name(since, until, now):
    """How a page names a period: "today (2026-11-28 UTC, so far)", or its days."""
    since, until = usage.day_floor(since), usage.day_ceil(until)
    last = until - timedelta(days=1)
    if since == usage.day_floor(now) and until == since + timedelta(days=1):
        return f"today ({since:%Y-%m-%d} UTC, so far)"
    if since == last:
        return f"{since:%Y-%m-%d} UTC"
    return f"{since:%Y-%m-%d} to {last:%Y-%m-%d} UTC"


def activity_shares(*, now):
    """{activity: its share of drive time} over the same period as drive_time_shares' default
    (today so far): the same quantity per activity (the usage report's by-activity drive_share)."""
    since = usage.day_floor(now)
    seconds, total = usage.drive_seconds(since=since, until=since + timedelta(days=1), by="activity", now=now)
    return {activity: usage.share_of(s, total) for activity, s in seconds.items()}


def drive_time_shares(*, now, since=None, until=None):
    """Every user's and group's share of drive time over the whole UTC days from since to
    until (until excluded; default: today so far)."""
    since = usage.day_floor(since or now)
    until = usage.day_ceil(until) if until else since + timedelta(days=1)
    users, total = usage.drive_seconds(since=since, until=until, by="user", now=now)
    groups, _ = usage.drive_seconds(since=since, until=until, by="group", now=now)
    return PeriodShare(since=since, until=until, period=period_name(since, until, now),
                       users={u: usage.share_of(s, total) for u, s in users.items()},
                       groups={(g or None): usage.share_of(s, total) for g, s in groups.items()}, total_s=total)


def drive_time_share_of(user_id, *, now):
    """One user's share of drive time today so far, the figure drive_time_shares gives it, read
    for that user alone (three statements, summed by the database): for the answers every client
    polls (the summary) and a user's own queue. Reading every user's and every group's, as the
    live page does, made the summary 2.9 times dearer (11.1 ms of CPU an answer, 3.9 before)."""
    since = usage.day_floor(now)
    until = since + timedelta(days=1)
    seconds, total = usage.drive_seconds(since=since, until=until, by="user", now=now, of=user_id)
    return PeriodShare(since=since, until=until, period=period_name(since, until, now),
                       users={user_id: usage.share_of(seconds[user_id], total)}, groups=None, total_s=total)
