"""schemathesis over /api/schema/ against a live server (gunicorn on loopback), once on
PostgreSQL and once on the embedded SQLite default: no answer may be a 500, and every answer
must match the schema (status documented, body as documented). The schema holds the native API
and the WLCG Tape REST door (api/tape_rest/schema.py); the door's stage answer links to the calls
that take its id, which schemathesis follows in its stateful phase (on PostgreSQL only: the
phase costs as much as the door's fuzzing, and the SQLite run is there for the database, not
for the flows).

Each run gets a database of its own (a fresh PostgreSQL database on the suite's server, or a
SQLite file in a temporary directory), migrated, with a user who has a token and a few
requests, so the list and detail answers carry real rows."""
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from carousel.infra.localservices import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SETUP = """
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.authtoken.models import Token
from carousel.domain.services import restore_submit
user = User.objects.create_user("fuzz", password="fuzz-pw")
restore_submit(user=user, now=timezone.now(), paths=["/fuzz/a", "/fuzz/b", "/fuzz/c"], pin_lifetime=None)
print(Token.objects.create(user=user).key)
"""


def _env(**changes):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({k: v for k, v in changes.items() if v is not None})
    return env


def _manage(env, *args, **kwargs):
    return subprocess.run([str(BIN / "python"), "manage.py", *args], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True, timeout=300, **kwargs)


def _wait_for(url, server, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited: {server.log_path.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def run_schemathesis(env, tmp_path, phases="examples,coverage,fuzzing,stateful"):
    _manage(env, "migrate", "--noinput")
    token = _manage(env, "shell", "-c", SETUP).stdout.strip().splitlines()[-1]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # Its log to a file: a pipe nobody reads fills up, and the server blocks on its next log line.
    log_path = tmp_path / "gunicorn.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen([str(BIN / "gunicorn"), "-w", "2", "-b", f"127.0.0.1:{port}", "--timeout", "60",
                                   "carousel.wsgi"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
    server.log_path = log_path
    try:
        _wait_for(f"{base}/api/schema/", server)
        with urllib.request.urlopen(f"{base}/api/schema/?format=json", timeout=30) as answer:
            described = json.load(answer)["paths"]
        assert {"/api/v1/requests/", "/api/tape-rest/v1/stage", "/api/tape-rest/v1/archiveinfo",
                "/.well-known/wlcg-tape-rest-api"} <= set(described)
        # 25 generated cases an operation, besides the coverage phase's (every boundary the
        # schema names): 72 s and 62 s, run one after the other on a loaded machine (load 3 on 2
        # cores); at 50, 123 s and 115 s idle, a third of the suite's budget once the schema grew.
        done = subprocess.run(
            [str(BIN / "schemathesis"), "run", f"{base}/api/schema/", "-H", f"Authorization: Token {token}",
             "--checks", "not_a_server_error,response_schema_conformance", "-n", "25", "--seed", "3",
             "--request-timeout", "30", "--phases", phases, "--report-dir", str(tmp_path / "report")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    print(done.stdout[-3000:])
    return done.stdout


@pytest.fixture
def fresh_postgres():
    """A database of its own on the suite's PostgreSQL: the live server cannot see the test
    database's uncommitted rows."""
    url = os.environ["DATABASE_URL"]
    name = f"schemathesis_{uuid.uuid4().hex[:8]}"
    admin = settings.DATABASES["default"]
    params = dict(host=admin["HOST"], port=admin["PORT"], user=admin["USER"], password=admin["PASSWORD"] or None,
                  dbname="postgres", autocommit=True)
    with psycopg.connect(**params) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(**params) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_schemathesis_finds_nothing_on_postgresql(fresh_postgres, tmp_path):
    # Redis: a database number of its own, so the withdrawals the cancels queue reach no other
    # test's worker.
    redis = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/13"
    out = run_schemathesis(_env(DATABASE_URL=fresh_postgres, REDIS_URL=redis, CAROUSEL_VAR_DIR=str(tmp_path / "var"),
                                CAROUSEL_STAGER="immediate"), tmp_path)
    assert "No issues found" in out or "passed" in out, out[-3000:]


def test_schemathesis_finds_nothing_on_the_embedded_sqlite_default(tmp_path):
    out = run_schemathesis(_env(CAROUSEL_VAR_DIR=str(tmp_path / "var"), CAROUSEL_STAGER="immediate"), tmp_path,
                           phases="examples,coverage,fuzzing")
    assert "No issues found" in out or "passed" in out, out[-3000:]
