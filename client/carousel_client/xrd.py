"""XRootD's staging hooks, as thin clients of Carousel (docs/xrootd.md says how to configure them).

- carousel-xrd-stagecmd REMOTE LOCAL, for `oss.stagecmd`: XRootD runs it when a client opens a
  file that is not on its disk, and tells the client to wait. It asks Carousel for the file
  (joining a request already active for it), waits until it is restored, copies it to LOCAL
  under a temporary name and renames it. Exit 0: staged; 2: the tape system has no such file;
  1: any other failure. On failure it leaves LOCAL.fail (modification time 2 for "no such
  file", as XRootD's own tools do), so that XRootD fails client retries within its hold window
  instead of running this program again for each of them.
- carousel-xrd-prepare [options] -- REQID stage|prep|cancel|evict|query PATH..., run by
  `libXrdOfsPrepGPI.so`. REQID is XRootD's own request id, kept as the submission's label so
  that query and cancel find it. For query, standard output is the reply gfal2 and FTS read.
"""
import fnmatch
import json
import os
import re
import shutil
import stat
import sys
import time
from pathlib import Path

from . import api
from .api import ClientError

STAGED, NO_SUCH_FILE, FAILED = 0, 2, 1
ACTIVE = ("queued", "submitted", "staging", "retry", "delivering")
MAX_PAUSE_S = 60.0
# Debian 12's xrootd 5.5 keeps 2,048 bytes of a query's reply (5.6: `-maxresp`); the reply
# must fit whole, or gfal2 reads broken JSON.
DEFAULT_MAXRESP = 2048


def log(message):
    # XRootD's log gets the hooks' standard error.
    print(f"carousel-xrd: {message}", file=sys.stderr, flush=True)


def client(patience=600.0):
    # The environment alone: XRootD may run the hooks with a HOME that is not its user's, whose
    # configuration file it cannot read (or should not use).
    return api.Client(api.Config.load(use_file=False), patience=patience)


# The hooks read XRootD's environment only, and keep their own patience: a hint of the command's
# that names its configuration file or CAROUSEL_RETRY_S would send a site to settings the hooks
# ignore. Other hints (a token file the user cannot read, try again later) hold as they are.
HOOK_HINTS = {api.EXIT_CONFIG: "the hooks read CAROUSEL_URL and CAROUSEL_TOKEN (or CAROUSEL_TOKEN_FILE) from "
                               "XRootD's environment, never a configuration file",
              api.EXIT_UNAVAILABLE: "check CAROUSEL_URL in XRootD's environment and that the server is running"}


def explained(error):
    """A ClientError's message and a hint that holds for the hooks."""
    hint = error.hint
    if hint and ("client.ini" in hint or "CAROUSEL_RETRY_S" in hint or str(api.CONFIG_FILE) in hint):
        hint = HOOK_HINTS.get(error.code, "")
    return error.message + (f" ({hint})" if hint else "")


def same_path(path):
    """A path as the server stores it, for matching: repeated slashes are one (XRootD passes
    what its client sent; "//a//b" named no file of a request for "/a/b")."""
    return re.sub(r"/{2,}", "/", path)


# --- Identity ------------------------------------------------------------------------------

def on_behalf_of(tident, env=None):
    """The Carousel user the site mapped this client to, or None (act as the token's user).

    Opt-in: CAROUSEL_XRD_USERMAP names a file of `PATTERN USER` lines, PATTERN matched (shell
    wildcards) against `user@host` of XRootD's trace identity. A site writes it only when its
    xrootd authenticates clients so that this name is proven (e.g. sss between trusted hosts);
    a name a client merely declares proves nothing, so without the file no mapping happens. The
    file must not be writable by group or others."""
    env = os.environ if env is None else env
    mapfile = env.get("CAROUSEL_XRD_USERMAP")
    if not mapfile or not tident:
        return None
    try:
        info = os.stat(mapfile)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            log(f"ignoring {mapfile}: writable by group or others")
            return None
        lines = Path(mapfile).read_text().splitlines()
    except OSError as exc:
        log(f"cannot read the user map {mapfile}: {exc.strerror}")
        return None
    user, _, host = tident.partition("@")
    who = f"{user.split('.', 1)[0]}@{host}"
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if fields and len(fields) != 2:
            # Said in XRootD's log: a line dropped without a word sent its clients' requests
            # to the token's own account.
            log(f"{mapfile} line {number}: expected PATTERN USER, ignored")
        elif fields and fnmatch.fnmatchcase(who, fields[0]):
            return fields[1]
    return None


# --- oss.stagecmd ----------------------------------------------------------------------------

def stagecmd_main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: carousel-xrd-stagecmd REMOTE LOCAL", file=sys.stderr)
        return FAILED
    remote, local = argv
    code, why = stage_file(remote, local)
    if code != STAGED:
        log(f"{remote}: {why}")
        _mark_failed(local, no_such_file=code == NO_SUCH_FILE)
    return code


def stage_file(remote, local, *, api_client=None, sleep=time.sleep):
    try:
        carousel = api_client or client()
        try:
            result = carousel.submit([remote])
        except ClientError as error:
            if error.code == api.EXIT_REFUSED:  # a path Carousel cannot take names no file on tape
                return NO_SUCH_FILE, error.message
            raise
        pause = 2.0
        while True:
            rows = carousel.get("requests/", bulk=result["bulk_id"], page_size=1)["results"]
            if not rows:
                return FAILED, "Carousel lost the request"
            request = rows[0]
            if request["state"] == "done":
                return _put(request, local)
            if request["state"] == "failed":
                # Failed at locate, before any tape was known: the tape system has no such file.
                gone = request["error_class"] == "permanent" and not request["tape"]
                return (NO_SUCH_FILE if gone else FAILED), request["last_error"] or "failed"
            if request["state"] in ("cancelled", "expired"):
                return FAILED, f"{request['state']}: {request['last_error']}"
            # Back off, and no faster than the server's own estimate calls for.
            detail = carousel.get(f"requests/{request['id']}/")
            eta = ((detail.get("outlook") or {}).get("eta_s") or [0])[0] or 0
            sleep(min(MAX_PAUSE_S, max(pause, eta / 4)))
            pause = min(pause * 1.5, MAX_PAUSE_S)
    except ClientError as error:
        return FAILED, explained(error)


def _put(request, local):
    source = request.get("disk_path")
    if not source:
        return FAILED, "restored, but Carousel does not say where the copy is (its stager gives no disk path)"
    target = Path(local)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and os.path.samefile(source, target):
        return STAGED, "already in place"
    temporary = target.with_name(f".{target.name}.carousel-{os.getpid()}")
    try:
        shutil.copyfile(source, temporary)
        os.replace(temporary, target)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        return FAILED, f"cannot copy {source} to {local}: {exc.strerror}"
    Path(f"{local}.fail").unlink(missing_ok=True)
    return STAGED, "staged"


def _mark_failed(local, *, no_such_file):
    fail = Path(f"{local}.fail")
    try:
        fail.parent.mkdir(parents=True, exist_ok=True)
        fail.touch()
        if no_such_file:
            os.utime(fail, (2, 2))  # XRootD reads modification time 2 as "no such file" (ENOENT)
    except OSError as exc:
        log(f"cannot write {fail}: {exc.strerror}")


# --- libXrdOfsPrepGPI.so's program -------------------------------------------------------------

def parse_prepare(argv):
    """[-a] [-C] [-n fin|rdy] [-p N] [-w] -- REQID ACTION [PATH...] -> (options, reqid, action, paths)."""
    options = {}
    args = list(argv)
    while args and args[0] != "--":
        flag = args.pop(0)
        if flag in ("-n", "-p") and args:
            options[flag] = args.pop(0)
        else:
            options[flag] = True
    priority = options.get("-p")
    if priority is not None and not re.fullmatch(r"[0-9]+", str(priority)):
        raise ValueError(f"-p takes a priority, a whole number (0 to 3), not {priority!r}")
    if not args or len(args) < 3:
        raise ValueError("usage: carousel-xrd-prepare [options] -- REQID stage|prep|cancel|evict|query [PATH...]")
    _, reqid, action, *paths = args
    return options, reqid, action, paths


def prepare_main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        options, reqid, action, paths = parse_prepare(argv)
    except ValueError as exc:
        log(str(exc))
        return 2
    if action == "query":  # the only action it bounds: a bad value must not stop staging
        try:
            limit = int(os.environ.get("CAROUSEL_XRD_MAXRESP") or DEFAULT_MAXRESP)
            if limit < 1:
                raise ValueError
        except ValueError:
            log(f"CAROUSEL_XRD_MAXRESP must be a number of bytes above 0, not "
                f"{os.environ.get('CAROUSEL_XRD_MAXRESP')!r}")
            return 2
    try:
        carousel = client(patience=20.0)
        if action in ("stage", "prep"):
            return prepare_stage(carousel, reqid, paths, options)
        if action == "cancel":
            return prepare_cancel(carousel, reqid, paths)
        if action == "evict":
            return prepare_evict(carousel, paths)
        if action == "query":
            reply = query_reply(carousel, reqid, paths)
            text = fit_reply(reply, limit)
            if text is None:
                log(f"query {reqid}: the reply for {len(paths)} paths exceeds {limit} bytes; ask for fewer paths "
                    "(xrootd 5.6: -maxresp and CAROUSEL_XRD_MAXRESP)")
                return 1
            sys.stdout.write(text)
            return 0
    except ClientError as error:
        log(f"{action} {reqid}: {explained(error)}")
        return 1
    log(f"unknown request {action!r}")
    return 2


def prepare_stage(carousel, reqid, paths, options):
    body = {"label": reqid}
    if options.get("-p"):
        body["priority"] = min(3, max(0, int(options["-p"])))
    user = on_behalf_of(os.environ.get("XRDPREP_TID"))
    if user:
        body["on_behalf_of"] = user
    # The paths the server refuses are left out and named, and the rest staged: XRootD only logs
    # the hook's exit code, so its client took a request refused whole for one bad path as staged.
    left, refused = list(paths), []
    while True:
        try:
            result = carousel.submit(left, **body)
            break
        except ClientError as error:
            listed = (error.body or {}).get("errors") if error.code == api.EXIT_REFUSED and isinstance(
                error.body, dict) else None
            # Only indexes into what was sent: anything else would resend the same list for ever.
            named = {e["index"]: e.get("message") for e in listed or []
                     if isinstance(e, dict) and isinstance(e.get("index"), int) and 0 <= e["index"] < len(left)}
            if not named:
                raise
            refused += [(left[i], why) for i, why in sorted(named.items())]
            left = [p for i, p in enumerate(left) if i not in named]
            if not left:
                break
    for path, why in refused:
        log(f"stage {reqid}: {path!r} refused: {why}")
    if not left:
        return 1
    log(f"stage {reqid}: {result['files']} files, submission {result['bulk_id']}"
        + (f" on behalf of {user}" if user else "") + (f"; {len(refused)} refused" if refused else ""))
    return 1 if refused else 0


def _bulk_requests(carousel, reqid):
    bulk = carousel.bulk_by_label(reqid)
    return bulk, (list(carousel.pages("requests/", bulk=bulk["id"])) if bulk else [])


def prepare_cancel(carousel, reqid, paths):
    bulk, rows = _bulk_requests(carousel, reqid)
    if bulk is None:
        log(f"cancel {reqid}: no such request")
        return 1
    wanted = {same_path(p) for p in paths}
    ids = [r["id"] for r in rows if r["state"] in ACTIVE and (not wanted or r["path"] in wanted)]
    cancelled = carousel.post("requests/cancel/", {"ids": ids})["cancelled"] if ids else 0
    log(f"cancel {reqid}: {cancelled} cancelled")
    return 0


def prepare_evict(carousel, paths):
    released = carousel.post("requests/release/", {"paths": paths})["released"]
    log(f"evict: {released} pins released")
    return 0


def query_reply(carousel, reqid, paths):
    """{"request_id", "responses": [...]}: one response per path, in the request's order."""
    _, rows = _bulk_requests(carousel, reqid)
    in_request = {}
    for row in rows:
        in_request.setdefault(row["path"], row)
    responses = []
    for path in paths:
        stored = same_path(path)
        row = in_request.get(stored)
        if row is None:  # not in this request: the user's latest request for it, if any
            found = carousel.requests_for_path(stored)
            row = found[0] if found else None
        responses.append(_response(path, row, has_reqid=stored in in_request))
    return {"request_id": reqid, "responses": responses}


def _response(path, row, *, has_reqid):
    state = row["state"] if row else None
    missing = state == "failed" and row["error_class"] == "permanent" and not row["tape"]
    error = row["last_error"] if state in ("failed", "cancelled", "expired") else ""
    return {"path": path, "path_exists": not missing, "on_tape": not missing, "online": state == "done",
            "requested": state in ACTIVE, "has_reqid": has_reqid,
            "req_time": _epoch(row["created_at"]) if row else "0", "error_text": error or ""}


def _epoch(iso):
    from datetime import datetime

    return str(int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()))


def fit_reply(reply, limit):
    """The reply as compact JSON within `limit` bytes (XRootD adds a NUL), shortening error texts
    if need be; None when even that does not fit."""
    room = limit - 1
    text = json.dumps(reply, separators=(",", ":"))
    if len(text.encode()) <= room:
        return text
    for keep in (200, 60, 20, 0):
        for response in reply["responses"]:
            response["error_text"] = response["error_text"][:keep]
        text = json.dumps(reply, separators=(",", ":"))
        if len(text.encode()) <= room:
            return text
    return None
