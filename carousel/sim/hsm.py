"""The `hsm-fifo` backend of replays (`manage.py simulate W --backend hsm-fifo`): a tape system
that hides its tapes, as dCache or CTA behind the Tape REST API do.

- In front, HiddenTapesStager: the broker learns no tape, position or size from locate (each
  file's stand-in is its directory, as the tape-rest stager's) and no drive from status(); a
  site's tape map (`--tape-map`) is then all it knows of the tapes.
- Behind, FifoLibrary: the simulated library's physics (carousel/sim/library.py,
  carousel/tape.py) with a recall queue of its own: one queue of files in arrival order; a free
  drive takes the oldest queued file whose tape is on no other drive, mounts that tape, reads
  every file then queued for it in position order, and unmounts. Files that arrive for a tape
  while it is mounted wait for its next mount: the system schedules whole recalls, first come
  first served (dCache's Tape REST path), not the broker's jobs.
"""
from carousel.sim.library import FAILED, QUEUED, Library
from carousel.stagers.base import LocateError, Location, directory_tape_label
from carousel.stagers.simulated import SimulatedStager


class FifoLibrary(Library):
    def submit(self, job, files, failed=()):
        """Queue the job's files behind everything queued before (whatever is on the drives)."""
        if job in self.jobs:
            return
        states = self.jobs[job] = dict.fromkeys(failed, FAILED)
        per_tape = {}
        for file in files:
            states[file.path] = QUEUED
            per_tape.setdefault((file.tape, file.media), []).append([job, file.path, file.offset, file.size])
        for (tape, media), items in per_tape.items():
            self.seq += 1
            self.queue.append([self.seq, job, tape, media, items])
        self._dispatch()

    def _work_of(self, taken):
        # A FIFO recall system reads every file then queued for the tape in position order.
        return sorted((item for entry in taken for item in entry[4]), key=lambda item: item[2])


class HiddenTapesStager(SimulatedStager):
    """The simulated stager as the Tape REST API shows a tape system: a file exists or not,
    nothing of where it lies, nothing of the drives."""

    def locate(self, paths):
        return [Location(path=p, tape=directory_tape_label(p), position=0, size=0, tape_known=False)
                if p in self.files else LocateError(p, "permanent", "no such file in the simulated library")
                for p in paths]

    def status(self):
        self.library.advance(self.clock())
        return {}
