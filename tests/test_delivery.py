"""Delivery: staged files are put where their users asked, throttled per file system, and
delivery failures are their own class."""
from datetime import timedelta

import pytest

from carousel.loop.cycle import run_cycle
from carousel.models import RestoreRequest
from carousel.domain.services import restore_submit
from tests.test_backpressure import Backend, control


@pytest.fixture(autouse=True)
def _destination_root(settings, tmp_path):
    # The operator allows deliveries under the test's directory (carousel/domain/authz.py).
    settings.CAROUSEL_DESTINATION_ROOTS = [str(tmp_path)]


@pytest.fixture
def copying(settings):
    settings.CAROUSEL_DELIVERY = "copy"


def staged(tmp_path, backend, paths):
    """The stager's disk: each path staged as a small file of its own."""
    disk = tmp_path / "stager-disk"
    disk.mkdir(exist_ok=True)
    for i, path in enumerate(paths):
        copy = disk / f"f{i}"
        copy.write_bytes(f"contents of {path}".encode())
        backend.disk_paths[path] = str(copy)
        backend.file_state[path] = "done"


def test_a_staged_file_is_copied_to_its_destination(copying, tmp_path, alice, now,
                                                    django_capture_on_commit_callbacks):
    control()
    target = tmp_path / "user" / "run1" / "a.root"
    restore_submit(user=alice, now=now, paths=["/star/a.root"], destination=str(target))
    backend = Backend()
    run_cycle(now=now, stager=backend)
    staged(tmp_path, backend, ["/star/a.root"])
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    request = RestoreRequest.objects.get()
    assert request.state == "done"
    assert target.read_bytes() == b"contents of /star/a.root"


def test_deliveries_are_throttled_per_file_system(copying, tmp_path, alice, now, django_capture_on_commit_callbacks):
    control(files_per_job=10, deliveries_per_fs=2)
    paths = [f"/star/{i}" for i in range(5)]
    for p in paths:
        restore_submit(user=alice, now=now, paths=[p], destination=str(tmp_path / "dest" / p.rsplit("/", 1)[1]))
    backend = Backend()
    run_cycle(now=now, stager=backend)
    staged(tmp_path, backend, paths)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        report = run_cycle(now=now + timedelta(seconds=10), stager=backend)
    assert report.delivering == 2 and len(callbacks) == 1
    assert RestoreRequest.objects.filter(state="delivering").count() == 5
    # While those two run, no more start on that file system.
    with django_capture_on_commit_callbacks(execute=False):
        assert run_cycle(now=now + timedelta(seconds=20), stager=backend).delivering == 0
    callbacks[0]()
    assert RestoreRequest.objects.filter(state="done").count() == 2
    with django_capture_on_commit_callbacks(execute=True):
        assert run_cycle(now=now + timedelta(seconds=30), stager=backend).delivering == 2


def test_a_destination_the_user_cannot_write_fails_with_a_user_error(copying, tmp_path, alice, now,
                                                                     django_capture_on_commit_callbacks):
    control()
    (tmp_path / "a-file").write_text("not a directory")
    restore_submit(user=alice, now=now, paths=["/star/b"], destination=str(tmp_path / "a-file" / "b"))
    backend = Backend()
    run_cycle(now=now, stager=backend)
    staged(tmp_path, backend, ["/star/b"])
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    request = RestoreRequest.objects.get()
    assert (request.state, request.error_class) == ("failed", "user")
    assert "cannot write" in request.last_error


def test_a_failed_delivery_is_retried_on_the_cycle_then_fails(copying, tmp_path, alice, now,
                                                              django_capture_on_commit_callbacks):
    control(retry_cycle_s=600, max_delivery_attempts=2, max_attempts=5)
    restore_submit(user=alice, now=now, paths=["/star/c"], destination=str(tmp_path / "out" / "c"))
    backend = Backend()
    run_cycle(now=now, stager=backend)
    backend.file_state["/star/c"] = "done"
    backend.disk_paths["/star/c"] = str(tmp_path / "evicted-before-delivery")
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    request = RestoreRequest.objects.get()
    assert (request.state, request.error_class, request.delivery_attempts) == ("retry", "delivery", 1)
    # On the retry cycle, not at once (the delivery task stamps its own time).
    assert request.retry_at >= now + timedelta(seconds=600)
    # Its retry time: staged again (the stager answers done at once) and delivered again.
    for t in (620, 630, 640):
        with django_capture_on_commit_callbacks(execute=True):
            run_cycle(now=now + timedelta(seconds=t), stager=backend)
    request.refresh_from_db()
    assert (request.state, request.error_class, request.delivery_attempts) == ("failed", "delivery", 2)
    assert "staged copy missing" in request.last_error and "gave up after 2 attempts" in request.last_error


def test_without_a_delivery_step_staged_files_are_done_in_place(tmp_path, alice, now):
    control()
    restore_submit(user=alice, now=now, paths=["/star/d"], destination=str(tmp_path / "ignored"))
    backend = Backend()
    run_cycle(now=now, stager=backend)
    backend.file_state["/star/d"] = "done"
    run_cycle(now=now + timedelta(seconds=10), stager=backend)
    assert RestoreRequest.objects.get().state == "done"


def test_a_dispatch_the_broker_refuses_is_sent_again_by_the_next_cycle(copying, tmp_path, alice, now, monkeypatch,
                                                                        django_capture_on_commit_callbacks):
    """A Redis blip as the deliveries are sent: the cycle's answer is not an error, and the files
    are dispatched again at the next cycle, not after the 6-hour lease (issue 24)."""
    from carousel import tasks

    control()
    target = tmp_path / "user" / "b.root"
    restore_submit(user=alice, now=now, paths=["/star/b.root"], destination=str(target))
    backend = Backend()
    run_cycle(now=now, stager=backend)
    staged(tmp_path, backend, ["/star/b.root"])

    def refused(*args, **kwargs):
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tasks.deliver, "delay", refused)
    with django_capture_on_commit_callbacks(execute=True):
        assert run_cycle(now=now + timedelta(seconds=10), stager=backend).delivering == 1
    assert RestoreRequest.objects.get().delivery_started_at is None
    monkeypatch.undo()
    with django_capture_on_commit_callbacks(execute=True):
        assert run_cycle(now=now + timedelta(seconds=20), stager=backend).delivering == 1
    assert RestoreRequest.objects.get().state == "done" and target.exists()
