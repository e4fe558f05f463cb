"""The `hpss` stager: HPSS through its hsi client, one `hsi -q "<command>"` per call.

    locate   hsi -q "ls -P <path> <path> ..."     tape, position+offset and size of each file
    submit   hsi -q "stage <path> <path> ..."     ask HPSS to bring the files into its disk cache
    poll     hsi -q "ls -V <path> <path> ..."     which files are in the disk cache now

HPSS keeps no request id a client can poll or cancel, so the stager keeps its own: one JSON file
per job in `state_dir`, holding the job's paths, how many of them hsi has been asked to stage,
the per-file errors stage reported and the paths cancelled since. That file makes submit
idempotent (a resubmitted job is not staged again) and tells poll which jobs exist. The
directory must be shared by every process that runs the loop (they lock its files with flock).

What hsi prints is only partly documented; every reading of its output is in the block below,
with what is verified and what is assumed, so that a site adjusts that block and nothing else.
"""
import fcntl
import fnmatch
import hashlib
import json
import os
import posixpath
import re
import signal
import subprocess
import tempfile
import time
from collections import namedtuple
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from carousel.models import ErrorClass
from carousel.tape import BEYOND_TAPE_END, MEDIA
from carousel.stagers.base import (
    FileStatus, LocateError, Location, Stager, StagerUnavailable, directory_tape_label,
)

# ----------------------------------------------------------------------------------------------
# What hsi prints, and how it is read. Sources:
#   [I] /work/shared/interfaces.md, "HPSS through hsi".
#   [T] WIPACrepo/tacc-sync, src/bin/syncer.rs: real `ls -P` lines from NERSC's HPSS, 13
#       tab-separated fields, e.g. (path shortened)
#         FILE  /home/.../x.zip  99658060045  99658060045  840+0  AG084600  5  0  1  03/01/2021 ...
#       and a file spanning two volumes: "119+558936243566" and "AU031800,AU031900". Its
#       comments also say that without hsi's -P option the listing comes on standard error.
#   [N] NERSC's hsi_file_sorter.script: `hsi -q "in list" 2>&1 | grep ^FILE`, sorts on the first
#       6 characters of field 6, then the two halves of field 5, numerically.
#   [W] NOAA-EMC/wxflow, src/wxflow/hsi.py: hsi exits 64 when an `ls` target does not exist,
#       72 when an `rm` target does not; it looks for "HPSS_ENOENT" in the output.
#   [M] HSI reference manual, "Path Names" (mgleicher.us/hsi): paths are printable ASCII
#       (0x20-0x7E); "pathnames containing spaces must be quoted". The hsi man page:
#       `hsi [options] [command [;command ...]]`.
#   [V] build_negweight_hpss_manifest.py, an archiving script in a public MINERvA-OmniFold
#       analysis repository, which parses `hsi ls -V`: a "Bytes at Level" table whose rows
#       read "<level> (disk|tape) <VV count> <stripe width> <bytes>", "(no data at this level)"
#       for an empty level; a file just put is at the disk level only, one migrated (and
#       purged) at the tape level.
#
# VERIFIED: the `ls -P` FILE line [I][T][N]: field 2 the path, 3 the size in bytes, 5
#   position+offset, 6 the volume list; listings may come on standard error [T][N]; volume
#   labels are 8 characters, the cartridge being the first 6 [T][N]; exit 64 for a missing ls
#   target, 72 for a missing rm target [W]; printable-ASCII paths, quoted when they hold a space [M];
#   ";" between commands, wildcards, "-" for DIR0 and options [M] (so what hsi_quote refuses).
# PARTLY VERIFIED: the `ls -V` level rows [V]; how its blocks for several files are laid out is
#   ASSUMED (each begins with a line ending in the file's path, like `ls -l`).
# ASSUMED: the error lines, "*** <call>: <text> [<code>: HPSS_E...]" as HPSS users quote them
#   ([W] only checks for HPSS_ENOENT), then the path on the next line (a guess; a path at the
#   end of the *** line is accepted too); that `stage <paths>` queues the recalls and returns
#   without waiting for the tapes (if a site's hsi waits, set stage_command to its no-wait form);
#   that exit codes other than 0, 64 and 72 mean
#   connection trouble (hsi's codes look like sysexits.h: 64 EX_USAGE, 72 EX_OSFILE).
# ----------------------------------------------------------------------------------------------

FILE_ERROR_EXIT_CODES = (64, 72)  # [W] some files had errors; the others were answered
# Position and offset packed into one integer that sorts like the pair (Location.position is
# only an ordering key for HPSS, not a byte offset). 45 bits hold offsets up to 32 TiB (one
# LTO-10 tape is 30 TB; [T] shows offsets of 5.6e11); that leaves 2**18 positions per volume
# under PostgreSQL's bigint. Out-of-range values are clamped: the order degrades, nothing fails.
OFFSET_BITS = 45
# Files HPSS has not migrated yet (or empty ones) list no volume; they share this pseudo-tape,
# whose "recall" costs no mount.
NOT_ON_TAPE = "(hpss disk)"
LEVEL_ROW = re.compile(r"^\s*\d+\s+\((disk|tape)\)\s*(.*)$")

Listing = namedtuple("Listing", "size tape position")


# What a path may hold to be carried to hsi, and why no more. hsi documents [M] that blanks
# separate words, ";" separates commands, and that a path with spaces "must be quoted" (with
# double quotes, as its examples do); it documents wildcards (* ? ^ [] {}) that work in every
# command, "-" as a path meaning DIR0, a leading "-" as an option, "!" as a local command, and
# "local : hpss" renames. It does not document whether quotes protect ";" or wildcards, nor any
# escape for a quote or a backslash. So a path is carried only when its meaning cannot depend on
# what is undocumented: absolute (never an option, "-", "~", "!" or a pipe), made of the
# characters below, spaces (in double quotes, as documented) but none beside a colon; anything
# else is refused with a permanent error before hsi is run, never guessed at.
HSI_SAFE = re.compile(r"/[A-Za-z0-9 /._+,:@%~=-]*")


def hsi_quote(path):
    """The path as one hsi word. Raises ValueError, saying why, for a path that hsi cannot be
    given safely (see HSI_SAFE)."""
    if not path or any(not " " <= ch <= "~" for ch in path):
        raise ValueError(f"hsi cannot name this path (only printable ASCII): {path!r}")
    if not path.startswith("/"):
        raise ValueError(f"hsi is given absolute paths only (a leading '-' would be an option): {path!r}")
    if not HSI_SAFE.fullmatch(path):
        refused = "".join(sorted({ch for ch in path if not HSI_SAFE.fullmatch("/" + ch)}))
        raise ValueError(f"hsi cannot be given this path safely: it holds {refused!r}, which hsi may read as "
                         f"quoting, an escape, a command separator or a wildcard: {path!r}")
    if path.endswith(" "):
        raise ValueError(f"hsi's listings end a line with the path: one ending in a blank cannot be read back: "
                         f"{path!r}")
    if re.search(r"\s:|:\s", path):
        raise ValueError(f"hsi would read a colon beside a blank as its 'local : hpss' rename: {path!r}")
    return f'"{path}"'


def command_line(verb, paths):
    return " ".join([verb, *(hsi_quote(p) for p in paths)])


class _Paths:
    """Finds the asked-for paths in hsi's lines, also when hsi prints them normalised."""

    def __init__(self, paths):
        self.by_text = {}
        for path in paths:
            self.by_text.setdefault(posixpath.normpath(path), path)
            self.by_text[path] = path

    def exact(self, text):
        return self.by_text.get(text) or self.by_text.get(posixpath.normpath(text)) if text else None

    def ending(self, line):
        """The asked-for path that ends this line (after a blank or at its start), longest first."""
        line = line.rstrip().removesuffix(":")
        for start in range(len(line)):
            if start == 0 or line[start - 1] in " \t":
                found = self.by_text.get(line[start:])
                if found:
                    return found
        return None


def cartridge_label(volumes):
    """Field 6 of `ls -P`: the first volume of a file that spans several, without the 2-character
    side suffix of an 8-character label [T][N]."""
    first = volumes.split(",")[0].strip()
    if not first:
        return NOT_ON_TAPE
    return first[:6] if len(first) == 8 else first


def tape_order_key(position, offset):
    position = min(max(position, 0), (1 << (63 - OFFSET_BITS)) - 1)
    offset = min(max(offset, 0), (1 << OFFSET_BITS) - 1)
    return position << OFFSET_BITS | offset


def parse_ls_P(text, paths):
    """{path: Listing} for the asked-for paths that `ls -P` listed as files."""
    wanted = _Paths(paths)
    found = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if fields[0] != "FILE" or len(fields) < 6:
            continue
        path = wanted.exact(fields[1])
        if path is None:
            continue
        try:
            size = int(fields[2])
            position, _, offset = fields[4].partition("+")
            key = tape_order_key(int(position), int(offset)) if offset else 0
        except ValueError:
            continue
        tape = cartridge_label(fields[5])
        found[path] = Listing(size=size, tape=tape, position=0 if tape == NOT_ON_TAPE else key)
    return found


def parse_errors(text, paths):
    """{path: message} for the asked-for paths an error line names."""
    wanted = _Paths(paths)
    lines = text.splitlines()
    errors = {}
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("***"):
            continue
        path = wanted.ending(line) or (wanted.exact(lines[i + 1].strip()) if i + 1 < len(lines) else None)
        if path:
            errors.setdefault(path, line.strip().lstrip("*").strip())
    return errors


def _bytes_at_level(rest):
    if "no data" in rest:
        return 0
    numbers = re.findall(r"\d+", rest)
    return int(numbers[-1]) if numbers else 0


def parse_ls_V(text, paths):
    """{path: in the disk cache} for the asked-for paths whose level table `ls -V` printed. A
    file is in the cache when a disk level holds as many bytes as its fullest level (a partial
    copy is still being staged); an empty file, which no level holds, counts as there. A file
    without level rows is left out: an unread layout must not pass for "staged"."""
    wanted = _Paths(paths)
    levels = {}
    current = None
    for line in text.splitlines():
        row = LEVEL_ROW.match(line)
        if row and current:
            kind, rest = row.groups()
            levels.setdefault(current, {"disk": 0, "tape": 0})
            levels[current][kind] = max(levels[current][kind], _bytes_at_level(rest))
            continue
        current = wanted.ending(line) or current
    return {path: level["disk"] >= level["tape"] for path, level in levels.items()}


def classify_error(message):
    """An hsi error line's class: no such file is permanent, a refused access the user's, any
    other (a tape error, a busy system) transient. ASSUMED beyond HPSS_ENOENT [W]."""
    text = message.lower()
    if "enoent" in text or "no such file" in text:
        return ErrorClass.PERMANENT
    if "eacces" in text or "eperm" in text or "permission denied" in text:
        return ErrorClass.USER
    return ErrorClass.TRANSIENT


# ----------------------------------------------------------------------------------------------


def _batches(items, size):
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _unnameable(paths):
    """{path: (class, message)} for the paths hsi cannot name."""
    errors = {}
    for path in paths:
        try:
            hsi_quote(path)
        except ValueError as exc:
            errors[path] = (ErrorClass.PERMANENT, str(exc))
    return errors


def _classified(errors):
    return {path: (classify_error(message), message) for path, message in errors.items()}


def _file_status(path, error, staged, in_cache):
    if error:
        return FileStatus(path=path, state="failed", error_class=error[0], message=error[1])
    if not staged:
        return FileStatus(path=path, state="queued")
    return FileStatus(path=path, state="done" if in_cache else "staging")


def media_rules(media, default_media):
    """[(fnmatch pattern, technology)] from the `media` option ({technology: [label patterns]})
    and `default_media`, checked: an unknown technology is a configuration error."""
    rules = []
    for technology, patterns in (media or {}).items():
        if technology not in MEDIA:
            raise ValueError(f"hpss option media: unknown technology {technology!r}; known: {', '.join(MEDIA)}")
        if isinstance(patterns, str):
            patterns = [patterns]
        rules += [(str(pattern), technology) for pattern in patterns]
    if default_media:
        if default_media not in MEDIA:
            raise ValueError(f"hpss option default_media: unknown technology {default_media!r}; "
                             f"known: {', '.join(MEDIA)}")
        rules.append(("*", default_media))
    return rules


# With a technology known, the broker plans mounts for the tape (carousel/loop/mounts.py) and orders
# its files with the tape model, which takes Location.position for a byte offset. HPSS gives
# no byte offset, only (section, offset in it), so the key is moved past the end of every
# technology's tape (carousel.tape.BEYOND_TAPE_END), so the order stays HPSS's own (ascending
# key, which its Tape Ordered Recall refines).
assert BEYOND_TAPE_END == 1 << OFFSET_BITS


class HpssStager(Stager):
    """release() is the base no-op: HPSS purges its disk cache by its own policy.

    Options beside hsi's: `media`, {technology: [cartridge label patterns]} (fnmatch, e.g.
    {"LTO-7": ["AG*", "VB*"], "LTO-8": "AU*"}), and `default_media` for labels no pattern
    matches: the technology of each volume, which hsi does not print, so that the broker plans
    mounts for HPSS's tapes (with the control row's drive count: hsi shows no drives).

    `volumes` false: the volumes hsi lists are not to be trusted or not shown to the broker's
    account (a site's HPSS that hides them): locate keeps what `ls -P` says of a file's
    existence and size, and its tape comes from the site's tape map (carousel/loop/locating.py),
    else the directory stands in for it, as for tape-rest."""

    def __init__(self, hsi="hsi", timeout_s=120, batch=500, extra_args=(), state_dir=None,
                 stage_command="stage", keep_days=30, media=None, default_media="", volumes=True):
        self.media_rules = media_rules(media, default_media)
        self.volumes = bool(volumes)
        self.hsi = str(hsi)
        self.timeout_s = timeout_s
        self.batch = batch
        self.extra_args = [str(arg) for arg in extra_args]
        self._state_dir = Path(state_dir) if state_dir else None
        self.stage_command = stage_command
        self.keep_days = keep_days

    # hsi

    def _run(self, command):
        argv = [self.hsi, *self.extra_args, "-q", command]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise StagerUnavailable(f"cannot run {self.hsi}: {exc}") from exc
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            # The whole group: a helper hsi started would otherwise keep the pipes open.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            raise StagerUnavailable(f"hsi did not answer within {self.timeout_s} s") from None
        # Listings come on standard error without hsi's -P option [T]: read both.
        return proc.returncode, (out + b"\n" + err).decode("ascii", "replace")

    def _ask(self, verb, paths, parse):
        """Run `verb paths`: (what parse read, {path: (class, message)} for the errors). An
        exit code that means "some files had errors" counts only if the output speaks of the
        files; otherwise the session itself failed."""
        code, text = self._run(command_line(verb, paths))
        answered, errors = parse(text, paths), parse_errors(text, paths)
        if code and (code not in FILE_ERROR_EXIT_CODES or not (answered or errors)):
            last = text.strip().splitlines()[-1:] or ["no output"]
            raise StagerUnavailable(f"hsi {verb.split()[0]} exited {code}: {last[0][:300]}")
        return answered, _classified(errors)

    # one JSON file per job

    @property
    def state_dir(self):
        if self._state_dir is None:
            self._state_dir = Path(settings.VAR_DIR) / "hpss"
        self._state_dir.mkdir(parents=True, exist_ok=True)
        return self._state_dir

    def _state_file(self, job_id):
        if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}", job_id):
            return self.state_dir / f"{job_id}.json"
        return self.state_dir / f"h-{hashlib.sha256(job_id.encode()).hexdigest()[:32]}.json"

    @contextmanager
    def _locked(self, job_id):
        with open(self._state_file(job_id).with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _load(self, job_id):
        try:
            state = json.loads(self._state_file(job_id).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return state if state.get("job_id") == job_id else None

    def _save(self, state):
        target = self._state_file(state["job_id"])
        with tempfile.NamedTemporaryFile("w", dir=target.parent, suffix=".tmp", delete=False) as tmp:
            json.dump(state, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, target)

    def _prune(self):
        """Forget jobs older than keep_days: the loop has long stopped polling them."""
        cutoff = time.time() - self.keep_days * 86400
        for path in self.state_dir.glob("*.json"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    path.with_suffix(".lock").unlink(missing_ok=True)
            except FileNotFoundError:
                pass

    def _ask_all(self, verb, paths, parse):
        """Ask hsi about `paths` in batches, leaving out names hsi cannot express: (what was
        found, {path: error})."""
        errors = _unnameable(paths)
        found = {}
        for chunk in _batches([p for p in paths if p not in errors], self.batch):
            more, failed = self._ask(verb, chunk, parse)
            found.update(more)
            errors.update(failed)
        return found, errors

    # the contract

    def locate(self, paths):
        listed, errors = self._ask_all("ls -P", list(dict.fromkeys(paths)), parse_ls_P)
        return [self._location(path, listed, errors) for path in paths]

    def media_of(self, tape):
        """The technology of a cartridge by the site's label patterns, or "" when none says."""
        if tape == NOT_ON_TAPE:
            return ""
        return next((media for pattern, media in self.media_rules if fnmatch.fnmatchcase(tape, pattern)), "")

    def _location(self, path, listed, errors):
        if path in listed and not self.volumes:
            return Location(path=path, tape=directory_tape_label(path), position=0, size=listed[path].size,
                            tape_known=False)
        if path in listed:
            size, tape, position = listed[path]
            media = self.media_of(tape)
            if media:  # see BEYOND_TAPE_END
                position = min(position + BEYOND_TAPE_END, (1 << 63) - 1)
            # Without a technology the broker reads each tape in ascending position, which is
            # HPSS's tape order, and sends its jobs without a mount plan.
            return Location(path=path, tape=tape, position=position, size=size, media=media)
        error_class, message = errors.get(path, (ErrorClass.TRANSIENT, "hsi ls -P did not list this path"))
        return LocateError(path=path, error_class=error_class, message=message)

    def submit(self, job):
        with self._locked(job.id):
            state = self._load(job.id)
            if state is None:
                self._prune()
                state = {"job_id": job.id, "backend_id": f"hpss-{job.id}", "paths": list(job.paths),
                         "staged": 0, "errors": {}, "cancelled": [], "submitted_at": time.time()}
                self._save(state)
            # A job sent before goes on where hsi stopped (it was unreachable part way); a job
            # fully staged is not staged again.
            while state["staged"] < len(state["paths"]):
                chunk = state["paths"][state["staged"]:state["staged"] + self.batch]
                errors = _unnameable(chunk)
                nameable = [p for p in chunk if p not in errors]
                if nameable:
                    errors.update(self._ask(self.stage_command, nameable, lambda text, paths: {})[1])
                state["errors"].update(errors)
                state["staged"] += len(chunk)
                self._save(state)
        return state["backend_id"]

    def poll(self, jobs):
        states = {job.id: state for job in jobs if (state := self._load(job.id))}
        watched = {job.id: self._watched(job, states[job.id]) for job in jobs if job.id in states}
        staged = {job_id: set(state["paths"][:state["staged"]]) for job_id, state in states.items()}
        # Only the files staged and without an error need a look at the cache.
        unique = list(dict.fromkeys(
            path for job_id, paths in watched.items() for path in paths
            if path in staged[job_id] and path not in states[job_id]["errors"]))
        cached, errors = self._ask_all("ls -V", unique, parse_ls_V)
        return {job_id: [_file_status(path, states[job_id]["errors"].get(path) or errors.get(path),
                                      path in staged[job_id], cached.get(path))
                         for path in paths]
                for job_id, paths in watched.items()}

    @staticmethod
    def _watched(job, state):
        """The job's paths that poll reports: those it was sent with, less the cancelled ones."""
        sent, cancelled = set(state["paths"]), set(state["cancelled"])
        return [p for p in dict.fromkeys(job.paths or state["paths"]) if p in sent and p not in cancelled]

    def cancel(self, backend_id, paths):
        """hsi cannot withdraw a stage: the files may still come into the disk cache, which
        costs a mount and nothing else. The paths are only dropped from what poll reports."""
        job_id = backend_id.removeprefix("hpss-")
        if not self._state_file(job_id).exists():
            return
        with self._locked(job_id):
            state = self._load(job_id)
            if state is None:
                return
            state["cancelled"] = sorted(set(state["cancelled"]) | (set(paths) & set(state["paths"])))
            self._save(state)

    def status(self):
        return {}  # hsi shows users nothing of HPSS's drives, queues or disk cache
