"""A small WLCG Tape REST API v1 server on loopback for the `tape-rest` stager's tests,
following the v1 document as /work/shared/interfaces.md summarises it.

    with TapeRestServer(token="s3cret") as server:
        server.url          # http://127.0.0.1:PORT, discovery advertises server.url + "/api/v1"
        server.advance()    # every file one step on: SUBMITTED -> STARTED -> COMPLETED (or FAILED)
        server.calls["POST /stage"]

Files fail at their STARTED -> next step if their path is in `failing` (path -> error text).
`down = True` closes every connection unanswered; `answer_all = 503` answers every call so."""
import json
import re
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BASE_PATH = "/api/v1"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}


class TapeRestServer:
    def __init__(self, *, token="", failing=None, files=None, sitename="fake-site"):
        self.token = token
        self.failing = dict(failing or {})
        self.files = dict(files or {})  # archiveinfo's namespace: path -> locality (None: unknown)
        self.archive_extras = {}  # path -> fields beyond v1 to add to its archiveinfo entry
        self.archive_errors = {}  # path -> the error its archiveinfo entry gives instead
        self.sitename = sitename
        self.requests = {}  # request id -> {"createdAt", "startedAt", "files": {path: file dict}}
        self.stage_bodies = []
        self.released = []  # (request id, paths)
        self.calls = Counter()
        self.down = False
        self.answer_all = None
        self.on_disk_style = False  # report files as {"path", "onDisk"} instead of a state
        self.millis = False  # timestamps in milliseconds, as dCache sends them
        self.lock = threading.Lock()
        self._httpd = None

    # --- test controls ----------------------------------------------------------------------

    def __enter__(self):
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.fake = self
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def url(self):
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def advance(self):
        with self.lock:
            for request in self.requests.values():
                request["startedAt"] = request["startedAt"] or self.now()
                for path, f in request["files"].items():
                    self._advance_file(path, f)

    def _advance_file(self, path, f):
        if f["state"] == "SUBMITTED":
            f.update(state="STARTED", startedAt=self.now())
        elif f["state"] == "STARTED" and path in self.failing:
            f.update(state="FAILED", finishedAt=self.now(), error=self.failing[path])
        elif f["state"] == "STARTED":
            f.update(state="COMPLETED", finishedAt=self.now())

    def now(self):
        return int(time.time() * 1000) if self.millis else int(time.time())

    # --- the API ----------------------------------------------------------------------------

    def discovery(self, handler):
        return 200, {"sitename": self.sitename, "description": "fake tape",
                     "endpoints": [{"uri": self.url + BASE_PATH, "version": "v1", "metadata": {}}]}

    def stage(self, handler, body):
        files = body.get("files") if isinstance(body, dict) else None
        if not isinstance(files, list) or not all(isinstance(f, dict) and f.get("path") for f in files):
            return problem(400, "Bad request", "files must be a list of objects with a path")
        self.stage_bodies.append(body)
        request_id = str(uuid.uuid4())
        self.requests[request_id] = {
            "createdAt": self.now(), "startedAt": None,
            "files": {sanitise(f["path"]): {"state": "SUBMITTED"} for f in files},
        }
        handler.extra_headers["Location"] = f"{self.url}{BASE_PATH}/stage/{request_id}"
        return 201, {"requestId": request_id}

    def stage_status(self, handler, request_id):
        request = self.requests.get(request_id)
        if request is None:
            return problem(404, "Not found", f"no stage request {request_id}")
        answer = {"id": request_id, "createdAt": request["createdAt"],
                  "files": [self._file_view(path, f) for path, f in request["files"].items()]}
        if request["startedAt"]:
            answer["startedAt"] = request["startedAt"]
        if all(f["state"] in TERMINAL for f in request["files"].values()):
            answer["completedAt"] = max(f.get("finishedAt", request["createdAt"]) for f in request["files"].values())
        return 200, answer

    def _file_view(self, path, f):
        if self.on_disk_style:
            view = {"path": path, "onDisk": f["state"] == "COMPLETED"}
            return {**view, "error": f["error"]} if "error" in f else view
        return {"path": path, **f}

    def cancel(self, handler, request_id, body):
        request = self.requests.get(request_id)
        if request is None:
            return problem(404, "Not found", f"no stage request {request_id}")
        paths = [sanitise(p) for p in (body or {}).get("paths", [])]
        foreign = [p for p in paths if p not in request["files"]]
        if foreign:  # the spec: 400 and no change at all
            return problem(400, "Bad request", f"not in request {request_id}: {', '.join(foreign)}")
        for path in paths:
            f = request["files"][path]
            if f["state"] not in TERMINAL:
                f.update(state="CANCELLED", finishedAt=self.now())
        return 200, None

    def delete(self, handler, request_id):
        if self.requests.pop(request_id, None) is None:
            return problem(404, "Not found", f"no stage request {request_id}")
        return 200, None

    def release(self, handler, request_id, body):
        if request_id not in self.requests:
            return problem(404, "Not found", f"no stage request {request_id}")
        self.released.append((request_id, (body or {}).get("paths", [])))
        return 200, None

    def archiveinfo(self, handler, body):
        answer = []
        for path in (body or {}).get("paths", []):
            if path in self.archive_errors:
                answer.append({"path": path, "error": self.archive_errors[path]})
            elif path not in self.files:
                answer.append({"path": path, "error": "No such file or directory"})
            elif self.files[path] is None:
                answer.append({"path": path})
            else:
                answer.append({"path": path, "locality": self.files[path], **self.archive_extras.get(path, {})})
        return 200, answer

    def route(self, handler, method, path, body):
        """(route name for `calls`, a function answering (status, body)) for one call."""
        path = path.rstrip("/") or "/"  # gfal2 posts with a trailing slash: accept both forms
        if path == "/.well-known/wlcg-tape-rest-api" and method == "GET":
            return "GET /.well-known/wlcg-tape-rest-api", lambda: self.discovery(handler)
        rest = path[len(BASE_PATH):] if path.startswith(BASE_PATH + "/") else path
        for pattern, name, call in (
            (r"POST /stage", "POST /stage", lambda: self.stage(handler, body)),
            (r"GET /stage/([^/]+)", "GET /stage/{id}", lambda i: self.stage_status(handler, i)),
            (r"POST /stage/([^/]+)/cancel", "POST /stage/{id}/cancel", lambda i: self.cancel(handler, i, body)),
            (r"DELETE /stage/([^/]+)", "DELETE /stage/{id}", lambda i: self.delete(handler, i)),
            (r"POST /release/([^/]+)", "POST /release/{id}", lambda i: self.release(handler, i, body)),
            (r"POST /archiveinfo", "POST /archiveinfo", lambda: self.archiveinfo(handler, body)),
        ):
            match = re.fullmatch(pattern, f"{method} {rest}")
            if match and rest != path:
                return name, lambda: call(*match.groups())
        return f"{method} ?", lambda: problem(404, "Not found", path)

    def authorised(self, name, headers):
        # Discovery is public, as on the real servers; everything else wants the bearer token.
        return not self.token or name.startswith("GET /.well-known") or \
            headers.get("Authorization") == f"Bearer {self.token}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out apart: without this each answer waits 40 ms

    def log_message(self, *args):
        pass  # quiet tests

    def do_GET(self):
        self.handle_call("GET")

    def do_POST(self):
        self.handle_call("POST")

    def do_DELETE(self):
        self.handle_call("DELETE")

    def handle_call(self, method):
        fake = self.server.fake
        self.extra_headers = {}
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if fake.down:
            fake.calls["down"] += 1
            self.close_connection = True  # no answer at all, as a crashed or unreachable server
            return
        with fake.lock:
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            name, call = fake.route(self, method, self.path.split("?")[0], body)
            fake.calls[name] += 1
            if fake.answer_all:
                status, answer = problem(fake.answer_all, "Service unavailable", "the fake is down")
            elif not fake.authorised(name, self.headers):
                status, answer = problem(401, "Unauthorized", "a valid bearer token is required")
            else:
                status, answer = call()
        self.reply(status, answer)

    def reply(self, status, answer):
        data = b"" if answer is None else json.dumps(answer).encode()
        self.send_response(status)
        if answer is not None:
            content_type = "application/problem+json" if status >= 400 else "application/json"
            self.send_header("Content-Type", content_type)
        for key, value in self.extra_headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def problem(status, title, detail):
    return status, {"status": status, "title": title, "detail": detail}


def sanitise(path):
    return re.sub(r"/{2,}", "/", path)
