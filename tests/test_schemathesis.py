"""schemathesis over /api/schema/ against a live server (gunicorn on loopback), on PostgreSQL and
on the embedded SQLite default: no answer may be a 500, and every answer must match the schema
(status documented, body as documented). The schema holds the native API and the WLCG Tape REST
door (api/tape_rest/schema.py); the door's stage answer links to the calls that take its id,
which schemathesis follows in its stateful phase (on PostgreSQL only: the phase costs as much as
the door's fuzzing, and the SQLite run is there for the database, not for the flows).

The operations run in groups, a test each (GROUPS), so that pytest-xdist spreads them over its
workers; the groups an xdist worker draws share its server on each database (a database of its
own, a fresh PostgreSQL database on the suite's server or a SQLite file in a temporary
directory, migrated, with a user who has a token and a few requests, so the list and detail
answers carry real rows)."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from carousel.infra.localservices import free_port
from tests import databases, parallel

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


# The operations, in two groups that run as tests of their own, so that pytest-xdist can give them
# to different workers (one run of every operation took 80-160 s on one worker, and a worker that
# drew both databases' runs set the suite's tail). Each operation's cases do not depend on the
# group: the same seed, the same number of cases an operation. The second group is every
# operation the first does not name (the Tape REST door, the stager, the summary, the usage), so
# an operation added later is fuzzed too. Two, not more: each group costs a schemathesis process
# (about 2.5 s of CPU before its first case) and, on a worker that has none yet, a server.
GROUPS = {
    "requests-and-bulks": r"^/api/v1/(requests|bulks)/",
}
OTHERS = "others"


def _filters(group):
    if group is None:
        return []
    if group == OTHERS:
        return ["--exclude-path-regex", "|".join(GROUPS.values())]
    return ["--include-path-regex", GROUPS[group]]


class LiveAPI:
    """gunicorn on loopback over a database of its own, a copy of the run's migrated one (with a
    user who has a token and a few requests, so that the list and detail answers carry real
    rows)."""

    def __init__(self, env, tmp_path, token):
        # The throttle raised out of reach (as benchmarks/load.py does): a group sends some 800
        # requests from one account in well under a minute, the groups an xdist worker draws run
        # back to back against the same account's count (one Redis database per worker), and a
        # run whose schema download is answered 429 tests nothing. 429s are tests/test_throttle.py's.
        env = dict(env, CAROUSEL_THROTTLE_RATE="1000000/minute")
        self.env, self.tmp_path, self.token = env, tmp_path, token
        self.base = f"http://127.0.0.1:{free_port()}"
        # Its log to a file: a pipe nobody reads fills up, and the server blocks on its next log line.
        self.log_path = tmp_path / "gunicorn.log"
        with open(self.log_path, "wb") as log:
            # One worker: schemathesis sends one request at a time (its default, --workers 1),
            # and each gunicorn worker costs a start of Django (about 1.7 s of CPU).
            self.server = subprocess.Popen([str(BIN / "gunicorn"), "-w", "1", "-b", self.base.removeprefix("http://"),
                                            "--timeout", "60", "carousel.wsgi"], cwd=ROOT, env=env,
                                           stdout=subprocess.DEVNULL, stderr=log)
        self.server.log_path = self.log_path
        try:
            _wait_for(f"{self.base}/api/schema/", self.server)
            with urllib.request.urlopen(f"{self.base}/api/schema/?format=json", timeout=30) as answer:
                described = json.load(answer)["paths"]
            assert {"/api/v1/requests/", "/api/tape-rest/v1/stage", "/api/tape-rest/v1/archiveinfo",
                    "/.well-known/wlcg-tape-rest-api"} <= set(described)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        self.server.terminate()
        self.server.wait(timeout=30)

    def schemathesis(self, phases, group, tmp_path):
        """schemathesis run over the group's operations (all of them for None); its output."""
        assert self.server.poll() is None, self.log_path.read_text()[-2000:]
        # 50 generated cases an operation, besides the coverage phase's (every boundary the
        # schema names): issue 14's "at least -n 50" (an earlier session had cut it to 25 for
        # the suite's time; the run is split into groups instead, which xdist spreads).
        done = subprocess.run(
            [str(BIN / "schemathesis"), "run", f"{self.base}/api/schema/", "-H", f"Authorization: Token {self.token}",
             "--checks", "not_a_server_error,response_schema_conformance", "-n", "50", "--seed", "3",
             "--request-timeout", "30", "--phases", phases, *_filters(group),
             "--report-dir", str(tmp_path / "report"),
             # No examples database: this run's would be in its temporary directory, which no
             # later run reads, and keeping one made Hypothesis shrink the pareto front of its
             # targets for that next run (requests-and-bulks on PostgreSQL: 21.6 s of CPU with it,
             # 17.2 s without, 1118 and 1128 cases; every failure is still reported, with its seed).
             "--generation-database", "none"],
            cwd=tmp_path, env=dict(self.env, HYPOTHESIS_STORAGE_DIRECTORY=str(hypothesis_storage())),
            capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
        print(done.stdout[-3000:])
        assert "No issues found" in done.stdout or "passed" in done.stdout, done.stdout[-3000:]
        tested = re.search(r"^ *Tested: (\d+)", done.stdout, re.M)
        assert tested and int(tested[1]) > 0, done.stdout[-3000:]  # a group that matches nothing tests nothing
        return done.stdout


def hypothesis_storage():
    """Hypothesis's storage directory for the run's schemathesis processes, with its Unicode
    tables already built. Hypothesis builds them on first use (the characters each codec can
    encode: a walk over every code point, 2.3 s of CPU; 0.001 s read from a built directory)
    and keeps them in its storage directory, by default `.hypothesis` under the working
    directory: a new one for each run here. Built once a run, by the first xdist worker that
    needs it, through the strategies schemathesis draws its strings from."""
    path = parallel.run_dir() / "hypothesis"
    with parallel.file_lock(parallel.run_dir() / "hypothesis.lock"):
        if not (path / "built").exists():
            subprocess.run([str(BIN / "python"), "-c", WARM_HYPOTHESIS], cwd=parallel.run_dir(), check=True,
                           env=dict(os.environ, HYPOTHESIS_STORAGE_DIRECTORY=str(path)), timeout=300)
            (path / "built").touch()
    return path


# schemathesis's strings: text over the codec it is told (utf-8 by default).
WARM_HYPOTHESIS = """
from hypothesis import given, settings, strategies as st
@settings(max_examples=1, database=None)
@given(st.text(), st.characters(codec="utf-8"))
def draw(text, char):
    pass
draw()
"""


def _private_redis_url():
    """A Redis database that no Celery worker of the suite reads (the withdrawals the cancels
    queue reach no other test's worker) and that no other such server shares (the throttles
    count per account id, the same in every fresh database): 13 in a run in one process, one of
    its own per xdist worker in a parallel run (localservices starts Redis with 256)."""
    index = parallel.worker_index()
    number = 13 if index is None else 128 + index
    return os.environ["REDIS_URL"].rsplit("/", 1)[0] + f"/{number}"


def _with_the_user(env):
    """Adds the user to env's database, a copy of a migrated one (tests/databases.py); the
    user's token."""
    return _manage(env, "shell", "-c", SETUP).stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def postgresql_template():
    """A PostgreSQL database migrated with the user, once a run, by the first xdist worker that
    needs it (a copy of the run's migrated database, tests/databases.py); the run drops it at its
    end (parallel.drop_database_at_the_end). Its name and the user's token."""
    path = parallel.run_dir() / "schemathesis-postgresql"
    with parallel.file_lock(parallel.run_dir() / "schemathesis-postgresql.lock"):
        if not path.exists():
            name = databases.copy_of_migrated_postgresql()
            parallel.drop_database_at_the_end(name)
            token = _with_the_user(databases.env_without_servers(DATABASE_URL=databases.database_url(name), REDIS_URL=_private_redis_url(),
                                        CAROUSEL_VAR_DIR=str(parallel.run_dir() / "schemathesis-var")))
            path.write_text(json.dumps([name, token]))
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def fresh_postgres(postgresql_template):
    """A database of its own on the suite's PostgreSQL, a copy of the template: the live server
    cannot see the test database's uncommitted rows."""
    template, _token = postgresql_template
    name = databases.copy_of(template, prefix="schemathesis")
    yield databases.database_url(name)
    with databases.admin_connection() as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def postgresql_api(postgresql_template, fresh_postgres, tmp_path_factory):
    """One server for every group an xdist worker draws on PostgreSQL (as the one run of every
    operation had)."""
    tmp_path = tmp_path_factory.mktemp("schemathesis-postgresql")
    api = LiveAPI(databases.env_without_servers(DATABASE_URL=fresh_postgres, REDIS_URL=_private_redis_url(),
                       CAROUSEL_VAR_DIR=str(tmp_path / "var"), CAROUSEL_STAGER="immediate"), tmp_path,
                  token=postgresql_template[1])
    yield api
    api.stop()


@pytest.fixture(scope="session")
def sqlite_template():
    """The embedded default's database file, migrated with the user, once a run (as
    postgresql_template); each server reads a copy. Its path and the user's token."""
    root = parallel.run_dir() / "schemathesis-sqlite"
    with parallel.file_lock(parallel.run_dir() / "schemathesis-sqlite.lock"):
        if not (root / "token").exists():
            shutil.rmtree(root, ignore_errors=True)  # a build that failed half way
            var = databases.sqlite_var_dir(root / "var")
            token = _with_the_user(databases.env_without_servers(CAROUSEL_VAR_DIR=str(var), CAROUSEL_STAGER="immediate"))
            (root / "token").write_text(token)
    return root / "var" / "carousel.sqlite3", (root / "token").read_text()


@pytest.fixture(scope="module")
def sqlite_api(sqlite_template, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("schemathesis-sqlite")
    database, token = sqlite_template
    (tmp_path / "var").mkdir()
    for suffix in ("", "-wal"):  # the write-ahead log too, had the last connection not folded it in
        if database.with_name(database.name + suffix).exists():
            shutil.copyfile(database.with_name(database.name + suffix), tmp_path / "var" / (database.name + suffix))
    api = LiveAPI(databases.env_without_servers(CAROUSEL_VAR_DIR=str(tmp_path / "var"), CAROUSEL_STAGER="immediate"), tmp_path, token=token)
    yield api
    api.stop()


@pytest.mark.long(65)
@pytest.mark.parametrize("group", [*GROUPS, OTHERS])
def test_schemathesis_finds_nothing_on_postgresql(postgresql_api, group, tmp_path):
    postgresql_api.schemathesis("examples,coverage,fuzzing", group, tmp_path)


@pytest.mark.long(30)
def test_schemathesis_follows_the_links_on_postgresql(postgresql_api, tmp_path):
    postgresql_api.schemathesis("stateful", None, tmp_path)


@pytest.mark.long(50)
@pytest.mark.parametrize("group", [*GROUPS, OTHERS])
def test_schemathesis_finds_nothing_on_the_embedded_sqlite_default(sqlite_api, group, tmp_path):
    sqlite_api.schemathesis("examples,coverage,fuzzing", group, tmp_path)
