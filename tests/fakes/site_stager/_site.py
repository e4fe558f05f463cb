"""What the fake site scripts share: the fake tape system's state, kept as files under
$FAKE_SITE_DIR, and the protocol's standard input and output (docs/stager-command.md).

    catalogue.json     {path: [tape, position, size]}, written by the test
    jobs/<id>.json     {"job": broker job id, "tape": ..., "files": {path: state}}
    released.jsonl     one {"job", "path"} line per released file

A real script would lock its state; the tests run one script at a time."""
import json
import os
import sys
from pathlib import Path

STATE = Path(os.environ["FAKE_SITE_DIR"])
JOBS = STATE / "jobs"


def read_lines():
    """Standard input, one entry per line. Read bytes and decode UTF-8 whatever the locale,
    and strip only the newline: a path may begin or end with spaces or tabs."""
    return sys.stdin.buffer.read().decode("utf-8", "surrogatepass").split("\n")[:-1]


def answer(obj):
    # json.dumps escapes everything outside ASCII, so the locale's encoding never matters.
    sys.stdout.write(json.dumps(obj) + "\n")


def job_file(backend_id):
    return JOBS / f"{backend_id}.json"


def load_job(backend_id):
    path = job_file(backend_id)
    return json.loads(path.read_text()) if path.exists() else None


def save_job(backend_id, job):
    JOBS.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: a worker killed mid-cycle never leaves half a job file.
    tmp = job_file(backend_id).with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(job))
    os.replace(tmp, job_file(backend_id))
