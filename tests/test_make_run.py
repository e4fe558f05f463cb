"""`make run`, as a person runs it: it answers, Ctrl-C stops the worker and the web server and ends
quietly, and everything it wrote is under CAROUSEL_VAR_DIR, nothing in the working tree."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

SIGINT_AT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                     "os.execvp(sys.argv[1], sys.argv[1:])")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Not `make run`'s doing: the environment, and what other tests running at the same time leave.
NOT_OURS = {".git", ".venv", "__pycache__", ".pytest_cache", "test-artifacts", ".hypothesis"}


def _tree():
    """Every file and folder in the working tree (ignored ones too), but NOT_OURS."""
    found = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in NOT_OURS]
        found.update(os.path.join(folder, name) for name in dirs + files if not name.endswith(".pyc"))
    return found


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _processes_of(var):
    """The pids of the processes started with CAROUSEL_VAR_DIR=var (make, its shell, the servers)."""
    mark = f"CAROUSEL_VAR_DIR={var}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


def _described(pids):
    """What a person would ask `ps` about each process: its group, its session, its state and
    what it waits in, its command."""
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        lines.append(f"pid {pid} ppid {fields[1]} pgid {fields[2]} sid {fields[3]} state {fields[0]} "
                     f"wchan {wchan}: {command[:200]}")
    return "\n".join(lines)


def test_make_run_stops_quietly_on_ctrl_c_and_writes_only_under_its_var_dir(tmp_path):
    var = tmp_path / "var"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAROUSEL_", "DATABASE_URL", "REDIS_URL"))}
    env["CAROUSEL_VAR_DIR"] = str(var)
    before = _tree()
    # `-o venv -o client`: the suite's own make has just made them; a test never reinstalls the
    # environment it runs in. A session of its own, as a terminal's foreground job is.
    # SIGINT at its default, as a terminal's shell leaves it: a shell that starts with it
    # ignored can never trap it (POSIX), and the suite's processes start with it ignored when
    # the suite itself was started in the background (`make test &`: a shell without job control
    # ignores SIGINT in what it starts there). make and its shell then ignored the Ctrl-C, unless
    # an earlier test in the same xdist worker happened to install a handler (exec resets that).
    proc = subprocess.Popen([sys.executable, "-c", SIGINT_AT_DEFAULT, "make", "-o", "venv", "-o", "client", "run",
                             f"ADDR=127.0.0.1:{port}"], cwd=ROOT,
                            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 240
        while not _answers(f"http://127.0.0.1:{port}/accounts/login/"):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "make run did not answer"
            time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals its foreground group
        # Until every process that shares its output has ended.
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired as stuck:
            said = stuck.output or b""  # bytes, even from a text-mode pipe
            said = said.decode(errors="replace") if isinstance(said, bytes) else said
            raise AssertionError(f"make run was still running 120 s after Ctrl-C:\n{_described(_processes_of(var))}\n"
                                 f"its output:\n{said[-4000:]}") from None
        left = _processes_of(var)
    finally:
        for pid in _processes_of(var):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
    assert proc.returncode in (0, -signal.SIGINT), out[-3000:]
    for noise in ("Traceback", "Segmentation fault", "Terminated", "make: ***", "Unrecoverable error"):
        assert noise not in out, out[-3000:]
    assert left == [], "make run left processes running"
    assert (var / "carousel.sqlite3").exists() and (var / "static").is_dir() and (var / "celery-control").is_dir()
    assert _tree() - before == set()
