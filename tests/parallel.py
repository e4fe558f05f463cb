"""What the suite needs to run in several processes at once (pytest-xdist: `make test` runs it
with `-n`). pytest.ini loads this plugin first (`-p tests.parallel`), before pytest-django reads
Django's settings, so that a worker's settings and every process its tests start agree.

Each worker has a test database of its own (pytest-django adds `_gw0`, `_gw1`, ... to its
name) and, from here, a Redis database of its own: number 16 + its index (localservices starts
Redis with enough of them; 0 to 15 stay for a run in one process and for the tests that name
one themselves). The Celery workers a test starts then take only their own test's tasks, and a
`cache.clear()` empties only its own worker's cache.

The workers of one run share a directory (`run_dir()`, removed at the end of the run), for what
is built once for all of them and for the locks between them; a PostgreSQL database built once
for all of them is dropped at the end too (`drop_database_at_the_end`).

A test marked `runs_alone` stops a server that every worker uses (the suite's PostgreSQL): it
waits until no other worker is inside a test and holds them off until it is done; they then
drop the connections that died with the server. `with alone():` does the same for a block
inside a test (up to the server's return), so that the others go on while the rest of the test
runs."""
import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

FIRST_WORKER_REDIS_DB = 16
RUN_DIR = "CAROUSEL_TEST_RUN_DIR"


def worker_index():
    """0, 1, ... in an xdist worker (gw0, gw1, ...); None when the suite runs in one process."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else None


def run_dir():
    return Path(os.environ[RUN_DIR])


@contextlib.contextmanager
def file_lock(path, mode=fcntl.LOCK_EX):
    with open(path, "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# On PostgreSQL the published default secret key is refused (carousel.E006): a run with its own
# DATABASE_URL, outside carousel.infra.localservices (which sets one), gets a secret of its own,
# here before Django reads its settings, so that the servers and workers the tests start have it.
os.environ.setdefault("SECRET_KEY", "carousel-test-suite-" + os.urandom(24).hex())


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    index, url = worker_index(), os.environ.get("REDIS_URL")
    if index is not None and url:
        os.environ["REDIS_URL"] = urlunsplit(urlsplit(url)._replace(path=f"/{FIRST_WORKER_REDIS_DB + index}"))
    if RUN_DIR not in os.environ:  # the process that starts the workers, or the only one
        # Readable by others: an unprivileged XRootD runs programs installed here.
        path = Path(tempfile.mkdtemp(prefix="carousel-tests-", dir="/tmp"))
        path.chmod(0o755)
        os.environ[RUN_DIR] = str(path)  # the workers, started later, inherit it
        early_config.stash[_run_dir_key] = path
    # What the tests' code writes under VAR_DIR (replay templates, file queues, the HPSS fake's
    # jobs), and the processes they start that are not given a directory of their own: under the
    # run's directory, one for each worker, never in the working tree (where test_make_run saw
    # another test's replay template appear while it checked that `make run` wrote nothing there).
    os.environ["CAROUSEL_VAR_DIR"] = str(run_dir() / f"var-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")


def pytest_configure(config):
    config.addinivalue_line("markers", "runs_alone: stops a server the other xdist workers use, so runs while "
                                       "they wait")
    config.addinivalue_line("markers", "long(seconds): takes about that long (wall, in a parallel run on 2 cores), "
                                       "so is started early, on a worker of its own choosing (see below)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The long tests first, spread over the workers: each worker's first share of the run starts
    with long tests whose seconds add up to about as much as every other worker's.

    `--dist worksteal` hands the workers equal, contiguous shares of the collection, in its
    order, and a worker that runs out takes the back half of the longest queue left. Long tests
    that sat together in the collection (a module of them) therefore ran one after the other on
    one worker, and the last of them set the run's end: the five schemathesis runs took one
    worker 260 s, from 180 s into the run to its end, 50 s after another worker had finished.
    Put at the front of the shares, the long tests start first and each worker's short ones
    after them are what the others take from it."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    long_tests = [item for item in items if item.get_closest_marker("long")]
    if not workers or workers < 2 or not long_tests:
        return

    def seconds(item):
        return item.get_closest_marker("long").args[0]

    shares, loads = [[] for _ in range(workers)], [0.0] * workers
    for item in sorted(long_tests, key=seconds, reverse=True):  # the longest first, to the least loaded
        least = loads.index(min(loads))
        shares[least].append(item)
        loads[least] += seconds(item)
    rest = [item for item in items if not item.get_closest_marker("long")]
    ordered, left = [], len(items)
    for index, share in enumerate(shares):
        size = left // (workers - index)  # as the scheduler divides what is left among the workers left
        fill = max(0, size - len(share))
        ordered += share + rest[:fill]
        rest = rest[fill:]
        left -= len(share) + fill
    items[:] = ordered + rest


def drop_database_at_the_end(name):
    """A PostgreSQL database that a worker made for the whole run (on the suite's server): the
    process that started the workers drops it once they are all done."""
    with file_lock(run_dir() / "databases.lock"), open(run_dir() / "databases", "a") as listing:
        listing.write(name + "\n")


def _drop_databases(path):
    listing = path / "databases"
    if not listing.exists():
        return
    import psycopg
    from django.conf import settings

    admin = settings.DATABASES["default"]
    with contextlib.suppress(psycopg.Error), psycopg.connect(
            host=admin["HOST"], port=admin["PORT"], user=admin["USER"], password=admin["PASSWORD"] or None,
            dbname="postgres", autocommit=True) as conn:
        for name in listing.read_text().split():
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pytest_unconfigure(config):
    path = config.stash.get(_run_dir_key, None)
    if path:
        _drop_databases(path)
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(RUN_DIR, None)


_run_dir_key = pytest.StashKey[Path]()


class _Turns:
    """A readers-writer lock between the workers: every test holds `tests` shared, a test that
    runs alone holds it exclusively. A writer first takes `turnstile`, which readers pass
    through on their way in, so that a steady stream of tests cannot keep it waiting."""

    def __init__(self, directory):
        self.turnstile = open(directory / "turnstile.lock", "a")
        self.tests = open(directory / "tests.lock", "a")
        self.outages = directory / "outages"
        self.outages_seen = self._outages()

    def _outages(self):
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int(self.outages.read_text())
        return 0

    @contextlib.contextmanager
    def shared(self):
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        fcntl.flock(self.tests, fcntl.LOCK_SH)
        fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        try:
            if self._outages() != self.outages_seen:  # a server went away while this worker waited
                from django.db import connections

                connections.close_all()
                self.outages_seen = self._outages()
            yield
        finally:
            fcntl.flock(self.tests, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def alone(self):
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        fcntl.flock(self.tests, fcntl.LOCK_EX)
        try:
            yield
        finally:
            self.outages_seen = self._outages() + 1
            self.outages.write_text(str(self.outages_seen))
            fcntl.flock(self.tests, fcntl.LOCK_UN)
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)


    @contextlib.contextmanager
    def alone_within_a_test(self):
        """alone() from inside a test that holds `tests` shared: the hold is let go first (two
        such tests waiting for each other's hold would wait for ever), taken back after."""
        fcntl.flock(self.tests, fcntl.LOCK_UN)
        try:
            with self.alone():
                yield
        finally:
            fcntl.flock(self.turnstile, fcntl.LOCK_EX)
            fcntl.flock(self.tests, fcntl.LOCK_SH)
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)


_turns = None


@contextlib.contextmanager
def alone():
    """For the block, inside a test: no other worker is inside a test (they finish the one they
    are in, then wait), as for a test marked `runs_alone` but only while the block lasts: for
    stopping a server they all use, when the rest of the test does not need them held off."""
    if worker_index() is None:
        yield
        return
    with _turns.alone_within_a_test():
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _turns
    if worker_index() is None:
        return (yield)
    if _turns is None:
        _turns = _Turns(run_dir())
    with _turns.alone() if item.get_closest_marker("runs_alone") else _turns.shared():
        return (yield)
