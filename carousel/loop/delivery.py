"""Delivery: once a file is on the stager's disk, put it where the user asked. Plugins named
in settings (CAROUSEL_DELIVERIES), like the stagers. The loop throttles deliveries per
destination file system (Control.deliveries_per_fs), as the DataCarousel did, so that many
restores finishing together don't overload a central file system."""
import errno
import os
import subprocess
from datetime import timedelta
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db.models import Count, F

from carousel.infra import nofollow, plugins, queue
from carousel.domain.authz import destination_root
from carousel.domain.paths import delivery_target
from carousel.loop.failures import Failure, FailureCount, fail_requests
from carousel.models import Control, ErrorClass, RequestState as S, RestoreRequest
from carousel.domain.services import request_transition


class DeliveryError(Exception):
    """A delivery failed. `user_error`: the destination is wrong or full (the user must act);
    otherwise the failure is retried on the retry cycle as its own class."""

    def __init__(self, message, *, user_error=False):
        super().__init__(message)
        self.user_error = user_error


class Delivery:
    # False: files are used where the stager put them, and requests are done once staged.
    moves_files = True

    def filesystem(self, destination):
        """A key naming the file system `destination` is on; deliveries are throttled per key."""
        raise NotImplementedError

    def deliver(self, source, target, *, root):
        """Put the staged file `source` at `target`, its own file under its submission's
        destination directory; raise DeliveryError on failure. `root`: the destination root
        `target` lies under, read again by the worker from the settings and the user's groups:
        nothing may be written outside it, and no symbolic link below it may be followed
        (carousel/infra/nofollow.py does both)."""
        raise NotImplementedError


class InPlace(Delivery):
    """No delivery: the file is used where the stager staged it."""

    moves_files = False

    def filesystem(self, destination):
        return ""

    def deliver(self, source, target, *, root):
        pass


def _existing_parent(path):
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _refused_link(target, exc):
    return DeliveryError(f"cannot write {target}: {exc.filename} is a symbolic link, and deliveries never follow "
                         "links below the destination root", user_error=True)


class LocalCopy(Delivery):
    """Copy to a path on a file system this worker mounts: each directory below the root opened
    without following links, the copy written to a new temporary file and renamed, so a reader
    never sees half a file and nothing lands outside the root."""

    def filesystem(self, destination):
        return f"dev:{os.stat(_existing_parent(destination)).st_dev}"

    def deliver(self, source, target, *, root):
        try:
            nofollow.copy_below(source, root, target)
        except nofollow.LinkBelowRoot as exc:
            raise _refused_link(target, exc) from exc
        except FileNotFoundError as exc:
            if exc.filename == source:
                raise DeliveryError(f"staged copy missing: {exc}") from exc
            # The root itself (the operator's to fix), or a directory removed as it was made: retried.
            raise DeliveryError(f"cannot write {target}: {exc.strerror}: {exc.filename}") from exc
        except (PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
            raise DeliveryError(f"cannot write {target}: {exc.strerror}", user_error=True) from exc
        except ValueError as exc:  # a name the file system cannot encode
            raise DeliveryError(f"cannot write {target!r}: {exc}", user_error=True) from exc
        except OSError as exc:
            # ENOSPC, EDQUOT: the user's space is full; ENAMETOOLONG: the name. Retrying will not help.
            user_error = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG)
            raise DeliveryError(f"copying to {target} failed: {exc.strerror}", user_error=user_error) from exc


class SiteCommand(Delivery):
    """A site's program: `<command...> -- SOURCE TARGET`, both absolute paths, TARGET the file's
    own place under its destination directory, checked first (no symbolic link below the root
    among what exists of it); the `--` ends the options, so no path can be read as one. Exit 0:
    delivered; exit 2: the destination is refused (a user error, not retried); anything else: a
    delivery failure, retried on the retry cycle. The program writes as it likes: it must not
    follow links itself. The file system key is the destination's first two path components
    (/gpfs/star) unless the site names a `filesystem_depth`."""

    def __init__(self, command, timeout_s=3600, filesystem_depth=2):
        self.command = command.split() if isinstance(command, str) else list(command)
        self.timeout_s = timeout_s
        self.depth = filesystem_depth

    def filesystem(self, destination):
        return "/" + "/".join(Path(destination).parts[1:1 + self.depth])

    def deliver(self, source, target, *, root=None):
        if root is not None:
            try:
                nofollow.check_below(root, target)
            except nofollow.LinkBelowRoot as exc:
                raise _refused_link(target, exc) from exc
            except NotADirectoryError as exc:
                raise DeliveryError(f"cannot write {target}: {exc.strerror}", user_error=True) from exc
            except OSError:
                pass  # what this worker cannot see, the program judges
        try:
            done = subprocess.run([*self.command, "--", source, target], capture_output=True, text=True,
                                  timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DeliveryError(f"delivery command failed: {exc}") from exc
        if done.returncode:
            detail = (done.stderr or done.stdout).strip()[-500:]
            raise DeliveryError(f"delivery command exited {done.returncode}: {detail}",
                                user_error=done.returncode == 2)


# Longer than any copy may take (the site command's own timeout is an hour): a delivery still
# marked started after this lost its worker and is started again.
DELIVERY_LEASE_S = 6 * 3600


def delivering():
    """The requests staged and waiting to be, or being, delivered."""
    return RestoreRequest.objects.filter(state=S.DELIVERING)


def dispatch_deliveries(*, now, control):
    """Start deliveries of staged files, at most `deliveries_per_fs` at once per destination
    file system; each batch runs in a worker task. A delivery started longer ago than its lease
    (its worker died) is started again."""
    # Run by the cycle only when some file is delivering (carousel/loop/due.py).
    waiting = delivering()
    waiting.filter(delivery_started_at__lt=now - timedelta(seconds=DELIVERY_LEASE_S)).update(
        delivery_started_at=None)
    running = dict(waiting.filter(delivery_started_at__isnull=False).order_by().values_list("delivery_fs")
                   .annotate(n=Count("id")).values_list("delivery_fs", "n"))
    started = []
    for fs in waiting.filter(delivery_started_at__isnull=True).order_by().values_list(
            "delivery_fs", flat=True).distinct():
        room = control.deliveries_per_fs - running.get(fs, 0)
        if room <= 0:
            continue
        ids = list(waiting.filter(delivery_fs=fs, delivery_started_at__isnull=True).order_by("id")
                   .values_list("id", flat=True)[:room])
        waiting.filter(id__in=ids, delivery_started_at__isnull=True).update(delivery_started_at=now)
        started.extend(ids)
    if started:
        # A broker that refuses the task (a Redis blip) must not leave these files marked started
        # until the lease runs out: they are unmarked, and the next cycle dispatches them again.
        queue.send_on_commit("carousel.tasks.deliver", started, refused=lambda: RestoreRequest.objects.filter(
            id__in=started, state=S.DELIVERING, delivery_started_at=now).update(delivery_started_at=None))
    return len(started)


def deliver_requests(ids, *, now, control=None):
    """Deliver these staged requests (a worker task): each file to its own place under its
    destination directory, below the root the worker finds for its user now; done, or failed
    with class DELIVERY (retried on the retry cycle) or USER (a destination the user must fix)."""
    control = control or Control.get()
    delivery = plugins.delivery()
    report = FailureCount()
    rows = list(RestoreRequest.objects.filter(id__in=ids, state=S.DELIVERING).values_list(
        "id", "user_id", "path", "staged_path", "destination", "destination_layout"))
    users = get_user_model().objects.in_bulk({row[1] for row in rows})
    for rid, user_id, path, source, destination, layout in rows:
        one = RestoreRequest.objects.filter(id=rid)
        one.update(delivery_attempts=F("delivery_attempts") + 1)
        target = delivery_target(destination, layout, path)
        root = destination_root(user=users.get(user_id), path=target)
        try:
            if root is None:
                raise DeliveryError(f"{target[:200]} is no longer under a destination root you may deliver to",
                                    user_error=True)
            delivery.deliver(source, target, root=root)
        except DeliveryError as exc:
            status_class = ErrorClass.USER if exc.user_error else ErrorClass.DELIVERY
            fail_requests(one, Failure(str(exc), status_class), now=now, control=control, report=report)
            continue
        request_transition(one, S.DONE, now=now)
    return report
