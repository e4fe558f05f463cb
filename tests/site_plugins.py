"""A site's own plugins, living outside the core, named in settings by the tests (and shown
in docs/plugins.md)."""
import errno
import os

from carousel.infra import nofollow
from carousel.loop.delivery import Delivery, DeliveryError
from carousel.stagers.base import FileStatus, Location
from carousel.stagers.immediate import ImmediateStager
from policies.sharing import SharePolicy, water_fill
from policies.sorting import SortPolicy
from policies.turns import FairTurns


class Symlink(Delivery):
    """A site's delivery: a symbolic link at each file's place to the staged copy, for a stager
    whose disk buffer users' nodes mount; made in its directory opened below the root without
    following links. Throttled per destination directory."""

    def filesystem(self, destination):
        return destination

    def deliver(self, source, target, *, root):
        try:
            with nofollow.parent_below(root, target) as (directory, name):
                os.symlink(source, name, dir_fd=directory)
        except FileExistsError as exc:
            raise DeliveryError(f"{target} exists already", user_error=True) from exc
        except OSError as exc:
            raise DeliveryError(f"cannot link {target}: {exc.strerror}", user_error=exc.errno == errno.ELOOP) from exc


class SiteStager(ImmediateStager):
    pass


class Newest(SortPolicy):
    """A site's policy: the newest request first (LIFO)."""

    name = "NEWEST"
    pools = SortPolicy.pools | {"newest"}

    def rank(self, candidates, tapes, params):
        return sorted(candidates, key=lambda c: (c.age_s, -c.id))


class MapStager(ImmediateStager):
    """Locates from a table the test writes: path -> (tape, position); files stay in flight
    (polls answer "staging") so what each cycle sends can be watched."""

    def __init__(self, where=None, media="LTO-7"):
        super().__init__()
        self.where = where or {}
        self.media = media
        self.sent = []

    def locate(self, paths):
        return [Location(p, *self.where.get(p, ("T-other", 0)), size=10**9, media=self.media) for p in paths]

    def submit(self, job):
        self.sent.append(job)
        return super().submit(job)

    def poll(self, jobs):
        return {j.id: [FileStatus(p, "staging") for p in j.paths] for j in jobs}


class Seniority(SharePolicy):
    """A site's sharing policy that writes only allocate(): a user's claim grows with their
    seniority (here: an odd user id weighs 3, an even one 1), caps aside."""

    name = "SENIORITY"

    def allocate(self, demands, groups, slots):
        users = sorted(demands, key=lambda d: d.user)
        grants = water_fill([max(0, min(d.pending, d.room)) for d in users], slots,
                            [3 if d.user % 2 else 1 for d in users])
        return {d.user: n for d, n in zip(users, grants) if n}


class Elders(SharePolicy):
    """A site's sharing policy: the oldest account (lowest user id) takes all it may, then the
    next; so the drives go to the elders first (their weights follow from allocate())."""

    name = "ELDERS"

    def allocate(self, demands, groups, slots):
        grants = {}
        for d in sorted(demands, key=lambda d: d.user):
            grants[d.user] = max(0, min(d.pending, d.room, slots))
            slots -= grants[d.user]
        return {user: n for user, n in grants.items() if n}


class LargestBacklogFirst(FairTurns):
    """A site's turn policy: the user with the most ready requests has the next turn, whatever
    their drive time held or their weight (ties: the lower user id). Whole tapes, riders, caps
    and the mount budget stay as the shipped policy has them."""

    def tag(self, demand, held_s, weight):
        return -demand.pending, demand.user
