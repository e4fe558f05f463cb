"""The cycle a site runs, at steady state, against a large queue, for every sorting x sharing pair.

    python -m carousel.infra.localservices -- .venv/bin/python benchmarks/cycle.py
        [--sizes 100000 1000000] [--pairs TAPEID/GRPW ...] [--cycles 20] [--warmup 15] [--step-s 60]
        [--profile DIR]

For each size of --sizes, a database is filled with that many QUEUED located requests from
1,000 users in 10 groups (skewed demand) over 20,000 LTO-8 tapes (30% of them to be delivered to
one of 4 destination file systems), and ANALYZEd. Then, for each policy pair, in a copy of that
database (CREATE DATABASE ... TEMPLATE: every pair starts from the same idle queue) and a fresh
process, the shipped loop (carousel.loop.cycle.run_cycle, the control row as shipped but for the
pair: the plan takes the drive count the stager reports) runs against the simulated tape library
(carousel/stagers/simulated.py in its replay form: 16 LTO-8 drives, 4 robots, the clock set
here), one cycle after another:

- between two cycles the library's clock moves on --step-s simulated seconds (the loop's `now`
  with it), outside the timed cycle, so mounts end, files are read and jobs finish. 60 s is six
  times the shipped cycle period: each cycle meets six periods' worth of news;
- 0.5% of the paths are missing from the library's catalogue (permanent failures, reported when
  their job is submitted) and 2% of the reads are reported failed as a transient drive error
  (retried after the retry cycle; a tape with 3 within the hour is quarantined);
- deliveries go through the `command` delivery a site would configure (here `true`; the shipped
  default, `none`, delivers nothing) and are slow: between two cycles a stand-in for the
  delivery worker finishes at most --deliveries-per-step of those the loop started, so staged
  files wait for delivery, throttled per file system;
- nothing is deleted between cycles: jobs, transitions, health and stager calls accumulate.

Cycle 0 is the first cycle from the idle system (the figure this benchmark used to report); the
next --warmup cycles fill the window (N x K = 5,000 requests planned or at the stager, reached
after about 7 cycles of 750) and bring the first finished mounts; the --cycles after them are
the steady state, of which the median and the worst are kept. Each cycle prints a line: its
time; the CPU time this process and the database server's process spent in it (which depends
far less than the time on the other work of a shared machine); the simulated library's own
share; what it did and what is in flight. --profile writes cProfile's statistics of each pair's
steady cycles to DIR and prints their top.

The last line is JSON: `queued` (the largest size), `cycles` (size -> pair -> steady worst, s),
`steady_worst_s` and `steady_median_s` (at the largest size: the slowest pair's worst, and the
largest of the pairs' medians), `first_worst_s` (the slowest first cycle at the largest size),
`growth` (steady worst at the largest size over the smallest), `peak_rss_mb` (the measuring
processes' largest), and beside them `steady_worst_cpu_s` (the most CPU time, this process's and
the database server's, that a steady cycle took at the largest size), `first`, `medians`,
`worst_cpu`, `load_average` (size -> pair -> s, or the load at the end of the pair) and the
settings.
"""
import argparse
import cProfile
import hashlib
import json
import os
import pstats
import random
import resource
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")

USERS, GROUPS, TAPES = 1000, 10, 20_000
MEDIA_NAME = "LTO-8"
DRIVES = 16
SORTS = ("NONE", "TAPEID", "SLIDER")
SHARES = ("EQUAL", "GROUP", "GRPW")
PAIRS = [f"{sort}/{share}" for sort in SORTS for share in SHARES]
DESTINED_PER_MILLE = 300  # requests with a destination: delivered after staging
FILESYSTEMS = 4  # destination file systems (deliveries are throttled per file system)
MISSING_PER_MILLE = 5  # paths the library does not have: permanent failures
TRANSIENT_PER_MILLE = 20  # reads reported failed as a drive error: retried
GB = 10**9


# The library's catalogue and the fill agree on where each path lies --------------------------

def _digest(text):
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=16).digest(), "big")


def place(path):
    """(tape index, offset, size, missing) of a benchmark path, from the path alone."""
    d = _digest(path)
    size = GB + d % (4 * GB)
    offset = (d >> 40) % (12 * 10**12 - 5 * GB)
    return (d >> 80) % TAPES, offset, size, (d >> 100) % 1000 < MISSING_PER_MILLE


def tape_label(index):
    return f"B{index:05d}"


class Catalogue:
    """The simulated library's files (the `files` of its replay form), computed from the path,
    so that a million paths cost no memory."""

    def get(self, path, default=None):
        from carousel.sim.library import File

        tape, offset, size, missing = place(path)
        return default if missing else File(path, tape_label(tape), MEDIA_NAME, offset, size)


# The databases ------------------------------------------------------------------------------

def setup_django():
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit(f"{sys.argv[0]} needs PostgreSQL: run it under `python -m carousel.infra.localservices --`")
    import django

    django.setup()


def database_url(name):
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path=f"/{name}"))


def admin(statement):
    """Run CREATE/DROP DATABASE on the server (connected to its `postgres` database)."""
    import psycopg

    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(statement)


def run_child(database, *args):
    """This script in a fresh process on `database`; its output is echoed but for the last line,
    which is returned, parsed as JSON."""
    env = dict(os.environ, DATABASE_URL=database_url(database))
    proc = subprocess.Popen([sys.executable, __file__, *args], env=env, stdout=subprocess.PIPE, text=True)
    last = None
    for line in proc.stdout:
        if last is not None:
            print(last, end="", flush=True)
        last = line
    if proc.wait():
        sys.exit(f"{' '.join(args)} failed (exit {proc.returncode})")
    return json.loads(last)


def prepare():
    """Migrate; users, groups, tapes and the shipped control row (benchmarks/live_page.py too)."""
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command

    from carousel.models import Account, Control, GroupShare, Tape

    call_command("migrate", verbosity=0)
    groups = []
    for g in range(GROUPS):
        group, _ = Group.objects.get_or_create(name=f"bench-g{g}")
        GroupShare.objects.update_or_create(group=group, defaults={"weight": g + 1})
        groups.append(group)
    for u in range(USERS):
        user, _ = User.objects.get_or_create(username=f"bench-u{u}")
        Account.objects.update_or_create(user=user, defaults={"group": groups[u % GROUPS]})
    Tape.objects.bulk_create([Tape(label=tape_label(t), media=MEDIA_NAME) for t in range(TAPES)], batch_size=5000,
                             ignore_conflicts=True)  # prepared before: the same tapes
    Control.objects.all().delete()
    Control.get()  # the shipped defaults
    return {}


def fill(count, seed=1):
    """`count` queued, located requests."""
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.utils import timezone

    from carousel.domain.counters import counters_fold
    from carousel.models import RestoreRequest, Tape, path_key

    rng = random.Random(seed)
    tape_id = dict(Tape.objects.values_list("label", "id"))
    users = list(User.objects.filter(username__startswith="bench-u").order_by("id").values_list("id", flat=True))
    group_ids = list(Group.objects.filter(name__startswith="bench-g").order_by("id").values_list("id", flat=True))
    # Skewed demand: a few heavy users (production campaigns), a long tail of analysts.
    weights = [1 / (rank + 1) ** 0.8 for rank in range(USERS)]
    now = timezone.now()
    start = time.perf_counter()
    columns = ("user_id, group_id, path, path_key, size, tape_id, position, priority, destination, state, attempts, "
               "error_class, last_error, created_at, updated_at")
    owner = rng.choices(range(USERS), weights=weights, k=count)
    with connection.cursor() as cursor, cursor.cursor.copy(
            f"COPY {RestoreRequest._meta.db_table} ({columns}) FROM STDIN") as copy:
        for i, u in enumerate(owner):
            path = f"/bench/u{u}/f{i:07d}"
            tape, offset, size, _ = place(path)
            destination = (f"/dest/fs{i % FILESYSTEMS}/u{u}/f{i:07d}"
                           if rng.randrange(1000) < DESTINED_PER_MILLE else "")
            created = now - timedelta(seconds=rng.uniform(0, 2 * 86400))
            copy.write_row((users[u], group_ids[u % GROUPS], path, path_key(path), size, tape_id[tape_label(tape)],
                            offset, 1 if rng.random() < 0.01 else 0, destination, "queued", 0, "", "", created,
                            created))
    # A queue this long is built over many cycles, each folding the counters' deltas: fold the
    # COPY's here, or the first measured cycle would fold the whole fill's.
    counters_fold()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return {"fill_s": round(time.perf_counter() - start, 1)}


# The measurement ----------------------------------------------------------------------------

def bench_stager(library, clock):
    """The simulated stager over `library`, reporting TRANSIENT_PER_MILLE of its reads failed
    (decided by job and path: the same answer at every poll, another one for the retry's job),
    and timing itself: its share of a cycle is the simulated library's, not the broker's."""
    from carousel.stagers.base import FileStatus
    from carousel.stagers.simulated import SimulatedStager

    class BenchStager(SimulatedStager):
        spent = 0.0

        def _timed(self, method, *args):
            start = time.perf_counter()
            try:
                return getattr(super(), method)(*args)
            finally:
                self.spent += time.perf_counter() - start

        def submit(self, job):
            return self._timed("submit", job)

        def cancel(self, backend_id, paths):
            return self._timed("cancel", backend_id, paths)

        def status(self):
            return self._timed("status")

        def poll(self, jobs):
            answers = self._timed("poll", jobs)
            return {job: [FileStatus(st.path, "failed", "transient", "simulated read error (drive fault)")
                          if st.state == "done" and _digest(f"{job}/{st.path}") % 1000 < TRANSIENT_PER_MILLE
                          else st for st in statuses] for job, statuses in answers.items()}

    return BenchStager(library=library, files=Catalogue(), clock=clock)


def database_cpu_s():
    """CPU seconds the server process behind this connection has used (the server runs here)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def measure(pair, *, cycles, warmup, step_s, drives, deliveries_per_step, profile=None):
    from django.db.models import Count
    from django.utils import timezone

    from carousel.loop.cycle import run_cycle
    from carousel.loop.delivery import deliver_requests
    from carousel.models import IN_FLIGHT_STATES, Control, Job, RestoreRequest
    from carousel.sim.library import Library

    sort, share = pair.split("/")
    Control.objects.filter(id=Control.get().id).update(sort_policy=sort, share_policy=share)
    queued = RestoreRequest.objects.filter(state="queued").count()
    library = Library(drives={MEDIA_NAME: drives}, record=False)
    clock = [0.0]
    stager = bench_stager(library, lambda: clock[0])
    started_at = timezone.now()
    times, cpu, errors = [], [], set()
    profiler = cProfile.Profile() if profile else None
    for k in range(1 + warmup + cycles):
        if k:
            # Between two cycles, untimed: the library works on, the delivery worker copies.
            clock[0] += step_s
            library.advance(clock[0])
            copying = list(RestoreRequest.objects.filter(state="delivering", delivery_started_at__isnull=False)
                           .order_by("delivery_started_at", "id").values_list("id", flat=True)[:deliveries_per_step])
            if copying:
                deliver_requests(copying, now=started_at + timedelta(seconds=clock[0]))
        now = started_at + timedelta(seconds=clock[0])
        stager.spent = 0.0
        if profiler and k > warmup:
            profiler.enable()
        database_before = database_cpu_s()
        process_before = time.process_time()
        start = time.perf_counter()
        report = run_cycle(now=now, stager=stager)
        elapsed = time.perf_counter() - start
        process = time.process_time() - process_before
        if profiler:
            profiler.disable()
        database = database_cpu_s() - database_before
        times.append(elapsed)
        cpu.append(process + database)
        states = dict(RestoreRequest.objects.exclude(state="queued").order_by().values_list("state")
                      .annotate(n=Count("id")).values_list("state", "n"))
        jobs = dict(Job.objects.order_by().values_list("state").annotate(n=Count("id")).values_list("state", "n"))
        in_flight = sum(states.get(s, 0) for s in IN_FLIGHT_STATES)
        phase = "first" if k == 0 else "warm-up" if k <= warmup else "steady"
        print(f"{queued:>9} {pair:13} {k:3} {phase:7} {elapsed:6.3f} s (CPU {process:.3f} + database {database:.2f}, "
              f"library {stager.spent:.3f}): "
              f"claimed {report.submitted}, done {report.done}, failed {report.failed}, retrying {report.retrying}, "
              f"requeued {report.requeued}, preempted {report.preempted}, deliveries started {report.delivering}; "
              f"in flight {in_flight} in {jobs.get('sent', 0)} sent + {jobs.get('pending', 0)} pending jobs, "
              f"delivering {states.get('delivering', 0)}, done {states.get('done', 0)}, "
              f"failed {states.get('failed', 0)}, retry {states.get('retry', 0)}"
              f"{', health ' + report.health if report.health != 'healthy' else ''}"
              f"{', ERROR ' + report.error if report.error else ''}", flush=True)
        if report.error:
            errors.add(report.error)
    steady, steady_cpu = times[1 + warmup:], cpu[1 + warmup:]
    if profiler:
        profiler.dump_stats(profile)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"queued": queued, "pair": pair, "first_s": round(times[0], 3),
            "steady_median_s": round(statistics.median(steady), 3), "steady_worst_s": round(max(steady), 3),
            "steady_worst_cpu_s": round(max(steady_cpu), 3),
            "steady_median_cpu_s": round(statistics.median(steady_cpu), 3),
            "load_average": round(os.getloadavg()[0], 1),
            "peak_rss_mb": round(peak, 1), "simulated_s": clock[0],
            "errors": sorted(errors)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="queued requests")
    parser.add_argument("--pairs", nargs="+", default=PAIRS, choices=PAIRS, metavar="SORT/SHARE",
                        help=f"policy pairs (default: all nine, {PAIRS[0]} ... {PAIRS[-1]})")
    parser.add_argument("--cycles", type=int, default=20, help="steady cycles measured per pair")
    parser.add_argument("--warmup", type=int, default=15, help="cycles after the first one, not measured")
    parser.add_argument("--step-s", type=float, default=60.0, help="simulated seconds between two cycles")
    parser.add_argument("--drives", type=int, default=DRIVES, help="the simulated library's LTO-8 drives")
    parser.add_argument("--deliveries-per-step", type=int, default=4,
                        help="deliveries the stand-in worker finishes between two cycles")
    parser.add_argument("--profile", metavar="DIR", help="cProfile the steady cycles: DIR/<size>-<pair>.prof, and "
                        "the top functions printed")
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fill", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare or args.fill or args.measure:
        # The delivery that ships for sites whose users name destinations: a site's command.
        os.environ.update(CAROUSEL_DELIVERY="command",
                          CAROUSEL_DELIVERY_OPTIONS=json.dumps({"command": ["true"], "filesystem_depth": 2}))
        setup_django()
        if args.prepare:
            print(json.dumps(prepare()))
        elif args.fill:
            print(json.dumps(fill(args.fill)))
        else:
            print(json.dumps(measure(args.measure, cycles=args.cycles, warmup=args.warmup, step_s=args.step_s,
                                     drives=args.drives, deliveries_per_step=args.deliveries_per_step,
                                     profile=args.profile)))
        return
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("benchmarks/cycle.py needs PostgreSQL: run it under `python -m carousel.infra.localservices --`")
    sizes = sorted(set(args.sizes))
    results = run_all(sizes, args)
    print(f"{'pair':13} " + " ".join(f"{f'{size:,} queued: first / median / worst (s)':>42}" for size in sizes))
    for pair in args.pairs:
        print(f"{pair:13} " + " ".join("{first_s:>22.3f} / {steady_median_s:.3f} / {steady_worst_s:.3f}".format(
            **results[size][pair]) for size in sizes))
    print(json.dumps(summary(results, sizes, args)))


def run_all(sizes, args):
    """{size: {pair: measure()'s result}}: each size filled in a database of its own, each pair
    measured in a fresh copy of it."""
    template = urlsplit(os.environ["DATABASE_URL"]).path.lstrip("/")
    run_child(template, "--prepare")
    results = {}
    for size in sizes:
        filled = f"bench_fill_{size}"
        admin(f"DROP DATABASE IF EXISTS {filled}")
        admin(f"CREATE DATABASE {filled} TEMPLATE {template} STRATEGY FILE_COPY")
        print(f"filling to {size} queued requests ...", flush=True)
        print(f"filled and analysed in {run_child(filled, '--fill', str(size))['fill_s']} s", flush=True)
        for pair in args.pairs:
            began = time.perf_counter()
            admin("DROP DATABASE IF EXISTS bench_run")
            admin(f"CREATE DATABASE bench_run TEMPLATE {filled} STRATEGY FILE_COPY")
            print(f"{size:>9} {pair:13} a fresh copy of the filled database in {time.perf_counter() - began:.1f} s",
                  flush=True)
            profile = []
            if args.profile:
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                profile = ["--profile", str(Path(args.profile) / f"{size}-{pair.replace('/', '-')}.prof")]
            r = results.setdefault(size, {})[pair] = run_child(
                "bench_run", "--measure", pair, "--cycles", str(args.cycles), "--warmup", str(args.warmup),
                "--step-s", str(args.step_s), "--drives", str(args.drives),
                "--deliveries-per-step", str(args.deliveries_per_step), *profile)
            print(f"{size:>9} {pair:13} first {r['first_s']:.3f} s, steady median {r['steady_median_s']:.3f} s, "
                  f"worst {r['steady_worst_s']:.3f} s (the most CPU a steady cycle took: "
                  f"{r['steady_worst_cpu_s']:.3f} s), peak RSS {r['peak_rss_mb']} MB, "
                  f"load average {r['load_average']}", flush=True)
        admin("DROP DATABASE IF EXISTS bench_run")
        admin(f"DROP DATABASE {filled}")
    return results


def summary(results, sizes, args):
    def per_pair(key):
        return {str(size): {pair: r[key] for pair, r in results[size].items()} for size in sizes}

    largest = results[sizes[-1]].values()
    worst = {size: max(r["steady_worst_s"] for r in results[size].values()) for size in sizes}
    return {
        "queued": sizes[-1],
        "cycles": per_pair("steady_worst_s"),
        "steady_worst_s": worst[sizes[-1]],
        "steady_median_s": max(r["steady_median_s"] for r in largest),
        "first_worst_s": max(r["first_s"] for r in largest),
        "growth": round(worst[sizes[-1]] / worst[sizes[0]], 2) if len(sizes) > 1 and worst[sizes[0]] else None,
        "peak_rss_mb": max(r["peak_rss_mb"] for size in sizes for r in results[size].values()),
        "steady_worst_cpu_s": max(r["steady_worst_cpu_s"] for r in largest),
        "first": per_pair("first_s"),
        "medians": per_pair("steady_median_s"),
        "worst_cpu": per_pair("steady_worst_cpu_s"),
        "load_average": per_pair("load_average"),
        "errors": sorted({e for size in sizes for r in results[size].values() for e in r["errors"]}),
        "settings": {"warmup": args.warmup, "steady_cycles": args.cycles, "step_s": args.step_s,
                     "drives": args.drives, "deliveries_per_step": args.deliveries_per_step},
    }

if __name__ == "__main__":
    main()
