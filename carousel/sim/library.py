"""The simulated tape library: drives, robots and cartridges, driven by events.

It behaves as "How the simulated library behaves" in tape-physics.md says, and no cleverer, so
that every gain in a replay comes from what the broker sends and when:

- a job is an ordered list of files; its files on several tapes are split per tape, in order;
- a free drive takes the oldest queued job whose tape is in no drive (and whose technology is
  the drive's), and a robot mounts the tape;
- a job for a tape already in a drive joins that drive's work, after what it has (until the
  drive starts putting the tape away: then it waits in the queue for the tape to come back);
- a drive reads its files in the order given; with nothing left it rewinds, unloads, a robot
  puts the cartridge back, and the drive is free;
- cancelling a queued file removes it; the file being located or read finishes.

A mount is: robot fetch, load, then per file a locate (none when streaming on) and a read, then
rewind, unload, robot put-back; every time comes from carousel/tape.py. A robot is held for
each cartridge move; drives wait for one in turn. Pure and deterministic: the time is an
argument (advance(to)), simultaneous events go in drive order, and the whole state turns into
plain JSON and back (the live stager keeps it in a file).
"""
import random
from collections import deque
from dataclasses import dataclass, field, replace

from carousel.tape import MEDIA, locate_s, read_s, rewind_s

DEFAULT_ROBOTS = 4
DEFAULT_EXCHANGE_S = 11.0  # BNL's SL8500 figure, tape-physics.md

IDLE = "idle"
ROBOT_WAIT = "robot-wait"
FETCH = "fetch"
LOAD = "load"
LOCATE = "locate"
READ = "read"
REWIND = "rewind"
UNLOAD = "unload"
PUT_BACK = "put-back"
# A job for a tape in one of these phases joins the drive's work (so does one waiting for the
# robot to fetch it); later, the tape is on its way out.
JOINABLE = frozenset({FETCH, LOAD, LOCATE, READ})
BUSY_PHASES = frozenset({FETCH, LOAD, LOCATE, READ, REWIND, UNLOAD, PUT_BACK})

QUEUED, STAGING, DONE, FAILED, CANCELLED = "queued", "staging", "done", "failed", "cancelled"


# The constants of the locate model (carousel/tape.py) that a departed library draws per tape.
LOCATE_CONSTANTS = ("c_fixed_s", "locate_speed_m_s", "rewind_fixed_s", "c_wrap_s", "c_band_s", "c_direction_s",
                    "c_back_s")


@dataclass(frozen=True)
class Mismatch:
    """A library whose physics departs from the model the broker plans with (tape-physics.md's
    figures are nominal; real cartridges and drives differ). Per tape, each locate constant is
    scaled by its own factor in [1 - P, 1 + P] and the bytes a wrap holds by one in
    [1 - P/15, 1 + P/15] (data reaches tape compressed already, so a wrap holds close to its
    nominal bytes; files deep in the tape then lie at other wraps and places than the model
    says); per drive, the read rate by a factor in [1 - P/3, 1 + P/3]. Each factor is drawn
    from the seed and the tape's label (or the drive's name) alone, so the same seed gives the
    same library whatever is sent to it, in whatever order."""

    fraction: float
    seed: int

    def _draw(self, what, spread):
        # A string seed is hashed by random with SHA-512: stable across runs and processes.
        return 1.0 + random.Random(f"carousel-mismatch/{self.seed}/{what}").uniform(-spread, spread)

    def tape_media(self, media, tape):
        nominal = MEDIA[media]
        changes = {name: getattr(nominal, name) * self._draw(f"tape/{tape}/{name}", self.fraction)
                   for name in LOCATE_CONSTANTS}
        changes["bytes_per_wrap"] = max(1, round(nominal.bytes_per_wrap * self._draw(
            f"tape/{tape}/bytes_per_wrap", self.fraction / 15)))
        return replace(nominal, **changes)

    def read_rate_factor(self, drive_name):
        return self._draw(f"drive/{drive_name}/read_rate", self.fraction / 3)


@dataclass(frozen=True)
class File:
    path: str
    tape: str
    media: str
    offset: int
    size: int


@dataclass
class Drive:
    name: str
    media: str
    phase: str = IDLE
    since: float = 0.0
    until: float | None = None  # end of a timed phase; None while idle or waiting for a robot
    tape: str = ""
    after_robot: str = ""  # the robot move a waiting drive waits for: FETCH or PUT_BACK
    head: int = 0  # byte offset: the byte after the last one read
    current: list | None = None  # [job, path, offset, size] being located or read
    work: deque = field(default_factory=deque)  # [job, path, offset, size] still to read


@dataclass
class Segment:
    """One phase of one drive, for timelines and busy time."""

    drive: int
    phase: str
    start: float
    end: float
    tape: str


class Library:
    def __init__(self, *, drives, read_rate_mb_s=None, robots=DEFAULT_ROBOTS, exchange_s=DEFAULT_EXCHANGE_S,
                 now=0.0, record=True, mismatch=None):
        """`drives`: technology -> number of drives. `record`: keep every phase as a Segment and
        every read as (time, job, path, size); replays need them, the live library does not.
        `mismatch`: a Mismatch, or None for a library that works exactly as carousel/tape.py
        says (status() still shows the nominal figures: they are what a site would know)."""
        unknown = sorted(set(drives) - set(MEDIA))
        if unknown:
            raise ValueError(f"unknown drive technology {', '.join(unknown)}; known: {', '.join(MEDIA)}")
        self.drives = [Drive(name=f"{media} #{i + 1}", media=media, since=now)
                       for media, count in drives.items() for i in range(count)]
        self.read_rate_mb_s = read_rate_mb_s
        self.robots = robots
        self.exchange_s = exchange_s
        self.now = now
        self.record = record
        self.robots_busy = 0
        self.robot_queue = deque()  # drive indexes waiting for a robot, first come first served
        self.queue = []  # [seq, job, tape, media, items] in arrival order
        self.seq = 0
        self.jobs = {}  # job id -> {path: state}
        self.mounts = 0
        self.bytes_read = 0
        self.changes = 0  # file state changes made by events (reads ending, drives taking jobs)
        self.segments = []
        self.reads = []  # (end time, job, path, size)
        self.mount_log = []  # (time, tape label) of every mount, when recording: the wear per tape
        self.mismatch = mismatch
        self._departed = {}  # tape label -> its Media under the mismatch
        self._rate_factors = {}  # drive name -> its read rate factor under the mismatch

    # The broker's side --------------------------------------------------------------------

    def submit(self, job, files, failed=()):
        """Queue job `job` (an id, unique): `files` in reading order; `failed` paths are known
        to be unreadable (not in the catalogue). Sending the same id again changes nothing."""
        if job in self.jobs:
            return
        states = self.jobs[job] = {path: FAILED for path in failed}
        per_tape = {}
        for file in files:
            states[file.path] = QUEUED
            key = (file.tape, file.media)
            per_tape.setdefault(key, []).append([job, file.path, file.offset, file.size])
        for (tape, media), items in per_tape.items():
            drive = self._holding(tape)
            if drive is not None and (drive.phase in JOINABLE or drive.after_robot == FETCH):
                drive.work.extend(items)
                for item in items:
                    states[item[1]] = STAGING
            else:
                self.seq += 1
                self.queue.append([self.seq, job, tape, media, items])
        self._dispatch()

    def cancel(self, job, paths):
        """Withdraw queued files; one being located or read finishes."""
        states = self.jobs.get(job)
        if not states:
            return
        gone = {p for p in paths if states.get(p) in (QUEUED, STAGING)}
        for drive in self.drives:
            if drive.current and drive.current[0] == job:
                gone.discard(drive.current[1])
        if not gone:
            return
        for entry in self.queue:
            if entry[1] == job:
                entry[4] = [item for item in entry[4] if item[1] not in gone]
        self.queue = [entry for entry in self.queue if entry[4]]
        for drive in self.drives:
            drive.work = deque(item for item in drive.work if not (item[0] == job and item[1] in gone))
        for path in gone:
            states[path] = CANCELLED

    def state(self, job, path):
        """A file's state in a job ("queued", "staging", "done", "failed", "cancelled"), or None
        when the job or the file is unknown."""
        return self.jobs.get(job, {}).get(path)

    def forget(self, job):
        self.jobs.pop(job, None)

    # Time ---------------------------------------------------------------------------------

    def advance(self, to):
        """Process every event up to time `to` and stop there."""
        while True:
            drive = self._next_drive()
            if drive is None or drive.until > to:
                break
            self.now = drive.until
            self._end_phase(drive)
        self.now = max(self.now, to)

    def next_event(self):
        """The time of the next event, or None when nothing is under way."""
        drive = self._next_drive()
        return None if drive is None else drive.until

    def busy(self):
        """Anything under way or waiting."""
        return bool(self.queue) or any(d.phase != IDLE for d in self.drives)

    # What it shows ------------------------------------------------------------------------

    def status(self):
        drives = []
        for drive in self.drives:
            entry = {"name": drive.name, "media": drive.media, "tape": drive.tape, "activity": drive.phase,
                     "since_s": drive.since, "file": "", "progress": None, "queued_files": len(drive.work)}
            if drive.current:
                entry["file"] = drive.current[1]
                if drive.phase == READ and drive.until > drive.since:
                    entry["progress"] = min(1.0, (self.now - drive.since) / (drive.until - drive.since))
                else:
                    entry["progress"] = 0.0
            drives.append(entry)
        return {"drives": drives, "queued_files": sum(len(e[4]) for e in self.queue)
                + sum(len(d.work) for d in self.drives), "clock_s": self.now, "mounts": self.mounts,
                "robots": self.robots, "robots_busy": self.robots_busy, "exchange_s": self.exchange_s,
                "read_rate_mb_s": self.read_rate_mb_s}

    def busy_seconds(self, until=None):
        """Drive time spent mounting, positioning, reading and putting away, up to `until`."""
        until = self.now if until is None else until
        total = sum(max(0.0, min(s.end, until) - s.start) for s in self.segments if s.phase in BUSY_PHASES)
        for drive in self.drives:  # phases under way
            if drive.phase in BUSY_PHASES:
                total += max(0.0, min(self.now, until) - drive.since)
        return total

    # Inside -------------------------------------------------------------------------------

    def _next_drive(self):
        best = None
        for drive in self.drives:
            if drive.until is not None and (best is None or drive.until < best.until):
                best = drive
        return best

    def _holding(self, tape):
        for drive in self.drives:
            if drive.tape == tape:
                return drive
        return None

    def _set(self, drive, phase, seconds=None):
        if self.record and drive.phase != IDLE and self.now > drive.since:
            self.segments.append(Segment(self.drives.index(drive), drive.phase, drive.since, self.now, drive.tape))
        drive.phase, drive.since = phase, self.now
        drive.until = None if seconds is None else self.now + seconds

    def _dispatch(self):
        for drive in self.drives:
            if drive.phase != IDLE or not self.queue:
                continue
            held = {d.tape for d in self.drives if d.tape}
            first = next((e for e in self.queue if e[3] == drive.media and e[2] not in held), None)
            if first is None:
                continue
            tape = first[2]
            # Every queued job for this tape is now a job for a tape in a drive: it joins.
            taken = [e for e in self.queue if e[2] == tape]
            self.queue = [e for e in self.queue if e[2] != tape]
            drive.tape, drive.head = tape, 0
            self.changes += 1
            for item in self._work_of(taken):
                drive.work.append(item)
                self.jobs[item[0]][item[1]] = STAGING
            self.mounts += 1
            if self.record:
                self.mount_log.append((self.now, tape))
            self._robot(drive, FETCH)

    def _work_of(self, taken):
        """The items a drive reads, in its order, from the queued jobs `taken` for its tape:
        this library follows the jobs and their file order (the broker's read order)."""
        return [item for entry in taken for item in entry[4]]

    def _robot(self, drive, move):
        if self.robots_busy < self.robots:
            self.robots_busy += 1
            self._set(drive, move, self.exchange_s)
        else:
            drive.after_robot = move
            self._set(drive, ROBOT_WAIT)
            self.robot_queue.append(self.drives.index(drive))

    def _robot_free(self):
        self.robots_busy -= 1
        if self.robot_queue:
            drive = self.drives[self.robot_queue.popleft()]
            self.robots_busy += 1
            self._set(drive, drive.after_robot, self.exchange_s)
            drive.after_robot = ""

    def _physics(self, drive):
        """(the Media of the tape in this drive, the drive's read rate in MB/s or None for the
        technology's native one)."""
        if self.mismatch is None:
            return MEDIA[drive.media], self.read_rate_mb_s
        media = self._departed.get(drive.tape)
        if media is None:
            media = self._departed[drive.tape] = self.mismatch.tape_media(drive.media, drive.tape)
        factor = self._rate_factors.get(drive.name)
        if factor is None:
            factor = self._rate_factors[drive.name] = self.mismatch.read_rate_factor(drive.name)
        return media, (self.read_rate_mb_s or media.read_rate_mb_s) * factor

    def _end_phase(self, drive):
        media, rate = self._physics(drive)
        phase = drive.phase
        if phase == FETCH:
            self._set(drive, LOAD, media.load_s)
            self._robot_free()
        elif phase == LOAD:
            drive.head = 0
            self._next_file(drive, media, rate)
        elif phase == LOCATE:
            self._set(drive, READ, read_s(media, drive.current[3], rate))
        elif phase == READ:
            job, path, offset, size = drive.current
            drive.head = offset + size
            drive.current = None
            self.bytes_read += size
            self.changes += 1
            states = self.jobs.get(job)
            if states is not None and states.get(path) in (QUEUED, STAGING, CANCELLED):
                states[path] = DONE
            if self.record:
                self.reads.append((self.now, job, path, size))
            self._next_file(drive, media, rate)
        elif phase == REWIND:
            self._set(drive, UNLOAD, media.unload_s)
        elif phase == UNLOAD:
            self._robot(drive, PUT_BACK)
        elif phase == PUT_BACK:
            drive.tape, drive.head = "", 0
            self._set(drive, IDLE)
            self._robot_free()
            self._dispatch()

    def _next_file(self, drive, media, rate):
        if not drive.work:
            self._set(drive, REWIND, rewind_s(media, drive.head))
            return
        drive.current = drive.work.popleft()
        seconds = locate_s(media, drive.head, drive.current[2])
        if seconds > 0:
            self._set(drive, LOCATE, seconds)
        else:
            self._set(drive, READ, read_s(media, drive.current[3], rate))

    # Plain data ---------------------------------------------------------------------------

    def to_state(self):
        return {
            "drives": [dict(name=d.name, media=d.media, phase=d.phase, since=d.since, until=d.until, tape=d.tape,
                            after_robot=d.after_robot, head=d.head, current=d.current, work=list(d.work))
                       for d in self.drives],
            "read_rate_mb_s": self.read_rate_mb_s, "robots": self.robots, "exchange_s": self.exchange_s,
            "now": self.now, "record": self.record, "robots_busy": self.robots_busy,
            "robot_queue": list(self.robot_queue), "queue": self.queue, "seq": self.seq, "jobs": self.jobs,
            "mounts": self.mounts, "bytes_read": self.bytes_read, "changes": self.changes,
            "segments": [[s.drive, s.phase, s.start, s.end, s.tape] for s in self.segments],
            "reads": [list(r) for r in self.reads],
            "mount_log": [list(m) for m in self.mount_log],
            "mismatch": [self.mismatch.fraction, self.mismatch.seed] if self.mismatch else None,
        }

    @classmethod
    def from_state(cls, state):
        library = cls(drives={}, read_rate_mb_s=state["read_rate_mb_s"], robots=state["robots"],
                      exchange_s=state["exchange_s"], now=state["now"], record=state["record"],
                      mismatch=Mismatch(*state["mismatch"]) if state.get("mismatch") else None)
        library.drives = [Drive(**{**d, "work": deque(d["work"])}) for d in state["drives"]]
        library.robots_busy = state["robots_busy"]
        library.robot_queue = deque(state["robot_queue"])
        library.queue, library.seq, library.jobs = state["queue"], state["seq"], state["jobs"]
        library.mounts, library.bytes_read, library.changes = state["mounts"], state["bytes_read"], state["changes"]
        library.segments = [Segment(*s) for s in state["segments"]]
        library.reads = [tuple(r) for r in state["reads"]]
        library.mount_log = [tuple(m) for m in state.get("mount_log", [])]
        return library
