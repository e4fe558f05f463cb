"""Bad weeks, simulated: the whole broker under faults, driven by a seed (issue 24).

run_seed(seed) builds a short schedule from random.Random(seed) alone: a small generated
library and workload (a few users in two or three groups; small submissions of datasets, those
of more than INTAKE_ABOVE new files through the intake), users cancelling, resubmitting, releasing and asking for
files another user has, pins running out, retention, operators pausing and changing caps,
weights and drives, and faults: stage requests the library loses, drives failing files,
locates answering "try later", the stager down or answering garbage or timing out, a mail
server that hangs, a message broker that refuses tasks, deliveries failing, a worker or the
cycle's process dying between two steps or inside a stager call (what its open transaction
wrote is rolled back; the next cycle is the restart). The faults stop before the end; after the
last event (the operator lifts a pause and any quarantine then, as when the faults stop) the run
goes on until every request is final, for at most DRAIN_S: a request still active when that
time has passed (the clock jumps there when nothing is due sooner) was forgotten.

It runs the real carousel.loop.cycle.run_cycle with the shipped control defaults on a
simulated clock, against the simulated library behind a FaultyStager, in the current database
(which must hold no requests: benchmarks/faults.py gives each seed a fresh SQLite copy). The
worker is simulated too: the tasks a commit sends are run by the simulator after the step that
sent them. Idle stretches are skipped as the replay skips them: a cycle runs at the next tick
at which something may change (an event that changes the database, the library's next change,
a time limit of the loop, the end of a fault that held the loop back, work the last cycle left).

After every step (a cycle, a user's or an operator's action) it checks the invariants and
stops at the first violation, with the seed and the step:

- every submitted file is accounted for by exactly one request or intake row of its submission,
  and a request in flight belongs to a job the broker still follows (none forgotten); all are
  final at the end;
- no request's file is read twice except after a failure or a lost job; no request cancelled
  or released is sent, delivered or left at the stager without a withdrawal; no live pin is
  released;
- while work waits, the stager answers and a drive is free, something is sent within two
  cycles, unless a rule the simulator names holds it back (among them the wear rules of
  carousel/loop/wear.py, asked as the planner asks them);
- the counters equal a recount; one user's action never changes another user's request.
"""
import math
import random
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from unittest import mock

from django.core.cache import cache
from django.core.mail.backends.base import BaseEmailBackend
from django.db import connection, transaction
from django.db.models import Count, Max, Min, Sum
from django.test.utils import override_settings

from carousel.domain import intake, pins, services
from carousel.domain.paths import delivery_target
from carousel.infra import queue
from carousel.infra.db import read_moment
from carousel.loop import cycle as cycle_module
from carousel.domain.selectors import last_unmounts
from carousel.loop import wear
from carousel.loop.delivery import Delivery, DeliveryError, deliver_requests
from carousel.loop.withdrawals import send_stager_calls
from carousel.models import (
    ACTIVE_STATES, IN_FLIGHT_STATES, READY, Account, Bulk, Control, GroupShare, Intake, Job, JobState,
    RequestState as S, RestoreRequest, StagerCall, StagerHealth, Tape, TapeBacklog, UserBacklog, UserStateCount,
    path_key, sql_values,
)
from carousel.ops.retention import prune
from carousel.sim import replay
from carousel.sim.library import QUEUED as LIB_QUEUED, STAGING as LIB_STAGING, File, Library
from carousel.stagers.base import FileStatus, LocateError, StagerUnavailable
from carousel.stagers.simulated import SimulatedStager

EPOCH = replay.EPOCH
MB = 10**6
# After the last scheduled event the run goes on until every request is final, for at most this
# long (simulated) or this many cycles: then what is still active was forgotten.
DRAIN_S = 4 * 86400.0
DRAIN_CYCLES = 1500
# Submissions of more new files than this go through the intake (CAROUSEL_INTAKE_ABOVE, 1,000
# when shipped): lowered so that a seed's small submissions take that path too.
INTAKE_ABOVE = 8
# The cycle's steps a crash may come before or after (names in carousel.loop.cycle).
CYCLE_STEPS = ("expire_requests", "requeue_due_retries", "requeue_orphans", "collect_progress", "judge_stager",
               "end_overdue_jobs", "locate_new_work", "claim_jobs", "preempt", "send_jobs", "end_expired_pins",
               "send_stager_calls", "dispatch_deliveries", "notices_due")
FAULTS = ("down", "flaky", "garbage", "try_later", "mail_hangs", "broker_refuses", "delivery_fails", "lossy",
          "drive_errors", "worker_down")
# The faults whose end lets the loop or the worker go on with what they could not do (the stager
# answers again, the worker runs its tasks, the broker takes them): the clock wakes the loop
# then. The others' consequences have times of their own the clock already wakes it for (a
# retry, a job's deadline), or none the invariants watch (a notice mailed later).
WAKING_FAULTS = ("down", "flaky", "garbage", "try_later", "broker_refuses", "worker_down")
# Events that only arm a fault for the loop's next cycle, whenever it comes: they change
# nothing the loop would act on, so they bring no cycle forward.
ARMING_EVENTS = ("crash", "crash_worker", "race_cancel")


class Crash(BaseException):
    """The process dies here: nothing after it runs, its open transaction is rolled back."""


class Violation(BaseException):
    """An invariant broken. A BaseException, like Crash: one found inside a stager call must
    not be taken by the loop for a stager's error and swallowed."""

    def __init__(self, seed, step, invariant, detail):
        super().__init__(f"seed {seed} step {step}: {invariant}: {detail}")
        self.seed, self.step, self.invariant, self.detail = seed, step, invariant, detail


@dataclass
class Result:
    seed: int
    steps: int
    cycles: int
    violation: Violation | None
    simulated_s: float
    wall_s: float
    counts: dict = field(default_factory=dict)


def _table(model):
    return connection.ops.quote_name(model._meta.db_table)


def _query(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _sql():
    from carousel.models import BulkItem

    req, bulk, item, intake_ = _table(RestoreRequest), _table(Bulk), _table(BulkItem), _table(Intake)
    accounted = (
        f"SELECT b.id, b.files, b.pending + (SELECT count(*) FROM {req} r WHERE r.bulk_id = b.id)"
        f" + (SELECT count(*) FROM {item} i WHERE i.bulk_id = b.id) AS counted FROM {bulk} b"
        f" WHERE b.files <> b.pending + (SELECT count(*) FROM {req} r WHERE r.bulk_id = b.id)"
        f" + (SELECT count(*) FROM {item} i WHERE i.bulk_id = b.id)"
        f" UNION ALL SELECT NULL, n, p FROM (SELECT (SELECT count(*) FROM {intake_}) AS n,"
        f" (SELECT coalesce(sum(pending), 0) FROM {bulk}) AS p) x WHERE n <> p")
    usc, ub, tb = _table(UserStateCount), _table(UserBacklog), _table(TapeBacklog)
    ready = f"FROM {req} WHERE state = '{S.QUEUED.value}' AND tape_id IS NOT NULL"

    def differ(a, b):
        return f"(SELECT count(*) FROM ({a} EXCEPT {b}) d1) + (SELECT count(*) FROM ({b} EXCEPT {a}) d2)"

    counters = "SELECT " + ", ".join([
        differ(f"SELECT user_id, state, count(*), coalesce(sum(size), 0) FROM {req} GROUP BY user_id, state",
               f"SELECT user_id, state, files, bytes FROM {usc} WHERE files <> 0 OR bytes <> 0"),
        differ(f"SELECT user_id, count(*), coalesce(sum(size), 0) {ready} GROUP BY user_id",
               f"SELECT user_id, files, bytes FROM {ub} WHERE files <> 0 OR bytes <> 0"),
        differ(f"SELECT user_id, tape_id, count(*) {ready} GROUP BY user_id, tape_id",
               f"SELECT user_id, tape_id, files FROM {tb} WHERE files <> 0"),
    ])
    job, call = _table(Job), _table(StagerCall)
    in_flight = sql_values(IN_FLIGHT_STATES)
    live_jobs = sql_values((JobState.PENDING, JobState.SENT))
    return {
        "accounted": accounted,
        "counters": counters,
        # _next_cycle's looks, each one statement (its ORM twins cost more to compile than to run).
        "more_to_send": (f"SELECT EXISTS (SELECT 1 FROM {req} WHERE state = '{S.QUEUED.value}')"
                         f" OR EXISTS (SELECT 1 FROM {job} WHERE state = '{JobState.PENDING.value}')"),
        "undispatched": (f"SELECT EXISTS (SELECT 1 FROM {req} WHERE state = '{S.DELIVERING.value}'"
                         " AND delivery_started_at IS NULL)"),
        "calls_due": f"SELECT EXISTS (SELECT 1 FROM {call} WHERE next_at <= %s)",
        "firsts": (f"SELECT (SELECT min(pin_until) FROM {req}),"
                   f" (SELECT min(locate_after) FROM {req} WHERE state = '{S.QUEUED.value}' AND tape_id IS NULL),"
                   f" (SELECT min(delivery_started_at) FROM {req} WHERE state = '{S.DELIVERING.value}'),"
                   f" (SELECT min(next_at) FROM {call})"),
        "sent_jobs": (f"SELECT chain, sent_at, progress_at, estimate_s, overdue_at FROM {job}"
                      f" WHERE state = '{JobState.SENT.value}'"),
        # What other users' requests look like (Simulation._others).
        "others": (f"SELECT state, count(id), count(pin_until), max(updated_at) FROM {req} WHERE NOT (user_id = %s)"
                   " GROUP BY state"),
        # Ready requests per user on tapes neither in use by an open job nor quarantined (held_back).
        "waiting": (f"SELECT r.user_id, count(r.id) FROM {req} r INNER JOIN {_table(Tape)} t ON t.id = r.tape_id"
                    f" WHERE r.state = '{S.QUEUED.value}' AND t.quarantined_at IS NULL AND r.tape_id NOT IN"
                    f" (SELECT tape_id FROM {job} WHERE state IN ({live_jobs}) AND tape_id IS NOT NULL)"
                    " GROUP BY r.user_id"),
        # A request in flight in a job the loop no longer follows (or in none).
        "orphan": (f"SELECT r.id, r.path, r.state, j.state FROM {req} r LEFT JOIN {job} j ON j.id = r.job_id"
                   f" WHERE r.state IN ({in_flight}) AND (j.state IS NULL OR j.state NOT IN ({live_jobs}))"
                   " ORDER BY r.id LIMIT 1"),
    }


# The schedule ---------------------------------------------------------------------------------

@dataclass
class Schedule:
    seed: int
    drives: int
    files: dict  # path -> library.File
    tapes: dict  # label -> [paths] in tape order
    groups: dict  # name -> weight
    users: dict  # name -> (group, cap or None)
    events: list  # (t, kind, args) by time
    windows: dict  # fault -> [(start, end)]
    faults_end: float
    horizon: float


def _library_files(rng):
    """A few LTO-8 tapes of small files, mostly back to back (streamed), sometimes with gaps."""
    files, tapes = {}, {}
    for t in range(rng.randint(2, 5)):
        label = f"T{t:02d}"
        offset, paths = rng.randrange(0, 200) * 1000 * MB, []
        for i in range(rng.randint(5, 30)):
            size = rng.randint(20, 200) * MB
            path = f"/data/run{t}/f{i:04d}"
            files[path] = File(path, label, "LTO-8", offset, size)
            paths.append(path)
            offset += size + (rng.randint(1, 2000) * 1000 * MB if rng.random() < 0.03 else 0)
        tapes[label] = paths
    return files, tapes


def schedule(seed):
    rng = random.Random(seed)
    files, tapes = _library_files(rng)
    groups = {f"g{i}": rng.choice([1, 1, 2, 3]) for i in range(rng.randint(2, 3))}
    users = {}
    for i, name in enumerate(("alice", "bob", "charlie", "dave", "erin")[:rng.randint(3, 5)]):
        users[name] = (f"g{i % len(groups)}", rng.choice([None, None, None, 10, 30]))
    horizon = rng.choice([2, 6, 12, 24, 48]) * 3600.0
    faults_end = horizon * rng.uniform(0.5, 0.8)
    windows = {}
    for fault in rng.sample(FAULTS, rng.randint(1, 4)):
        start = rng.uniform(0, faults_end)
        windows[fault] = [(start, min(faults_end, start + rng.choice([120, 600, 1800, 3600, 4 * 3600])))]
    names = sorted(users)
    events = []

    def at():
        return rng.uniform(0, horizon)

    labels = sorted(label for label in tapes if not label.startswith("B"))
    for _ in range(rng.randint(1, 3)):
        # A dataset: a run of files written together, so lying together on a tape.
        chosen = []
        for label in rng.sample(labels, rng.choice([1, 1, 2])):
            run = tapes[label]
            first = rng.randrange(len(run))
            chosen += run[first:first + rng.randint(1, 6)]
        options = {"pin_s": rng.choice([None, None, None, 3600, 6 * 3600, 86400]),
                   "destination": rng.random() < 0.3, "notify": rng.random() < 0.3,
                   "deadline_s": rng.choice([None, None, None, None, 1800, 4 * 3600])}
        events.append((at(), "submit", (rng.choice(names), chosen, options)))
    later = ["resubmit", "ask_others", "cancel_bulk", "cancel_paths", "release", "retention", "operator",
             "operator"]
    for _ in range(rng.randint(2, 4)):
        events.append((at(), rng.choice(later), (rng.choice(names), rng.random())))
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        # Before or after a step of the cycle, or inside a stager call; restarted after a while.
        where = rng.choice(["before", "after", "stager"])
        if where == "stager":
            where = rng.choice(["submit", "poll", "locate", "status"])
        events.append((rng.uniform(0, faults_end), "crash", (rng.choice(CYCLE_STEPS), where,
                                                             rng.choice([10, 60, 300, 900]))))
    for _ in range(rng.choice([0, 0, 1])):
        events.append((rng.uniform(0, faults_end), "crash_worker", ()))
    for _ in range(rng.choice([0, 0, 1])):
        events.append((rng.uniform(0, faults_end), "race_cancel", ()))
    events.append((faults_end, "faults_end", ()))
    events.sort(key=lambda e: e[0])
    return Schedule(seed=seed, drives=rng.randint(1, 4), files=files, tapes=tapes, groups=groups, users=users,
                    events=events, windows=windows, faults_end=faults_end, horizon=horizon)


# The fakes ------------------------------------------------------------------------------------

_current = None  # the Simulation running (the mail backend and the delivery plugin find it here)


class FaultyStager(SimulatedStager):
    """The simulated library behind faults: outages, timeouts, garbage, lost stage requests,
    drive errors, "try later"; and the simulator's eyes on what is sent, withdrawn and released."""

    def __init__(self, sim):
        super().__init__(library=sim.library, files=sim.schedule.files, clock=lambda: sim.t)
        self.sim = sim

    def _gate(self, call):
        sim = self.sim
        if sim.active("down"):
            raise StagerUnavailable(f"{call}: connection refused (simulated outage)")
        if sim.active("flaky") and sim.rng.random() < 0.3:
            raise StagerUnavailable(f"{call}: timed out (simulated)")
        if sim.crash_in == call:
            sim.crash_in = None
            raise Crash(f"the process died during {call}")

    def locate(self, paths):
        self._gate("locate")
        answers = super().locate(paths)
        if self.sim.active("try_later"):
            answers = [LocateError(a.path, "transient", "try later") if self.sim.rng.random() < 0.5 else a
                       for a in answers]
        return answers

    def submit(self, job):
        sim = self.sim
        again = job.id in sim.tried  # the same job again (its answer was lost): not a new send
        sim.tried.add(job.id)
        if sim.active("down"):
            raise StagerUnavailable("submit: connection refused (simulated outage)")
        if not again:
            sim.check_sent(job)
        if sim.race_cancel:
            # A user's cancel commits while the loop is inside submit() (another process).
            sim.race_cancel = False
            services.request_cancel(queryset=RestoreRequest.objects.filter(job_id=job.id, path__in=job.paths[:1]),
                                    now=sim.now())
        if sim.active("lossy") and sim.rng.random() < 0.3:
            sim.lost[job.id] = sim.rng.choice(["unknown", "stuck"])
        else:
            if sim.active("drive_errors"):
                sim.failing.update((job.id, p) for p in job.paths if sim.rng.random() < 0.2)
            super().submit(job)
        sim.sent_jobs += 1
        if sim.crash_in == "submit":  # taken by the library, the answer never read
            sim.crash_in = None
            raise Crash("the process died waiting for submit()'s answer")
        if sim.active("flaky") and sim.rng.random() < 0.3:
            raise StagerUnavailable("submit: timed out after the library took it (simulated)")
        return f"sim-{job.id}"

    def poll(self, jobs):
        sim = self.sim
        self._gate("poll")
        answers = super().poll([j for j in jobs if j.id not in sim.lost])
        for spec in jobs:
            if sim.lost.get(spec.id) == "stuck":
                answers[spec.id] = [FileStatus(p, "queued") for p in spec.paths]
        for job_id, statuses in answers.items():
            answers[job_id] = [FileStatus(st.path, "failed", "transient", "drive error reading the file (simulated)")
                               if st.state == "done" and (job_id, st.path) in sim.failing else st
                               for st in statuses]
        if sim.active("garbage") and sim.rng.random() < 0.5:
            kind = sim.rng.randrange(4)
            if kind == 0:
                return [answers]  # not a mapping at all
            if kind == 1:
                return {"no-such-job": [FileStatus("/nowhere", "done")], **answers}
            if kind == 2:
                return {j: [FileStatus(st.path, "exploded") for st in sts] for j, sts in answers.items()}
            return {j: [FileStatus(st.path + "/garbage", "done") for st in sts] for j, sts in answers.items()}
        return answers

    def cancel(self, backend_id, paths):
        self._gate("cancel")
        self.sim.withdrawn.update((backend_id.removeprefix("sim-"), p) for p in paths)
        super().cancel(backend_id, paths)

    def release(self, backend_id, paths):
        # Called from the loop's sender thread: no database here; checked after the step.
        self._gate("release")
        self.sim.releases.append((self.sim.t, list(paths)))

    def status(self):
        self._gate("status")
        return super().status()


class FaultyDelivery(Delivery):
    """Copies that fail while the fault is on; every copy checks that its request still wants it."""

    def filesystem(self, destination):
        return "/" + destination.strip("/").split("/", 1)[0]

    def deliver(self, source, target, *, root):
        sim = _current
        waiting = sim.check_delivered(source, target)
        if sim.crash_in == "deliver":
            sim.crash_in = None
            raise Crash("the worker died delivering")
        if sim.active("delivery_fails") and sim.rng.random() < 0.5:
            # A failure: the file may be staged again (a second read is then no defect).
            sim.failing.update((str(job), path) for job, path in waiting)
            raise DeliveryError("the destination file system did not answer (simulated)")


class MailBackend(BaseEmailBackend):
    """A mail server that hangs while the fault is on (the hang is its timeout, at once)."""

    def send_messages(self, messages):
        if _current is not None and _current.active("mail_hangs"):
            raise TimeoutError("the mail server did not answer (simulated)")
        if _current is not None:
            _current.mails += len(messages)
        return len(messages)


# The simulation -------------------------------------------------------------------------------

class Simulation:
    def __init__(self, seed, *, plant=None):
        self.seed = seed
        self.schedule = schedule(seed)
        self.rng = random.Random(f"faults/{seed}/run")  # the faults' draws, apart from the schedule's
        self.plant = plant  # a test's hook: called with the simulation after each step
        self.t = 0.0
        self.step = 0
        self.cycles = 0
        self.library = Library(drives={"LTO-8": self.schedule.drives}, now=0.0)
        self.stager = FaultyStager(self)
        self.faults_on = True
        self.crash_in = None  # a stager call that dies this cycle
        self.restart_at = 0.0  # a crashed loop runs again from then
        self.restart_s = 10.0  # how long a crashed loop takes to come back
        self.crash_step = None  # (step name, "before" or "after") for the next cycle
        self.worker_crash = False
        self.outbox = []  # tasks sent on commit, for the simulated worker
        self.lost, self.failing, self.withdrawn = {}, set(), set()
        self.tried = set()  # job ids submit() was called with
        self.race_cancel = False  # a cancel to commit during the next submit()
        self.sent_for = {}  # (job id, path) -> request ids sent in it
        self.read_by = {}  # request id -> (job id, path) of its last read
        self.reads_seen = 0
        self.released = {}  # (user id, path) -> when the user released it
        self.releases = []  # (t, paths) the stager was asked to release, to check
        self.pin_of = {}  # bulk id -> pin lifetime in seconds
        self.retention_cutoff = None  # the latest cutoff retention pruned with
        self.why_not = ""
        self.starved = 0  # cycles in a row that sent nothing while they could have
        self.sent_jobs = 0
        self.mails = 0
        self.bulks = {}  # user -> [Bulk]
        self.users = {}
        self.sql = _sql()

    # Helpers ----------------------------------------------------------------------------------

    def active(self, fault):
        return self.faults_on and any(a <= self.t < b for a, b in self.schedule.windows.get(fault, ()))

    def now(self):
        return EPOCH + timedelta(seconds=self.t)

    def fail(self, invariant, detail):
        raise Violation(self.seed, self.step, invariant, detail)

    def _send_on_commit(self, name, *args, robust=False, refused=None):
        def send():
            if self.active("broker_refuses"):
                if refused is not None:
                    refused()
                return  # lost: the cycle's fallback does the work
            self.outbox.append((name, args))

        transaction.on_commit(send, robust=robust)

    # The run ----------------------------------------------------------------------------------

    def run(self):
        global _current
        began = time.perf_counter()
        violation = None
        with ExitStack() as stack:
            stack.enter_context(override_settings(
                EMAIL_BACKEND="carousel.sim.faults.MailBackend",
                CAROUSEL_DELIVERIES={"faults": "carousel.sim.faults.FaultyDelivery"}, CAROUSEL_DELIVERY="faults",
                CAROUSEL_DELIVERY_OPTIONS={}, CAROUSEL_DESTINATION_ROOTS=["/gpfs"],
                CAROUSEL_INTAKE_ABOVE=INTAKE_ABOVE,
                CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                    "LOCATION": f"carousel-faults-{self.seed}"}}))
            stack.enter_context(mock.patch.object(queue, "send_on_commit", self._send_on_commit))
            # The cycle's wall-clock duration, for the metrics: noise in a simulation on a
            # simulated clock (no invariant reads it), and a transaction of its own each cycle.
            stack.enter_context(mock.patch.object(cycle_module.metrics, "record_cycle", lambda seconds: None))
            _current = self
            try:
                cache.clear()
                self._setup()
                self._loop()
            except Violation as exc:
                violation = exc
            finally:
                _current = None
        return Result(seed=self.seed, steps=self.step, cycles=self.cycles, violation=violation,
                      simulated_s=self.t, wall_s=time.perf_counter() - began,
                      counts={"sent_jobs": self.sent_jobs, "lost": len(self.lost), "mails": self.mails})

    def _setup(self):
        from django.contrib.auth.models import Group, User

        if RestoreRequest.objects.exists():
            raise replay.ReplayError("the database already holds requests: a fault run needs an empty one")
        self.control = Control.get()
        # The database is fresh (no requests, no users): each row is created, in one statement
        # per table (a seed's setup by get_or_create cost more queries than its first cycles).
        groups = dict(zip(self.schedule.groups, Group.objects.bulk_create(
            [Group(name=name) for name in self.schedule.groups])))
        GroupShare.objects.bulk_create([GroupShare(group=groups[name], weight=weight)
                                        for name, weight in self.schedule.groups.items()])
        users = User.objects.bulk_create([User(username=name, email=f"{name}@example.org")
                                          for name in self.schedule.users])
        User.groups.through.objects.bulk_create([
            User.groups.through(user_id=user.pk, group_id=groups[self.schedule.users[user.username][0]].pk)
            for user in users])
        Account.objects.bulk_create([Account(user=user, group=groups[group], inflight_cap=cap)
                                     for user, (group, cap) in zip(users, self.schedule.users.values())])
        for user in users:
            self.users[user.username] = user
            self.bulks[user.username] = []

    def _loop(self):
        period = Control.get().cycle_s
        events = list(self.schedule.events)
        self.last_event_t = events[-1][0]
        # Before the first event the database is empty: the first cycle is the tick that follows it.
        next_cycle = math.ceil(events[0][0] / period) * period
        end = self.last_event_t + DRAIN_S
        drain_cycles = 0
        while True:
            if events and events[0][0] <= next_cycle:
                self.t, kind, args = events.pop(0)
                self._event(kind, args)
                if not events:
                    # The operator after the last event too (it may have paused the loop after the
                    # faults stopped): the drain's cycles run with the loop unpaused.
                    self._morning_after()
                if kind not in ARMING_EVENTS:
                    # Something changed: the loop runs at its next tick (once restarted, after a crash).
                    next_cycle = max(min(next_cycle, math.ceil(self.t / period) * period), self.restart_at)
                self._worker()
            else:
                self.t = next_cycle
                report = self._cycle()
                # The worker runs what the cycle sent before the clock looks ahead: its calls to
                # the stager (withdrawals) meet the library at the cycle's time, not at the next
                # change the look-ahead ran it to.
                self._worker()
                next_cycle = self._next_cycle(report, period, events)
                if report is None:  # the process died: it is restarted a while later
                    self.restart_at = self.t + max(period, self.restart_s)
                    next_cycle = max(next_cycle or self.restart_at, self.restart_at)
                if not events:
                    drain_cycles += 1
                    if self._all_final():
                        return
                    # Judged only once the drain time has passed (or after too many cycles): with
                    # nothing due before then, the clock jumps to its end, where every time limit
                    # of the loop has run out, and the cycle there has its chance.
                    if self.t >= end or drain_cycles > DRAIN_CYCLES:
                        self._forgotten(report)
                    if next_cycle is None or next_cycle > end:
                        next_cycle = end
                if next_cycle is None:
                    next_cycle = events[0][0] if events else end
            self._check()

    def _event(self, kind, args):
        self.step += 1
        if kind == "faults_end":
            self.faults_on = False
            self.crash_step = self.crash_in = None
            self.worker_crash = self.race_cancel = False
            self._morning_after()
            return
        if kind == "crash":
            step, where, self.restart_s = args
            if where in ("before", "after"):
                self.crash_step = (step, where)
            else:
                self.crash_in = where
            return
        if kind == "crash_worker":
            self.worker_crash = True
            return
        if kind == "race_cancel":
            self.race_cancel = True
            return
        if kind == "retention":
            older = timedelta(days=self.rng.choice([0, 0, 0.25, 1]))
            prune(now=self.now(), older_than=older)
            cutoff = self.now() - older
            self.retention_cutoff = max(self.retention_cutoff or cutoff, cutoff)
            return
        if kind == "operator":
            self._operator(args[1])
            return
        name = args[0]
        user = self.users[name]
        before = self._others(user)
        getattr(self, f"_user_{kind}")(name, user, *args[1:])
        if self._others(user) != before:
            self.fail("one user's action changed another user's request",
                      f"{name}'s {kind}: {before} became {self._others(user)}")

    def _morning_after(self):
        """The operator after the bad week (and after the last event): the loop unpaused,
        quarantined tapes back in service."""
        Control.objects.filter(id=1).update(paused=False)
        services.tape_lift_quarantine(queryset=Tape.objects.all())

    def _operator(self, draw):
        rng = self.rng
        choice = int(draw * 6)
        if choice == 0:
            Control.objects.filter(id=1).update(paused=not Control.get().paused)
        elif choice == 1:
            Control.objects.filter(id=1).update(default_user_cap=rng.choice([20, 50, 2500]))
        elif choice == 2:
            Control.objects.filter(id=1).update(default_group_cap=rng.choice([30, 100, 5000]))
        elif choice == 3:
            GroupShare.objects.filter(group__name=rng.choice(sorted(self.schedule.groups))).update(
                weight=rng.choice([0.5, 1, 4]))
        elif choice == 4:
            Control.objects.filter(id=1).update(drives=rng.choice([0, 0, 1, 2]))
        else:
            Account.objects.filter(user__username=rng.choice(sorted(self.users))).update(
                inflight_cap=rng.choice([None, 10, 30]))

    # Users ------------------------------------------------------------------------------------

    def _submit(self, name, user, paths, options):
        now = self.now()
        kwargs = {"notify": options.get("notify", False)}
        if options.get("pin_s"):
            kwargs["pin_lifetime"] = timedelta(seconds=options["pin_s"])
        if options.get("deadline_s"):
            kwargs["deadline"] = now + timedelta(seconds=options["deadline_s"])
        if options.get("destination"):
            kwargs["destination"] = f"/gpfs/{name}/restored"
        result = services.restore_submit(user=user, paths=paths, now=now, **kwargs)
        self.bulks[name].append((result.bulk, paths, options))
        if options.get("pin_s"):
            self.pin_of[result.bulk.pk] = options["pin_s"]

    def _user_submit(self, name, user, paths, options):
        self._submit(name, user, paths, options)

    def _user_resubmit(self, name, user, draw):
        mine = self.bulks[name]
        if mine:
            _, paths, options = mine[int(draw * len(mine))]
            self._submit(name, user, paths, options)

    def _user_ask_others(self, name, user, draw):
        theirs = [b for other, bulks in sorted(self.bulks.items()) if other != name for b in bulks]
        if theirs:
            _, paths, options = theirs[int(draw * len(theirs))]
            self._submit(name, user, paths[:40], {**options, "deadline_s": None})

    def _user_cancel_bulk(self, name, user, draw):
        mine = self.bulks[name]
        if mine:
            bulk = Bulk.objects.filter(pk=mine[int(draw * len(mine))][0].pk).first()
            if bulk is not None:
                services.bulk_cancel(bulk=bulk, now=self.now())

    def _user_cancel_paths(self, name, user, draw):
        mine = self.bulks[name]
        if mine:
            _, paths, _ = mine[int(draw * len(mine))]
            some = paths[:max(1, len(paths) // 2)]
            services.request_cancel(queryset=RestoreRequest.objects.filter(
                user=user, path_key__in=[path_key(p) for p in some]), now=self.now())

    def _user_release(self, name, user, draw):
        mine = self.bulks[name]
        if mine:
            _, paths, _ = mine[int(draw * len(mine))]
            for path in paths:
                self.released[(user.pk, path)] = self.t
            pins.release_pins(user=user, paths=paths, now=self.now())

    def _others(self, user):
        """What another user's requests look like: per state, how many, pinned, last changed."""
        return sorted((state, n, pinned, read_moment(changed))
                      for state, n, pinned, changed in _query(self.sql["others"], [user.pk]))

    # The loop ---------------------------------------------------------------------------------

    def _cycle(self):
        self.step += 1
        self.cycles += 1
        sent_before = self.sent_jobs
        crashed = False
        with ExitStack() as stack:
            if self.crash_step:
                name, where = self.crash_step
                self.crash_step = None
                real = getattr(cycle_module, name)

                def dying(*args, **kwargs):
                    if where == "after":
                        real(*args, **kwargs)
                    raise Crash(f"the process died {where} {name}")

                stack.enter_context(mock.patch.object(cycle_module, name, dying))
            try:
                report = cycle_module.run_cycle(now=self.now(), stager=self.stager)
            except Crash:
                crashed, report = True, None
        if report is not None and report.skipped:
            raise replay.ReplayError("the cycle was skipped: another process holds the loop's lock")
        self._liveness(report, sent=self.sent_jobs > sent_before, crashed=crashed)
        if not crashed:
            self._no_orphans()
        return report

    def _next_cycle(self, report, period, events):
        """The next tick at which something may change (idle stretches skipped); None: nothing due."""
        now = self.t
        soon = now + period
        if report is None or report.error or report.requeued or report.expired or report.preempted:
            return soon
        # After locating and sending, the next tick has more to do only if work is left that
        # the loop may locate, claim or send (a cap, a choice per cycle, a job on a chain);
        # what was sent shows its progress at the library's next change.
        if (report.located or report.submitted) and _query(self.sql["more_to_send"])[0][0]:
            return soon
        # Deliveries the cycle dispatched were run by the worker since: the next tick has more
        # to dispatch only if some wait for room (deliveries_per_fs). While the message broker
        # refuses tasks, a dispatch is refused again at each tick until it comes back: nothing
        # to see until then (its end wakes the loop).
        if report.delivering and not self.active("broker_refuses") and _query(self.sql["undispatched"])[0][0]:
            return soon
        # Stager calls: more are due now than a cycle sends (later ones are moments below).
        if report.stager_calls and _query(self.sql["calls_due"],
                                          [connection.ops.adapt_datetimefield_value(self.now())])[0][0]:
            return soon
        if replay.next_change(self.library, horizon=soon) is not None:
            return soon
        # The control row as _setup read it: of its fields, the simulated operator changes only
        # the pause, caps and drives, the loop only its last cycle's time and error, and none of
        # those is read here.
        control = self.control
        candidates = [replay._loop_deadline(control, now)]
        if events:
            candidates.append(events[0][0])
        # A fault's end may let work go on; its start changes nothing until the loop calls.
        for fault in WAKING_FAULTS:
            candidates += [b for a, b in self.schedule.windows.get(fault, ()) if b > now]
        pin, locate, lease, call = (read_moment(m) for m in _query(self.sql["firsts"])[0])
        moments = [pin, locate]
        if lease:
            moments.append(lease + timedelta(seconds=6 * 3600))
        moments.append(call)
        # Jobs' deadlines (carousel/loop/deadlines.py): marked overdue, given up a cycle later.
        for chain, sent_at, progress_at, estimate, overdue in _query(self.sql["sent_jobs"]):
            sent_at, progress_at = read_moment(sent_at), read_moment(progress_at)
            if overdue:
                candidates.append(now + period)
            elif sent_at:
                start = sent_at if chain else max(sent_at, progress_at or sent_at)
                moments.append(start + timedelta(seconds=max(control.job_deadline_floor_s,
                                                             control.job_deadline_factor * (estimate or 0))))
        # A second past each moment: the loop's comparisons are strict (past a deadline, a lease).
        candidates += [(m - EPOCH).total_seconds() + 1 for m in moments if m]
        candidates = [c for c in candidates if c is not None and c > now]
        horizon = min(candidates, default=now + DRAIN_S)
        change = replay.next_change(self.library, horizon=horizon)
        if change is not None:
            candidates.append(change)
        if not candidates:
            return None
        return max(soon, math.ceil(min(candidates) / period - 1e-9) * period)

    def _worker(self):
        """The worker runs the tasks the steps sent (none while it is down: they wait)."""
        if self.active("worker_down"):
            return
        while self.outbox:
            name, args = self.outbox.pop(0)
            now = self.now()
            if name == "carousel.tasks.settle_intake":
                intake.settle(args[0], now=now)
            elif name == "carousel.tasks.deliver":
                if self.worker_crash:
                    self.worker_crash = False
                    self.crash_in = "deliver"
                try:
                    deliver_requests(args[0], now=now)
                except Crash:
                    pass
            elif name == "carousel.tasks.send_notices":
                services.bulk_notify_complete(now=now)
            elif name == "carousel.tasks.withdraw":
                send_stager_calls(now=now, stager=self.stager)

    def _all_final(self):
        return not RestoreRequest.objects.filter(state__in=ACTIVE_STATES).exists() and not Intake.objects.exists()

    def _forgotten(self, report):
        left = dict(RestoreRequest.objects.filter(state__in=ACTIVE_STATES).order_by().values_list("state")
                    .annotate(n=Count("id")))
        self.fail("every request reaches a final state once the faults stop",
                  f"{left} still active, {Intake.objects.count()} in the intake, "
                  f"{(self.t - self.last_event_t) / 3600:.1f} h after the last event (its last cycle "
                  f"{'sent something' if report is not None and report.submitted else 'sent nothing'}); stager "
                  f"{StagerHealth.get().state}, control paused={Control.get().paused}")

    # Invariants -------------------------------------------------------------------------------

    def check_sent(self, job):
        """A job being sent: each of its files is wanted by a request in flight in it."""
        rows = list(RestoreRequest.objects.filter(job_id=job.id).values_list("id", "path", "state"))
        wanted = {p for _, p, s in rows if s in IN_FLIGHT_STATES}
        unwanted = [p for p in job.paths if p not in wanted]
        if unwanted:
            self.fail("no cancelled or released request is sent",
                      f"job {job.id} sends {len(unwanted)} file(s) no request in flight wants, e.g. {unwanted[0]}")
        for rid, path, state in rows:
            if state in IN_FLIGHT_STATES:
                self.sent_for.setdefault((job.id, path), set()).add(rid)

    def check_delivered(self, source, target):
        """[(job id, path)] of the requests waiting for this delivery; none is a violation."""
        waiting = [(job, path) for job, path, destination, layout in RestoreRequest.objects.filter(
                       staged_path=source, state=S.DELIVERING).values_list("job_id", "path", "destination",
                                                                           "destination_layout")
                   if delivery_target(destination, layout, path) == target]
        if not waiting:
            self.fail("no cancelled or released request is delivered",
                      f"{source} delivered to {target} for no request waiting for it")
        return waiting

    def check_release(self, t, paths):
        """No request done with a pin still running on these paths (the simulator's own account
        of pins: done at finished_at, for its submission's lifetime, unless its user released it)."""
        for rid, user_id, path, bulk_id, finished, lifetime in RestoreRequest.objects.filter(
                state=S.DONE, path__in=list(paths), pin_lifetime__isnull=False).values_list(
                "id", "user_id", "path", "bulk_id", "finished_at", "pin_lifetime"):
            ends = (finished - EPOCH).total_seconds() + lifetime.total_seconds()
            released = self.released.get((user_id, path))
            if ends > t and not (released is not None and released >= (finished - EPOCH).total_seconds()):
                self.fail("no live pin is released",
                          f"{path} released while request {rid} is pinned for {ends - t:.0f} s more")

    def _reads(self):
        reads = self.library.reads
        for _, job, path, _ in reads[self.reads_seen:]:
            for rid in self.sent_for.get((job, path), ()):
                before = self.read_by.get(rid)
                if before is not None and before != (job, path) and before not in self.failing and before[0] not in self.lost:
                    self.fail("no file is read twice for one request (except after a failure or a lost job)",
                              f"request {rid}: {path} read in job {before[0]}, then again in job {job}")
                self.read_by[rid] = (job, path)
        self.reads_seen = len(reads)

    def _left_at_stager(self):
        """A file the library still has to read for a job must be wanted by a request in flight
        in that job, or have a withdrawal recorded (or sent)."""
        waiting = [(job, path) for job, states in self.library.jobs.items() if job not in self.lost
                   for path, state in states.items() if state in (LIB_QUEUED, LIB_STAGING)]
        if not waiting:
            return
        on_drive = {(d.current[0], d.current[1]) for d in self.library.drives if d.current}
        waiting = [w for w in waiting if w not in on_drive and w not in self.withdrawn]
        if not waiting:
            return
        jobs = {job for job, _ in waiting}
        # A job still pending (its acknowledgement lost) is the loop's to send again and settle.
        jobs -= {str(j) for j in Job.objects.filter(id__in=jobs, state=JobState.PENDING).values_list("id", flat=True)}
        waiting = [(job, path) for job, path in waiting if job in jobs]
        if not waiting:
            return
        wanted = set(RestoreRequest.objects.filter(job_id__in=jobs, state__in=IN_FLIGHT_STATES)
                     .values_list("job_id", "path"))
        wanted = {(str(j), p) for j, p in wanted}
        calls = {(backend.removeprefix("sim-"), p) for backend, paths in StagerCall.objects.filter(
            kind=StagerCall.Kind.CANCEL).values_list("backend_id", "paths") for p in paths}
        for job, path in waiting:
            if (job, path) not in wanted and (job, path) not in calls:
                self.fail("no cancelled or released request is left at the stager",
                          f"{path} of job {job} waits to be read, no request wants it and no withdrawal is recorded")

    def _no_orphans(self):
        """After a cycle that ran through: a request in flight is in a job the loop follows."""
        lost = _query(self.sql["orphan"])
        if lost:
            row = lost[0]
            self.fail("a request not final is so for a reason the broker can name",
                      f"request {row[0]} ({row[1]}) is {row[2]} in a job that is {row[3]}")

    def _accounted(self):
        """Each submission's files: its own requests, the ones it asked for again, its intake rows;
        and the intake holds what the submissions say is pending. One statement (raw SQL: the
        checks run after every step, and the ORM's compiling would cost more than the loop)."""
        with connection.cursor() as cursor:
            cursor.execute(self.sql["accounted"])
            rows = cursor.fetchall()
        for bulk_id, files, counted in rows:
            if bulk_id is None:
                self.fail("every submitted request is in exactly one state (none forgotten)",
                          f"{files} intake rows, {counted} files pending in submissions")
            bulk = Bulk.objects.filter(pk=bulk_id).first()
            if self.retention_cutoff is not None and bulk.created_at < self.retention_cutoff:
                continue  # retention pruned some of its finished requests
            self.fail("every submitted request is in exactly one state (none forgotten)",
                      f"submission {bulk_id} of {files} file(s) accounts for {counted} (own requests, again, "
                      "in the intake)")

    def _counters(self):
        """The trigger-kept counters against a recount, in one statement."""
        with connection.cursor() as cursor:
            cursor.execute(self.sql["counters"])
            drift = cursor.fetchone()
        if any(drift):
            names = ("per user and state", "backlog per user", "backlog per user and tape")
            self.fail("the counters equal a recount",
                      ", ".join(f"{name}: {n} row(s) differ" for name, n in zip(names, drift) if n))

    def _liveness(self, report, *, sent, crashed):
        """While work waits, the stager answers and a drive is free, something goes out within
        two cycles, unless a rule holds it back (named)."""
        if sent or crashed or report is None or report.error or any(
                self.active(f) for f in ("down", "flaky", "garbage", "lossy")):
            self.starved = 0
            return
        rule = self.held_back()
        if rule:
            self.starved = 0
            return
        self.starved += 1
        if self.starved > 2:
            self.fail("while work waits, the stager answers and a drive is free, something is sent within two cycles",
                      f"{self.starved} cycles sent nothing; no rule holds it back: {self.why_not}")

    def held_back(self):
        """The rule that holds work back now, named; "" when none does (work waits, the stager
        answers, a drive is free)."""
        idle = sum(1 for d in self.library.drives if d.phase == "idle")
        if not idle or self.library.queue:
            return "no drive is free"
        waiting = dict(_query(self.sql["waiting"]))
        if not waiting:
            return "no work waits (or only on tapes in use or quarantined)"
        control = Control.get()
        if control.paused:
            return "operator pause"
        busy_tapes = set(Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT)).values_list(
            "tape_id", flat=True))
        ready = RestoreRequest.objects.filter(READY, tape__quarantined_at__isnull=True).exclude(
            tape_id__in=[t for t in busy_tapes if t is not None])
        health = StagerHealth.get()
        if health.state != "healthy":
            return f"the stager is judged {health.state} ({health.reason})"
        open_jobs = Job.objects.filter(state__in=(JobState.PENDING, JobState.SENT))
        limit = health.jobs_limit or control.jobs_in_flight
        if open_jobs.count() >= limit:
            return "the adaptive jobs limit"
        if control.drives and open_jobs.values("tape_id").distinct().count() >= control.drives:
            return "the operator's drive count"
        rule = self.wear_hold(ready, open_jobs, control)
        if rule:
            return rule
        in_flight = dict(RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).order_by()
                         .values_list("user_id").annotate(n=Count("id")))
        group_in_flight = dict(RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).order_by()
                               .values_list("group_id").annotate(n=Count("id")))
        accounts = {a.user_id: a for a in Account.objects.filter(user_id__in=list(waiting)).select_related("group")}
        group_caps = dict(GroupShare.objects.values_list("group_id", "inflight_cap"))
        backlog = dict(RestoreRequest.objects.filter(READY).order_by().values_list("user_id").annotate(n=Count("id")))
        for user_id in waiting:
            account = accounts.get(user_id)
            cap = account.inflight_cap if account and account.inflight_cap is not None else control.default_user_cap
            group = account.group_id if account else None
            group_cap = group_caps.get(group) or control.default_group_cap
            # A user at their cap refills by whole jobs (policies/selection.py): N files, or all they have left.
            room = cap - in_flight.get(user_id, 0)
            if room >= min(control.files_per_job, backlog.get(user_id, 0), cap) and room > 0 and (
                    group is None or group_in_flight.get(group, 0) < group_cap):
                self.why_not = (f"ready on free tapes per user {waiting}, in flight per user {in_flight} and group "
                                f"{group_in_flight}; user {user_id} cap {cap}, group {group} cap {group_cap}; "
                                f"open jobs {open_jobs.count()} of {limit}; drives idle {idle}, control drives "
                                f"{control.drives}")
                return ""
        return "user or group caps"

    def wear_hold(self, ready, open_jobs, control):
        """The wear rule (carousel/loop/wear.py) that holds every tape with ready work back, named,
        or "": only while each of the broker's drive chains has open work (the planner holds a
        new mount only while other work can use the drive), asking the planner's own rule."""
        chains = set(open_jobs.exclude(chain="").values_list("chain", flat=True).distinct())
        if len(chains) < len(self.library.drives):
            return ""
        rules = wear.WearRules.of(control)
        now = self.now()
        tapes = list(ready.order_by().values_list("tape_id").annotate(
            n=Count("id"), b=Sum("size"), oldest=Min("created_at"), priority=Max("priority")))
        unmounted = last_unmounts([t[0] for t in tapes], since=now - timedelta(seconds=rules.remount_delay_s))
        big = any(rules.big_enough(n, b or 0) for _, n, b, _, _ in tapes)
        names = set()
        for tape, n, b, oldest, priority in tapes:
            at = unmounted.get(tape)
            rule = wear.hold(files=n, nbytes=b or 0, oldest_age_s=(now - oldest).total_seconds(), priority=priority,
                             unmounted_s_ago=None if at is None else (now - at).total_seconds(), rules=rules)
            if not rule or (rule == wear.MIN_MOUNT and not big and not self._big_planned(rules)):
                return ""
            names.add(rule)
        return (f"a wear rule ({', '.join(sorted(names))}, carousel/loop/wear.py) holds every waiting tape back "
                "while other work is planned on each drive")

    @staticmethod
    def _big_planned(rules):
        sizes = RestoreRequest.objects.filter(state__in=IN_FLIGHT_STATES).order_by().values_list("tape_id").annotate(
            n=Count("id"), b=Sum("size")).values_list("n", "b")
        return any(rules.big_enough(n, b or 0) for n, b in sizes)

    def _check(self):
        self._reads()
        while self.releases:
            self.check_release(*self.releases.pop(0))
        self._accounted()
        self._counters()
        self._left_at_stager()
        if self.plant is not None:
            self.plant(self)


def run_seed(seed, *, plant=None):
    """Run one seed in the current database (empty of requests); return its Result."""
    return Simulation(seed, plant=plant).run()
