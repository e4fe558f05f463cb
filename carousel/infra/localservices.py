"""Private PostgreSQL and Redis servers on loopback, in a temporary directory, for the tests
and the benchmarks:

    python -m carousel.infra.localservices -- pytest

starts both, runs the command with DATABASE_URL and REDIS_URL set (and a random SECRET_KEY when
none is set: on PostgreSQL the default one is refused), and stops them (also when
the command fails). The Debian packages are installed by `make services` when missing."""
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(cmd):
    # initdb and postgres refuse to run as root: drop to the postgres user when we are root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _wait(check, what, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not start within {timeout} s")


def _port_open(port):
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


@contextlib.contextmanager
def postgres(workdir):
    data = Path(workdir) / "pg"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(workdir, "postgres")
        shutil.chown(data, "postgres")
    port = free_port()
    subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-U", "carousel", "--auth=trust",
                                 "--encoding=UTF8", "--no-sync"]), check=True, stdout=subprocess.DEVNULL)
    # Durability is not what tests measure; fsync off keeps the suite fast.
    options = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={data} "
               "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
               "-c shared_buffers=512MB -c work_mem=32MB -c maintenance_work_mem=256MB")
    log = data / "server.log"
    subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options,
                                 "-w", "start"]), check=True, stdout=subprocess.DEVNULL)
    try:
        subprocess.run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "carousel",
                        "carousel"], check=True)
        yield f"postgres://carousel@127.0.0.1:{port}/carousel"
    finally:
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def redis(workdir):
    port = free_port()
    # More than Redis's default 16 databases: the suite gives each pytest-xdist worker one of its
    # own from 16 up (tests/parallel.py).
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                             "--save", "", "--appendonly", "no", "--databases", "256"], stdout=subprocess.DEVNULL)
    try:
        _wait(lambda: _port_open(port), "redis-server")
        yield f"redis://127.0.0.1:{port}/0", port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main(argv):
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="carousel-services-") as workdir:
        os.chmod(workdir, 0o755)
        with postgres(workdir) as database_url, redis(workdir) as (redis_url, redis_port):
            env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url,
                       CAROUSEL_REDIS_PORT=str(redis_port), CAROUSEL_SERVICES_DIR=workdir)
            # PostgreSQL is production to the system checks (carousel.E006): the servers and
            # workers the tests and benchmarks start get a secret of their own, unless given one.
            env.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
            print(f"PostgreSQL at {database_url}, Redis at {redis_url}", flush=True)
            return subprocess.run(argv, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
