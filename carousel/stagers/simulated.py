"""The simulated tape library (carousel/sim/library.py) behind the stager contract. One model, two
clocks:

- live (the embedded default of `make run`): the library advances with the wall clock times
  `speedup`. Its state lives in a JSON file under VAR_DIR, rewritten by atomic rename under an
  flock, so the worker can restart and the web process can read status() at any time. Files
  lie where a deterministic synthetic catalogue puts them (tape from the directory, offset and
  size from the path).
- bytes (options `archive_dir`, `disk_dir`, live mode only): the "tape" copy of path P is the
  file archive_dir/P, and a path with no such file is one the tape system does not have; when
  the library has read a file, its restored copy appears at disk_dir/P (written under a
  temporary name and renamed, world-readable, so a reader such as XRootD never sees half a
  file), and the stager reports that disk path. The sizes are the real files' sizes.
- replay (carousel/sim/replay.py): the driver hands over a Library, the workload's files and a
  clock it sets itself.
"""
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from carousel.sim.library import CANCELLED, FAILED, File, Library
from carousel.tape import GB, MEDIA
from carousel.stagers.base import FileStatus, LocateError, Location, Stager

STATE_VERSION = 1
FORGET_AFTER_S = 86400.0  # simulated seconds a finished, reported job stays answerable


class SimulatedStager(Stager):
    def __init__(self, *, drives=None, speedup=20.0, media="LTO-8", tapes=40, robots=4, exchange_s=11.0,
                 read_rate_mb_s=None, state_file=None, library=None, files=None, clock=None, archive_dir=None,
                 disk_dir=None):
        self.archive_dir = Path(archive_dir) if archive_dir else None
        self.disk_dir = Path(disk_dir) if disk_dir else None
        if library is not None:  # replay
            self.library, self.files, self.clock = library, files, clock
            return
        self.library = None
        if media not in MEDIA:
            raise ValueError(f"unknown media {media!r}; known: {', '.join(MEDIA)}")
        self.drives = drives or {media: 4}
        self.speedup, self.media, self.tapes = float(speedup), media, int(tapes)
        self.robots, self.exchange_s, self.read_rate_mb_s = robots, exchange_s, read_rate_mb_s
        self._state_file = state_file

    @property
    def state_file(self):
        if self._state_file:
            return Path(self._state_file)
        from django.conf import settings  # not at import time: tests override VAR_DIR

        return Path(settings.VAR_DIR) / "simulated-library.json"

    # The contract -------------------------------------------------------------------------

    def locate(self, paths):
        missing = "no such file on tape" if self.archive_dir else "no such file in the simulated library"
        return [self._location(path) or LocateError(path, "permanent", missing) for path in paths]

    def submit(self, job):
        with self._session() as (library, _):
            found = [self._location(p) for p in job.paths]
            files = [File(loc.path, loc.tape, loc.media, loc.position, loc.size) for loc in found if loc]
            library.submit(job.id, files, failed=[p for p, loc in zip(job.paths, found) if loc is None])
        return f"sim-{job.id}"

    def poll(self, jobs):
        answers = {}
        with self._session() as (library, reported):
            for spec in jobs:
                states = library.jobs.get(spec.id)
                if states is None:
                    continue  # not known here: the loop puts its requests back in the queue
                answers[spec.id] = [self._file_status(path, states.get(path)) for path in spec.paths]
                if reported is not None and all(s.state in ("done", "failed") for s in answers[spec.id]):
                    reported.setdefault(spec.id, library.now)
            if reported is not None:
                for job_id, at in list(reported.items()):
                    if library.now - at > FORGET_AFTER_S:
                        library.forget(job_id)
                        del reported[job_id]
        if self.disk_dir is not None:  # outside the library's lock: copying takes time
            answers = {job: [self._restored(st) for st in statuses] for job, statuses in answers.items()}
        return answers

    def cancel(self, backend_id, paths):
        with self._session() as (library, _):
            library.cancel(backend_id.removeprefix("sim-"), paths)

    def status(self):
        if self.library is not None:
            self.library.advance(self.clock())
            return self.library.status()
        state = self._read()
        if state is None:
            return {"drives": [dict(name=f"{media} #{i + 1}", media=media, tape="", activity="idle", file="",
                                    progress=None) for media, n in self.drives.items() for i in range(n)],
                    "queued_files": 0, "clock_s": 0.0, "speedup": self.speedup}
        library = Library.from_state(state["library"])
        library.advance(self._now(state))
        return {**library.status(), "speedup": self.speedup}

    # Inside -------------------------------------------------------------------------------

    @staticmethod
    def _file_status(path, state):
        if state is None:
            return FileStatus(path, "failed", "transient", "the simulated library has no such file in this job")
        if state == FAILED:
            return FileStatus(path, "failed", "permanent", "no such file in the simulated library")
        if state == CANCELLED:
            return FileStatus(path, "failed", "permanent", "withdrawn from the simulated library")
        return FileStatus(path, state)

    def _location(self, path):
        if self.library is not None:
            file = self.files.get(path)
            return file and Location(path=path, tape=file.tape, position=file.offset, size=file.size,
                                     media=file.media)
        location = synthetic_location(path, media=self.media, tapes=self.tapes)
        if self.archive_dir is None:
            return location
        tape_copy = _under(self.archive_dir, path)
        if tape_copy is None or not tape_copy.is_file():
            return None
        return dataclasses.replace(location, size=tape_copy.stat().st_size)

    def _restored(self, status):
        """A file the library has read gets its disk copy (once) and says where it is."""
        if status.state != "done":
            return status
        target, source = _under(self.disk_dir, status.path), _under(self.archive_dir, status.path)
        if target is None:
            return status
        if not target.exists() and source is not None and source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}.{os.getpid()}.part")
            shutil.copyfile(source, temporary)
            os.chmod(temporary, 0o644)
            os.replace(temporary, target)
        return dataclasses.replace(status, disk_path=str(target)) if target.exists() else status

    def _now(self, state):
        return (wall_clock() - state["started_at"]) * self.speedup

    @contextlib.contextmanager
    def _session(self):
        """The library advanced to now; in live mode, read and written back under a lock."""
        if self.library is not None:
            self.library.advance(self.clock())
            yield self.library, None
            return
        path = self.state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._read() or self._fresh()
            library = Library.from_state(state["library"])
            library.advance(self._now(state))
            yield library, state["reported"]
            state["library"] = library.to_state()
            temporary = path.with_name(f".{path.name}.{os.getpid()}")
            temporary.write_text(json.dumps(state))
            os.replace(temporary, path)

    def _read(self):
        try:
            state = json.loads(self.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return state if state.get("version") == STATE_VERSION else None

    def _fresh(self):
        library = Library(drives=self.drives, read_rate_mb_s=self.read_rate_mb_s, robots=self.robots,
                          exchange_s=self.exchange_s, record=False)
        return {"version": STATE_VERSION, "started_at": wall_clock(), "library": library.to_state(), "reported": {}}


def wall_clock():
    return time.time()


def _under(root, path):
    """root/path, or None when path would leave root (paths are validated at submission, but the
    stager does not rely on it)."""
    if root is None:
        return None
    candidate = (root / path.lstrip("/")).resolve()
    return candidate if candidate.is_relative_to(root.resolve()) else None


def _digest(text):
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def synthetic_location(path, *, media="LTO-8", tapes=40):
    """Where the live library keeps `path`: the tape follows from the directory (so a campaign's
    files share tapes), the position and a size of 1-5 GB from the path itself."""
    directory = path.rsplit("/", 1)[0] or "/"
    digest = _digest(path)
    capacity = MEDIA[media].capacity_bytes
    slot = 5 * GB
    return Location(path=path, tape=f"SIM{_digest(directory) % tapes:03d}",
                    position=(digest % (capacity // slot - 1)) * slot, size=GB + (digest >> 20) % (4 * GB),
                    media=media)
