"""Delivery: staged files are put where their users asked, each under its submission's
destination directory, throttled per file system, never through a symbolic link below the
destination root; delivery failures are their own class."""
import json
import os
import sys
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
    destination = tmp_path / "user" / "run1"
    target = destination / "star" / "a.root"
    restore_submit(user=alice, now=now, paths=["/star/a.root"], destination=str(destination))
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
    target = tmp_path / "user" / "star" / "b.root"
    restore_submit(user=alice, now=now, paths=["/star/b.root"], destination=str(tmp_path / "user"))
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
    assert RestoreRequest.objects.get().state == "done" and target.read_bytes() == b"contents of /star/b.root"


# A destination is a directory: each file under it by its path, or by its name.

def deliver(tmp_path, user, now, paths, destination, after_submission=None, **options):
    """Submit `paths` for delivery under `destination`, run `after_submission` (if given), and
    stage them: the next cycle delivers them. Returns the stager."""
    control(files_per_job=10, deliveries_per_fs=10)
    restore_submit(user=user, now=now, paths=paths, destination=str(destination), **options)
    if after_submission:
        after_submission()
    backend = Backend()
    run_cycle(now=now, stager=backend)
    staged(tmp_path, backend, paths)
    return backend


def test_many_files_under_one_destination_each_get_their_own_file(copying, tmp_path, alice, now,
                                                                  django_capture_on_commit_callbacks):
    paths = ["/star/run1/a.root", "/star/run2/a.root", "/star/b.root"]
    out = tmp_path / "out"
    out.mkdir()  # an existing directory, as a user names one
    backend = deliver(tmp_path, alice, now, paths, out)
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"done"}
    for path in paths:
        assert (out / path.lstrip("/")).read_bytes() == f"contents of {path}".encode()


def test_files_delivered_by_name_go_straight_under_the_destination(copying, tmp_path, alice, now,
                                                                  django_capture_on_commit_callbacks):
    paths = ["/star/run1/a.root", "/star/run2/b.root"]
    backend = deliver(tmp_path, alice, now, paths, tmp_path / "out", destination_layout="name")
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"done"}
    assert sorted(os.listdir(tmp_path / "out")) == ["a.root", "b.root"]
    assert (tmp_path / "out" / "b.root").read_bytes() == b"contents of /star/run2/b.root"


# Symbolic links below a root: never followed, whenever they are planted.

@pytest.fixture
def root(settings, tmp_path):
    """A destination root with a directory beside it, outside it, that nothing may reach."""
    (tmp_path / "root" / "alice").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    settings.CAROUSEL_DESTINATION_ROOTS = [str(tmp_path / "root")]
    return tmp_path / "root"


def swap_for_link(directory, to):
    """What a user can do between submission and delivery: a directory replaced by a link."""
    directory.rename(directory.with_name(directory.name + ".old"))
    directory.symlink_to(to, target_is_directory=True)


@pytest.mark.parametrize("swapped", ["out", "out/star"])
def test_a_link_planted_after_submission_fails_the_delivery_and_nothing_is_written_outside(
        copying, tmp_path, root, alice, now, swapped, django_capture_on_commit_callbacks):
    paths = ["/star/config", "/star/passwd"]
    (root / "alice" / "out" / "star").mkdir(parents=True)
    backend = deliver(tmp_path, alice, now, paths, root / "alice" / "out",
                      after_submission=lambda: swap_for_link(root / "alice" / swapped, tmp_path / "outside"))
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    assert list((tmp_path / "outside").rglob("*")) == []
    for request in RestoreRequest.objects.all():
        assert (request.state, request.error_class) == ("failed", "user")
        assert "symbolic link" in request.last_error and str(root / "alice" / swapped) in request.last_error


def test_a_link_planted_as_the_worker_makes_a_directory_is_not_followed(
        copying, tmp_path, root, alice, now, monkeypatch, django_capture_on_commit_callbacks):
    """The race a check before writing cannot win: the directory is missing when looked for
    and a link to outside the root by the time the worker makes it."""
    backend = deliver(tmp_path, alice, now, ["/star/config"], root / "alice" / "out")
    real_mkdir = os.mkdir

    def planted(name, mode=0o777, *, dir_fd=None):
        os.symlink(tmp_path / "outside", name, dir_fd=dir_fd)
        real_mkdir(name, mode, dir_fd=dir_fd)  # the worker's own mkdir: the name is taken

    monkeypatch.setattr(os, "mkdir", planted)
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    monkeypatch.undo()
    assert list((tmp_path / "outside").rglob("*")) == []
    request = RestoreRequest.objects.get()
    assert (request.state, request.error_class) == ("failed", "user") and "symbolic link" in request.last_error


def test_a_link_at_the_file_itself_is_replaced_not_followed(copying, tmp_path, root, alice, now,
                                                            django_capture_on_commit_callbacks):
    victim = tmp_path / "outside" / "config"
    victim.write_bytes(b"site config")
    (root / "alice" / "star").mkdir()
    (root / "alice" / "star" / "config").symlink_to(victim)
    backend = deliver(tmp_path, alice, now, ["/star/config"], root / "alice")
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    assert RestoreRequest.objects.get().state == "done"
    assert victim.read_bytes() == b"site config"
    delivered = root / "alice" / "star" / "config"
    assert not delivered.is_symlink() and delivered.read_bytes() == b"contents of /star/config"


def test_a_root_withdrawn_before_delivery_fails_it_as_a_user_error(copying, settings, tmp_path, root, alice, now,
                                                                   django_capture_on_commit_callbacks):
    """The worker finds the root again for the user; it does not trust the stored string."""
    backend = deliver(tmp_path, alice, now, ["/star/a"], root / "alice")
    settings.CAROUSEL_DESTINATION_ROOTS = [str(tmp_path / "elsewhere")]
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    request = RestoreRequest.objects.get()
    assert (request.state, request.error_class) == ("failed", "user")
    assert "no longer under a destination root" in request.last_error
    assert not (root / "alice" / "star").exists()


# The site's command.

@pytest.fixture
def command(settings, tmp_path):
    """A site command that records each call's arguments and exits 0."""
    record = tmp_path / "calls"
    script = tmp_path / "deliver.py"
    script.write_text(f"import json, sys\nopen({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    settings.CAROUSEL_DELIVERY = "command"
    settings.CAROUSEL_DELIVERY_OPTIONS = {"command": [sys.executable, str(script)]}
    return lambda: [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_the_command_gets_each_files_resolved_place(command, tmp_path, root, alice, now,
                                                    django_capture_on_commit_callbacks):
    """A link inside the root is resolved at submission; the command then gets each file's own
    place under the destination, not the destination."""
    (root / "alice" / "run5").mkdir()
    (root / "alice" / "current").symlink_to(root / "alice" / "run5", target_is_directory=True)
    paths = ["/star/a.root", "/star/b.root"]
    backend = deliver(tmp_path, alice, now, paths, root / "alice" / "current" / "out")
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"done"}
    disk = tmp_path / "stager-disk"
    assert sorted(call[-2:] for call in command()) == [
        [str(disk / "f0"), str(root / "alice" / "run5" / "out" / "star" / "a.root")],
        [str(disk / "f1"), str(root / "alice" / "run5" / "out" / "star" / "b.root")]]


def test_the_command_is_not_run_through_a_link_planted_after_submission(command, tmp_path, root, alice, now,
                                                                       django_capture_on_commit_callbacks):
    (root / "alice" / "out").mkdir()
    backend = deliver(tmp_path, alice, now, ["/star/a.root"], root / "alice" / "out",
                      after_submission=lambda: swap_for_link(root / "alice" / "out", tmp_path / "outside"))
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(now=now + timedelta(seconds=10), stager=backend)
    request = RestoreRequest.objects.get()
    assert (request.state, request.error_class) == ("failed", "user") and "symbolic link" in request.last_error
    assert command() == []


def test_a_name_the_file_system_cannot_encode_is_a_user_error(tmp_path):
    from carousel.loop.delivery import DeliveryError, LocalCopy

    source = tmp_path / "staged"
    source.write_bytes(b"restored")
    with pytest.raises(DeliveryError) as refused:
        LocalCopy().deliver(str(source), f"{tmp_path}/out/a\ud800", root=str(tmp_path))
    assert refused.value.user_error and list((tmp_path / "out").iterdir()) == []
