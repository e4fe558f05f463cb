"""`carousel`: the command line for people. Every command takes --json (anywhere, also after its
own arguments) and then prints one JSON document for scripts; errors go to standard error with
what to do, and the exit code says what happened (api.EXIT_*)."""
import argparse
import codecs
import json
import math
import os
import re
import sys
import time
import uuid
from datetime import datetime

from . import api
from .api import ClientError

ACTIVE = ("queued", "submitted", "staging", "retry", "delivering")
STATES = ACTIVE + ("done", "failed", "cancelled", "expired")

EPILOG = """exit codes: 0 fine; 2 bad command line; 3 no server or token configured; 4 token or action
refused; 5 not found; 6 input refused; 7 server unreachable or failing; for wait: 10 some files
failed, 11 some cancelled or expired, 12 --timeout passed.
configuration: CAROUSEL_URL (the server's address, without /api/v1); CAROUSEL_TOKEN, or
CAROUSEL_TOKEN_FILE, or ~/.config/carousel/client.ini (CAROUSEL_CONFIG: another file).
CAROUSEL_RETRY_S: how many seconds to keep retrying a server that is unreachable, failing or
throttling. Unset: a refused or unreachable server ends the command at once (within 5 s, exit 7),
and a failing or throttling one is retried for 60 s."""

# Without CAROUSEL_RETRY_S a person is waiting: an address that does not answer is an error at
# once, and an unreachable host may take at most this long to say so.
CONNECT_TIMEOUT_S = 4.0
SERVER_PATIENCE_S = 60.0


def _seconds(text, *, zero=False):
    """A number of seconds for --timeout (0: look once) and --interval (above 0): finite, not
    negative (a negative interval polled the API without a pause; nan never timed out)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds {'from 0' if zero else 'above 0'}")
    return value


def _timeout(text):
    return _seconds(text, zero=True)


def _count(text):
    """A number of rows for --limit: a whole number, 0 for all (-1 showed one row)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 0 (0: all)")
    return value


def build_parser():
    parser = argparse.ArgumentParser(prog="carousel", description="Restore files from tape through Carousel.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts (any position)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    submit = commands.add_parser("submit", help="ask for files to be restored; prints the submission's id")
    submit.add_argument("paths", nargs="*", metavar="PATH", help="files to restore; '-' reads them from standard input")
    submit.add_argument("--from-file", metavar="FILE", help="read paths from FILE, one a line ('#' comments)")
    submit.add_argument("--priority", type=int, choices=range(4), default=None, help="0 (default) to 3")
    submit.add_argument("--destination", metavar="DIR",
                        help="a directory to copy the restored files under (if the site delivers them); "
                             "each file goes to DIR/its/whole/path (see --destination-layout)")
    submit.add_argument("--destination-layout", choices=("path", "name"), default=None,
                        help="'path' (default): DIR/star/run1/a.root for /star/run1/a.root; 'name': DIR/a.root, "
                             "and two files with the same name are refused (nothing is submitted)")
    submit.add_argument("--deadline", help="ISO 8601 date-time after which unfinished files expire")
    submit.add_argument("--pin", metavar="DURATION", help="how long the copies stay on disk: PT6H, or seconds")
    submit.add_argument("--notify", action="store_true", default=None, help="be told when it is finished")
    submit.add_argument("--label", help="your own name for this submission")
    submit.add_argument("--activity", metavar="NAME",
                        help="what the files are for (e.g. Express): the site's activity table gives it a priority "
                             "and a share of your group's drive time; unknown names get the group's default")

    status = commands.add_parser("status", help="a submission's progress, estimate and why not yet")
    status.add_argument("id", nargs="?", metavar="ID", help="submission id (default: your latest)")

    wait = commands.add_parser("wait", help="follow a submission until it is finished")
    wait.add_argument("id", metavar="ID")
    wait.add_argument("--timeout", type=_timeout, metavar="SECONDS", help="give up after this long (exit 12)")
    wait.add_argument("--interval", type=_seconds, default=None, metavar="SECONDS",
                      help="first pause between checks (then it grows, up to 30 s)")

    ls = commands.add_parser("ls", help="your requests, newest first")
    ls.add_argument("--state", help="comma-separated: " + ", ".join(STATES))
    ls.add_argument("--bulk", metavar="ID", help="only this submission")
    ls.add_argument("--tape", help="only files on this tape")
    ls.add_argument("--since", help="created at or after (ISO 8601)")
    ls.add_argument("--until", help="created before (ISO 8601)")
    ls.add_argument("--path", help="path contains this text")
    ls.add_argument("--limit", type=_count, default=100, help="at most this many (default 100; 0: all)")

    cancel = commands.add_parser("cancel", help="cancel a submission, requests or paths (your own requests for "
                                                "a path, also files still being queued)")
    cancel.add_argument("targets", nargs="+", metavar="ID|PATH",
                        help="a submission id (UUID), a request id (number) or a path")
    cancel.add_argument("--all-users", action="store_true",
                        help="for paths: every user's requests, not only yours (operators: needs the change "
                             "permission on restore requests)")

    why = commands.add_parser("why", help="where a file's request stands and why it is not restored yet")
    why.add_argument("path", metavar="PATH|ID", help="the file's path, or a request id (as `carousel ls` shows)")
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    # --json is accepted anywhere before a "--", so that it can follow a command's own arguments.
    cut = argv.index("--") if "--" in argv else len(argv)
    as_json = "--json" in argv[:cut]
    argv = [a for i, a in enumerate(argv) if not (i < cut and a == "--json")]
    args = build_parser().parse_args(argv)
    args.json = as_json
    try:
        client = api.Client(api.Config.load(), **patience(os.environ.get("CAROUSEL_RETRY_S")))
        return COMMANDS[args.command](client, args) or api.EXIT_OK
    except ClientError as error:
        return api.report(error, as_json=as_json)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`carousel ls | head`): nothing wrong here. Point stdout at
        # /dev/null so the interpreter's own flush at exit does not fail on the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return api.EXIT_OK


def patience(retry_s):
    """The HTTP client's patience from CAROUSEL_RETRY_S (see EPILOG)."""
    if not retry_s:
        return {"patience": SERVER_PATIENCE_S, "reach_patience": 0.0, "connect_timeout": CONNECT_TIMEOUT_S}
    try:
        seconds = float(retry_s)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ClientError(f"CAROUSEL_RETRY_S is {retry_s!r}: give a number of seconds", code=api.EXIT_CONFIG)
    return {"patience": seconds}


def out(args, data, text):
    print(json.dumps(data, indent=2) if args.json else text)


# Commands -------------------------------------------------------------------------------

def read_paths(args):
    """(paths, where each one was: "line 5 of FILE", "line 2 of standard input", "argument 1"),
    blank lines and # comments left out: the server numbers the list it gets, and a person
    fixes the line of the file they gave."""
    found = []
    sources = list(args.paths)
    if args.from_file:
        try:
            with open(args.from_file, "rb") as f:
                found += _numbered(_text(f.read(), args.from_file), args.from_file)
        except OSError as exc:
            raise ClientError(f"cannot read {args.from_file}: {exc.strerror}", code=api.EXIT_USAGE)
    if "-" in sources:
        stdin = getattr(sys.stdin, "buffer", None)
        found += _numbered(_text(stdin.read(), "standard input") if stdin else sys.stdin.read(), "standard input")
    found += [(p, f"argument {n}") for n, p in enumerate((p for p in sources if p != "-"), 1)]
    if not found:
        raise ClientError("no paths to submit", code=api.EXIT_USAGE,
                          hint="name them, or use --from-file FILE, or '-' to read them from standard input")
    return [p for p, _ in found], [where for _, where in found]


def _numbered(text, name):
    return [(line.strip(), f"line {n} of {name}") for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")]


def _refused_where(exc, origins):
    """A refused submission's listing with each path's place in what the user gave (the
    server's "line N" counts the list it was sent)."""
    errors = exc.body.get("errors") if exc.status == 400 and isinstance(exc.body, dict) else None
    if not errors:
        return exc

    def where(e):
        index = e.get("index")
        return origins[index] if isinstance(index, int) and 0 <= index < len(origins) else f"line {e.get('line')}"

    return ClientError(exc.message.split("\n", 1)[0] + api.refused_lines(errors, where), hint=exc.hint,
                       code=exc.code, status=exc.status, body=exc.body)


def _text(data, name):
    """A list of paths as text: UTF-8 (with or without a byte-order mark), else one line that
    says what the file is instead."""
    fix = "save it as UTF-8 text, one path a line"
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ClientError(f"{name} is UTF-16 text: {fix}", code=api.EXIT_USAGE)
    if b"\0" in data:
        raise ClientError(f"{name} is not a text file (it holds NUL bytes: binary, or UTF-16): {fix}",
                          code=api.EXIT_USAGE)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ClientError(f"{name} is not UTF-8 text (line {line} has the byte {data[exc.start]:#04x}): {fix}",
                          code=api.EXIT_USAGE) from None


def _request_id(text):
    """A request id as typed: ASCII digits only ('²'.isdigit() is true, and int('²') fails)."""
    return re.fullmatch(r"[0-9]+", text) is not None


def cmd_submit(client, args):
    pin = args.pin
    if pin and re.fullmatch(r"\d+", pin):
        pin = int(pin)
    paths, origins = read_paths(args)
    # Large lists go in one request: the server takes a whole submission or refuses it whole.
    try:
        result = client.submit(paths, priority=args.priority, destination=args.destination,
                               destination_layout=args.destination_layout,
                               deadline=args.deadline, pin_lifetime=pin, notify=args.notify, label=args.label,
                               activity=args.activity)
    except ClientError as exc:
        raise _refused_where(exc, origins) from None
    data = {"id": result["bulk_id"], **{k: v for k, v in result.items() if k != "bulk_id"}}
    if not args.json and sys.stderr.isatty():
        print(f"{result['files']} files: {result['created']} new, {result['existing']} already requested, "
              f"{result['shared']} joining another user's restore. Follow it: carousel wait {data['id']}",
              file=sys.stderr)
    out(args, data, data["id"])


def _bulk_id(client, given):
    if given:
        try:
            uuid.UUID(given)
        except ValueError:
            raise ClientError(f"{given!r} is not a submission id", code=api.EXIT_USAGE,
                              hint="a submission id is the UUID that `carousel submit` printed")
        return given
    latest = client.get("bulks/", page_size=1, mine="true")["results"]  # an operator sees everyone's
    if not latest:
        raise ClientError("you have no submissions yet", code=api.EXIT_NOT_FOUND, hint="carousel submit PATH...")
    return latest[0]["id"]


STEPS = ("restored", "delivering", "being_read", "planned", "queued", "waiting_to_retry", "failed", "cancelled",
         "expired")


def snapshot(client, bulk_id):
    """The submission at a glance, from the server's summary (one call whatever its size): counts
    per state and per step, bytes, the estimate for the rest and why not yet."""
    bulk = client.get(f"bulks/{bulk_id}/")
    try:
        summary = client.get(f"bulks/{bulk_id}/summary/")
    except ClientError as error:
        if error.status != 404:
            raise
        summary = {}  # a server older than the summary: counts per state only
    states = bulk["states"]
    estimate = summary.get("estimate")
    snap = {"id": bulk_id, "files": bulk["files"], "states": states, "done": states.get("done", 0),
            "active": sum(states.get(s, 0) for s in ACTIVE), "bytes_total": summary.get("size") or None,
            "bytes_done": summary.get("bytes_restored"), "eta_s": None, "why": summary.get("why") or [],
            "counts": summary.get("counts") or {}, "estimate": estimate, "finished": summary.get("finished")}
    if estimate and snap["active"]:
        now = time.time()
        snap["eta_s"] = [max(0.0, _epoch(estimate["earliest"]) - now),
                         None if not estimate.get("latest") else max(0.0, _epoch(estimate["latest"]) - now)]
    return snap


def _epoch(iso):
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _clock(iso):
    """An ISO time in the client's own time zone, as a person reads it next to now."""
    when = datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone()
    return when.strftime("%H:%M" if when.date() == datetime.now().astimezone().date() else "%Y-%m-%d %H:%M")


def _range(estimate):
    """"between 17:40 and 19:10", "not before 17:40", "" without an estimate."""
    if not estimate:
        return ""
    earliest, latest = _clock(estimate["earliest"]), estimate.get("latest") and _clock(estimate["latest"])
    if latest is None:
        return f"not before {earliest}"
    return f"about {latest}" if earliest == latest else f"between {earliest} and {latest}"


def summary_line(snap):
    """"31,204 of 50,000 files restored, 12 failed, the rest between 17:40 and 19:10"."""
    counts = snap["counts"]
    text = f"{snap['done']:,} of {snap['files']:,} files restored"
    for step in ("failed", "cancelled", "expired"):
        if counts.get(step):
            text += f", {counts[step]:,} {step}"
    if snap["active"]:
        when = _range(snap["estimate"])
        text += f", the rest {when}" if when else ", the rest: no estimate yet"
    elif snap["estimate"]:
        text += f" (the first at {_clock(snap['estimate']['earliest'])}, the last at " \
                f"{_clock(snap['estimate']['latest'])})"
    return text


def restored_files(client, bulk_id):
    """Every restored file of the submission with where it is, page after page."""
    return [{"path": r["path"], "where": r.get("where") or r.get("disk_path"), "where_kind": r.get("where_kind"),
             "pin_until": r.get("pin_until")}
            for r in client.pages("requests/", bulk=bulk_id, state="done")]


def cmd_status(client, args):
    bulk_id = _bulk_id(client, args.id)
    snap = snapshot(client, bulk_id)
    if args.json:
        snap["restored"] = restored_files(client, bulk_id)
    lines = [f"submission {snap['id']}: {summary_line(snap)}"]
    if snap["bytes_total"]:
        lines.append(f"  {_size(snap['bytes_done'])} of {_size(snap['bytes_total'])} restored")
    lines.append("  " + ", ".join(f"{s} {n}" for s, n in snap["states"].items() if n))
    if snap["active"]:
        lines += [f"  why not yet: {reason}" for reason in snap["why"]]
    if snap["done"]:
        lines.append(f"  where they are: carousel status {bulk_id} --json, or carousel ls --bulk {bulk_id} "
                     "--state done --json")
    out(args, snap, "\n".join(lines))


def cmd_wait(client, args):
    bulk_id = _bulk_id(client, args.id)
    bar = sys.stdout.isatty() and not args.json
    started = time.monotonic()
    pause = args.interval or 2.0
    history = []  # (time, files done, bytes done): the rate seen by this client
    while True:
        snap = snapshot(client, bulk_id)
        now = time.monotonic()
        history = [h for h in history if now - h[0] < 120] + [(now, snap["done"], snap["bytes_done"] or 0)]
        if bar:
            _draw(snap, history)
        if not snap["active"]:
            break
        if args.timeout is not None and now - started >= args.timeout:
            if bar:
                print(file=sys.stdout)
            out(args, {**snap, "result": "timeout"}, f"still {snap['active']} files to go after {args.timeout:g} s")
            return api.EXIT_TIMEOUT
        # Never hammer the API: grow the pause, and wait longer when the server expects long.
        eta = (snap["eta_s"] or [None])[0]
        wait = min(30.0, max(pause, (eta or 0) / 10))
        if args.timeout is not None:
            wait = max(0.1, min(wait, args.timeout - (now - started)))
        time.sleep(wait)
        pause = min(pause * 1.5, 30.0)
    if bar:
        print(file=sys.stdout)
    states = snap["states"]
    failed, gone = states.get("failed", 0), states.get("cancelled", 0) + states.get("expired", 0)
    code = api.EXIT_FAILED if failed else api.EXIT_CANCELLED if gone else api.EXIT_OK
    result = {api.EXIT_OK: "restored", api.EXIT_FAILED: "failed", api.EXIT_CANCELLED: "cancelled"}[code]
    text = f"{snap['done']} of {snap['files']} files restored"
    if failed or gone:
        unfinished = ",".join(s for s in ("failed", "cancelled", "expired") if states.get(s))
        text += (f"; {failed} failed, {gone} cancelled or expired "
                 f"(see: carousel ls --bulk {bulk_id} --state {unfinished})")
    out(args, {**snap, "result": result}, text)
    return code


def _draw(snap, history):
    width = 30
    total = max(snap["files"], 1)
    filled = int(width * snap["done"] / total)
    t0, f0, b0 = history[0]
    t1, f1, b1 = history[-1]
    rate = (f1 - f0) / (t1 - t0) if t1 > t0 else 0.0
    byte_rate = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
    left = snap["files"] - snap["done"]
    eta = left / rate if rate > 0 else (snap["eta_s"] or [None])[0]
    parts = [f"[{'#' * filled}{'.' * (width - filled)}] {snap['done']}/{snap['files']} files"]
    if snap["bytes_total"]:
        parts.append(f"{_size(snap['bytes_done'])}/{_size(snap['bytes_total'])}")
    parts.append(f"{rate:.1f} files/s" + (f" {_size(byte_rate)}/s" if snap["bytes_total"] else ""))
    when = _range(snap["estimate"]) if snap["active"] else ""
    parts.append(f"rest {when}" if when else f"eta {_eta([eta] if eta is not None else None)}")
    sys.stdout.write("\r" + "  ".join(parts) + "\x1b[K")
    sys.stdout.flush()


def cmd_ls(client, args):
    rows = []
    for row in client.pages("requests/", state=args.state, bulk=args.bulk, tape=args.tape, since=args.since,
                            until=args.until, path=args.path, mine="true"):
        rows.append(row)
        if args.limit and len(rows) >= args.limit:
            break
    line = "{:>8}  {:<10}  {:>9}  {:<8}  {}".format
    shown = [line("ID", "STATE", "SIZE", "TAPE", "PATH")]
    for r in rows:
        shown.append(line(r["id"], r["state"], _size(r["size"]), r["tape"] or "-", r["path"]))
        if r.get("where"):  # a restored file: where it is, on a line of its own under it
            shown.append(" " * 10 + where_text(r) + (f", pinned until {_clock(r['pin_until'])}"
                                                      if r.get("pin_until") else ""))
    text = "\n".join(shown) if rows else "(no requests)"
    out(args, rows, text)


def cmd_cancel(client, args):
    total, missing = 0, []
    ids, paths = [], []
    for target in args.targets:
        if target.startswith("/"):
            paths.append(target)
        elif _request_id(target):
            ids.append(int(target))
        else:
            try:
                uuid.UUID(target)
            except ValueError:
                raise ClientError(f"{target!r} is neither a submission id, a request id nor a path",
                                  code=api.EXIT_USAGE, hint="paths start with '/'")
            total += client.post(f"bulks/{target}/cancel/")["cancelled"]
    if paths:
        # The server picks the requests: the caller's own (files still being queued included),
        # or everyone's with --all-users; it says which paths had none active.
        body = {"paths": paths, **({"all_users": True} if args.all_users else {})}
        answer = client.post("requests/cancel/", body)
        total += answer["cancelled"]
        missing += answer.get("not_active", [])
    skipped = 0
    if ids:
        # The server skips the ids the caller may not cancel or that are not active, silently:
        # said here as for paths (before: "cancelled 0 requests", exit 0, for an id never seen).
        cancelled = client.post("requests/cancel/", {"ids": ids})["cancelled"]
        total += cancelled
        skipped = len(set(ids)) - cancelled
    if missing or skipped:
        said = [f"no active request for: {', '.join(missing)}"] if missing else []
        if skipped:
            said.append(f"{skipped} of the request ids given {'is' if skipped == 1 else 'are'} not yours or "
                        "not active")
        raise ClientError("; ".join(said) + (f" (the others cancelled: {total})" if total else ""),
                          code=api.EXIT_NOT_FOUND, hint="see your requests with: carousel ls")
    out(args, {"cancelled": total}, f"cancelled {total} request{'s' if total != 1 else ''}")


def cmd_why(client, args):
    if _request_id(args.path):  # a request id, as `carousel ls` shows them
        detail = client.get(f"requests/{args.path}/")
    elif args.path.startswith("/"):
        found = client.requests_for_path(args.path, mine="true")  # yours, even when you see others
        if not found:
            raise ClientError(f"you have no request for {args.path}", code=api.EXIT_NOT_FOUND,
                              hint=f"ask for it with: carousel submit {args.path}")
        detail = client.get(f"requests/{found[0]['id']}/")
    else:
        raise ClientError(f"{args.path!r} is neither a path nor a request id", code=api.EXIT_USAGE,
                          hint="paths start with '/'; request ids are the first column of `carousel ls`")
    state = detail["state"]
    lines = [f"{detail['path']}: {state} (request {detail['id']})"]
    if state == "done":
        lines.append(f"  restored: {where_text(detail)}")
        pinned = detail.get("pin_until")
        lines.append(f"  pinned until {_clock(pinned)}" if pinned else
                     "  not pinned: the stager may drop its copy when it needs the space")
    elif state in ("failed", "cancelled", "expired"):
        lines.append(f"  {detail.get('last_error') or state}")
    else:
        outlook = detail.get("outlook") or {}
        lines += [f"  {reason}" for reason in outlook.get("reasons") or []]
        lines.append(f"  estimate: {_eta(outlook.get('eta_s'))}")
    out(args, detail, "\n".join(lines))


WHERE = {"disk": "on disk at", "delivered": "delivered to", "in_place": "used in place at"}


def where_text(detail):
    """Where a restored file is, as the server says (an older server gives only disk_path)."""
    if detail.get("where"):
        return f"{WHERE.get(detail.get('where_kind'), 'at')} {detail['where']}"
    return f"on disk at {detail['disk_path']}" if detail.get("disk_path") else "where the tape system put it"


COMMANDS = {"submit": cmd_submit, "status": cmd_status, "wait": cmd_wait, "ls": cmd_ls, "cancel": cmd_cancel,
            "why": cmd_why}


def _size(n):
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _eta(eta):
    if not eta or eta[0] is None:
        return "unknown yet"
    low, high = eta[0], eta[1] if len(eta) > 1 else None

    def human(s):
        s = int(s)
        return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
    return f"{human(low)} to {human(high)}" if high is not None and high != low else f"about {human(low)}" \
        if high is not None else f"at least {human(low)}"


if __name__ == "__main__":
    sys.exit(main())
