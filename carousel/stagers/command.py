"""The `command` stager: one site script per operation, for a tape system the broker has no
built-in backend for. docs/stager-command.md is the protocol for script writers; in short:

    operation  arguments           standard input              standard output
    locate     -                   paths, one per line         JSON lines: a location or an error per path
    stage      JOB_ID [TAPE]       paths, one per line         the backend's id for the job, or nothing
    poll       BACKEND_ID ...      BACKEND_ID<TAB>PATH lines   JSON lines: the state of each file
    cancel     BACKEND_ID          paths, one per line         ignored
    release    BACKEND_ID          paths, one per line         ignored
    status     -                   empty                       one JSON object

Standard input and output are UTF-8. Exit 0 is success; exit 75 (EX_TEMPFAIL) means "the tape
system is unavailable, try later" and raises StagerUnavailable, as does a script that outlives
timeout_s (its whole process group is killed). A script that cannot be started, exits with any
other code or prints a line the protocol does not allow raises SiteScriptError, a
StagerUnavailable too, so the loop makes no progress and nothing is lost, but the message names
the script, the exit code or output line and the problem, for the site to fix.

The stage script must treat a repeated JOB_ID as the job it already has: the broker sends a job
again when it could not record the answer. A job the poll script does not mention is left out
of poll()'s answer, which tells the loop the backend does not know it (it requeues the files).
"""
import json
import logging
import os
import shlex
import signal
import subprocess

from carousel.models import ErrorClass, Job, Tape
from carousel.stagers.base import (
    MAX_LABEL, FileStatus, LocateError, Location, Stager, StagerUnavailable, directory_tape_label,
)

log = logging.getLogger(__name__)

EX_TEMPFAIL = 75  # sysexits.h: "temporary failure, user is invited to retry"
FILE_STATES = ("queued", "staging", "done", "failed")
FILE_ERROR_CLASSES = (ErrorClass.PERMANENT, ErrorClass.TRANSIENT, ErrorClass.USER)
STDERR_TAIL_CHARS = 2000
SHOWN_LINE_CHARS = 300


class SiteScriptError(StagerUnavailable):
    """A site script could not be run, failed, or broke the protocol. The loop treats it like
    any unavailability (no progress, tried again later) but it needs the site's fix, not time."""


class _Problem(Exception):
    """What is wrong with one line of a script's output; the caller adds the script and line."""


_REQUIRED = object()
MAX_COUNT = 2**63 - 1  # positions and sizes are stored as bigint
MAX_MEDIA = Tape._meta.get_field("media").max_length
_KIND_NAMES = {str: "a string", int: "an integer"}


def _field(obj, key, kind, default=_REQUIRED):
    value = obj.get(key)
    if value is None:
        if default is _REQUIRED:
            raise _Problem(f'"{key}" is missing')
        return default
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Problem(f'"{key}" must be {_KIND_NAMES[kind]}, not {json.dumps(value)}')
    return value


def _count(obj, key):
    value = _field(obj, key, int)
    if value < 0:
        raise _Problem(f'"{key}" must not be negative, not {value}')
    if value > MAX_COUNT:
        raise _Problem(f'"{key}" must be at most {MAX_COUNT} (a signed 64-bit integer), not {value}')
    return value


def _text(obj, key, limit, default=_REQUIRED):
    """A string field of at most `limit` characters (the column it is stored in): a longer one
    refused here names the line; stored, it failed the database's insert, and the whole cycle."""
    value = _field(obj, key, str, default)
    if value is not None and len(value) > limit:
        raise _Problem(f'"{key}" is longer than {limit} characters')
    return value


def _error_class(obj):
    value = _field(obj, "class", str, ErrorClass.PERMANENT)
    if value not in FILE_ERROR_CLASSES:
        raise _Problem(f'"class" must be one of {", ".join(FILE_ERROR_CLASSES)}, not {json.dumps(value)}')
    return value


def _json_object(raw):
    try:
        text = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise _Problem(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Problem(f"not JSON ({exc.msg} at column {exc.colno}); print one JSON object per line") from None
    if not isinstance(obj, dict):
        raise _Problem(f"expected a JSON object, not {type(obj).__name__}")
    return obj


def _as_argv(command, operation):
    argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
    if not argv:
        raise ValueError(f"the {operation} command is empty")
    return argv


def _stdin(lines):
    for line in lines:
        if "\n" in line or "\r" in line:
            raise ValueError(f"cannot send {line[:200]!r} to a site script: one entry per line, and it holds a newline")
    return "".join(f"{line}\n" for line in lines).encode("utf-8", "surrogatepass")


def _stderr_tail(err):
    text = err.decode("utf-8", "replace").strip()
    if not text:
        return ""
    if len(text) > STDERR_TAIL_CHARS:
        text = "..." + text[-STDERR_TAIL_CHARS:]
    return f"; its standard error ends with:\n{text}"


class CommandStager(Stager):
    def __init__(self, *, locate, stage, poll, cancel=None, release=None, status=None, timeout_s=120, env=None):
        given = {"locate": locate, "stage": stage, "poll": poll, "cancel": cancel, "release": release,
                 "status": status}
        self.commands = {op: _as_argv(cmd, op) for op, cmd in given.items() if cmd is not None}
        self.timeout_s = timeout_s
        self.env = {name: str(value) for name, value in (env or {}).items()}

    def locate(self, paths):
        """A path the script does not answer is left out; the loop asks again at a later cycle."""
        if not paths:
            return []
        asked = set(paths)
        answers = {}

        def read(obj):
            path = _field(obj, "path", str)
            if path not in asked:
                raise _Problem("this path was not asked for (print each path exactly as it was read)")
            if path in answers:
                raise _Problem("a second answer for this path")
            if "error" in obj:
                answers[path] = LocateError(path=path, error_class=_error_class(obj),
                                            message=_field(obj, "error", str))
                return
            tape = _text(obj, "tape", MAX_LABEL, None)
            if tape is None:
                # The tape system does not say: the site's tape map may (carousel/loop/locating.py).
                size = _count(obj, "size") if obj.get("size") is not None else 0
                answers[path] = Location(path=path, tape=directory_tape_label(path), position=0, size=size,
                                         tape_known=False)
                return
            if not tape.strip():
                raise _Problem('"tape" is empty')
            answers[path] = Location(path=path, tape=tape, position=_count(obj, "position"),
                                     size=_count(obj, "size"), media=_text(obj, "media", MAX_MEDIA, ""))

        self._read_lines("locate", self._run("locate", (), paths), read)
        return [answers[path] for path in paths if path in answers]

    def submit(self, job):
        args = [job.id, job.tape] if job.tape else [job.id]
        out = self._run("stage", args, job.paths)
        lines = [(number, raw) for number, raw in enumerate(out.split(b"\n"), 1) if raw.strip()]
        if not lines:
            return job.id
        number, raw = lines[0]
        if len(lines) > 1:
            self._bad_line("stage", lines[1][0], lines[1][1],
                           "a second line: print the backend id alone (messages go to standard error)")
        backend_id = raw.decode("utf-8", "replace").strip()
        limit = Job._meta.get_field("backend_id").max_length
        if len(backend_id) > limit:
            self._bad_line("stage", number, raw, f"the backend id is longer than {limit} characters")
        if any(not ch.isprintable() for ch in backend_id):
            self._bad_line("stage", number, raw, "the backend id holds a tab or another unprintable character")
        return backend_id

    def poll(self, jobs):
        """One call for all jobs. Lines about files not asked for are ignored: a file withdrawn
        from a job may still be reported by a backend that missed the cancel."""
        if not jobs:
            return {}
        by_backend_id = {job.backend_id or job.id: job for job in jobs}
        jobs_of_path = {}
        for backend_id, job in by_backend_id.items():
            for path in job.paths:
                jobs_of_path.setdefault(path, []).append(backend_id)
        answers = {}
        seen = set()

        def read(obj):
            path = _field(obj, "path", str)
            backend_id = _field(obj, "job", str, None)
            if backend_id is None:
                owners = jobs_of_path.get(path, [])
                if len(owners) > 1:
                    raise _Problem(f'no "job", and this path is in {len(owners)} of the polled jobs: say which')
                if not owners:
                    return
                backend_id = owners[0]
            elif backend_id not in by_backend_id:
                raise _Problem(f"job {backend_id!r} was not polled (the polled jobs are the arguments)")
            job = by_backend_id[backend_id]
            statuses = answers.setdefault(job.id, [])
            if backend_id not in jobs_of_path.get(path, []):
                return
            if (backend_id, path) in seen:
                raise _Problem("a second state for this file of this job")
            seen.add((backend_id, path))
            state = _field(obj, "state", str)
            if state not in FILE_STATES:
                raise _Problem(f'"state" must be one of {", ".join(FILE_STATES)}, not {json.dumps(state)}')
            failed = state == "failed"
            statuses.append(FileStatus(path=path, state=state, error_class=_error_class(obj) if failed else "",
                                       message=_field(obj, "message", str, "")))

        lines = [f"{backend_id}\t{path}" for backend_id, job in by_backend_id.items() for path in job.paths]
        self._read_lines("poll", self._run("poll", list(by_backend_id), lines), read)
        return answers

    def cancel(self, backend_id, paths):
        if "cancel" in self.commands and paths:
            self._run("cancel", [backend_id], paths)

    def release(self, backend_id, paths):
        if "release" in self.commands and paths:
            self._run("release", [backend_id], paths)

    def status(self):
        if "status" not in self.commands:
            return {}
        out = self._run("status")
        if not out.strip():
            return {}
        try:
            answer = json.loads(out.decode("utf-8", "surrogatepass"))
        except UnicodeDecodeError as exc:
            raise SiteScriptError(f"{self._describe('status')} printed something not UTF-8 "
                                  f"({exc.reason} at byte {exc.start})") from None
        except json.JSONDecodeError as exc:
            raise SiteScriptError(f"{self._describe('status')} printed a bad line {exc.lineno}: not JSON "
                                  f"({exc.msg} at column {exc.colno}); print one JSON object") from None
        if not isinstance(answer, dict):
            raise SiteScriptError(f"{self._describe('status')} printed a JSON {type(answer).__name__}; "
                                  "expected one JSON object")
        return answer

    def _describe(self, operation):
        return f"the {operation} script ({shlex.join(self.commands[operation])})"

    def _run(self, operation, args=(), lines=()):
        """Run one operation's script with these arguments and standard input lines; return
        its standard output (bytes) if it exits 0, else raise."""
        argv = [*self.commands[operation], *args]
        name = self._describe(operation)
        stdin = _stdin(lines)
        try:
            # A session of its own, so a timeout kills whatever the script started too.
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env={**os.environ, **self.env}, start_new_session=True)
        except OSError as exc:
            raise SiteScriptError(f"{name} cannot be started: {exc.strerror or exc} "
                                  "(is the path right, the file executable, its #! line valid?)") from exc
        try:
            out, err = process.communicate(stdin, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            err = self._kill(process)
            raise StagerUnavailable(f"{name} did not finish within {self.timeout_s} s and was killed"
                                    f"{_stderr_tail(err)}") from None
        if err.strip():
            log.info("%s wrote on standard error: %s", name, err.decode("utf-8", "replace")[-STDERR_TAIL_CHARS:])
        if process.returncode == EX_TEMPFAIL:
            raise StagerUnavailable(f"{name}: the tape system is unavailable (exit {EX_TEMPFAIL}){_stderr_tail(err)}")
        if process.returncode < 0:
            raise SiteScriptError(f"{name} was killed by signal {-process.returncode}{_stderr_tail(err)}")
        if process.returncode != 0:
            raise SiteScriptError(f"{name} failed with exit {process.returncode}{_stderr_tail(err)}")
        return out

    def _kill(self, process):
        """Kill the script's process group; return what it wrote on standard error."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            return process.communicate(timeout=5)[1]
        except subprocess.TimeoutExpired:  # a descendant left the group and holds the pipes open
            process.wait()
            return b""

    def _read_lines(self, operation, out, read):
        """Call read() on the JSON object of each non-blank output line."""
        for number, raw in enumerate(out.split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                read(_json_object(raw))
            except _Problem as problem:
                self._bad_line(operation, number, raw, str(problem))

    def _bad_line(self, operation, number, raw, problem):
        shown = raw.decode("utf-8", "replace")
        if len(shown) > SHOWN_LINE_CHARS:
            shown = shown[:SHOWN_LINE_CHARS] + "..."
        raise SiteScriptError(f"{self._describe(operation)} printed a bad line {number}: {problem}\n"
                              f"  line {number}: {shown}") from None
