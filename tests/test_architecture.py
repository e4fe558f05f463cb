"""The package map holds: dependencies point down (the import-linter contracts in .importlinter),
no module imports itself back through others, and carousel/ keeps its few loose modules."""
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("carousel", "policies", "api", "frontend")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# Django's and Celery's entry points, which stay where those frameworks look for them.
ENTRY_POINTS = {"__init__", "settings", "urls", "wsgi", "asgi", "celery", "apps", "admin"}


def lint_imports(root):
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_the_contracts_hold():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_upward_import_breaks_the_layers(tmp_path):
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(ROOT / ".importlinter", tmp_path)
    step = tmp_path / "carousel" / "loop" / "health.py"
    step.write_text(step.read_text() + "\n\ndef _later():\n    from carousel import tasks  # a step reaching up\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "carousel.loop.health -> carousel.tasks" in done.stdout


def strongly_connected(graph):
    """Tarjan's algorithm, iterative: the groups of modules that import each other in a circle."""
    index, low, on_stack, stack, groups, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter[0]
                    counter[0] += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.find_modules_directly_imported_by(succ)))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def test_no_module_imports_itself_back(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)  # imports inside functions count
    assert strongly_connected(graph) == []


def test_the_cycle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert strongly_connected(graph) == [["p.a", "p.b", "p.c"]]


def test_carousel_keeps_at_most_six_loose_modules():
    loose = {p.stem for p in (ROOT / "carousel").glob("*.py")} - ENTRY_POINTS
    assert len(loose) <= 6, sorted(loose)
