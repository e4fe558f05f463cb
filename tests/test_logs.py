"""Structured logs: JSON lines with the context ids, readable text in a terminal, and a real
worker whose every log line is a JSON object, the cycle's carrying the cycle's id."""
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from carousel.ops.logs import ConsoleFormatter, JsonFormatter, log_context, log_format
from carousel.domain.services import restore_submit


def _logger(formatter):
    stream = StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    log = logging.getLogger(f"carousel.test.{uuid.uuid4().hex}")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return log, stream


def test_json_lines_carry_the_context_ids_and_extras():
    log, stream = _logger(JsonFormatter())
    job = uuid.uuid4()
    with log_context(cycle="c-1"):
        log.info("sent %d files", 3, extra={"job": job, "request": 42})
        with log_context(tape="T1"):
            try:
                raise ValueError("line one\nline two")
            except ValueError:
                log.exception("it broke")
    log.warning("outside")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3  # one object per line, tracebacks included
    first, second, third = (json.loads(line) for line in lines)
    assert first["msg"] == "sent 3 files" and first["level"] == "INFO"
    assert (first["cycle"], first["job"], first["request"]) == ("c-1", str(job), 42)
    assert second["cycle"] == "c-1" and second["tape"] == "T1" and "line two" in second["exc"]
    assert "cycle" not in third and third["msg"] == "outside"
    assert first["ts"].endswith("+00:00")


def test_text_lines_for_a_person():
    log, stream = _logger(ConsoleFormatter())
    with log_context(cycle="c-9"):
        log.warning("stager healthy -> down: refused", extra={"job": "j-1"})
    line = stream.getvalue().strip()
    assert "WARNING" in line and "stager healthy -> down: refused" in line and "[cycle=c-9 job=j-1]" in line
    assert not line.startswith("{")


def test_the_format_follows_the_setting_and_the_terminal(monkeypatch):
    monkeypatch.setenv("CAROUSEL_LOG_FORMAT", "json")
    assert log_format() == "json"
    monkeypatch.setenv("CAROUSEL_LOG_FORMAT", "text")
    assert log_format() == "text"
    monkeypatch.delenv("CAROUSEL_LOG_FORMAT")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert log_format() == "text"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert log_format() == "json"


def test_demo_accounts_stay_one_line_each(db):
    out = StringIO()
    call_command("demo", "--no-requests", "--any-database", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "Demo accounts (user / password / API token):"
    for line, name in zip(lines[1:], ("alice", "bob", "charlie", "operator")):
        user, password, token = line.split()[:3]
        assert (user, password, len(token)) == (name, f"{name}-demo", 40)


def _test_database_url():
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def test_a_real_worker_writes_json_lines_with_the_cycle_id(transactional_db, tmp_path, alice, now):
    from carousel.models import Control

    Control.objects.update_or_create(id=1, defaults={"cycle_s": 0.5})
    restore_submit(user=alice, now=now, paths=["/logs/a", "/logs/b"])
    # A Tape REST endpoint where nothing listens: the cycle finds the stager down and says so.
    env = dict(os.environ, DATABASE_URL=_test_database_url(), CAROUSEL_TICK_S="0.5", CAROUSEL_VAR_DIR=str(tmp_path),
               CAROUSEL_STAGER="tape-rest", CAROUSEL_STAGER_OPTIONS=json.dumps({"url": "http://127.0.0.1:9",
                                                                                 "timeout_s": 1}),
               CAROUSEL_LOG_FORMAT="json")
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "carousel", "worker", "-B", "--pool=solo",
                                 "-Q", "celery,control,delivery", "-s", str(tmp_path / "beat-schedule")],
                                env=env, stdout=subprocess.DEVNULL, stderr=out, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "-> down" not in log.read_text(errors="replace"):
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.5)
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    entries = []
    for line in log.read_text().splitlines():
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}")
    down = [e for e in entries if "-> down" in e["msg"]]
    assert down, entries[-5:]
    assert down[0]["logger"] == "carousel.loop" and down[0]["level"] == "WARNING"
    assert uuid.UUID(down[0]["cycle"])  # the cycle task's id
