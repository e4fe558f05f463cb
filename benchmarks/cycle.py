"""The shipped cycle against a large queue, for every sorting x sharing policy pair.

Fills PostgreSQL with QUEUED located requests from 1,000 users in 10 groups over 20,000 LTO-8
tapes, runs ANALYZE, then in a fresh process times one whole cycle (carousel.loop.cycle.run_cycle:
expiry, retries, polling, the stager's judgement, locating, choosing and claiming, the mount
plan laying the jobs out on the drives' chains, preemption, sending, deliveries) per policy
pair, with the control row as shipped except the drive count the plan needs (--drives; the
`immediate` stager reports no drives, as hsi does not), undoing each cycle's work before the
next pair. It does so at each size of --sizes in one run (default 100,000 then 1,000,000: the
queue grows between them) and prints, last, one JSON object: `queued` (the largest size),
`worst_s` (its slowest pair), `worst_100k_s` (the slowest pair at the first size), `growth`
(their ratio), `peak_rss_mb` (the measuring processes' largest) and `cycles` (size -> pair ->
seconds).

    python -m carousel.infra.localservices -- .venv/bin/python benchmarks/cycle.py [--sizes 100000 1000000]
"""
import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carousel.settings")

USERS, GROUPS, TAPES = 1000, 10, 20_000
DRIVES = 16


def setup_django():
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("benchmarks/cycle.py needs PostgreSQL: run it under `python -m carousel.infra.localservices --`")
    import django

    django.setup()


def fill(queued, already=0, seed=1):
    """Make the queue `queued` requests long (`already` of them are there from a smaller size)."""
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.db import connection

    from carousel.models import Account, Control, GroupShare, Tape

    if already:
        return append(queued - already, already, seed)
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE carousel_restorerequest, carousel_job, carousel_tape, carousel_userbacklog, "
                       "carousel_tapebacklog, carousel_transition, carousel_bulkitem, carousel_bulk CASCADE")
    groups = []
    for g in range(GROUPS):
        group, _ = Group.objects.get_or_create(name=f"bench-g{g}")
        GroupShare.objects.update_or_create(group=group, defaults={"weight": g + 1})
        groups.append(group)
    users = []
    for u in range(USERS):
        user, _ = User.objects.get_or_create(username=f"bench-u{u}")
        Account.objects.update_or_create(user=user, defaults={"group": groups[u % GROUPS]})
        users.append(user.id)
    Tape.objects.bulk_create([Tape(label=f"B{t:05d}", media="LTO-8") for t in range(TAPES)], batch_size=5000)
    Control.objects.all().delete()  # the shipped defaults, but for the drive count set when measuring
    Control.get()
    return append(queued, 0, seed)


def append(count, first, seed):
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.utils import timezone

    from carousel.models import RestoreRequest, Tape, path_key

    rng = random.Random(seed * 1_000_003 + first)
    tape_ids = list(Tape.objects.order_by("id").values_list("id", flat=True))
    users = list(User.objects.filter(username__startswith="bench-u").order_by("id").values_list("id", flat=True))
    group_ids = list(Group.objects.filter(name__startswith="bench-g").order_by("id").values_list("id", flat=True))
    # Skewed demand: a few heavy users (production campaigns), a long tail of analysts.
    weights = [1 / (rank + 1) ** 0.8 for rank in range(USERS)]
    now = timezone.now()
    start = time.perf_counter()
    table = RestoreRequest._meta.db_table
    columns = ("user_id, group_id, path, path_key, size, tape_id, position, priority, destination, state, attempts, "
               "error_class, last_error, created_at, updated_at")
    owner = rng.choices(range(USERS), weights=weights, k=count)
    with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for i, u in enumerate(owner, start=first):
            path = f"/bench/u{u}/f{i:07d}"
            created = now - timedelta(seconds=rng.uniform(0, 2 * 86400))
            copy.write_row((users[u], group_ids[u % GROUPS], path, path_key(path), rng.randint(10**9, 5 * 10**9),
                            rng.choice(tape_ids), rng.randint(0, 12 * 10**12), 1 if rng.random() < 0.01 else 0,
                            "", "queued", 0, "", "", created, created))
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return time.perf_counter() - start


def measure(drives):
    from django.db import connection
    from django.utils import timezone

    from carousel.loop.cycle import run_cycle
    from carousel.models import Control, Job, RestoreRequest, StagerHealth, Transition
    from carousel.stagers.immediate import ImmediateStager

    Control.objects.filter(id=Control.get().id).update(drives=drives)
    queued = RestoreRequest.objects.filter(state="queued").count()
    stager = ImmediateStager()
    cycles = {}
    for sort in ("NONE", "TAPEID", "SLIDER"):
        for share in ("EQUAL", "GROUP", "GRPW"):
            Control.objects.filter(id=Control.get().id).update(sort_policy=sort, share_policy=share)
            now = timezone.now()
            start = time.perf_counter()
            report = run_cycle(now=now, stager=stager)
            elapsed = time.perf_counter() - start
            jobs = Job.objects.count()
            chains = Job.objects.exclude(chain="").values("chain").distinct().count()
            sent = Job.objects.filter(state="sent").count()
            cycles[f"{sort}/{share}"] = round(elapsed, 3)
            print(f"{queued:>9} {sort:6}/{share:5}: {elapsed:.3f} s, {report.submitted} files claimed in {jobs} "
                  f"jobs on {chains} chains, {sent} sent{' ERROR ' + report.error if report.error else ''}",
                  flush=True)
            # Undo the cycle so that every pair starts from the same queue.
            with connection.cursor() as cursor:
                cursor.execute("UPDATE carousel_restorerequest SET state = 'queued', job_id = NULL, job_rank = 0, "
                               "submitted_at = NULL, attempts = 0 WHERE state <> 'queued'")
            Job.objects.all().delete()
            Transition.objects.all().delete()
            StagerHealth.objects.all().delete()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"queued": queued, "cycles": cycles, "worst_s": max(cycles.values()), "peak_rss_mb": round(peak, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--drives", type=int, default=DRIVES, help="the control row's drive count for the plan")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    setup_django()
    if args.measure:
        print(json.dumps(measure(args.drives)))
        return
    sizes = sorted(args.sizes)
    results = []
    for i, size in enumerate(sizes):
        print(f"filling to {size} queued requests ...", flush=True)
        print(f"filled and analysed in {fill(size, sizes[i - 1] if i else 0):.1f} s", flush=True)
        # A fresh process: no warm caches or imports from the fill count against the cycle.
        out = subprocess.run([sys.executable, __file__, "--measure", "--drives", str(args.drives)], check=True,
                             capture_output=True, text=True).stdout
        lines = out.rstrip("\n").splitlines()
        print("\n".join(lines[:-1]), flush=True)
        results.append(json.loads(lines[-1]))
    first, last = results[0], results[-1]
    print(json.dumps({"queued": last["queued"], "worst_s": last["worst_s"], "worst_100k_s": first["worst_s"],
                      "growth": round(last["worst_s"] / first["worst_s"], 2) if first["worst_s"] else None,
                      "peak_rss_mb": max(r["peak_rss_mb"] for r in results), "drives": args.drives,
                      "cycles": {str(r["queued"]): r["cycles"] for r in results}}))


if __name__ == "__main__":
    main()
