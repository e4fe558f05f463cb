"""The mount plan's glue (its pure part is plan.py): one chain of mounts per drive, laid out
from what is planned or in flight; short mounts first and preemption of a long one; sending
each job once the one before it on its chain is finished."""
import copy
import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, F, Q, Sum, Value
from django.db.models.functions import Greatest

from policies.order import position_order, read_order
from policies.sorting import TapeInfo
from policies.turns import EXCHANGE_S

from carousel.loop import plan, wear
from carousel.loop.failures import Failure, fail_requests
from carousel.loop.locating import any_unlocated
from carousel.models import (
    FINISHED_JOB_STATES, IN_FLIGHT_STATES, READY, Control, ErrorClass, Job, JobState, RequestState as S,
    RestoreRequest, StagerCall, StagerHealth, Tape,
)
from carousel.loop.progress import files_in_flight, job_spec
from carousel.loop.wear import WearRules
from carousel.domain.selectors import drive_allocation, drives_in_use, last_unmounts
from carousel.domain.services import request_claim, request_transition, stager_call_record
from carousel.stagers.base import StagerUnavailable
from carousel.tape import MEDIA, mount_profile

log = logging.getLogger("carousel.loop")


@dataclass
class Planned:
    """A piece of work for one tape, as the jobs that carry it: its files (path, key, position,
    size) in read order; its drive chain ("" when unplanned) and the job it follows."""

    tape: int
    files: list
    chain: str = ""
    after: object = None  # a Job id, or an earlier Planned of this cycle
    estimate_s: float = 0.0
    jumps: bool = False  # a short mount put before the long ones
    last_job: object = None  # set once its jobs exist
    join: object = None  # a pending Job of the tape whose files these join (one pass, read order)
    rides: bool = False  # sent at once to join its tape's mount on the drive of `chain`


# Long mounts laid out ahead on each drive's chain while more work waits than the window
# holds: the one on the drive and the next. Laying the whole window out (50 jobs for 8 drives on
# `groups`) fixed whose tape each drive reads hours ahead, by the estimates: on a library whose
# tapes and drives are slower or faster than the model, the groups whose mounts landed on fast
# drives got more than their weight (cms 0.29 for 0.25). One ahead was measured too: the turns
# are then taken among users who hold only what is left of the mounts on the drives, and the
# finish-tag rule over-serves the light users (groups, nominal library: 0.43 / 0.25 / 0.16 /
# 0.16 for 0.5 / 0.25 / 0.125 / 0.125). Two gives 0.50 / 0.25 / 0.12 / 0.12 (docs/benchmarks.md).
MOUNTS_AHEAD = 2


@dataclass
class MountPlanner:
    """Lays a cycle's new work out on the drives' chains (carousel/loop/plan.py) from what is
    already planned or in flight. `drives`: media -> drives to plan for."""

    drives: dict
    read_rate_mb_s: float | None = None
    exchange_s: float = 11.0
    taken_back: set = field(default_factory=set)  # jobs whose work this cycle plans again
    held: dict = field(default_factory=dict)  # tape id -> the wear rule that held its new mount back this cycle
    # The stager shows its drives (status()). One that hides them (Tape REST, hsm-fifo: the
    # count to plan for is the control row's) schedules its own recalls: it reads each request's
    # files in its own (position) order, and a request for a tape it has mounted waits for the
    # tape's next mount instead of joining it.
    shown: bool = True

    @classmethod
    def from_status(cls, status, control):
        """From the stager's status() and the control row; None (no plan) when neither gives a
        drive count."""
        counts = {}
        for drive in status.get("drives") or []:
            media = drive.get("media") or ""
            counts[media] = counts.get(media, 0) + 1
        shown = bool(counts)
        if control.drives:
            counts = {(next(iter(counts)) if len(counts) == 1 else ""): control.drives}
        if not counts:
            return None
        return cls(drives=counts, read_rate_mb_s=status.get("read_rate_mb_s"),
                   exchange_s=float(status.get("exchange_s") or 11.0), shown=shown)

    def order(self, media, files):
        """Keys of one tape's (key, offset, size) files in the order its stager will read them:
        the plan's read order, or position order behind a stager that hides its drives (it
        reads in its own order, so that is the order its mounts take the time of)."""
        return read_order(media, files) if self.shown else position_order(files)

    def mounts_wanted(self):
        """How many more long mounts the drives' chains take now: MOUNTS_AHEAD each, less the
        long mounts laid on it and not finished (a tape's jobs on one chain are one mount)."""
        laid = Counter(chain for chain, _ in Job.objects.filter(
            state__in=(JobState.PENDING, JobState.SENT), jumps_queue=False).exclude(chain="")
            .order_by().values_list("chain", "tape_id").distinct())
        return sum(max(0, MOUNTS_AHEAD - laid[f"{media}/{i}"]) for media, n in self.drives.items() for i in range(n))

    def lay_out(self, ordered, tapes, users, *, control, groups=None, now=None, priorities=None):
        """[Planned] for {tape id: [(path, key, position, size)] in read order}; `users`: tape
        id -> Counter of the users whose requests these are; `groups`: tape id -> the group
        whose drive time its mount is (drive allocation, plan.Allocation). When this is the last of the
        backlog, the last long mount planned on each chain, if not sent yet, is planned again
        with it (their jobs are listed in `self.taken_back`; claiming moves their requests to
        the new jobs and deletes them), so the final round is laid out across all the drives,
        not only this cycle's work."""
        # Cut tapes across drives only for the last of the backlog: while more waits, whole
        # tapes keep every drive busy with one mount each.
        # (This cycle's claims are still queued until its jobs are made.)
        keys = [f[1] for files in ordered.values() for f in files]
        split = last_of_backlog(keys)
        # The chains' last mounts taken back come first: their turns came before this cycle's.
        groups = {} if groups is None else groups
        replanned = self._take_back(ordered, tapes, groups) if split else []
        if not self.shown:
            # Its mounts are planned, estimated and cut (in stretches along the tape, not parts
            # of the read order that each reach across it) as such a stager reads them.
            for tape_id, files in ordered.items():
                media = tapes[tape_id].media if tape_id in tapes else None
                by_key = {f[1]: f for f in files}
                ordered[tape_id] = [by_key[k] for k in self.order(media, [(f[1], f[2], f[3]) for f in files])]
        order = [*replanned, *(tape for tape in ordered if tape not in set(replanned))]
        replanned = set(replanned)
        chains = self._chains()
        # Short mounts of users with little in flight go first: one analyst's file does not wait
        # behind hours of someone's backlog. (A short remnant of a big backlog does not jump.)
        # This cycle's claims count too: a backlog's first cycle is not "little in flight".
        load = Counter(user for tape_users in users.values() for user in tape_users.elements())
        load.update(dict(RestoreRequest.objects.filter(user_id__in=list(load), state__in=IN_FLIGHT_STATES)
                         .order_by().values_list("user_id").annotate(n=Count("id")).values_list("user_id", "n")))
        busy = {user for user, n in load.items() if n >= control.files_per_job}
        # Not a job already tried (sent_at: its submit's answer was lost): it is sent again with
        # its id, which a stager takes as the job it has, with the files it had; files merged
        # into it were never read, and failed as missing from it.
        pending_tape = {tape: rest for tape, *rest in Job.objects.filter(
            state=JobState.PENDING, tape_id__in=list(ordered), sent_at__isnull=True).exclude(chain="")
            .exclude(id__in=self.taken_back)
            .order_by("created_at", "rank")
            .values_list("tape_id", "chain", "after_id", "jumps_queue", "id")}
        # Tapes on a drive now, unless a short mount waits for that drive (it may be cutting
        # that mount short: the files it gave back must not join it again).
        waiting_short = Job.objects.filter(state=JobState.PENDING, jumps_queue=True).values("chain")
        on_drive = dict(Job.objects.filter(state=JobState.SENT, tape_id__in=list(ordered)).exclude(chain="")
                        .exclude(chain__in=waiting_short).order_by("sent_at").values_list("tape_id", "chain"))
        steps, mounts = [], []  # in order: a piece as it is, or a new mount (the wear rules choose)
        for tape_id in order:
            files = ordered[tape_id]
            media = tapes[tape_id].media if tape_id in tapes else None
            group = media if media in self.drives else ("" if "" in self.drives else None)
            if group is None or media not in MEDIA:
                steps.append(Planned(tape_id, files))  # no drive or no model for it: sent at once
                continue
            pre, suf = mount_profile(media, [(f[2], f[3]) for f in files], read_rate_mb_s=self.read_rate_mb_s,
                                     exchange_s=self.exchange_s)
            if tape_id in pending_tape:  # joins the tape's planned mount (claiming merges them)
                chain, after, jumps, job = pending_tape[tape_id]
                steps.append(Planned(tape_id, files, chain=chain, after=after, estimate_s=pre[-1], jumps=jumps,
                                     join=job))
            elif tape_id in on_drive and self.shown:
                # The tape is on a drive now: sent at once, the stager reads it in the same
                # mount (a library adds a request for a mounted tape to that drive's work),
                # instead of a second mount hours later at the end of a chain. Files of a
                # burst located after its first cycle land here. (Not with a stager that
                # hides its drives: there such a request waits for the tape's next mount, so
                # it is planned as one, where the plan puts it, not read next on that drive.)
                steps.append(Planned(tape_id, files, chain=on_drive[tape_id], estimate_s=pre[-1], rides=True))
            else:
                short = (tape_id not in replanned and pre[-1] <= control.short_mount_s
                         and not set(users.get(tape_id, ())) & busy)
                mounts.append(_NewMount(tape_id, files, pre, suf, group, short, replanned=tape_id in replanned))
                steps.append(mounts[-1])
        # The wear rules choose between candidates (wear.py): the runs they would hold are laid
        # out last, on the drives the rest of this cycle's work leaves with nothing to do now.
        # Which drives those are is known once the rest is laid out (a group at its drive
        # allocation queues its mount behind its current one, on whichever drive the plan
        # chooses; a mount taken back goes where the plan puts it), so it is laid out without
        # them first, then again with those the idle drives take; a released run the plan does
        # not start now on one of them (its group may not use it) is held after all.
        held = self._wear_holds(mounts, tapes, control=control, now=now, priorities=priorities or {})
        idle = {name for name, c in chains.items() if c.tail is None and c.front is None}
        # _place updates the chains it is given: a laying out again starts from a copy of them
        # as read (the database has not changed in between; reading them again cost two queries).
        read = copy.deepcopy(chains) if held else None
        pieces, started = self._place(steps, held, ordered, chains, idle, control=control, groups=groups, split=split)
        if held:
            free = Counter(name.rsplit("/", 1)[0] for name in idle - set(started.values()))
            released = set()
            for m in mounts:  # in turn order
                if m.tape in held and free[m.group] > 0:
                    free[m.group] -= 1
                    released.add(m.tape)
            if released:
                rules = held
                held = {tape: rule for tape, rule in rules.items() if tape not in released}
                pieces, started = self._place(steps, held, ordered, copy.deepcopy(read), idle, control=control,
                                              groups=groups, split=split)
                late = released - set(started)
                if late:  # not started now on an idle drive: held after all
                    held.update({tape: rules[tape] for tape in late})
                    pieces, _ = self._place(steps, held, ordered, copy.deepcopy(read), idle, control=control,
                                            groups=groups, split=split)
        self.held = held
        return pieces

    def _place(self, steps, held, ordered, chains, idle, *, control, groups, split):
        """(the cycle's pieces from `steps`, without the new mounts of `held`'s tapes: short
        mounts in front of the drives' chains (which this updates), long ones laid out by the
        plan after what each chain holds; {tape id: chain} of its new mounts that start now on
        a chain of `idle`)."""
        pieces, work, started = [], {}, {}
        for step in steps:
            if isinstance(step, Planned):
                pieces.append(step)
            elif step.tape in held:
                continue  # held back by a wear rule: its requests stay queued for a later cycle
            elif step.short:
                pieces.append(self._short(step.tape, step.files, step.pre[-1], chains, step.group, control))
                if pieces[-1].chain in idle and pieces[-1].after is None:
                    started[step.tape] = pieces[-1].chain
            else:
                work.setdefault(step.group, []).append(plan.TapeWork(
                    step.tape, tuple(range(len(step.files))), tuple(step.pre), tuple(step.suf), groups.get(step.tape)))
        limits = drive_allocation()
        for group, tape_work in work.items():
            ends = {name: c.end_s for name, c in chains.items() if name.startswith(f"{group}/")}
            # (An allocation holds per technology's drives: each is planned on its own.)
            allocation = plan.Allocation(limits, {name: chains[name].segments for name in ends}) if limits else None
            layout, _ = plan.plan(ends, tape_work, split=split, allocation=allocation)
            for name, new in layout.items():
                after = chains[name].tail
                for p in new:
                    files = [ordered[p.tape][i] for i in p.keys]
                    after = Planned(p.tape, files, chain=name, after=after, estimate_s=p.seconds)
                    pieces.append(after)
                    if name in idle and p.start_s <= 0:
                        started[p.tape] = name
        return pieces, started

    def _wear_holds(self, mounts, tapes, *, control, now, priorities):
        """{tape id: rule} of this cycle's new mounts the wear rules would hold back (wear.py).
        A rule only chooses between candidates: min_mount holds a small run only while a run
        big enough for it (a new one, or one planned or on a drive) waits for its technology's
        drives, remount_delay a tape only while any other work does; lay_out gives the drives
        that would otherwise have nothing to do the held runs, in turn, at once. Mounts planned
        again (taken back) are not new."""
        rules = WearRules.of(control)
        mine = [m for m in mounts if not m.replanned]
        if now is None or not mine:
            return {}
        unmounted = last_unmounts([m.tape for m in mine], since=now - timedelta(seconds=rules.remount_delay_s)) \
            if rules.remount_delay_s > 0 else {}
        rule_of, big = {}, set()
        for m in mine:
            info = tapes.get(m.tape)
            # The mount reads every user's ready files on the tape (riders), not only this cycle's.
            files = max(len(m.files), info.files if info else 0)
            nbytes = max(sum(f[3] for f in m.files), info.bytes if info else 0)
            at = unmounted.get(m.tape)
            rule = wear.hold(files=files, nbytes=nbytes, oldest_age_s=info.oldest_age_s if info else 0.0,
                             priority=priorities.get(m.tape, 0),
                             unmounted_s_ago=None if at is None else (now - at).total_seconds(), rules=rules)
            if rule:
                rule_of[m.tape] = rule
            elif rules.big_enough(files, nbytes):
                big.add(m.group)
        if wear.MIN_MOUNT in rule_of.values():
            big |= self.big_on_chains(rules)
        group_of = {m.tape: m.group for m in mine}
        return {t: r for t, r in rule_of.items() if r != wear.MIN_MOUNT or group_of[t] in big}

    def big_on_chains(self, rules):
        """The technologies (chain groups) whose drives' chains hold a long mount big enough for
        min_mount (its requests in flight, by tape), planned or on a drive. Bounded by N x K."""
        sizes = {}
        for chain, tape, n, nbytes in (RestoreRequest.objects.filter(
                state__in=IN_FLIGHT_STATES, job__state__in=(JobState.PENDING, JobState.SENT), job__jumps_queue=False)
                .exclude(job__chain="").exclude(job_id__in=self.taken_back).order_by()
                .values_list("job__chain", "tape_id").annotate(n=Count("id"), b=Sum("size"))
                .values_list("job__chain", "tape_id", "n", "b")):
            key = (chain.rsplit("/", 1)[0], tape)
            files, total = sizes.get(key, (0, 0))
            sizes[key] = (files + n, total + (nbytes or 0))
        return {group for (group, _), (n, nbytes) in sizes.items() if rules.big_enough(n, nbytes)}

    def _short(self, tape_id, files, estimate, chains, group, control):
        """A short mount goes on the drive where it would start first: after that drive's
        current mount and the short ones already waiting there, first come first served; the
        long mounts planned on it follow. Behind a long mount a short one waits about the time
        it takes to cut it (see preempt); among drives it would cut, the one whose mount has
        least left (it frees first anyway, and the cut leaves the least to mount again), so the
        cuts do not fall on one drive's tapes over and over."""
        mine = {name: c for name, c in chains.items() if name.startswith(f"{group}/")}

        def start(name):
            c = mine[name]
            head = c.head_left_s
            if c.head_long and control.preempt_after_s > 0:
                head = min(head, control.preempt_after_s + PREEMPT_FREES_S)
            return head + c.shorts_s

        name = min(mine, key=lambda n: (start(n), mine[n].head_left_s, n))
        chain = mine[name]
        chain.shorts_s += estimate
        front = chain.front
        planned = Planned(tape_id, files, chain=name, after=front, estimate_s=estimate, jumps=True)
        if chain.tail == front:  # nothing long waits on this drive: this cycle's long work follows it
            chain.tail = planned
        chain.front = planned
        return planned

    def rebalance_due(self):
        """Whether the final round should be laid out again although nothing new was chosen:
        nothing waits to be chosen or located, a drive has nothing planned, and a long mount
        waits on a chain. (The final round was planned from estimates, maybe hours before;
        the drives must still finish together.)"""
        open_jobs = Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT)).exclude(chain="")
        used = set(open_jobs.values_list("chain", flat=True).distinct())
        if all(f"{media}/{i}" in used for media, n in self.drives.items() for i in range(n)):
            return False
        if not open_jobs.filter(state=JobState.PENDING, jumps_queue=False).exists():
            return False
        return last_of_backlog()

    def _take_back(self, ordered, tapes, groups):
        """Take the last long mount planned on each drive's chain, when none of it is sent yet
        (nor tried: the stager may hold a job whose answer was lost), back into this cycle's work: plan.plan lays the final round out again with it, so the
        drives finish together however the estimates and this cycle's new work came out. The
        mounts before it keep their turns. A tape is taken back only when all its open jobs
        are such chain ends (a cut tape whose other piece is on a drive or further up a chain
        stays as planned: its pieces must not overlap). Their files join `ordered` (merged in
        the order the stager reads, `order`, with this cycle's new files of the same tape);
        jobs that followed them now follow what they followed. Returns the tapes taken back,
        in the order they were planned; `self.taken_back` holds their jobs. Bounded by the
        drives."""
        open_jobs = open_chain_jobs()
        row_of = {row[0]: row for row in open_jobs}
        back = chain_ends(open_jobs)
        self.taken_back = back
        for job in back:
            groups.setdefault(row_of[job][1], row_of[job][6])
        if not back:
            return []
        after_of = {job: row[3] for job, row in row_of.items()}
        for job, _, _, after, *_ in open_jobs:
            if job not in back and after in back:
                while after in back:
                    after = after_of.get(after)
                Job.objects.filter(id=job).update(after_id=after)
        rows = (RestoreRequest.objects.filter(job_id__in=back, state__in=IN_FLIGHT_STATES)
                .order_by("job__created_at", "job__rank", "job_rank").values_list("tape_id", "path", "path_key",
                                                                                   "position", "size"))
        taken = {}
        for tape_id, path, key, position, size in rows:
            taken.setdefault(tape_id, {}).setdefault(key, (path, key, position or 0, size or 0))
        media_of = dict(Tape.objects.filter(id__in=list(taken)).values_list("id", "media"))
        for tape_id, files in taken.items():
            merged = {f[1]: f for f in ordered.get(tape_id, [])}
            merged.update((k, f) for k, f in files.items() if k not in merged)
            media = media_of.get(tape_id)
            if tape_id not in tapes:
                tapes[tape_id] = TapeInfo(id=tape_id, media=media or None, files=0, bytes=0, oldest_age_s=0.0)
            ordered[tape_id] = [merged[k] for k in self.order(media, [(k, f[2], f[3]) for k, f in merged.items()])]
        return list(taken)

    def _chains(self):
        """{chain name: _Chain} for every drive, from the unfinished jobs on the chains (less
        those taken back to be planned again)."""
        chains = {f"{media}/{i}": _Chain() for media, n in self.drives.items() for i in range(n)}
        jobs = list(Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT)).exclude(chain="")
                    .exclude(id__in=self.taken_back)
                    .order_by("created_at", "rank").values_list("id", "chain", "state", "after_id", "estimate_s",
                                                                "files", "jumps_queue", "group_id"))
        sent = [j[0] for j in jobs if j[2] == JobState.SENT]
        left = dict(RestoreRequest.objects.filter(job_id__in=sent, state__in=IN_FLIGHT_STATES).order_by()
                    .values_list("job_id").annotate(n=Count("path_key", distinct=True)).values_list("job_id", "n"))
        followed = {j[3] for j in jobs}
        for job_id, name, state, after, estimate, files, jumps, group in jobs:
            chain = chains.setdefault(name, _Chain())
            share = estimate * (left.get(job_id, 0) / files if state == JobState.SENT and files else 1.0)
            chain.segments.append((chain.end_s, chain.end_s + share, group))
            chain.end_s += share
            if state == JobState.SENT:
                chain.front = job_id
                chain.head_left_s += share
                chain.head_long = chain.head_long or not jumps and estimate > 0
            elif jumps:  # a short mount waiting at the front
                chain.front = job_id
                chain.shorts_s += share
            if job_id not in followed:
                chain.tail = job_id
        return chains


def mount_estimate_s(media, places):
    """A job's estimated drive time from its files' (position, size) in the order the mount
    reads them, without a plan too: the turn policy charges it (policies/turns.py). 0 for a
    technology the model does not know."""
    if media not in MEDIA:
        return 0.0
    pre, _ = mount_profile(media, places, exchange_s=EXCHANGE_S)
    return pre[-1]


def last_of_backlog(keys=()):
    """Whether nothing waits to be chosen or located but the requests of `keys` (path keys):
    the work planned is the last there is, and the final round is laid out (lay_out)."""
    return not RestoreRequest.objects.filter(READY).exclude(path_key__in=keys).exists() and not any_unlocated()


def open_chain_jobs():
    """The unfinished jobs on the chains, in the order they were planned, as rows (id, tape id,
    state, after id, jumps_queue, chain, group id, sent_at). Bounded by the window (N x K)."""
    return list(Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT)).exclude(chain="")
                .order_by("created_at", "rank")
                .values_list("id", "tape_id", "state", "after_id", "jumps_queue", "chain", "group_id", "sent_at"))


def chain_ends(open_jobs):
    """The jobs a final-round layout takes back (MountPlanner._take_back) among `open_jobs`
    (open_chain_jobs()'s rows): the last long mount planned on each chain, when none of it is
    sent or tried, and only when all its tape's open jobs are such ends. (The outlook's
    estimates read the same set: where the loop may still move a mount.)"""
    row_of = {row[0]: row for row in open_jobs}
    followed = {row[3] for row in open_jobs}
    ends = set()
    for job, tape, _, _, _, chain, _, _ in open_jobs:
        if job in followed:
            continue
        row = row_of[job]
        # A pending job already tried (sent_at: its submit timed out or the process died,
        # perhaps after the stager took it) is sent again with its id, never planned again:
        # its files on new jobs were read twice (seed 10069 of the fault simulator).
        while (row is not None and row[2] == JobState.PENDING and row[7] is None and not row[4]
               and row[1] == tape and row[5] == chain):
            ends.add(row[0])
            row = row_of.get(row[3])
    of_tape = {}
    for job, tape, *_ in open_jobs:
        of_tape.setdefault(tape, set()).add(job)
    return {job for job in ends if of_tape[row_of[job][1]] <= ends}


@dataclass
class _NewMount:
    """A tape's work this cycle that needs a mount of its own (the wear rules may hold it)."""

    tape: int
    files: list
    pre: list
    suf: list
    group: str
    short: bool
    replanned: bool = False


@dataclass
class _Chain:
    end_s: float = 0.0  # until its planned and sent work is done (estimated)
    head_left_s: float = 0.0  # until the mount now on its drive (its jobs sent) is done
    head_long: bool = False  # that mount is a long one (a short one waiting may cut it)
    front: object = None  # the job a new short mount follows: the last one sent, or the last short one waiting
    shorts_s: float = 0.0  # the short mounts waiting at the front
    tail: object = None  # the job that new long work follows
    segments: list = field(default_factory=list)  # (start s, end s, group) of its jobs, estimated


# Roughly what a cut long mount still takes before its drive is free: the file being read, the
# rewind and unload, the robot's put-back.
PREEMPT_FREES_S = 300.0


def send_jobs(*, now, stager):
    """Send every committed, unacknowledged job. A job left pending by a crash is sent again
    with the same id, which the stager treats as the same job. Returns the error that stopped
    sending, or ""."""
    ready = Q(after__isnull=True) | Q(after__state__in=FINISHED_JOB_STATES)
    limits = drive_allocation()
    in_use = drives_in_use() if limits else {}
    seen = set()
    # A job that ends here (nothing left to send, or refused) lets the one behind it on its
    # chain go: it is read again, in this cycle, not a cycle later (seed 4441 of the fault
    # simulator: a replay that skips idle ticks never came back for it).
    while True:
        pending = {str(j.id): j for j in Job.objects.filter(ready, state=JobState.PENDING).exclude(id__in=seen)
                   .select_related("tape").order_by("created_at", "rank")}
        if not pending:
            return ""
        seen.update(j.id for j in pending.values())
        error, ended = _send(pending, limits=limits, in_use=in_use, now=now, stager=stager)
        if error or not ended:
            return error


def _send(pending, *, limits, in_use, now, stager):
    """Send the ready jobs `pending` in order. Returns (the error that stopped sending or "",
    whether a job ended without going to the stager)."""
    ended = False
    files = files_in_flight(pending)
    for job_id, job in pending.items():
        spec = job_spec(job, files[job_id])
        # A job tried before without an answer (sent_at: the process died, or the call timed out,
        # after the stager may have taken it) may hold files at the stager that nobody wants any
        # more (cancelled or expired meanwhile): their withdrawal could not be recorded without
        # the stager's id. It is sent again (the same id: the same job) to learn the id, and they
        # are withdrawn.
        dropped = _dropped(job, spec) if job.sent_at else []
        if not spec.paths and not dropped:
            Job.objects.filter(id=job.id).update(state=JobState.CANCELLED, finished_at=now)
            ended = True
            continue
        most = limits.get(job.group_id, (0, None))[1]
        chains = in_use.setdefault(job.group_id, set())
        if spec.paths and most is not None and job.chain and job.chain not in chains and len(chains) >= most:
            # The group holds its most drives: the mount waits for one of them to end (the plan
            # tries to avoid this; estimates are estimates).
            continue
        Job.objects.filter(id=job.id, state=JobState.PENDING).update(sent_at=now)  # tried, from now on
        try:
            backend_id = stager.submit(spec if spec.paths else replace(spec, paths=dropped))
        except StagerUnavailable as exc:  # the job stays pending for a later cycle
            log.warning("submitting %s failed: %s", job.id, exc)
            return str(exc) or type(exc).__name__, ended
        except Exception as exc:  # noqa: BLE001 - the stager refused this job: the others still go
            log.exception("the stager refused job %s", job.id)
            _refused(job, exc, now=now)
            ended = True
            continue
        _acknowledge(job, spec, dropped, backend_id, now=now)
        if job.chain and spec.paths:
            chains.add(job.chain)
    return "", ended


def _acknowledge(job, spec, dropped, backend_id, *, now):
    """Record that the stager took `job` (sent; or cancelled, when only files nobody wants were
    sent again to learn its id), then withdraw what the call sent that no request in the job
    wants any more: the files dropped before it, and those a cancel took while it was under way
    (a cancel that read the job before its backend id was recorded recorded nothing to
    withdraw: stager_call_record skips such jobs). A cancel holds its requests from before it
    reads the job until it commits, so locking them after the id is committed sees every cancel
    that missed it (one that saw it withdraws the file itself; withdrawing twice is harmless).
    Two transactions: the job's update fires the usage counters' triggers, so none is held
    while waiting on the requests' locks."""
    if spec.paths:
        acknowledged = Job.objects.filter(id=job.id, state=JobState.PENDING).update(
            state=JobState.SENT, backend_id=backend_id, sent_at=now, progress_at=now)
    else:
        acknowledged = Job.objects.filter(id=job.id, state=JobState.PENDING).update(
            state=JobState.CANCELLED, backend_id=backend_id, finished_at=now)
    if not acknowledged:
        # Given up or cancelled meanwhile: still the stager's, so its files are withdrawn.
        Job.objects.filter(id=job.id, backend_id="").update(backend_id=backend_id)
    with transaction.atomic():
        # In id order, as request_cancel locks: two lockers of the same rows wait, never deadlock.
        wanted = set(RestoreRequest.objects.filter(job_id=job.id, state__in=IN_FLIGHT_STATES).order_by("id")
                     .select_for_update(no_key=True).values_list("path", flat=True))
        unwanted = [p for p in [*spec.paths, *dropped] if p not in wanted]
        if unwanted:
            stager_call_record(kind=StagerCall.Kind.CANCEL, pairs=[(job.id, p) for p in unwanted], now=now)


def _dropped(job, spec):
    """The files of `job` whose requests left it before it was acknowledged (none of its
    requests for them is in flight any more), in no particular order."""
    return sorted(set(RestoreRequest.objects.filter(job=job).exclude(state__in=IN_FLIGHT_STATES)
                      .values_list("path", flat=True)) - set(spec.paths))


def short_mounts_waiting():
    """Short mounts (jobs that jump the queue) waiting behind a mount their drive has at the
    stager: preempt's candidates, whatever their wait."""
    return Job.objects.filter(state=JobState.PENDING, jumps_queue=True, after__state=JobState.SENT)


def preempt(*, now, stager, control):
    """A short mount that has waited `preempt_after_s` behind a long one on its drive's chain
    cuts that one short: the long mount's files after the one on the drive are withdrawn from
    the stager (not counted as an attempt), so the drive comes free after the file it is
    reading, and resume as a mount of their own on that drive once the short mounts waiting
    there are read. At most one per `preempt_gap_s`, so long mounts are not cut to pieces.
    Returns the files withdrawn."""
    if control.preempt_after_s <= 0:
        return 0
    candidates = list(short_mounts_waiting().filter(created_at__lte=now - timedelta(seconds=control.preempt_after_s))
                      .select_related("after").order_by("created_at", "rank")[:20])
    if not candidates:
        return 0  # most cycles: no short mount waits behind another, and the gap needs no look
    last = StagerHealth.objects.values_list("preempted_at", flat=True).first()
    if last is not None and (now - last).total_seconds() < control.preempt_gap_s:
        return 0
    for waiting in candidates:
        # The mount it waits for is the piece its predecessor belongs to: that tape's jobs sent
        # on that chain. Only a long one is cut.
        piece = list(Job.objects.filter(state=JobState.SENT, chain=waiting.after.chain,
                                        tape_id=waiting.after.tape_id).order_by("created_at", "rank"))
        if sum(j.estimate_s for j in piece) > control.short_mount_s:
            break
    else:
        return 0
    rank = {j.id: i for i, j in enumerate(piece)}
    rows = sorted(RestoreRequest.objects.filter(job__in=piece, state__in=IN_FLIGHT_STATES)
                  .values_list("job_id", "job_rank", "path"), key=lambda r: (rank[r[0]], r[1]))
    # The first of them in read order is on the drive (or next to be): it finishes.
    withdrawn = {}
    for job_id, _, path in rows[1:]:
        if path != rows[0][2]:
            withdrawn.setdefault(job_id, []).append(path)
    if not withdrawn:
        return 0
    backend = {j.id: j.backend_id for j in piece}
    n = 0
    for job_id, paths in withdrawn.items():
        # Back in the queue together with the stager letting them go, one job at a time: the
        # update waits in a transaction until cancel() returns, so a refused cancel leaves
        # them in flight (the mount runs on) and a withdrawn file is never left in flight, where
        # the poll would see it as failed. The cut gives back the attempt the job's submission
        # counted; a request that joined another user's stage spent none, so none comes back.
        with transaction.atomic():
            n += request_transition(RestoreRequest.objects.filter(job_id=job_id, path__in=paths,
                                                                  state__in=IN_FLIGHT_STATES),
                                    S.QUEUED, now=now, attempts=Greatest(F("attempts") - 1, Value(0)))
            stager.cancel(backend[job_id], paths)
        StagerHealth.objects.filter(id=1).update(preempted_at=now)
    # The cut mount resumes on the same drive once the short mounts waiting there are read: its
    # files keep their turn. (Left in the queue, they would wait behind every tape holding more
    # files, hours later on a long backlog, and the estimates shown for them would not hold.
    # Should the process die before this, they are queued: chosen again by the policies.)
    _resume(piece[0], [p for paths in withdrawn.values() for p in paths], after=_last_short(waiting), now=now,
            control=control)
    log.info("the mount of tape %s cut after its current file for short job %s: %d requests resume after it",
             waiting.after.tape_id, waiting.id, n)
    return sum(len(paths) for paths in withdrawn.values())


def _last_short(waiting):
    """The last of the short mounts waiting in line on `waiting`'s drive, from `waiting` on
    (each follows the one before it: MountPlanner._short)."""
    last = waiting
    while True:
        nxt = (Job.objects.filter(state=JobState.PENDING, jumps_queue=True, chain=waiting.chain, after=last)
               .order_by("created_at", "rank").first())
        if nxt is None:
            return last
        last = nxt


@transaction.atomic
def _resume(cut, paths, *, after, now, control):
    """The files of `paths` cut from `cut`'s mount and queued again, planned as a mount of
    their own (jobs of at most N files, in the order its stager reads them: MountPlanner.order)
    on the same chain right after job `after`, their requests claimed for it; the long mounts
    that followed `after` follow it."""
    rows = {}  # path -> (key, position, size): one per file, its requests queued again
    for path, key, position, size in (RestoreRequest.objects.filter(tape_id=cut.tape_id, path__in=paths,
                                                                      state=S.QUEUED)
                                      .values_list("path", "path_key", "position", "size").order_by()):
        rows[path] = (key, position or 0, size or 0)
    if not rows:
        return
    files = sorted(rows)
    media = cut.tape.media if cut.tape_id else None
    planner = MountPlanner.from_status(StagerHealth.get().status or {}, control)
    places = [(i, rows[p][1], rows[p][2]) for i, p in enumerate(files)]
    files = [files[k] for k in (planner.order(media, places) if planner else read_order(media, places))]
    estimate = mount_estimate_s(media, [rows[p][1:] for p in files])
    placed = []
    for rank, start in enumerate(range(0, len(files), control.files_per_job)):
        part = files[start:start + control.files_per_job]
        job = Job.objects.create(tape_id=cut.tape_id, files=len(part), created_at=now, rank=rank, chain=cut.chain,
                                 group_id=cut.group_id, after=after, jumps_queue=False,
                                 estimate_s=estimate * len(part) / len(files))
        Job.objects.filter(state=JobState.PENDING, jumps_queue=False, chain=cut.chain, after=after).exclude(
            id=job.id).update(after=job)
        placed += [(rows[p][0], job.id, i) for i, p in enumerate(part)]
        after = job
    request_claim(placed, now=now)


def _refused(job, exc, *, now):
    """A job the stager refuses (not "unavailable": an error of its own) fails transiently, so
    its requests wait for the retry cycle, bounded by their attempts, instead of blocking every
    later job."""
    control = Control.get()
    failure = Failure(f"the stager refused the job: {exc}", ErrorClass.TRANSIENT)
    fail_requests(RestoreRequest.objects.filter(job=job), failure, now=now, control=control)
    Job.objects.filter(id=job.id).update(state=JobState.FAILED, finished_at=now)
