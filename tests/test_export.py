"""export-workload: a small workload run through the real loop and the simulated library in
the test database, exported, gives back its tapes, files and requests; simulate accepts it."""
import json
import re
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from carousel.models import RestoreRequest, Tape
from carousel.sim import replay
from carousel.sim.workload import load, parse

ROOT = Path(__file__).resolve().parent.parent


def small_workload():
    tapes = []
    for t in range(3):
        files = [[f"/exp/T{t}/f{i}", 2_000_000_000 + i * 1000, 50_000_000_000 * i + t] for i in range(6)]
        tapes.append({"label": f"EXP00{t}", "media": "LTO-8", "used_bytes": 12_000_000_000_000, "files": files})
    requests = [{"t": 0, "user": "prod", "path": f"/exp/T0/f{i}"} for i in range(6)]
    requests += [{"t": 0, "user": "prod", "path": f"/exp/T1/f{i}"} for i in range(6)]
    requests += [{"t": 120.5, "user": "ana", "path": "/exp/T2/f1"}, {"t": 120.5, "user": "ana", "path": "/exp/T2/f4"},
                 {"t": 900, "user": "ana2", "path": "/exp/T0/f3"}, {"t": 1800, "user": "ana", "path": "/exp/T2/f5"}]
    return {"format": "carousel-workload/1", "name": "export-test", "library": {"drives": {"LTO-8": 2}},
            "groups": {"production": {"weight": 3}, "analysis": {"weight": 1}},
            "users": {"prod": {"group": "production", "cap": 500}, "ana": {"group": "analysis"},
                      "ana2": {"group": "analysis"}},
            "tapes": tapes, "requests": requests}


@pytest.mark.long(23)
def test_export_of_a_replayed_workload_gives_back_its_tapes_files_and_requests(db, tmp_path):
    original = parse(small_workload())
    replay.replay_broker(original)
    assert RestoreRequest.objects.filter(state="done").count() == len(original.requests)
    out = tmp_path / "week.json.gz"
    stdout = StringIO()
    call_command("export-workload", str(out), "--since", (replay.EPOCH - timedelta(hours=1)).isoformat(),
                 "--until", (replay.EPOCH + timedelta(days=1)).isoformat(), "--drives", "LTO-8=2", stdout=stdout)
    assert "16 requests of 3 users, 15 files on 3 tapes" in stdout.getvalue()
    exported = load(out)  # the format's own checks
    assert exported.tape_media == original.tape_media
    requested = {r.path for r in original.requests}
    assert {p: (f.tape, f.offset, f.size) for p, f in exported.files.items()} == {
        p: (f.tape, f.offset, f.size) for p, f in original.files.items() if p in requested}
    assert sorted((r.t, r.user, r.path) for r in exported.requests) == sorted(
        (r.t, r.user, r.path) for r in original.requests)
    assert exported.groups == original.groups
    assert {u: (s.group, s.cap) for u, s in exported.users.items()} == {
        u: (s.group, s.cap) for u, s in original.users.items()}
    assert exported.drives == {"LTO-8": 2}
    # simulate accepts it and replays it whole.
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "manage.py", "simulate", str(out), "--report", str(report)], cwd=ROOT,
                   check=True, capture_output=True, timeout=300)
    result = json.loads(report.read_text())
    assert result["workload"] == exported.name and result["files_done"] == 16 and result["tapes"] == 3


def test_unknown_positions_are_laid_end_to_end_and_said(db, tmp_path, alice, now):
    from carousel.domain.services import restore_submit

    restore_submit(user=alice, now=now, paths=["/rest/b", "/rest/a"])
    tape = Tape.objects.create(label="TR1", media="")
    RestoreRequest.objects.update(tape=tape, size=100, position=None)
    out = tmp_path / "rest.json"
    err = StringIO()
    call_command("export-workload", str(out), "--since", (now - timedelta(minutes=1)).isoformat(),
                 "--until", (now + timedelta(minutes=1)).isoformat(), "--drives", "LTO-9=1", stderr=err,
                 stdout=StringIO())
    data = json.loads(out.read_text())
    assert data["tapes"][0]["files"] == [["/rest/a", 100, 0], ["/rest/b", 100, 100]]
    assert data["tapes"][0]["media"] == "LTO-9"
    assert "only good for questions of sharing" in data["description"] and "only good" in err.getvalue()
    load(out)


# Found by a probe, the last four: a workload `simulate` then refused, or a traceback for the file's place.
@pytest.mark.parametrize("target, args, says", [
    ("x.json", ["--drives", "LTO-8=1"], "no located request"),
    ("x.json", ["--drives", "LTO-99=1"], "'LTO-99' is not a known technology"),
    ("x.json", ["--drives", "LTO-8=0"], "expected MEDIA=N with N from 1 to 1000"),
    # A file `simulate` then refused; a date's error said "invalid _moment value" (a probe).
    ("x.json", ["--drives", "LTO-8=1001"], "expected MEDIA=N with N from 1 to 1000"),
    ("x.json", ["--since", "notadate", "--until", "2026-01-01"], "'notadate' is not an ISO 8601 date-time or date"),
    ("x.json", ["--media", "LTO-99"], "invalid choice: 'LTO-99'"),
    ("nowhere/x.json", [], "no directory"),
    ("", [], "is a directory"),
    ("x.json", ["--since", "2026-01-02", "--until", "2026-01-01"], "--since must be before"),
])
def test_bad_arguments_are_refused(db, tmp_path, target, args, says):
    period = [] if "--since" in args else ["--since", "2026-01-01", "--until", "2026-01-02"]
    with pytest.raises(CommandError, match=re.escape(says)):
        call_command("export-workload", str(tmp_path / target), *period, *args)
    assert not (tmp_path / "x.json").exists()
