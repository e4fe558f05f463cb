"""Requests that do not slow down with history: a one-file stage through each door and a poll,
for a user with --submissions past submissions among --requests finished requests, against a
user with none, in the same run.

    .venv/bin/python -m carousel.infra.localservices -- .venv/bin/python benchmarks/history.py

The doors are called in-process through Django's test client (the views, the services and
PostgreSQL as they ship; no HTTP server), each warmed up once, then timed --repeat times each,
alternating the two users; the figure is the median. Last line JSON: {"submissions", "requests",
"stage_x_fresh", "submit_x_fresh", "poll_x_fresh", "seconds": {door: {user: median s}}}, where
x_fresh is the user with history's median over the fresh user's (goal: each at most 2)."""
import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.ingest import setup_django  # noqa: E402
from benchmarks.load import RATE  # noqa: E402

HISTORY, FRESH = "bench-history-old", "bench-history-new"


def build_history(user, *, submissions, requests, now):
    """`submissions` past submissions of `user` through the service, then their finished files
    (COPY) up to `requests` rows in all."""
    from carousel.domain import intake
    from carousel.domain.services import restore_submit
    from carousel.infra import db
    from carousel.models import Bulk, RequestState, RestoreRequest, path_key

    with intake.direct():
        for s in range(submissions):
            restore_submit(user=user, paths=[f"/hist/s{s:05d}/first.root"], now=now - timedelta(days=30))
    bulks = list(Bulk.objects.filter(user=user).values_list("id", "group_id"))
    per_bulk = max(0, requests - submissions) // max(1, len(bulks))
    finished = now - timedelta(days=20)
    columns = intake.COLUMNS

    def rows():
        for b, (bulk_id, group_id) in enumerate(bulks):
            for i in range(per_bulk):
                path = f"/hist/s{b:05d}/f{i:06d}.root"
                # by name: the intake's columns grow (destination_layout came after this was written)
                row = dict(user_id=user.id, group_id=group_id, bulk_id=bulk_id, path=path, path_key=path_key(path),
                           priority=0, destination="", destination_layout="path", deadline=None,
                           pin_lifetime=None, state=RequestState.DONE, attempts=1, error_class="", last_error="",
                           job_id=None, job_rank=0, created_at=finished, updated_at=finished,
                           submitted_at=finished, started_at=finished, finished_at=finished,
                           activity="default", size=None, tape_id=None, position=None, pin_until=None,
                           staged_path="", delivery_fs="", copy_job=None)
                yield tuple(row[c] for c in columns)

    db.insert_rows(RestoreRequest, columns, rows(), ids=False)
    RestoreRequest.objects.filter(user=user, state=RequestState.QUEUED).update(
        state=RequestState.DONE, finished_at=finished)
    return RestoreRequest.objects.count()


def timed(call):
    started = time.perf_counter()
    response = call()
    elapsed = time.perf_counter() - started
    if response.status_code >= 300:
        raise RuntimeError(f"{response.status_code}: {response.content[:300]!r}")
    return elapsed, response


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    # The throttles as shipped, with a rate that never answers: this measures the doors.
    os.environ.setdefault("CAROUSEL_THROTTLE_RATE", RATE)
    setup_django()
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from carousel.models import Account, GroupShare

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # Django's test client
    call_command("migrate", interactive=False, verbosity=0)
    now = timezone.now()
    group, _ = Group.objects.get_or_create(name="bench-history")
    GroupShare.objects.get_or_create(group=group)
    clients, users = {}, {}
    for name in (HISTORY, FRESH):
        user = User.objects.create_user(name)
        user.groups.add(group)
        Account.objects.create(user=user, group=group)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
        clients[name], users[name] = client, user
    started = time.monotonic()
    total = build_history(users[HISTORY], submissions=args.submissions, requests=args.requests, now=now)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"history: {args.submissions} submissions, {total:,} requests in the table, "
          f"built in {time.monotonic() - started:.0f} s", flush=True)

    counter = iter(range(10**9))
    last_stage = {}

    def submit(name):
        return clients[name].post("/api/v1/requests/", {"paths": [f"/new/{name}/n{next(counter)}.root"]},
                                  format="json")

    def stage(name):
        response = clients[name].post("/api/tape-rest/v1/stage/",
                                      {"files": [{"path": f"/new/{name}/t{next(counter)}.root"}]}, format="json")
        last_stage[name] = response.headers.get("Location", "")
        return response

    def poll(name):
        return clients[name].get(last_stage[name])

    doors = {"submit": submit, "stage": stage, "poll": poll}
    seconds = {door: {name: [] for name in clients} for door in doors}
    for door, call in doors.items():
        for name in clients:
            timed(lambda: call(name))  # warm up: the first call of a path compiles and caches
        for _ in range(args.repeat):
            for name in clients:
                seconds[door][name].append(timed(lambda: call(name))[0])
    medians = {door: {name: statistics.median(v) for name, v in by_user.items()} for door, by_user in seconds.items()}
    for door, by_user in medians.items():
        print(f"{door:7s} with history {by_user[HISTORY] * 1000:8.1f} ms   fresh {by_user[FRESH] * 1000:8.1f} ms",
              flush=True)
    ratio = {door: round(by_user[HISTORY] / by_user[FRESH], 2) for door, by_user in medians.items()}
    print(json.dumps({"submissions": args.submissions, "requests": total, "stage_x_fresh": ratio["stage"],
                      "submit_x_fresh": ratio["submit"], "poll_x_fresh": ratio["poll"],
                      "seconds": {door: {("history" if n == HISTORY else "fresh"): round(v, 4) for n, v in by.items()}
                                  for door, by in medians.items()}}))


if __name__ == "__main__":
    main()
