"""The simplest built-in stager: every file exists, lies on a tape derived from its
directory, and is on disk at the first poll after its job is sent. It lets the broker run
end to end before the simulated tape library is plugged in; nothing else should rely on it."""
import hashlib

from carousel.stagers.base import FileStatus, Location, Stager

GB = 10**9


class ImmediateStager(Stager):
    def __init__(self, tapes=100):
        self.tapes = tapes

    def _digest(self, text):
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")

    def locate(self, paths):
        out = []
        for path in paths:
            directory = path.rsplit("/", 1)[0] or "/"
            tape = f"IM{self._digest(directory) % self.tapes:04d}"
            digest = self._digest(path)
            out.append(Location(path=path, tape=tape, position=(digest % 700) * GB, size=GB + digest % GB,
                                media="LTO-7"))
        return out

    # Stateless, so any worker process can poll what another one sent.
    def submit(self, job):
        return f"im-{job.id}"

    def poll(self, jobs):
        return {job.id: [FileStatus(path=p, state="done") for p in job.paths] for job in jobs}

    def cancel(self, backend_id, paths):
        pass  # nothing is ever waiting here
