"""Bad weeks, simulated (carousel/sim/faults.py): seeds S .. S+N-1, each in a fresh SQLite copy of
a database migrated once (a scratch file: synchronous off), P processes at once. Nothing else
needs to run: no server, no worker.

    .venv/bin/python benchmarks/faults.py --seeds N [--seed-start S] [--procs P] [--stop-at-first]

Prints each violation as it is found (seed, step, invariant, detail) and, as its last line, one
JSON object: seeds, steps (cycles and actions simulated, all seeds together), violations,
first_violation (seed and step of the lowest seed that failed, or null), wall_s, and the
per-seed time (mean and slowest, in one process's seconds)."""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_work = None  # this process's working database file


def _configure(scratch):
    """Settings for a process of this run: its own SQLite file and VAR_DIR under `scratch`."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "carousel.settings"
    os.environ["CAROUSEL_VAR_DIR"] = str(scratch)
    os.environ["DATABASE_URL"] = f"sqlite:///{scratch}/work.sqlite3"
    for name in ("REDIS_URL", "CELERY_BROKER_URL"):
        os.environ.pop(name, None)
    import django

    django.setup()
    from django.db.backends.signals import connection_created

    connection_created.connect(_scratch_pragmas, weak=False)


def _scratch_pragmas(sender, connection, **kwargs):
    """A seed's database is a scratch copy, dropped after the seed: it needs no durability
    against a power cut, and syncing its WAL cost about a tenth of a seed's time. (The
    simulator's crashes are the loop's process dying, its transaction rolled back: unchanged.)"""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous=OFF")


def _template(scratch):
    """A migrated empty database, made once in a child of its own (Django set up there only)."""
    path = Path(scratch) / "template.sqlite3"
    context = get_context("spawn")
    process = context.Process(target=_migrate, args=(str(scratch), str(path)))
    process.start()
    process.join()
    if process.exitcode:
        raise SystemExit("migrating the template database failed")
    return path


def _migrate(scratch, path):
    _configure(Path(scratch) / "migrate")
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    connection.close()
    shutil.copyfile(connection.settings_dict["NAME"], path)


def _init(scratch_root, template):
    global _work
    scratch = Path(tempfile.mkdtemp(prefix="proc-", dir=scratch_root))
    _configure(scratch)
    _work = (scratch / "work.sqlite3", Path(template))


def _one(seed):
    from django.db import connection

    from carousel.sim.faults import run_seed

    connection.close()
    work, template = _work
    for suffix in ("-wal", "-shm"):
        Path(f"{work}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(template, work)
    started = time.process_time()
    try:
        result = run_seed(seed)
    except Exception:  # noqa: BLE001 - a crash of the simulator itself is a finding too
        return {"seed": seed, "steps": 0, "cpu_s": time.process_time() - started,
                "violation": {"seed": seed, "step": None, "invariant": "the simulation ran",
                              "detail": traceback.format_exc()}}
    v = result.violation
    return {"seed": seed, "steps": result.steps, "cpu_s": time.process_time() - started,
            "violation": v and {"seed": v.seed, "step": v.step, "invariant": v.invariant, "detail": v.detail}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, required=True)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--stop-at-first", action="store_true", help="stop at the first violation")
    args = parser.parse_args()
    began = time.perf_counter()
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="carousel-faults-", dir=shm if shm.is_dir() else None) as scratch:
        template = _template(scratch)
        seeds = range(args.seed_start, args.seed_start + args.seeds)
        context = get_context("spawn")
        steps, cpu, slowest, violations = 0, 0.0, (0.0, None), []
        with context.Pool(args.procs, initializer=_init, initargs=(scratch, str(template))) as pool:
            for outcome in pool.imap_unordered(_one, seeds, chunksize=4):
                steps += outcome["steps"]
                cpu += outcome["cpu_s"]
                slowest = max(slowest, (outcome["cpu_s"], outcome["seed"]), key=lambda s: s[0])
                if outcome["violation"]:
                    violations.append(outcome["violation"])
                    print(json.dumps(outcome["violation"]), flush=True)
                    if args.stop_at_first:
                        pool.terminate()
                        break
    first = min(violations, key=lambda v: v["seed"], default=None)
    done = len(seeds)
    print(json.dumps({"seeds": done, "steps": steps, "violations": len(violations),
                      "first_violation": first and {"seed": first["seed"], "step": first["step"]},
                      "wall_s": round(time.perf_counter() - began, 2), "procs": args.procs,
                      "cpu_s_per_seed_mean": round(cpu / max(1, done), 4),
                      "cpu_s_per_seed_max": round(slowest[0], 4), "slowest_seed": slowest[1]}))


if __name__ == "__main__":
    main()
