"""Files already on disk are not read again (issue 23, carousel/domain/ondisk.py): a path whose
restored copy another user's request still pins is answered at once through either door (the
native API, the Tape REST door), with its own pin, and the copy stays while any pin on it lives;
a file the stager says is on its disk is completed without a stage request."""
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, connections, transaction
from django.forms.models import model_to_dict
from django.test import override_settings
from django.utils import timezone

from carousel.domain import intake, pins
from carousel.infra import queue
from carousel.domain.services import restore_submit
from carousel.loop.cycle import run_cycle
from carousel.ops.retention import prune
from carousel.models import Bulk, Job, RequestState as S, RestoreRequest
from carousel.stagers.base import FileStatus
from carousel.stagers.immediate import ImmediateStager
from carousel.stagers.tape_rest import TapeRestStager
from tests.conftest import client_for
from tests import counters_scenario, databases
from tests.conftest import a_backend_waits_for_a_lock
from tests.fakes.tape_rest_server import TapeRestServer

pytestmark = pytest.mark.django_db
HOUR = timedelta(hours=1)
PATH = "/star/raw/a.daq"
ROOT = Path(__file__).resolve().parent.parent


class DiskStager(ImmediateStager):
    """Restores a file at the first poll onto its disk (a real file under `disk`); records what
    it is asked to stage and to release."""

    def __init__(self, disk):
        super().__init__()
        self.disk = disk
        self.staged = []
        self.released = []

    def disk_path(self, path):
        copy = self.disk / path.lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(f"contents of {path}")
        return str(copy)

    def submit(self, job):
        self.staged.extend(job.paths)
        return super().submit(job)

    def poll(self, jobs):
        return {job.id: [FileStatus(path=p, state="done", disk_path=self.disk_path(p)) for p in job.paths]
                for job in jobs}

    def release(self, backend_id, paths):
        self.released.append((backend_id, list(paths)))


@pytest.fixture
def stager(tmp_path):
    return DiskStager(tmp_path / "stager-disk")


@pytest.fixture
def alices(alice, stager):
    """Alice's request for PATH, restored by a tape job and pinned for an hour."""
    now = timezone.now()
    restore_submit(user=alice, paths=[PATH], now=now, pin_lifetime=HOUR)
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + timedelta(seconds=1), stager=stager)
    request = RestoreRequest.objects.get(user=alice)
    assert request.state == S.DONE and request.pin_until and request.staged_path and stager.staged == [PATH]
    return request


def unchanged(request):
    return model_to_dict(RestoreRequest.objects.get(pk=request.pk)) == model_to_dict(request)


def no_tape_read_after(stager, now):
    """A cycle later, nothing more was sent to the stager and no job was made."""
    jobs = Job.objects.count()
    run_cycle(now=now, stager=stager)
    return stager.staged == [PATH] and Job.objects.count() == jobs


def test_bob_gets_a_file_alice_pins_at_once_through_the_native_api(alices, bob, as_bob, stager):
    before = timezone.now()
    r = as_bob.post("/api/v1/requests/", {"paths": [PATH], "pin_lifetime": "PT2H"}, format="json")
    assert r.status_code == 201, r.content
    mine = RestoreRequest.objects.get(user=bob)
    detail = as_bob.get(f"/api/v1/requests/{mine.pk}/").json()
    assert detail["state"] == "done" and detail["disk_path"] == alices.staged_path
    assert before + 2 * HOUR <= mine.pin_until <= timezone.now() + 2 * HOUR  # a pin of its own
    assert mine.job_id is None and mine.copy_job == alices.job_id and mine.finished_at is not None
    assert unchanged(alices)
    assert no_tape_read_after(stager, timezone.now() + timedelta(seconds=5))


def test_bob_gets_a_file_alice_pins_at_once_through_the_tape_rest_door(alices, bob, as_bob, stager):
    r = as_bob.post("/api/tape-rest/v1/stage", {"files": [{"path": PATH, "diskLifetime": "PT2H"}]}, format="json")
    assert r.status_code == 201, r.content
    body = as_bob.get(f"/api/tape-rest/v1/stage/{r.json()['requestId']}").json()
    assert [f["state"] for f in body["files"]] == ["COMPLETED"] and "completedAt" in body
    mine = RestoreRequest.objects.get(user=bob)
    assert mine.state == S.DONE and mine.staged_path == alices.staged_path and mine.pin_until > alices.pin_until
    assert unchanged(alices)
    assert no_tape_read_after(stager, timezone.now() + timedelta(seconds=5))


@pytest.mark.parametrize("first", ["alice", "bob"])
def test_the_copy_stays_while_either_pin_lives(alices, alice, bob, as_alice, as_bob, stager, first):
    restore_submit(user=bob, paths=[PATH], now=timezone.now(), pin_lifetime=HOUR)
    clients = {"alice": as_alice, "bob": as_bob}
    then = clients.pop(first)
    (second,) = clients.values()
    now = timezone.now()
    assert then.post("/api/v1/requests/release/", {"paths": [PATH]}, format="json").json() == {"released": 1}
    run_cycle(now=now + timedelta(seconds=5), stager=stager)
    assert stager.released == []  # the other pin still holds the copy
    assert second.post("/api/v1/requests/release/", {"paths": [PATH]}, format="json").json() == {"released": 1}
    run_cycle(now=now + timedelta(seconds=10), stager=stager)
    assert stager.released == [(f"im-{alices.job_id}", [PATH])]  # the stage that made the copy


def test_a_copy_is_released_once_the_last_pin_runs_out(alices, bob, stager):
    restore_submit(user=bob, paths=[PATH], now=timezone.now(), pin_lifetime=3 * HOUR)
    run_cycle(now=alices.pin_until + timedelta(seconds=1), stager=stager)
    assert stager.released == [] and RestoreRequest.objects.get(user=bob).pin_until is not None
    run_cycle(now=timezone.now() + 4 * HOUR, stager=stager)
    assert stager.released == [(f"im-{alices.job_id}", [PATH])]


def test_retention_keeps_the_job_a_live_pin_was_served_from(alices, alice, bob, as_alice, stager):
    """Alice's request ends and is pruned while bob's pin on her copy lives: the job that made
    the copy stays, so that bob's pin's end still sends its release."""
    restore_submit(user=bob, paths=[PATH], now=timezone.now(), pin_lifetime=timedelta(days=60))
    assert as_alice.post("/api/v1/requests/release/", {"paths": [PATH]}, format="json").json() == {"released": 1}
    later = timezone.now() + timedelta(days=30)
    pruned = prune(now=later, older_than=timedelta(days=14))
    assert pruned.requests == 1 and not RestoreRequest.objects.filter(user=alice).exists()
    assert Job.objects.filter(id=alices.job_id).exists()
    run_cycle(now=timezone.now() + timedelta(days=61), stager=stager)
    assert stager.released == [(f"im-{alices.job_id}", [PATH])]


def test_a_file_served_to_a_submission_without_a_pin_lifetime_is_held_as_long_as_the_copy_was(alices, bob, stager):
    """No lifetime asked (the API's and the form's default): the served request still holds a
    pin, up to the end of the pin it was served from, so that pin's early end does not take
    the copy from under a user just told it is on disk."""
    restore_submit(user=bob, paths=[PATH], now=timezone.now())
    mine = RestoreRequest.objects.get(user=bob)
    assert mine.state == S.DONE and mine.pin_until == alices.pin_until
    pins.release_pins(user=alices.user, paths=[PATH], now=timezone.now())
    run_cycle(now=timezone.now() + timedelta(seconds=5), stager=stager)
    assert stager.released == []


@pytest.mark.parametrize("how", ["released", "expired"])
def test_a_file_whose_pin_ended_is_read_again(alices, alice, bob, stager, how):
    from carousel.domain.pins import release_pins

    now = timezone.now() + 2 * HOUR if how == "expired" else timezone.now()
    if how == "released":
        assert release_pins(user=alice, paths=[PATH], now=now) == 1
    restore_submit(user=bob, paths=[PATH], now=now)
    assert RestoreRequest.objects.get(user=bob).state == S.QUEUED
    run_cycle(now=now + timedelta(seconds=1), stager=stager)
    run_cycle(now=now + timedelta(seconds=2), stager=stager)
    assert stager.staged == [PATH, PATH] and RestoreRequest.objects.get(user=bob).state == S.DONE


def test_a_submission_with_a_destination_goes_through_the_delivery_step(
        alices, bob, stager, settings, tmp_path, django_capture_on_commit_callbacks):
    settings.CAROUSEL_DESTINATION_ROOTS = [str(tmp_path)]
    settings.CAROUSEL_DELIVERY = "copy"
    destination = tmp_path / "bob" / "run1"
    restore_submit(user=bob, paths=[PATH], now=timezone.now(), destination=str(destination), pin_lifetime=HOUR)
    mine = RestoreRequest.objects.get(user=bob)
    assert mine.state == S.DELIVERING and mine.staged_path == alices.staged_path and mine.pin_until is None
    # Started, as the doors show it (Tape REST's startedAt is an integer, never null).
    assert mine.submitted_at is not None and mine.started_at is not None
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=timezone.now() + timedelta(seconds=5), stager=stager)
    mine.refresh_from_db()
    assert mine.state == S.DONE and mine.pin_until is not None
    assert (destination / PATH.lstrip("/")).read_text() == f"contents of {PATH}"
    assert stager.staged == [PATH] and unchanged(alices)


def test_a_big_submission_is_served_from_the_pinned_copy_in_the_intakes_move(alices, bob, stager):
    paths = [f"/star/raw/b{i}.daq" for i in range(4)] + [PATH]
    with override_settings(CAROUSEL_INTAKE_ABOVE=2):
        result = restore_submit(user=bob, paths=paths, now=timezone.now(), pin_lifetime=HOUR)
    assert Bulk.objects.get(pk=result.bulk.pk).pending == 5
    intake.settle(result.bulk.pk, now=timezone.now())
    states = dict(RestoreRequest.objects.filter(user=bob).values_list("path", "state"))
    assert states == {**{p: S.QUEUED for p in paths[:4]}, PATH: S.DONE}
    mine = RestoreRequest.objects.get(user=bob, path=PATH)
    assert mine.staged_path == alices.staged_path and mine.copy_job == alices.job_id and mine.pin_until
    assert mine.size == alices.size and unchanged(alices)
    counters_scenario.check("the intake's move", (bob,))


def test_the_move_looks_pinned_copies_up_by_index(alices, bob):
    from django.db import connection

    from carousel.infra import db as infra_db

    with override_settings(CAROUSEL_INTAKE_ABOVE=0):
        result = restore_submit(user=bob, paths=[PATH, "/star/raw/x"], now=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE carousel_restorerequest")
        with infra_db.index_probes():
            sql, params = intake.queue_rest(result.bulk, timezone.now())
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "request_pinned_path" in plan and "Seq Scan on carousel_restorerequest" not in plan, plan


def test_a_file_the_tape_rest_stager_says_is_on_disk_is_done_without_a_stage_request(alice, tmp_path):
    files = {"/grid/online": "DISK_AND_TAPE", "/grid/disk-only": "DISK", "/grid/nearline": "TAPE"}
    with TapeRestServer(token="t", files=files) as server:
        stager = TapeRestStager(url=server.url, token="t", timeout_s=5, state_dir=tmp_path / "state")
        try:
            now = timezone.now()
            restore_submit(user=alice, paths=sorted(files), now=now, pin_lifetime=HOUR)
            run_cycle(now=now, stager=stager)
            states = dict(RestoreRequest.objects.values_list("path", "state"))
            assert states["/grid/online"] == S.DONE and states["/grid/disk-only"] == S.DONE
            assert states["/grid/nearline"] != S.DONE
            assert [[f["path"] for f in body["files"]] for body in server.stage_bodies] == [["/grid/nearline"]]
            online = RestoreRequest.objects.get(path="/grid/online")
            assert online.job_id is None and online.pin_until is not None and online.tape_id is not None
        finally:
            stager.close()


def test_a_copy_served_on_from_a_served_request_keeps_naming_the_stage_that_made_it(alices, alice, bob, charlie,
                                                                                     stager):
    from carousel.domain.pins import release_pins

    now = timezone.now()
    restore_submit(user=bob, paths=[PATH], now=now, pin_lifetime=HOUR)
    assert release_pins(user=alice, paths=[PATH], now=now) == 1
    restore_submit(user=charlie, paths=[PATH], now=now, pin_lifetime=HOUR)
    charlies = RestoreRequest.objects.get(user=charlie)
    assert charlies.state == S.DONE and charlies.copy_job == alices.job_id and charlies.job_id is None
    release_pins(user=bob, paths=[PATH], now=now)
    release_pins(user=charlie, paths=[PATH], now=now)
    run_cycle(now=now + timedelta(seconds=5), stager=stager)
    assert stager.released == [(f"im-{alices.job_id}", [PATH])] and stager.staged == [PATH]


def test_a_big_submission_with_a_destination_hands_the_pinned_copy_to_the_delivery_step(
        alices, bob, settings, tmp_path):
    settings.CAROUSEL_DESTINATION_ROOTS = [str(tmp_path)]
    settings.CAROUSEL_DELIVERY = "copy"
    paths = [f"/star/raw/c{i}.daq" for i in range(3)] + [PATH]
    with override_settings(CAROUSEL_INTAKE_ABOVE=2):
        result = restore_submit(user=bob, paths=paths, now=timezone.now(), destination=str(tmp_path / "bob"),
                                pin_lifetime=HOUR)
    intake.settle(result.bulk.pk, now=timezone.now())
    mine = RestoreRequest.objects.get(user=bob, path=PATH)
    assert mine.state == S.DELIVERING and mine.staged_path == alices.staged_path and mine.delivery_fs.startswith("dev:")
    assert mine.pin_until is None and mine.finished_at is None and mine.copy_job == alices.job_id
    assert mine.submitted_at is not None and mine.started_at is not None
    assert set(RestoreRequest.objects.filter(user=bob).exclude(path=PATH).values_list("state", flat=True)) == {S.QUEUED}


def test_a_move_and_a_release_sharing_pinned_copies_take_them_in_one_order(transactional_db, alice, bob, stager,
                                                                         monkeypatch):
    """A release locks the pins it ends in id order (pins._end_pins); the intake's move must
    take the pinned copies it serves from in that order too, whatever the submission's order:
    else each holds one the other waits for, and PostgreSQL aborts one of them (a deadlock)."""
    if connection.vendor != "postgresql":
        pytest.skip("two real connections to PostgreSQL")
    now = timezone.now()
    paths = ["/star/raw/first.daq", "/star/raw/second.daq"]
    restore_submit(user=alice, paths=paths, now=now, pin_lifetime=HOUR)
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + timedelta(seconds=1), stager=stager)
    low, high = RestoreRequest.objects.filter(user=alice, state=S.DONE).order_by("id").values_list("id", flat=True)
    monkeypatch.setattr(queue, "send_on_commit", lambda *args, **kwargs: None)  # the move: this test's
    with override_settings(CAROUSEL_INTAKE_ABOVE=1):  # the copies in the reverse of their ids' order
        bulk = restore_submit(user=bob, paths=paths[::-1], now=now, pin_lifetime=HOUR).bulk
    assert Bulk.objects.get(pk=bulk.pk).pending == 2
    errors = []

    def move():
        try:
            intake.settle(bulk.pk, now=timezone.now())
        except Exception as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)
        finally:
            connections.close_all()

    mover = threading.Thread(target=move)
    with transaction.atomic():  # a release half way: it holds the first pin, in id order
        list(RestoreRequest.objects.filter(id=low).select_for_update(no_key=True))
        mover.start()
        assert a_backend_waits_for_a_lock()
        # Its next lock, the pin after it: the move, waiting for the first, holds none yet.
        list(RestoreRequest.objects.filter(id=high).select_for_update(no_key=True, nowait=True))
    mover.join(10)
    assert not errors and not mover.is_alive()
    assert set(RestoreRequest.objects.filter(user=bob).values_list("state", flat=True)) == {S.DONE}


SQLITE_SERVED = """
import warnings; warnings.simplefilter("error", RuntimeWarning)
import django; django.setup()
from datetime import timedelta
from django.db import connection; assert connection.vendor == "sqlite"
from django.utils import timezone
from carousel.domain.services import restore_submit
from carousel.models import RestoreRequest
from tests.conftest import make_user
alice, bob, now = make_user("alice", "analysis"), make_user("bob", "analysis"), timezone.now()
restore_submit(user=alice, paths=["/star/raw/a.daq"], now=now)
RestoreRequest.objects.filter(user=alice).update(state="done", finished_at=now, staged_path="/disk/a.daq",
                                                 pin_until=now + timedelta(hours=1))
restore_submit(user=bob, paths=["/star/raw/a.daq"], now=now)
mine = RestoreRequest.objects.get(user=bob)
assert mine.state == "done" and mine.pin_until == now + timedelta(hours=1), (mine.state, mine.pin_until)
print("served OK")
"""


def test_on_the_embedded_sqlite_default_a_served_pin_is_the_copys_own_moment(tmp_path):
    """SQLite gives the copy's pin back from the raw look-up as naive UTC text: the served
    request's pin must be that moment, not a naive time Django would take for the site's zone
    (a RuntimeWarning, an error here)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    # A copy of a migrated database (tests/databases.py), not a migration of its own.
    env.update(CAROUSEL_VAR_DIR=str(databases.sqlite_var_dir(tmp_path)), DJANGO_SETTINGS_MODULE="carousel.settings")
    done = subprocess.run([sys.executable, "-c", SQLITE_SERVED], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "served OK" in done.stdout, done.stderr[-3000:]


def test_a_request_done_from_another_jobs_copy_releases_that_copy(alice, bob, as_alice, as_bob, stager):
    """alice's request waiting to retry (its job failed) is done when bob's job reads the file;
    it kept its failed job, and its pin's end, the last, asked the stager to release the copy
    of that failed job, not of bob's, which stayed pinned (a reviewer's finding)."""
    now = timezone.now()
    failing = [True]

    class FailsFirst(DiskStager):
        def poll(self, jobs):
            if failing[0]:
                failing[0] = False
                return {job.id: [FileStatus(p, "failed", "transient", "drive error") for p in job.paths]
                        for job in jobs}
            return super().poll(jobs)

    disk = FailsFirst(stager.disk)
    restore_submit(user=alice, paths=[PATH], now=now, pin_lifetime=HOUR)
    run_cycle(now=now, stager=disk)
    run_cycle(now=now + timedelta(seconds=1), stager=disk)
    first_job = RestoreRequest.objects.get(user=alice).job_id
    assert RestoreRequest.objects.get(user=alice).state == S.RETRY
    restore_submit(user=bob, paths=[PATH], now=now + timedelta(seconds=2), pin_lifetime=HOUR)
    run_cycle(now=now + timedelta(seconds=2), stager=disk)
    run_cycle(now=now + timedelta(seconds=3), stager=disk)
    bobs_job = RestoreRequest.objects.get(user=bob).job_id
    assert bobs_job != first_job
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {S.DONE}
    assert as_bob.post("/api/v1/requests/release/", {"paths": [PATH]}, format="json").json() == {"released": 1}
    run_cycle(now=now + timedelta(seconds=5), stager=disk)
    assert as_alice.post("/api/v1/requests/release/", {"paths": [PATH]}, format="json").json() == {"released": 1}
    run_cycle(now=now + timedelta(seconds=10), stager=disk)
    assert disk.released == [(f"im-{bobs_job}", [PATH])]


# (A reviewer's finding: with the default delivery, which moves no files, a request that named a
# destination was shown "delivered to" it, a path where nothing was ever written.)
@pytest.mark.django_db
def test_a_file_never_delivered_is_not_said_to_be_delivered(settings, alice, tmp_path):
    settings.CAROUSEL_DELIVERY = "none"  # the default: files are used where the stager put them
    settings.CAROUSEL_DESTINATION_ROOTS = ["/scratch"]
    stager = DiskStager(tmp_path / "stager-disk")
    now = timezone.now()
    bulk = restore_submit(user=alice, paths=["/star/raw/a.daq"], now=now, destination="/scratch/alice",
                          pin_lifetime=timedelta(hours=1)).bulk
    run_cycle(now=now, stager=stager)
    run_cycle(now=now + timedelta(seconds=1), stager=stager)
    request = RestoreRequest.objects.get()
    assert request.state == S.DONE and request.delivery_started_at is None
    copy = request.staged_path
    assert copy.startswith(str(tmp_path / "stager-disk"))
    assert not (tmp_path / "scratch").exists()  # nothing was copied anywhere
    detail = client_for(alice).get(f"/api/v1/requests/{request.id}/").json()
    text = b"".join(client_for(alice).get(f"/api/v1/bulks/{bulk.id}/restored.txt").streaming_content).decode()
    assert (detail["where_kind"], detail["where"]) == ("disk", copy), (detail["where_kind"], detail["where"])
    assert text.split("\t")[1] == f"on disk at {copy}", text
    listed = client_for(alice).get("/api/v1/requests/").json()["results"][0]
    assert (listed["where_kind"], listed["where"]) == ("disk", copy)
