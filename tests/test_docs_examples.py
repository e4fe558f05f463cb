"""The examples of the README and docs/ run in a fresh clone: every workload they replay and every
file they point at is in the repository, not beside it."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests" / "workloads" / "README.md"]

SIMULATE = re.compile(r"manage\.py simulate\s+([^\s`]+\.json(?:\.gz)?)")  # a file, not WORKLOAD
EXPORT = re.compile(r"manage\.py export-workload\b[^\n]*?\s(\S+\.json(?:\.gz)?)\s*$", re.MULTILINE)
WORKLOAD = re.compile(r"[\w./-]*workloads/[\w.-]+\.json(?:\.gz)?")
RELATIVE = re.compile(r"`(\.\./[^`\s]+)`")


def test_every_replayed_workload_is_in_the_repository():
    checked = 0
    for doc in DOCS:
        text = doc.read_text()
        # A workload the same page exports first (last week's traffic) is the reader's own file.
        exported = set(EXPORT.findall(text))
        for name in SIMULATE.findall(text):
            if name in exported:
                continue
            assert (ROOT / name).is_file(), f"{doc.relative_to(ROOT)}: `manage.py simulate {name}`: no such file"
            checked += 1
        for name in WORKLOAD.findall(text):
            assert (ROOT / name).is_file(), f"{doc.relative_to(ROOT)}: {name}: no such file in the repository"
    assert checked  # the README's replay example was found


def test_no_doc_points_outside_the_repository():
    for doc in DOCS:
        text = doc.read_text()
        assert "shared/" not in text, f"{doc.relative_to(ROOT)} names a file outside the repository"
        for target in RELATIVE.findall(text):
            resolved = (doc.parent / target).resolve()
            assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{doc.relative_to(ROOT)}: {target}"


def test_the_replay_benchmark_replays_the_repositorys_workloads():
    spec = importlib.util.spec_from_file_location("replay_benchmark", ROOT / "benchmarks" / "replay.py")
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    assert replay.WORKLOADS.is_relative_to(ROOT)
    shipped = {p.name for p in replay.WORKLOADS.iterdir()}
    assert {"bnl-704.json", "bnl-large.json", "groups.json.gz", "overlap.json.gz", "storm.json.gz"} <= shipped
