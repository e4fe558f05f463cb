"""Turn-taking policies: whose tape is mounted next. The sorting policy orders each user's own
queue, in runs of one tape (a run is one mount); the sharing policy gives each user's claim on
the drives' time; the turn policy hands out the runs, a mount at a time, and says how much of
the cycle's slots each takes. Chosen by CAROUSEL_TURN_POLICY (docs/plugins.md).

A turn policy works on plain data, a ReadyWork: the selection step (policies/selection.py)
reads it from the database, and answers the few questions a policy can only ask once it has
picked (whose queues to read, who else waits on a tape)."""
import heapq
from collections import defaultdict, deque
from dataclasses import dataclass

from carousel.tape import MEDIA, mount_profile

from .sorting import in_read_order


@dataclass(frozen=True)
class Lane:
    """One user's ready requests of one activity: the unit that takes turns. `weight` and
    `priority` are the activity's for the user's group (carousel/domain/activities.py)."""
    user: int
    activity: str = ""
    weight: float = 1.0
    priority: int = 0

    @property
    def key(self):
        return self.user, self.activity


def lane_of(candidate):
    """The lane key (user, activity) of a Candidate."""
    return candidate.user, candidate.activity or ""


class ReadyWork:
    """What a turn policy is handed: the users with ready requests and their limits, as plain
    data, and readers for the rest.

    demands: [UserDemand], one per user with ready requests: their group, how many are ready
        (pending) and how many more they may have in flight (room: cap minus in flight, refilled
        by whole jobs);
    groups: {group id: GroupLimit}, each group's weight and room (users of no group: none);
    in_flight: {user id: their requests planned or at the stager};
    files_per_job: N, the files of one job;
    share: the active SharePolicy (allocate(), drive_weights());
    whole_tapes: the sorting policy keeps a user's files on a tape together;
    tapes: {tape id: TapeInfo} of every tape runs() returned a request on;
    lanes: {user id: [Lane]}, the activities each user has ready work of (a user not in it: one
        lane, activity "").

    A ReadyWork without lanes need only write held_drive_time() and runs(); one with lanes
    writes held_lane_time() and lane_runs() too."""

    def __init__(self, *, demands, groups, in_flight, files_per_job, share, whole_tapes, lanes=None):
        self.demands = demands
        self.groups = groups
        self.in_flight = in_flight
        self.files_per_job = files_per_job
        self.share = share
        self.whole_tapes = whole_tapes
        self.lanes = lanes or {}
        self.tapes = {}

    def lanes_of(self, user):
        return self.lanes.get(user) or [Lane(user)]

    def held_drive_time(self, users):
        """{user id: the estimated drive time (s) of their requests planned or on the drives}."""
        raise NotImplementedError

    def held_lane_time(self, keys):
        """{(user, activity): the estimated drive time (s) of that lane's requests planned or on
        the drives}, for the lane keys `keys`."""
        held = self.held_drive_time({user for user, _ in keys})
        return {(user, activity): held.get(user, 0.0) for user, activity in keys}

    def lane_runs(self, allotments):
        """runs() per lane: {(user, activity): up to allotments[(user, activity)] of the lane's
        ready requests, in runs of one tape}."""
        by_user = self.runs({user: n for (user, _), n in allotments.items()})
        return {key: by_user[key[0]] for key in allotments if by_user.get(key[0])}

    def runs(self, allotments):
        """{user id: up to allotments[user] of their ready requests, in the sorting policy's
        order, cut into runs of one tape: [[Candidate, ...], ...]}; users with none left out."""
        raise NotImplementedError

    def every_user_on(self, tape):
        """{user id: their ready requests on `tape`}, every user's (tapes[tape].user_files
        completed; until then it holds only the users whose runs are on the tape)."""
        raise NotImplementedError

    def on_tape(self, tape, wanted):
        """Up to wanted[user] of each user's ready requests on `tape`, each user's by position."""
        raise NotImplementedError


class TurnPolicy:
    """Base of turn-taking policies."""

    def take_turns(self, work, *, slots, most_slots, mounts):
        """The requests this cycle sends, in sending order: up to `slots` Candidates from
        `work`, a run (one tape, one mount) at a time; users' caps and their groups' rooms are
        the policy's to respect. `most_slots`: the most slots a cycle can have (a run larger
        than that can never go whole). `mounts`: None, or how many more long mounts the drives'
        chains want (the mount plan is on and the backlog is larger than the window): runs of
        users with N files or more in flight count against it; others' short ones do not."""
        raise NotImplementedError


class FairTurns(TurnPolicy):
    """fair: weighted fair queueing in drive time, whole tapes, riders and the mount budget.

    Each user's queue comes from the sorting policy, in runs of one tape. The next run goes to
    the user whose drive time held (the estimated drive time of their work planned or on the
    drives, plus the runs given this cycle), with that run added, is the smallest for their
    weight (share.drive_weights); the run's estimated mount time (carousel.tape.mount_profile)
    is charged to them. So the drives' time, not a cycle's file slots, is shared, and tapes stay
    whole: when the run whose turn it is does not fit in the slots left, the cycle stops there
    and the run goes whole at a later cycle (unless the cycle has chosen nothing and the run is
    bigger than `most_slots`: waiting would not help, so it goes in part). A tape other users
    want too is read once: their ready files on it ride along in the same mount. Caps bound
    each user and group; `mounts`, when given, bounds the runs of users with work in flight
    (N files or more, counting this cycle's): a user with little in flight (an analyst's few
    files) still goes, as the plan puts such short mounts first anyway.

    A site that only wants another order of turns overrides tag()."""

    def tag(self, demand, held_s, weight):
        """The key of `demand`'s user's next turn, smallest first: `held_s` is their drive time
        held with the run whose turn it is (ordering turns), or without it (choosing whose
        queues to read); `weight` their claim on the drives' time. Ties go to the lower user id
        whatever this returns."""
        # Weighted fair queueing by finish tag: the drive time held once the run is read, not
        # before it. With mounts hours long, starting from the tags before would hand every
        # user a drive in the first round, whatever their weight, and that first round is a
        # large part of a campaign.
        return _virtual(held_s, weight), demand.user

    def take_turns(self, work, *, slots, most_slots, mounts):
        if slots <= 0 or not work.demands:
            return []
        grants = work.share.allocate(work.demands, work.groups, slots)
        able = [d for d in work.demands if min(d.pending, d.room) > 0]
        if mounts is not None and mounts <= 0:
            # No drive wants another long mount: only users with little in flight can have a turn
            # (most cycles of a long backlog; without this they would each gather and order pools
            # for nothing).
            able = [d for d in able if work.in_flight.get(d.user, 0) < work.files_per_job]
            if not able:
                return []
        user_weights = work.share.drive_weights(able, work.groups)
        demand = {d.user: d for d in able}
        group_of = {d.user: d.group for d in work.demands}
        lanes = {lane.key: lane for d in able for lane in work.lanes_of(d.user)}
        several = {user for user, _ in lanes if len(work.lanes_of(user)) > 1}
        held = work.held_lane_time(sorted(lanes))
        weights = lane_weights(list(lanes.values()), user_weights, group_of, demand)

        def tag(key, seconds):
            return self.tag(demand[key[0]], seconds, weights.get(key, 0.0)), key

        # How far into each lane's queue to look: twice the file slots the sharing policy would
        # grant its user, and at least a job's worth (N files, so a whole tape of up to N files
        # fits); and only for the lanes whose turn comes first (higher priorities first), until
        # their pools hold twice the slots. This keeps the pools, and the cycle's cost, in
        # proportion to the slots, not to the users or their backlogs.
        # Priorities order the lanes within a group, not across groups: a group's lanes of its
        # highest priority come first, by their turns among every group's (a priority activity
        # of one group filling the pools left the other groups none, cycle after cycle, while it
        # lasted); its lower ones after them, for when those have nothing to mount.
        top_of = {}
        for key, lane in lanes.items():
            top_of[group_of[key[0]]] = max(top_of.get(group_of[key[0]], lane.priority), lane.priority)
        wanted, total = {}, 0
        def gathering(key):
            lower = lanes[key].priority < top_of[group_of[key[0]]]
            return lower, -lanes[key].priority if lower else 0, tag(key, held[key])

        for key in sorted(lanes, key=gathering):
            if total >= 2 * slots:
                break
            d = demand[key[0]]
            wanted[key] = min(d.pending, d.room, slots, max(2 * grants.get(d.user, 0), work.files_per_job))
            total += wanted[key]
        runs = work.lane_runs(wanted)
        queues = {key: deque(runs[key]) for key in sorted(runs) if runs[key]}
        # Within a group, the lanes of its highest activity priority that have something to mount
        # take the group's whole share; the others wait until those have nothing left.
        top = {}
        for key in queues:
            group = group_of[key[0]]
            top[group] = max(top.get(group, 0), lanes[key].priority)
        present = {key[0] for key in queues}
        queues = {key: q for key, q in queues.items() if lanes[key].priority == top[group_of[key[0]]]}
        weights = lane_weights([lanes[key] for key in queues], user_weights, group_of, present)
        held = {key: held[key] for key in queues}

        def turn(key):
            return tag(key, held[key] + run_seconds(queues[key][0], work.tapes))

        user_room = {d.user: d.room for d in work.demands}
        group_room = {g: limit.room for g, limit in work.groups.items()}
        chosen, allotments = [], {}
        taken = set()  # requests chosen already (as another user's riders)
        heap = [turn(key) for key in queues]
        heapq.heapify(heap)
        remaining = slots
        while heap and remaining > 0:
            _, key = heapq.heappop(heap)
            user = key[0]
            run = [c for c in queues[key].popleft() if c.id not in taken]
            if not run:
                if queues[key]:
                    heapq.heappush(heap, turn(key))
                continue
            # A run onto a tape whose mount is planned, not sent yet, joins that mount: no new one.
            busy = (work.in_flight.get(user, 0) + allotments.get(user, 0) + len(run) >= work.files_per_job
                    and not work.tapes[run[0].tape].open)
            if mounts is not None and busy and mounts <= 0:
                continue  # no drive needs another long mount yet: this user's turn waits
            group = group_of[user]
            # The user's cap holds across their lanes (each lane's pool is within it alone).
            user_left = user_room[user] - allotments.get(user, 0)
            if user_left <= 0:
                continue  # at their cap this cycle: their other lanes wait too
            run = run[:user_left]
            fit = min(remaining, group_room.get(group, remaining))
            # A policy that keeps tapes whole needs room for all the user's ready files on the
            # tape, not only those its pool held (the pool may have been cut by the slots), as
            # far as the user's and group's caps would ever let them go together; and for the
            # other users' ready files on it, which ride along in the same mount (a tape two
            # users want is mounted once, not once per user's turn, hours apart). The user's own
            # files of their other activities on it ride along too, charged to those activities.
            tape = run[0].tape
            need = len(run)
            if work.whole_tapes:
                most = min(work.tapes[tape].user_files.get(user, 0), user_left,
                           work.groups[group].room if group in work.groups else need)
                need = max(need, most)
            riders = {}
            if need > fit:
                if fit <= 0:
                    continue  # this user's group is full: the others go on
                if chosen or need <= most_slots:
                    break  # a whole tape waits for its turn at a later cycle, when slots free up
                run = run[:fit]
            elif work.whole_tapes:
                riders = _riders(work.every_user_on(tape), user, len(run), group_of, user_room, allotments,
                                 group_room, remaining - len(run), own_too=user in several)
            along = []
            if riders:
                mine = {c.id for c in run}
                # The user's own riders are read after the run's files: ask for as many more.
                asked = {**riders, user: riders[user] + len(run)} if user in riders else riders
                along = [c for c in work.on_tape(tape, asked) if c.id not in taken and c.id not in mine]
                if user in riders:
                    own = [c for c in along if c.user == user][:riders[user]]
                    along = [c for c in along if c.user != user] + own
            seconds = run_seconds(in_read_order([*run, *along], work.tapes) if along else run, work.tapes)
            parts = defaultdict(list)
            parts[key] = list(run)
            for c in along:
                parts[lane_of(c)].append(c)
            for lane, theirs in parts.items():
                who = lane[0]
                chosen.extend(theirs)
                taken.update(c.id for c in theirs)
                allotments[who] = allotments.get(who, 0) + len(theirs)
                remaining -= len(theirs)
                if group_of[who] in group_room:
                    group_room[group_of[who]] -= len(theirs)
                # The mount's drive time is charged to its lanes by their files on it.
                held[lane] = held.get(lane, 0.0) + seconds * len(theirs) / (len(run) + len(along))
            if mounts is not None and busy:
                mounts -= 1
            if queues[key]:
                heapq.heappush(heap, turn(key))
        return chosen


def lane_weights(lanes, user_weights, group_of, present):
    """{(user, activity): weight} for `lanes`: each group's share (the sum of the sharing
    policy's weights of its users in `present`) split between the group's activities among
    `lanes` by the activities' weights, then each activity's part between the group's users
    with work of it in proportion to their weights. With one activity per group it gives each
    user their own weight: the sharing policy's split, unchanged."""
    share = defaultdict(float)
    for user in present:
        share[group_of[user]] += user_weights.get(user, 0.0)
    activity_weight, users_in = {}, defaultdict(float)
    for lane in lanes:
        place = group_of[lane.user], lane.activity
        activity_weight[place] = lane.weight
        users_in[place] += user_weights.get(lane.user, 0.0)
    activities = defaultdict(float)
    for (group, _), weight in activity_weight.items():
        activities[group] += weight
    weights = {}
    for lane in lanes:
        group = group_of[lane.user]
        place = group, lane.activity
        if users_in[place] > 0 and activities[group] > 0:
            weights[lane.key] = (share[group] * activity_weight[place] / activities[group]
                                 * user_weights.get(lane.user, 0.0) / users_in[place])
        else:
            weights[lane.key] = 0.0
    return weights


def _riders(user_files, user, own, group_of, user_room, allotments, group_room, room, own_too=False):
    """{user: how many of their ready requests on the tape (`user_files`: user -> ready
    requests on it) go in `user`'s mount of it (`own` of theirs), within each one's cap, their
    group's room and the `room` left in the cycle. `own_too`: `user`'s other ready files on it
    (their other activities') ride too."""
    riders = {}
    left = dict(group_room)
    if group_of[user] in left:
        left[group_of[user]] -= own
    for other, files in sorted(user_files.items()):
        if other not in user_room or (other == user and not own_too):
            continue
        mine = own if other == user else 0
        n = min(files - mine, user_room[other] - allotments.get(other, 0) - mine, room)
        other_group = group_of[other]
        if other_group in left:
            n = min(n, left[other_group])
        if n > 0:
            riders[other] = n
            room -= n
            if other_group in left:
                left[other_group] -= n
    return riders


def _virtual(held_s, weight):
    # A user of weight 0 comes after every weighted one, by their own drive time.
    return (0, held_s / weight) if weight > 0 else (1, held_s)


# A tape of a technology the model does not know is charged as if it were LTO-8 (the newest
# technology in the shipped workloads): only the relative drive time of users' runs matters.
FALLBACK_MEDIA = "LTO-8"
# The robot's cartridge move, fetch and put-back, as the simulated library's default (workloads/README.md).
EXCHANGE_S = 11.0


def run_seconds(run, tapes):
    """The estimated drive time of the mount reading `run` (one tape's candidates, in read
    order): robot exchange, load, locates, reads, rewind and unload."""
    media = tapes[run[0].tape].media
    pre, _ = mount_profile(media if media in MEDIA else FALLBACK_MEDIA, [(c.position, c.size) for c in run],
                           exchange_s=EXCHANGE_S)
    return pre[-1]
