"""Big submissions through the intake (carousel/domain/intake.py): answered once their files are durable,
queued moments later exactly as the direct path would have queued them, and never lost, doubled
or hidden in between."""
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from carousel.domain import intake
from carousel.loop.cycle import run_cycle
from carousel.models import Bulk, BulkItem, Intake, Job, RequestState as S, RestoreRequest, path_key
from carousel.domain.services import restore_submit

URL = "/api/v1/requests/"
STAGE = "/api/tape-rest/v1/stage/"
COMPARED = ("group_id", "priority", "destination", "deadline", "pin_lifetime", "state", "attempts", "job_id",
            "created_at")


@pytest.fixture
def small_intake(settings):
    settings.CAROUSEL_INTAKE_ABOVE = 2  # three new files or more go through the intake
    settings.CAROUSEL_DESTINATION_ROOTS = ["/dest"]


def options(now):
    return {"priority": 2, "destination": "/dest", "deadline": now + timedelta(days=1),
            "pin_lifetime": timedelta(hours=3)}


def test_a_big_submission_is_answered_from_the_intake_and_queued_as_the_direct_path_would(
        small_intake, alice, now):
    alice.groups.add(Group.objects.create(name="star"))
    direct = restore_submit(user=alice, paths=["/d/1", "/d/2"], now=now, **options(now))
    big = restore_submit(user=alice, paths=["/i/1", "/i/2", "/i/3"], now=now, **options(now))
    assert (direct.bulk.pending, big.bulk.pending, big.created) == (0, 3, 3)
    assert RestoreRequest.objects.filter(bulk=big.bulk).count() == 0
    assert sorted(Intake.objects.values_list("path", flat=True)) == ["/i/1", "/i/2", "/i/3"]

    assert intake.settle(big.bulk.pk, now=now + timedelta(seconds=5)) == 3
    assert intake.settle(big.bulk.pk, now=now) == 0  # a second settler finds nothing to do
    assert not Intake.objects.exists() and Bulk.objects.get(pk=big.bulk.pk).pending == 0
    reference = RestoreRequest.objects.filter(bulk=direct.bulk).values(*COMPARED).first()
    moved = list(RestoreRequest.objects.filter(bulk=big.bulk).order_by("path").values("path", *COMPARED))
    assert [m.pop("path") for m in moved] == ["/i/1", "/i/2", "/i/3"]
    assert reference["group_id"] is not None and reference["state"] == S.QUEUED
    assert moved == [reference] * 3  # created_at: the submission's time, not the move's


def test_the_tape_rest_door_lists_every_file_right_after_the_post(small_intake, alice, as_alice):
    paths = [f"/t/{i}" for i in range(5)]
    r = as_alice.post(STAGE, {"files": [{"path": p} for p in paths]}, format="json")
    assert r.status_code == 201
    rid = r.headers["Location"].rstrip("/").rsplit("/", 1)[1]
    assert Intake.objects.count() == 5 and not RestoreRequest.objects.exists()
    body = as_alice.get(f"{STAGE}{rid}").json()
    assert sorted((f["path"], f["state"]) for f in body["files"]) == [(p, "SUBMITTED") for p in paths]
    assert "completedAt" not in body
    # Cancelling some of its paths queues the rest and cancels those.
    r = as_alice.post(f"{STAGE}{rid}/cancel", {"paths": ["/t/0"]}, format="json")
    assert r.status_code == 200, r.content
    assert dict(RestoreRequest.objects.values_list("path", "state")) == {
        "/t/0": S.CANCELLED, **{p: S.QUEUED for p in paths[1:]}}


def test_the_users_next_submission_sees_the_waiting_files_as_its_own(small_intake, alice, now):
    first = restore_submit(user=alice, paths=["/n/1", "/n/2", "/n/3"], now=now)
    second = restore_submit(user=alice, paths=["/n/3", "/n/4"], now=now)
    assert (second.created, second.existing) == (1, 1)
    assert Bulk.objects.get(pk=first.bulk.pk).pending == 0  # queued before the second was judged
    assert RestoreRequest.objects.filter(user=alice, state=S.QUEUED).count() == 4
    assert list(BulkItem.objects.values_list("bulk_id", "request__path")) == [(second.bulk.pk, "/n/3")]


def test_the_ceiling_counts_the_waiting_files(small_intake, alice, now):
    from carousel.domain.exceptions import QueueCeilingReached
    from carousel.models import Control

    Control.objects.update_or_create(id=1, defaults={"default_queued_ceiling": 5})
    restore_submit(user=alice, paths=["/c/1", "/c/2", "/c/3"], now=now)
    with pytest.raises(QueueCeilingReached):
        restore_submit(user=alice, paths=["/c/4", "/c/5", "/c/6"], now=now)
    # The refusal stored nothing of the second; the first's files are all there (the move ran in
    # the refused transaction and was rolled back with it: they still wait, for the next mover).
    assert RestoreRequest.objects.count() + Intake.objects.count() == 3
    assert Bulk.objects.count() == 1


def test_deleting_the_stage_request_leaves_nothing_waiting(small_intake, as_alice):
    r = as_alice.post(STAGE, {"files": [{"path": f"/x/{i}"} for i in range(4)]}, format="json")
    rid = r.headers["Location"].rstrip("/").rsplit("/", 1)[1]
    assert as_alice.delete(f"{STAGE}{rid}").status_code == 200
    assert not Intake.objects.exists() and not Bulk.objects.exists()
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {S.CANCELLED}


def test_a_cancel_by_path_stops_files_still_in_the_intake(small_intake, alice, bob, as_alice, now):
    """They are cancelled, never queued for a cycle to claim; bob's request for one of them and
    alice's other waiting files stay (issue 25)."""
    restore_submit(user=alice, paths=["/i/1", "/i/2", "/i/3"], now=now)
    restore_submit(user=bob, paths=["/i/2", "/b/1", "/b/2"], now=now)
    r = as_alice.post("/api/v1/requests/cancel/", {"paths": ["/i/1", "//i/2", "/i/9"]}, format="json")
    assert r.status_code == 200, r.content
    assert r.json() == {"cancelled": 2, "not_active": ["/i/9"]}
    mine = dict(RestoreRequest.objects.filter(user=alice).values_list("path", "state"))
    assert mine == {"/i/1": S.CANCELLED, "/i/2": S.CANCELLED, "/i/3": S.QUEUED}
    assert not Intake.objects.filter(bulk_id__in=Bulk.objects.filter(user=alice)).exists()
    assert set(Intake.objects.values_list("path", flat=True)) == {"/i/2", "/b/1", "/b/2"}  # bob's, untouched


def test_the_task_sent_at_the_commit_queues_them(small_intake, alice, now, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):  # Celery runs eagerly in tests
        result = restore_submit(user=alice, paths=["/k/1", "/k/2", "/k/3"], now=now)
    assert RestoreRequest.objects.filter(bulk=result.bulk).count() == 3 and not Intake.objects.exists()


def test_the_cycle_queues_what_still_waits(small_intake, alice, now):
    """The worker was down when the task was sent: the next cycle moves the files, locates and
    sends them."""
    restore_submit(user=alice, paths=["/w/1", "/w/2", "/w/3"], now=now)
    run_cycle(now=now)
    assert not Intake.objects.exists()
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {S.SUBMITTED}


def test_a_waiting_file_another_user_stages_joins_that_stage_at_the_move(small_intake, alice, bob, now):
    restore_submit(user=bob, paths=["/j/1"], now=now)
    run_cycle(now=now)
    job = Job.objects.get()
    big = restore_submit(user=alice, paths=["/j/1", "/j/2", "/j/3"], now=now + timedelta(seconds=1))
    assert big.shared == 1
    intake.settle(big.bulk.pk, now=now + timedelta(seconds=2))
    joined = RestoreRequest.objects.get(user=alice, path="/j/1")
    assert (joined.state, joined.job_id, joined.attempts) == (S.SUBMITTED, job.id, 0)
    # Where the file is and its size, as bob's request knows them (they were left empty: no bytes
    # counted, no tape shown; a probe's finding).
    staged = RestoreRequest.objects.get(user=bob)
    assert (joined.size, joined.tape_id, joined.position) == (staged.size, staged.tape_id, staged.position)
    assert staged.tape_id is not None and staged.size is not None


def test_a_file_another_user_stages_joins_that_stage_with_its_place_and_size(alice, bob, now):
    """The same through the direct path (a small submission)."""
    restore_submit(user=bob, paths=["/j/9"], now=now)
    run_cycle(now=now)
    assert restore_submit(user=alice, paths=["/j/9"], now=now + timedelta(seconds=1)).shared == 1
    joined, staged = RestoreRequest.objects.get(user=alice), RestoreRequest.objects.get(user=bob)
    assert (joined.state, joined.job_id) == (S.SUBMITTED, staged.job_id)
    assert (joined.size, joined.tape_id, joined.position) == (staged.size, staged.tape_id, staged.position)
    assert staged.tape_id is not None and staged.size is not None


def test_a_submission_still_waiting_is_not_finished(small_intake, alice, now, mailoutbox):
    """Its files are not requests yet, so none is active: it must not count as finished (no
    completion notice) until they are queued and done."""
    from carousel.domain.services import bulk_notify_complete

    alice.email = "alice@example.org"
    alice.save()
    restore_submit(user=alice, paths=["/m/1", "/m/2", "/m/3"], now=now, notify=True)
    assert bulk_notify_complete(now=now) == 0 and mailoutbox == []


def test_a_broker_that_refuses_the_tasks_does_not_fail_the_answers(small_intake, alice, as_alice, monkeypatch,
                                                                    django_capture_on_commit_callbacks):
    """The submission and the cancel are committed before their tasks are sent: a broker that
    cannot take a task leaves the work to the cycle, and the answers stay 201 and 200."""
    from carousel import tasks

    def refused(*args, **kwargs):
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(tasks.settle_intake, "delay", refused)
    monkeypatch.setattr(tasks.withdraw, "delay", refused)
    with django_capture_on_commit_callbacks(execute=True):
        r = as_alice.post(URL, {"paths": ["/b/1", "/b/2", "/b/3"]}, format="json")
    assert r.status_code == 201 and Intake.objects.count() == 3
    run_cycle(now=timezone.now())  # queues and sends: the cancel then has files to withdraw
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {S.SUBMITTED}
    with django_capture_on_commit_callbacks(execute=True):
        r = as_alice.post(f"/api/v1/bulks/{r.json()['bulk_id']}/cancel/")
    assert r.status_code == 200 and r.json()["cancelled"] == 3


def move_scenario(now):
    """The move into the queue (two INSERT ... SELECT statements) on whichever database is
    configured: a file that became the user's own active request between the answer and the move
    is listed with a BulkItem, not stored twice, and not counted as created; a file another user
    is staging joins that stage; the others are queued with the submission's options, in its
    order. Run on PostgreSQL below and on SQLite in a subprocess."""
    from django.contrib.auth.models import User
    from django.test import override_settings

    from carousel.domain.counters import counters_fold
    from carousel.domain.selectors import queue_summary
    from carousel.models import Control

    Control.objects.update_or_create(id=1, defaults={"default_queued_ceiling": 1000})
    alice, bob = User.objects.create(username="mover-a"), User.objects.create(username="mover-b")
    job = Job.objects.create(created_at=now, state="sent", sent_at=now)
    carol = User.objects.create(username="mover-c")
    for path in ("/s/2", "/s/3"):  # carol's queued requests: no stage to join
        RestoreRequest.objects.create(user=carol, path=path, path_key=path_key(path), created_at=now,
                                      updated_at=now)
    staged = RestoreRequest.objects.create(user=bob, path="/s/2", path_key=path_key("/s/2"), state=S.SUBMITTED,
                                           job=job, job_rank=7, submitted_at=now, created_at=now, updated_at=now)
    paths = [f"/s/{i}" for i in range(6)]
    with override_settings(CAROUSEL_INTAKE_ABOVE=2):
        big = restore_submit(user=alice, paths=paths, now=now, priority=1, pin_lifetime=timedelta(hours=2),
                             destination_layout="name")
    assert big.bulk.pending == 6 and big.shared == 1
    # Between the answer and the move, /s/4 became alice's active request another way.
    own = RestoreRequest.objects.create(user=alice, path="/s/4", path_key=path_key("/s/4"), state=S.QUEUED,
                                        created_at=now, updated_at=now)
    assert intake.settle(big.bulk.pk, now=now + timedelta(seconds=1)) == 6
    bulk = Bulk.objects.get(pk=big.bulk.pk)
    assert (bulk.pending, bulk.created) == (0, 5)
    assert list(BulkItem.objects.filter(bulk=bulk).values_list("request_id", flat=True)) == [own.pk]
    assert RestoreRequest.objects.filter(user=alice, path="/s/4").count() == 1
    moved = list(RestoreRequest.objects.filter(bulk=bulk).order_by("id").values_list(
        "path", "state", "job_id", "job_rank", "submitted_at", "priority", "pin_lifetime", "destination_layout",
        "created_at", "updated_at"))
    assert [m[0] for m in moved] == ["/s/0", "/s/1", "/s/2", "/s/3", "/s/5"]  # the submission's order
    assert moved[2][1:5] == (S.SUBMITTED, job.id, 7, staged.submitted_at)
    assert {m[1:5] for m in moved[:2] + moved[3:]} == {(S.QUEUED, None, 0, None)}
    assert {m[5:] for m in moved} == {(1, timedelta(hours=2), "name", now, now + timedelta(seconds=1))}
    counters_fold()
    assert queue_summary(user=alice)["states"]["queued"] == 5  # the counters' triggers saw the move


def test_the_move_into_the_queue_dedupes_and_joins_on_postgresql(db, now):
    move_scenario(now)


def test_the_move_into_the_queue_dedupes_and_joins_on_sqlite(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    from tests.databases import sqlite_var_dir

    # A copy of a migrated database (tests/databases.py), not a migration of its own.
    env.update(CAROUSEL_VAR_DIR=str(sqlite_var_dir(tmp_path)), DJANGO_SETTINGS_MODULE="carousel.settings")
    code = ("import django; django.setup()\n"
            "from django.db import connection; assert connection.vendor == 'sqlite'\n"
            "from django.utils import timezone; from tests.test_intake import move_scenario\n"
            "from django.db import transaction\n"
            "with transaction.atomic():  # no commit: the task the answer sends is never sent\n"
            "    move_scenario(timezone.now()); transaction.set_rollback(True)\n"
            "print('move OK')")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "move OK" in done.stdout, done.stderr[-3000:]


def test_the_move_probes_the_request_table_by_index_even_with_stale_statistics(small_intake, alice, now):
    """Statistics taken while the request table was empty make the planner scan it whole for
    each file of the move, pages the move itself fills included: quadratic (a 100,000-file move
    took 141 s), or hash the whole table. The move keeps to index probes per file."""
    from django.db import connection

    from carousel.infra import db as infra_db

    big = restore_submit(user=alice, paths=[f"/q/{i}" for i in range(5)], now=now)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE carousel_restorerequest")
        with infra_db.index_probes():
            sql, params = intake.queue_rest(big.bulk, now)
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan on carousel_restorerequest" not in plan and "Hash" not in plan, plan
    assert "request_in_flight" not in plan, plan  # every request in flight walked for each file
    with connection.cursor() as cursor:  # as they were after the block
        cursor.execute("SELECT current_setting('enable_seqscan'), current_setting('enable_hashjoin')")
        assert cursor.fetchone() == ("on", "on")
    assert intake.settle(big.bulk.pk, now=now) == 5


def test_the_next_move_is_planned_on_statistics_that_have_seen_the_last_one(small_intake, alice, now):
    """With the statistics taken while the request table was empty, a 100,000-file move right
    after another took 680 s instead of 7: the planner joined the whole submission against every
    active request. A move first brings the statistics up to date when autovacuum would
    (db.fresh_statistics), so the next one is planned knowing the rows the last one added."""
    from django.db import connection

    def rows_the_planner_believes():
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE oid = 'carousel_restorerequest'::regclass")
            return cursor.fetchone()[0]

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE carousel_restorerequest")  # taken while empty, as on a new site
    assert rows_the_planner_believes() <= 0
    first = restore_submit(user=alice, paths=[f"/a/{i}" for i in range(300)], now=now)
    assert intake.settle(first.bulk.pk, now=now) == 300
    second = restore_submit(user=alice, paths=[f"/b/{i}" for i in range(300)], now=now)
    assert intake.settle(second.bulk.pk, now=now) == 300
    assert rows_the_planner_believes() == 300  # the first move's rows, seen before the second moved


def test_the_submissions_hex_keys_are_the_path_keys():
    """restore_submit keys its paths by models.path_keys (hex text, no UUID object per path);
    they must name the rows path_key names."""
    import uuid

    from carousel.models import path_keys

    paths = ["/a/b", "/ü/x y", "/" + "z" * 4000]
    assert [uuid.UUID(k) for k in path_keys(paths)] == [path_key(p) for p in paths]


def test_the_path_filter_finds_a_big_submissions_files_before_and_after_their_paths_are_indexed(
        small_intake, alice, as_operator, now):
    """The move queues a big submission's files without adding them to the path filter's index
    (PathSearch: its trigram index was a second of a 100,000-file move); the filter still finds
    them, from the request table, until index_paths adds them after the move."""
    from django.db import connection

    from carousel.models import PathSearch

    postgres = connection.vendor == "postgresql"
    restore_submit(user=alice, paths=["/s/needle1", "/s/x_y"], now=now)  # small: indexed at once
    big = restore_submit(user=alice, paths=["/b/needle2", "/b/hay", "/b/needle3", "/b/xzy"], now=now)
    assert intake.settle(big.bulk.pk, now=now) == 4

    def listed(text):
        return sorted(r["path"] for r in as_operator.get(URL, {"path": text}).json()["results"])

    moved = RestoreRequest.objects.filter(bulk=big.bulk)
    assert not Bulk.objects.get(pk=big.bulk.pk).paths_searchable
    if postgres:
        assert sorted(PathSearch.objects.values_list("path", flat=True)) == ["/s/needle1", "/s/x_y"]
    assert listed("needle") == ["/b/needle2", "/b/needle3", "/s/needle1"]
    assert listed("x_y") == ["/s/x_y"]  # a LIKE wildcard in the text is a character

    assert intake.index_paths(big.bulk.pk) == (4 if postgres else 0)
    assert intake.index_paths(big.bulk.pk) == 0  # once
    assert Bulk.objects.get(pk=big.bulk.pk).paths_searchable
    if postgres:
        assert set(PathSearch.objects.values_list("request_id", flat=True)) == set(
            RestoreRequest.objects.values_list("id", flat=True))
    assert listed("needle") == ["/b/needle2", "/b/needle3", "/s/needle1"]
    assert listed("x_y") == ["/s/x_y"]

    moved.delete()  # as retention deletes requests: their rows in the index go with them
    assert listed("needle") == ["/s/needle1"]
    if postgres:
        assert sorted(PathSearch.objects.values_list("path", flat=True)) == ["/s/needle1", "/s/x_y"]


def test_the_task_and_the_cycle_index_the_moved_paths(small_intake, alice, now, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):  # the task: the move, then the index
        by_task = restore_submit(user=alice, paths=["/k/1", "/k/2", "/k/3"], now=now)
    assert Bulk.objects.get(pk=by_task.bulk.pk).paths_searchable
    left = restore_submit(user=alice, paths=["/c/1", "/c/2", "/c/3"], now=now)  # no task ran
    run_cycle(now=now)
    assert Bulk.objects.get(pk=left.bulk.pk).paths_searchable
