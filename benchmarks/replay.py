"""Replays of the shipped workloads: the broker under each sorting x sharing pair that makes
sense (every sharing policy only where the workload has several groups; they coincide for one),
both baselines, and the lower bound. Each broker run is `manage.py simulate` in its own
throwaway SQLite database, timed from outside (process start, migrations and all). Prints a
table and, as its last line, one JSON object.

    .venv/bin/python benchmarks/replay.py [--workloads DIR] [--only NAME ...] [--quick] [--jobs N]

--quick: the shipped default policies only. --jobs N: N broker runs at once (their walls then
include each other's load; time the replay speed with --jobs 1).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")

SORTS = ("NONE", "TAPEID", "SLIDER")
SHARES = ("EQUAL", "GROUP", "GRPW")
DEFAULT = ("TAPEID", "GRPW")


def broker(path, sort, share, scratch):
    report = Path(scratch) / f"{path.name}-{sort}-{share}.json"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "simulate", str(path), "--sort", sort,
                           "--share", share, "--report", str(report)], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1], "command_wall_s": wall}
    return {**json.loads(report.read_text()), "command_wall_s": wall}


def row(result, label):
    analysis = (result.get("group_waits") or {}).get("analysis") or {}
    prod = (result.get("users") or {}).get("prod") or {}
    return {
        "run": label,
        "makespan_s": result.get("makespan_s"),
        "mounts": result.get("mounts"),
        "ratio": result.get("ratio_to_bound"),
        "analysts_wait_max_p95_s": analysis.get("users_wait_max_p95_s"),
        "analysts_wait_max_s": analysis.get("wait_max_s"),
        "analysts_within_1800_s": analysis.get("users_within_1800_s"),
        "analysts": analysis.get("users"),
        "prod_finish_s": prod.get("wait_max_s"),
        "wall_s": result.get("command_wall_s", result.get("wall_s")),
        "error": result.get("error"),
    }


def fmt(value, digits=0):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default=str(ROOT.parent / "shared" / "workloads"))
    parser.add_argument("--only", nargs="*", help="workload names (file names without extension)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()

    from carousel.sim.lowerbound import lower_bound
    from carousel.sim.replay import replay_baseline, report
    from carousel.sim.workload import load

    paths = sorted(p for p in Path(args.workloads).iterdir() if p.name.endswith((".json", ".json.gz")))
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for path in paths:
            name = path.name.removesuffix(".gz").removesuffix(".json")
            if args.only and name not in args.only:
                continue
            workload = load(path)
            bound = lower_bound(workload)
            rows = [{"run": "lower bound", "makespan_s": bound.seconds, "ratio": 1.0, "binding": bound.binding}]
            for kind in ("direct", "eradat"):
                started = time.perf_counter()
                result = report(workload, replay_baseline(workload, kind), bound)
                result["command_wall_s"] = time.perf_counter() - started
                rows.append(row(result, f"baseline {kind}"))
            groups = {u.group for u in workload.users.values()}
            shares = SHARES if len(groups) > 1 else (DEFAULT[1],)
            pairs = [DEFAULT] if args.quick else [(s, h) for s in SORTS for h in shares]
            def run(pair, path=path, name=name):
                result = broker(path, *pair, scratch)
                print(f"  {name} {pair[0]}/{pair[1]} done", file=sys.stderr, flush=True)
                return result

            with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each run is its own process
                for (sort, share), result in zip(pairs, pool.map(run, pairs)):
                    rows.append(row(result, f"broker {sort}/{share}"))
            results[name] = rows
            print(f"\n{name} (lower bound {bound.seconds:,.0f} s, binding: {bound.binding})")
            print(f"{'run':24} {'makespan s':>11} {'mounts':>6} {'x bound':>7} {'analysts p95 max wait s':>23} "
                  f"{'analysts max s':>14} {'<=1800 s':>9} {'prod done s':>11} {'wall s':>7}")
            for r in rows:
                within = (f"{r.get('analysts_within_1800_s')}/{r.get('analysts')}" if r.get("analysts") else "-")
                print(f"{r['run']:24} {fmt(r.get('makespan_s')):>11} {fmt(r.get('mounts')):>6} "
                      f"{fmt(r.get('ratio'), 2):>7} {fmt(r.get('analysts_wait_max_p95_s')):>23} "
                      f"{fmt(r.get('analysts_wait_max_s')):>14} {within:>9} {fmt(r.get('prod_finish_s')):>11} "
                      f"{fmt(r.get('wall_s'), 1):>7}" + (f"  ERROR {r['error']}" if r.get("error") else ""))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
