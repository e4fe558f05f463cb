"""One scheduling cycle against a large queue, for every sorting x sharing policy pair.

Fills PostgreSQL with QUEUED located requests (default 1,000,000) from 1,000 users in 10
groups over 20,000 tapes, runs ANALYZE, then in a fresh process times one full selection
cycle per policy pair: choose, claim and commit N x K = 15 x 50 slots (claiming.claim_jobs),
undoing the claims between pairs. Prints one JSON object as its last line.

    python -m carousel.localservices -- .venv/bin/python benchmarks/cycle.py [--queued 100000]
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
N, K = 15, 50


def setup_django():
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("benchmarks/cycle.py needs PostgreSQL: run it under `python -m carousel.localservices --`")
    import django

    django.setup()


def fill(queued, seed=1):
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from carousel.models import Account, Control, GroupShare, RestoreRequest, Tape, path_key

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE carousel_restorerequest, carousel_job, carousel_tape, carousel_userbacklog, "
                       "carousel_tapebacklog, carousel_transition, carousel_bulkitem, carousel_bulk CASCADE")
    rng = random.Random(seed)
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
    tape_ids = list(Tape.objects.values_list("id", flat=True))
    Control.objects.update_or_create(id=1, defaults={"files_per_job": N, "jobs_in_flight": K,
                                                     "default_user_cap": 500, "default_group_cap": 5000})
    # Skewed demand: a few heavy users (production campaigns), a long tail of analysts.
    weights = [1 / (rank + 1) ** 0.8 for rank in range(USERS)]
    now = timezone.now()
    start = time.perf_counter()
    table = RestoreRequest._meta.db_table
    columns = ("user_id, group_id, path, path_key, size, tape_id, position, priority, destination, state, attempts, "
               "error_class, last_error, created_at, updated_at")
    owner = rng.choices(range(USERS), weights=weights, k=queued)
    with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for i, u in enumerate(owner):
            path = f"/bench/u{u}/f{i:07d}"
            created = now - timedelta(seconds=rng.uniform(0, 2 * 86400))
            copy.write_row((users[u], groups[u % GROUPS].id, path, path_key(path), rng.randint(10**9, 5 * 10**9),
                            rng.choice(tape_ids), rng.randint(0, 12 * 10**12), 1 if rng.random() < 0.01 else 0,
                            "", "queued", 0, "", "", created, created))
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return time.perf_counter() - start


def measure():
    from django.db import connection
    from django.utils import timezone

    from carousel.claiming import claim_jobs
    from carousel.models import Control, Job, RestoreRequest
    from policies.selection import share_policy, sort_policy

    control = Control.get()
    queued = RestoreRequest.objects.filter(state="queued").count()
    cycles = {}
    for sort in ("NONE", "TAPEID", "SLIDER"):
        for share in ("EQUAL", "GROUP", "GRPW"):
            now = timezone.now()
            start = time.perf_counter()
            jobs = claim_jobs(now=now, control=control, sort=sort_policy(sort), share=share_policy(share))
            elapsed = time.perf_counter() - start
            files = sum(len(j.paths) for j in jobs)
            cycles[f"{sort}/{share}"] = round(elapsed, 3)
            print(f"{sort:6}/{share:5}: {elapsed:.3f} s, {files} files in {len(jobs)} jobs", flush=True)
            # Undo the claims so every pair starts from the same queue.
            with connection.cursor() as cursor:
                cursor.execute("UPDATE carousel_restorerequest SET state = 'queued', job_id = NULL, "
                               "submitted_at = NULL, attempts = 0 WHERE state = 'submitted'")
            Job.objects.all().delete()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"queued": queued, "cycles": cycles, "worst_s": max(cycles.values()), "peak_rss_mb": round(peak, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    setup_django()
    if args.measure:
        print(json.dumps(measure()))
        return
    print(f"filling {args.queued} queued requests ...", flush=True)
    print(f"filled and analysed in {fill(args.queued):.1f} s", flush=True)
    # A fresh process: no warm caches or imports from the fill count against the cycle.
    out = subprocess.run([sys.executable, __file__, "--measure"], check=True, capture_output=True, text=True).stdout
    lines = out.strip().splitlines()
    print("\n".join(lines[:-1]))
    print(lines[-1])


if __name__ == "__main__":
    main()
