"""The contract between the loop and a tape backend. A backend subclasses Stager."""
import re
from dataclasses import dataclass, field

MAX_LABEL = 64  # Tape.label's max_length


class StagerUnavailable(Exception):
    """The backend could not be reached or did not answer in time (a whole call failed, not one
    file). The loop treats it as no progress: it backs off and probes again later."""


@dataclass(frozen=True)
class Location:
    path: str
    tape: str
    position: int  # byte offset from the beginning of the tape
    size: int
    media: str = ""
    # False when the backend cannot tell the file's tape (Tape REST never does): `tape` is then
    # a stand-in (directory_tape_label) and the locating step looks the file up in the site's
    # tape map (carousel/loop/locating.py) before it falls back to the stand-in.
    tape_known: bool = True
    # True when the backend says the file is on its disk now (Tape REST archiveinfo's DISK or
    # DISK_AND_TAPE): its queued requests are completed by the locate step without a tape job
    # (carousel/domain/ondisk.py); `disk_path` where it lies, "" at its own path.
    on_disk: bool = False
    disk_path: str = ""


def directory_tape_label(path):
    """A stand-in tape for a file whose backend hides its tape. Files of one directory were
    mostly written together (one dataset, one tape family), so the directory is the best guess
    at "likely on the same tape": it keeps a job's files together the way the backend's recall
    queue would."""
    directory = re.sub(r"/{2,}", "/", path).rsplit("/", 1)[0] or "/"
    label = f"rest:{directory}"
    if len(label) > MAX_LABEL:
        label = f"rest:~{directory[-(MAX_LABEL - 6):]}"  # the deepest part tells datasets apart
    return label


@dataclass(frozen=True)
class LocateError:
    path: str
    error_class: str  # an ErrorClass value
    message: str


@dataclass(frozen=True)
class FileStatus:
    path: str
    state: str  # "queued", "staging", "done" or "failed"
    error_class: str = ""
    message: str = ""
    disk_path: str = ""  # where a done file lies on the stager's disk, when not at its own path


@dataclass
class JobSpec:
    id: str  # the broker's job id: sending twice with the same id must not stage twice
    paths: list
    tape: str = ""
    backend_id: str = ""  # set once the backend acknowledged the job
    lifetimes: dict = field(default_factory=dict)


class Stager:
    def locate(self, paths):
        """Return a list with one Location or LocateError per path."""
        raise NotImplementedError

    def submit(self, job):
        """Send a JobSpec; return the backend's id for it. Idempotent on job.id."""
        raise NotImplementedError

    def poll(self, jobs):
        """Given sent JobSpecs, return {job.id: [FileStatus, ...]}. A job left out of the
        answer is one the backend does not know (lost, or never received)."""
        raise NotImplementedError

    def cancel(self, backend_id, paths):
        """Withdraw these paths of one job from the backend."""
        raise NotImplementedError

    def release(self, backend_id, paths):
        """The broker no longer needs these staged copies on the backend's disk (pin over).
        Backends without pins do nothing."""

    def status(self):
        """What the backend knows of its drives, queues and disk buffer, as a dict ({} when
        nothing). Known keys: "drives" (a list of dicts: "name", "media", "tape", "activity"),
        "queued_files", "disk_free_bytes", "disk_total_bytes"; "read_rate_mb_s" and
        "exchange_s" (a robot's cartridge move) when they differ from the media's tables. The
        loop plans mounts for the drives listed (carousel/loop/plan.py)."""
        return {}
