"""Replays of the shipped workloads: the broker under each sorting x sharing pair that makes
sense (every sharing policy only where the workload has several groups; they coincide for one),
both baselines, and the lower bound. Each broker run is `manage.py simulate` in its own
throwaway SQLite database, timed from outside (process start, migrations and all). Prints a
table and, as its last line, one JSON object.

    .venv/bin/python benchmarks/replay.py [--workloads DIR] [--only NAME ...] [--quick] [--jobs N]

--quick: the shipped default policies only. --jobs N: N broker runs at once (their walls then
include each other's load; time the replay speed with --jobs 1). --hsm-fifo: also the shipped
defaults against the hsm-fifo backend (a tape system hiding its tapes), without and with the
workload's tape map (`simulate --backend hsm-fifo [--tape-map]`).

    .venv/bin/python benchmarks/replay.py --ablation [--mismatch 0.3] [--seeds 1 2 3] [--jobs 2]
        [--results FILE] [--only NAME ...] [--skip-mismatch NAME ...]

--ablation: what each gain is worth. For every workload: the broker (shipped control defaults),
eradat-rao (eradat in the broker's read order), eradat and the lower bound, on the nominal
library and on libraries departing from the model by --mismatch for each of --seeds; prints a
markdown table (eradat / eradat-rao is the order's part of the speed-up, eradat-rao / broker the
plan's) and, last, the JSON of every run. Nominal runs go first, the largest workloads last.
--results FILE keeps every finished run there and reuses it when run again (so a long set can be
finished later, or a subset re-run after deleting its entries).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")

SORTS = ("NONE", "TAPEID", "SLIDER")
SHARES = ("EQUAL", "GROUP", "GRPW")
DEFAULT = ("TAPEID", "GRPW")
WORKLOADS = ROOT / "tests" / "workloads"  # the shipped workloads, in the repository
HSM_FIFO = ("--backend", "hsm-fifo")
HSM_FIFO_MAP = ("--backend", "hsm-fifo", "--tape-map")
BACKEND_LABELS = {HSM_FIFO: " hsm-fifo", HSM_FIFO_MAP: " hsm-fifo+map"}


def broker(path, sort, share, scratch, extra=()):
    report = Path(scratch) / f"{path.name}-{sort}-{share}-{'-'.join(extra)}.json"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "simulate", str(path), "--sort", sort,
                           "--share", share, "--report", str(report), *extra], capture_output=True, text=True,
                          cwd=ROOT)
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
        "max_mounts_per_tape_day": result.get("max_mounts_per_tape_day"),
        "ratio": result.get("ratio_to_bound"),
        "analysts_wait_max_p95_s": analysis.get("users_wait_max_p95_s"),
        "analysts_wait_max_s": analysis.get("wait_max_s"),
        "analysts_within_1800_s": analysis.get("users_within_1800_s"),
        "analysts": analysis.get("users"),
        "prod_finish_s": prod.get("wait_max_s"),
        "files_failed": result.get("files_failed"),
        "shares": {g: v.get("share") for g, v in (result.get("groups") or {}).items()},
        "wall_s": result.get("command_wall_s", result.get("wall_s")),
        "error": result.get("error"),
        # the broker's estimates, scored (issue 26: carousel/sim/replay.py); None for a baseline
        **{k: result.get(k) for k in ESTIMATE_KEYS},
    }


ESTIMATE_KEYS = ("estimate_coverage_planned", "estimate_coverage_located", "estimate_width_ratio",
                 "estimate_files_scored")


def fmt(value, digits=0):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


# The ablation ----------------------------------------------------------------------------------

KINDS = ("broker", "eradat-rao", "eradat")


def workload_paths(directory, only=None):
    paths = sorted(p for p in Path(directory).iterdir() if p.name.endswith((".json", ".json.gz")))
    named = [(p.name.removesuffix(".gz").removesuffix(".json"), p) for p in paths]
    return [(n, p) for n, p in named if not only or n in only]


def run_key(name, kind, seed):
    return f"{name}|{kind}|{'nominal' if seed is None else seed}"


def ablation_run(name, path, kind, seed, mismatch, scratch):
    """One replay's report (the keys the table reads, and the report's own)."""
    extra = ["--mismatch", str(mismatch), "--mismatch-seed", str(seed)] if seed is not None else []
    started = time.perf_counter()
    if kind == "broker":
        result = broker(path, *DEFAULT, scratch, extra)
    else:
        done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "simulate", str(path), "--baseline", kind,
                               "--report", str(Path(scratch) / f"{name}-{kind}-{seed}.json"), *extra],
                              capture_output=True, text=True, cwd=ROOT)
        result = ({"error": (done.stderr.strip().splitlines() or ["failed"])[-1]} if done.returncode else
                  json.loads((Path(scratch) / f"{name}-{kind}-{seed}.json").read_text()))
    result["command_wall_s"] = time.perf_counter() - started
    keep = ("makespan_s", "lower_bound_s", "mounts", "tapes", "bytes", "bytes_read", "files_done", "files_failed",
            "mismatch", "mismatch_seed", "beats_nominal_bound", "groups", "command_wall_s", "error", "policy")
    return {k: result.get(k) for k in keep}


def ratio(a, b):
    return a / b if a and b else None


def shares_text(workload, result):
    """Each group's share of files restored against its weight's fraction, when there are several."""
    if not result or not result.get("groups") or len(workload.groups) < 2:
        return "-"
    total = sum(workload.groups.values())
    parts = []
    for group, weight in workload.groups.items():
        share = (result["groups"].get(group) or {}).get("share")
        parts.append(f"{group} {share:.2f}/{weight / total:.2f}" if share is not None else f"{group} -")
    return ", ".join(parts)


def ablation(args):
    from carousel.sim.lowerbound import lower_bound
    from carousel.sim.workload import load

    results_file = Path(args.results) if args.results else None
    results = json.loads(results_file.read_text()) if results_file and results_file.exists() else {}
    workloads = workload_paths(args.workloads, args.only)
    loaded = {name: load(path) for name, path in workloads}
    size = {name: len(w.requests) for name, w in loaded.items()}
    seeds = [None] + [s for s in args.seeds]
    tasks = []
    # Nominal first, then each seed; within each, the smallest workloads first (storm last).
    for seed in seeds:
        for name, path in sorted(workloads, key=lambda np: size[np[0]]):
            if seed is not None and name in (args.skip_mismatch or ()):
                continue
            for kind in KINDS:
                if run_key(name, kind, seed) not in results:
                    tasks.append((name, path, kind, seed))
    lock = threading.Lock()

    def run(task):
        name, path, kind, seed = task
        result = ablation_run(name, path, kind, seed, args.mismatch, scratch)
        with lock:
            results[run_key(name, kind, seed)] = result
            if results_file:
                results_file.write_text(json.dumps(results, indent=1))
        print(f"  {name} {kind} {'nominal' if seed is None else f'mismatch {args.mismatch} seed {seed}'}: "
              f"{fmt(result.get('makespan_s'))} s{'  ERROR ' + result['error'] if result.get('error') else ''}",
              file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(run, tasks))

    print("| workload | library | lower bound s | eradat s | eradat-rao s | broker s | order x | plan x | "
          "speed-up x | retained | broker mounts | broker bytes_read / bytes | broker shares / weights |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, _ in workloads:
        bound = lower_bound(loaded[name]).seconds
        nominal_speedup = None
        for seed in seeds:
            got = {kind: results.get(run_key(name, kind, seed)) for kind in KINDS}
            if not any(got.values()):
                continue
            span = {kind: (r or {}).get("makespan_s") for kind, r in got.items()}
            speedup = ratio(span["eradat"], span["broker"])
            if seed is None:
                nominal_speedup = speedup
            b = got["broker"] or {}
            retained = ratio(speedup, nominal_speedup) if seed is not None else None
            beat = " (beats the nominal bound)" if any((r or {}).get("beats_nominal_bound") for r in got.values()) \
                else ""
            reads = f"{ratio(b.get('bytes_read'), b.get('bytes')):.3f}" if b.get("bytes") else "-"
            print(f"| {name} | {'nominal' if seed is None else f'P={args.mismatch} seed {seed}'}{beat} | "
                  f"{bound:,.0f} | {fmt(span['eradat'])} | {fmt(span['eradat-rao'])} | {fmt(span['broker'])} | "
                  f"{fmt(ratio(span['eradat'], span['eradat-rao']), 2)} | "
                  f"{fmt(ratio(span['eradat-rao'], span['broker']), 2)} | {fmt(speedup, 2)} | "
                  f"{fmt(retained * 100, 0) + '%' if retained else '-'} | {fmt(b.get('mounts'))} | {reads} | "
                  f"{shares_text(loaded[name], b)} |")
    print(json.dumps(results))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default=str(WORKLOADS))
    parser.add_argument("--only", nargs="*", help="workload names (file names without extension)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--hsm-fifo", action="store_true", help="also the hsm-fifo backend, without and with the map")
    parser.add_argument("--ablation", action="store_true", help="broker, eradat-rao, eradat, bound; and mismatched")
    parser.add_argument("--mismatch", type=float, default=0.3)
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--results", help="--ablation: keep finished runs in this JSON file and reuse them")
    parser.add_argument("--skip-mismatch", nargs="*", help="--ablation: workloads to replay on the nominal library only")
    args = parser.parse_args()
    if args.ablation:
        return ablation(args)

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
            pairs = [(pair, ()) for pair in ([DEFAULT] if args.quick else [(s, h) for s in SORTS for h in shares])]
            if args.hsm_fifo:
                pairs += [(DEFAULT, HSM_FIFO), (DEFAULT, HSM_FIFO_MAP)]

            def run(task, path=path, name=name):
                (sort, share), extra = task
                result = broker(path, sort, share, scratch, extra)
                print(f"  {name} {sort}/{share} {' '.join(extra)} done", file=sys.stderr, flush=True)
                return result

            with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each run is its own process
                for ((sort, share), extra), result in zip(pairs, pool.map(run, pairs)):
                    rows.append(row(result, f"broker {sort}/{share}{BACKEND_LABELS.get(extra, '')}"))
            results[name] = rows
            print(f"\n{name} (lower bound {bound.seconds:,.0f} s, binding: {bound.binding})")
            print(f"{'run':24} {'makespan s':>11} {'mounts':>6} {'x bound':>7} {'analysts p95 max wait s':>23} "
                  f"{'analysts max s':>14} {'<=1800 s':>9} {'prod done s':>11} {'wall s':>7}")
            for r in rows:
                if r.get("shares") and len(r["shares"]) > 1:
                    r_shares = " shares " + ", ".join(f"{g} {v:.3f}" if v is not None else f"{g} -"
                                                      for g, v in r["shares"].items())
                else:
                    r_shares = ""
                within = (f"{r.get('analysts_within_1800_s')}/{r.get('analysts')}" if r.get("analysts") else "-")
                print(f"{r['run']:24} {fmt(r.get('makespan_s')):>11} {fmt(r.get('mounts')):>6} "
                      f"{fmt(r.get('ratio'), 2):>7} {fmt(r.get('analysts_wait_max_p95_s')):>23} "
                      f"{fmt(r.get('analysts_wait_max_s')):>14} {within:>9} {fmt(r.get('prod_finish_s')):>11} "
                      f"{fmt(r.get('wall_s'), 1):>7}" + r_shares
                      + (f"  ERROR {r['error']}" if r.get("error") else ""))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
