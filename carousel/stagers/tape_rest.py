"""The `tape-rest` stager: Carousel as a client of a WLCG Tape REST API v1 endpoint (dCache,
CTA/EOS, StoRM). See /work/shared/interfaces.md for the API as the servers and gfal2 speak it.

Every failure of a whole call (no connection, timeout, 5xx, 429, a refused token, an answer
that is not the API's) raises StagerUnavailable, so the loop backs off and tries again; a
failure of one file is reported for that file."""
import json
import logging
import os
import re
import ssl
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote, urljoin

import httpx

from carousel.stagers.base import (
    MAX_LABEL, FileStatus, LocateError, Location, Stager, StagerUnavailable, directory_tape_label,
)

log = logging.getLogger("carousel.stagers.tape_rest")

DISCOVERY_PATH = "/.well-known/wlcg-tape-rest-api"
LOCATABLE = {"TAPE", "DISK_AND_TAPE", "DISK", "NONE"}  # NONE is an empty file: nothing to read
ON_DISK = {"DISK", "DISK_AND_TAPE"}  # online now: no stage request is sent (carousel/domain/ondisk.py)
FILE_STATES = {"SUBMITTED": "queued", "STARTED": "staging", "COMPLETED": "done"}
# A wrong "permanent" fails a user's request at once, so only what says the file is gone;
# "connection lost" is a network hiccup, not a lost file.
PERMANENT_ERRORS = re.compile(r"no such file|not found|does not exist|(?<!connection )\blost\b", re.IGNORECASE)
TAPE_KEYS = ("tape", "vid")  # vid: CTA's name for a tape label


class TapeRestStager(Stager):
    def __init__(self, *, url, token="", token_file="", timeout_s=30, verify=True, site="", disk_lifetime=None,
                 state_dir=None, locate_batch=1000):
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise ValueError(f"url must be the endpoint's address, https://host:port[/path], got {url!r}")
        self.url = url.rstrip("/")
        self.token = token
        self.token_file = token_file
        self.timeout_s = timeout_s
        self.verify = verify
        self.site = site
        self.disk_lifetime = disk_lifetime
        self._state_dir = state_dir
        self.locate_batch = locate_batch
        self._base = None
        self._sitename = ""
        self._client = None

    # --- the contract -----------------------------------------------------------------------

    def locate(self, paths):
        out = []
        for start in range(0, len(paths), self.locate_batch):
            batch = paths[start:start + self.locate_batch]
            answer = self._json(self._call("POST", "/archiveinfo", body={"paths": batch}, ok=(200,)))
            if not isinstance(answer, list):
                raise StagerUnavailable(f"tape REST archiveinfo: expected a list, got {answer!r:.200}")
            by_key = {path_key(e.get("path", "")): e for e in answer if isinstance(e, dict)}
            out.extend(self._location(p, by_key.get(path_key(p))) for p in batch)
        return out

    def submit(self, job):
        # The API has no idempotency key of its own, so a local record of job id -> request id
        # makes a resubmitted job (the loop crashed before saving our answer) return the same
        # request. A crash between a successful POST and writing the record leaves no trace, and
        # the job is posted again: harmless, as the API says N requests of one file mean the
        # same as one, so the files are staged once; the orphan request only pins them a while.
        if job.backend_id:
            return job.backend_id
        known = self._recorded_request(job.id)
        if known:
            return known
        files = [self._stage_entry(path, job) for path in job.paths]
        response = self._call("POST", "/stage", body={"files": files}, ok=(201,))
        answer = self._json(response)
        request_id = answer.get("requestId") if isinstance(answer, dict) else None
        if not request_id:
            raise StagerUnavailable(f"tape REST stage: no requestId in {response.text[:200]!r}")
        self._record_request(job.id, str(request_id))
        return str(request_id)

    def poll(self, jobs):
        answers = {}
        for job in jobs:
            # The loop polls only jobs whose backend id it committed: our record is spent.
            self._state_file(job.id).unlink(missing_ok=True)
            if not job.backend_id:
                continue
            response = self._call("GET", f"/stage/{quote(job.backend_id, safe='')}", ok=(200, 404))
            if response.status_code == 404:
                continue  # unknown to the backend: left out, the loop requeues its files
            request = self._json(response)
            if not isinstance(request, dict):
                raise StagerUnavailable(f"tape REST stage/{job.backend_id}: not a request: {response.text[:200]!r}")
            answers[job.id] = file_statuses(job.paths, request)
        return answers

    def cancel(self, backend_id, paths):
        # One foreign path makes the server refuse the whole list (400, no change), so on a
        # 400 each path goes alone and the ones it still refuses are only logged.
        response = self._cancel(backend_id, list(paths))
        if response.status_code == 400 and len(paths) > 1:
            for path in paths:
                self._cancel(backend_id, [path])

    def _cancel(self, backend_id, paths):
        response = self._call("POST", f"/stage/{quote(backend_id, safe='')}/cancel", body={"paths": paths},
                              ok=(200, 400, 404))
        if response.status_code != 200:
            log.info("cancel of %s in %s refused: %s", paths, backend_id, problem_text(response))
        return response

    def release(self, backend_id, paths):
        response = self._call("POST", f"/release/{quote(backend_id, safe='')}", body={"paths": list(paths)},
                              ok=(200, 400, 404))
        if response.status_code != 200:
            # A request the backend forgot (or never pinned) has nothing left to release.
            log.info("release of %s in %s refused: %s", list(paths), backend_id, problem_text(response))

    def status(self):
        return {}  # the API has no view of drives, queues or disk buffers

    def close(self):
        """Close the kept-alive connections (the loop never needs to; tests and tools do)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    # --- locate and stage helpers -----------------------------------------------------------

    def _location(self, path, entry):
        if entry is None:
            return LocateError(path, "transient", "tape REST archiveinfo did not answer for this file")
        if entry.get("error"):
            # Classed by its words, as a stage request's errors are: "no such file" fails the
            # request, "not known yet, being located; ask again" (a second Carousel's door) or
            # a server's passing trouble is asked again at the next locate.
            return LocateError(path, error_class(entry["error"]), f"tape REST archiveinfo: {entry['error']}")
        locality = entry.get("locality")
        if locality == "LOST":
            return LocateError(path, "permanent", "tape REST archiveinfo: the file is LOST")
        if locality == "UNAVAILABLE":
            return LocateError(path, "transient", "tape REST archiveinfo: the file is UNAVAILABLE for now")
        if locality is not None and locality not in LOCATABLE:
            return LocateError(path, "transient", f"tape REST archiveinfo: unknown locality {locality!r}")
        # An absent locality means "not known", never "no file" (that gets an error): the file
        # exists, so it is staged and the stage request tells how it went.
        # v1 gives neither position nor size: 0 for both; the backend orders its own recalls.
        # Without a tape of the server's, the site's tape map may know it (carousel/loop/locating.py).
        tape = self._tape_label(entry)
        return Location(path=path, tape=tape or synthetic_tape_label(path), position=0, size=0,
                        tape_known=bool(tape), on_disk=locality in ON_DISK)

    def _tape_label(self, entry):
        """The tape a server names, if any does (no v1 server is required to), else ""."""
        targeted = entry.get("targetedMetadata")
        ours = targeted.get(self.site or self._sitename) if isinstance(targeted, dict) else None
        offered = [entry.get("metadata"), ours]
        for metadata in offered:
            for key in TAPE_KEYS:
                if isinstance(metadata, dict) and metadata.get(key):
                    return str(metadata[key])[:MAX_LABEL]
        return ""

    def _stage_entry(self, path, job):
        entry = {"path": path}
        lifetime = iso_duration(job.lifetimes.get(path, self.disk_lifetime))
        if lifetime:
            entry["diskLifetime"] = lifetime
        return entry

    # --- the local record of submitted jobs -------------------------------------------------

    def _state_file(self, job_id):
        if self._state_dir is None:
            from django.conf import settings  # read late: never at import time

            self._state_dir = Path(settings.VAR_DIR) / "tape-rest"
        return Path(self._state_dir) / f"{job_id}.json"

    def _recorded_request(self, job_id):
        try:
            return json.loads(self._state_file(job_id).read_text())["requestId"]
        except FileNotFoundError:
            return None

    def _record_request(self, job_id, request_id):
        # Written to a temporary file and renamed, so a reader never sees half a record.
        target = self._state_file(job_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({"requestId": request_id, "endpoint": self._base}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)

    # --- HTTP -------------------------------------------------------------------------------

    def _call(self, method, route, *, body=None, ok):
        """One call to {base}{route}; raise StagerUnavailable unless the status is in `ok`."""
        url = self._discover() + route
        response = self._send(method, url, body=body)
        if response.status_code not in ok:
            raise StagerUnavailable(f"tape REST {method} {url}: {http_failure(response)}")
        return response

    def _discover(self):
        if self._base is None:
            url = self.url + DISCOVERY_PATH
            response = self._send("GET", url, follow_redirects=True)
            if response.status_code != 200:
                raise StagerUnavailable(f"tape REST discovery {url}: {http_failure(response)}")
            document = self._json(response)
            if not isinstance(document, dict):
                document = {}
            endpoints = [e for e in document.get("endpoints") or [] if isinstance(e, dict)
                         and e.get("version") == "v1" and e.get("uri")]
            if not endpoints:
                raise StagerUnavailable(f"tape REST discovery {url}: no v1 endpoint in {document!r:.200}")
            self._sitename = document.get("sitename", "")
            self._base = urljoin(str(response.url), endpoints[0]["uri"]).rstrip("/")
        return self._base

    def _send(self, method, url, *, body=None, follow_redirects=False):
        try:
            return self._http().request(method, url, json=body, headers=self._headers(),
                                        follow_redirects=follow_redirects)
        except httpx.HTTPError as exc:
            # The endpoint may have moved (or come back elsewhere): discover again next time.
            self._base = None
            raise StagerUnavailable(f"tape REST {method} {url}: {type(exc).__name__}: {exc}") from exc

    def _http(self):
        # Made on first use, so a process forked after the stager was built gets its own.
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s, verify=ssl_verify(self.verify))
        return self._client

    def _headers(self):
        token = self.token
        if self.token_file:
            # Read at every call: token renewers rewrite the file while we run.
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise StagerUnavailable(f"tape REST token file {self.token_file}: {exc}") from exc
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _json(self, response):
        try:
            return response.json()
        except ValueError as exc:
            raise StagerUnavailable(f"tape REST {response.request.method} {response.request.url}: "
                                    f"answer is not JSON: {response.text[:200]!r}") from exc


def file_statuses(paths, request):
    """The FileStatus of each of the job's paths in a GET stage/{id} answer. Servers sanitise
    paths (duplicate slashes), so files are matched by a normalised key and reported under the
    job's own spelling."""
    files = {path_key(f.get("path", "")): f for f in request.get("files", []) if isinstance(f, dict)}
    out = []
    for path in paths:
        entry = files.get(path_key(path))
        if entry is None:
            # Failing it (bounded retries) beats waiting forever for a file the server dropped.
            out.append(FileStatus(path, "failed", "transient", "tape REST: the stage request does not list this file"))
        else:
            out.append(file_status(path, entry))
    return out


def file_status(path, entry):
    if "state" in entry:
        state = str(entry["state"]).upper()
        if state in FILE_STATES:
            return FileStatus(path, FILE_STATES[state])
        if state == "FAILED":
            message = entry.get("error") or "failed without a reason"
            return FileStatus(path, "failed", error_class(message), failure_text(message, entry))
        if state in ("CANCELLED", "CANCELED"):  # the spec's spelling and gfal2's
            # The broker's own cancels never get here: withdrawn files have already left the
            # job's in-flight set. So someone else cancelled it (a site operator, the server's
            # cleanup) while a user still wants the file: fail it as transient, retried within
            # the attempt limit, rather than a "user" error the user did not make.
            return FileStatus(path, "failed", "transient", failure_text("cancelled at the tape system", entry))
        return FileStatus(path, "failed", "transient", f"tape REST: unrecognised file state {state!r}")
    if entry.get("onDisk"):
        return FileStatus(path, "done")
    if entry.get("error"):
        return FileStatus(path, "failed", error_class(entry["error"]), failure_text(entry["error"], entry))
    # onDisk false says nothing of progress: report no progress rather than invent some.
    return FileStatus(path, "queued")


def error_class(message):
    return "permanent" if PERMANENT_ERRORS.search(str(message)) else "transient"


def failure_text(message, entry):
    when = ""
    try:
        when = f" (at {epoch_to_iso(entry['finishedAt'])})"
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        pass  # a missing or nonsensical time must not fail the poll
    return f"tape REST: {message}{when}"


def epoch_seconds(value):
    """Seconds since the epoch from seconds or milliseconds (dCache sends milliseconds).
    10**11 seconds is the year 5138, so anything larger is milliseconds."""
    return value / 1000 if value > 10**11 else value


def epoch_to_iso(value):
    return datetime.fromtimestamp(epoch_seconds(value), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def path_key(path):
    return re.sub(r"/{2,}", "/", path)


def synthetic_tape_label(path):
    """v1 hides which tape holds a file: the directory stands in for it (base.directory_tape_label)."""
    return directory_tape_label(path)


def iso_duration(lifetime):
    """diskLifetime as the API wants it: ISO-8601 strings pass through, seconds are converted."""
    if lifetime is None or lifetime == "":
        return None
    if isinstance(lifetime, (int, float)):
        return f"PT{int(lifetime)}S"
    return str(lifetime)


def ssl_verify(verify):
    """`verify` as httpx wants it: a bool, or a CA file, or a CA directory such as
    /etc/grid-security/certificates."""
    if isinstance(verify, (str, Path)):
        path = Path(verify)
        return ssl.create_default_context(capath=path) if path.is_dir() else ssl.create_default_context(cafile=path)
    return verify


def http_failure(response):
    """A status a person can act on, with the RFC 7807 title and detail when the server sent them."""
    hint = {401: " (is the token right and not expired?)", 403: " (does the token's scope cover this path?)"}
    return f"{response.status_code} {problem_text(response)}{hint.get(response.status_code, '')}"


def problem_text(response):
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and (body.get("title") or body.get("detail")):
        return ": ".join(str(body[k]) for k in ("title", "detail") if body.get(k))
    return response.text[:200] or response.reason_phrase
