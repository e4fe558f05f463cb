"""Writing below a trusted directory without following symbolic links.

A user names where restored files go and the worker writes there with its own rights. A check
of the path as a string cannot hold: a component may be a link to /etc, or be swapped for one
between the check and the write. So each component below the root is opened relative to the
one before it (openat) with O_NOFOLLOW, directories are made relative to their parent, and the
file is created with O_EXCL under a temporary name in the last directory opened, then renamed
there: whatever the tree looks like meanwhile, nothing is written outside the root. The root
itself is the operator's and is opened as it is named."""
import errno
import os
import shutil
import stat
import uuid
from contextlib import contextmanager, suppress

_BELOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkBelowRoot(OSError):
    """A component below the root is a symbolic link: it is not followed."""

    def __init__(self, path):
        super().__init__(errno.ELOOP, "a symbolic link below the destination root, not followed", path)


def _is_link(name, parent):
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_directory(name, parent, shown, *, create):
    """The directory `name` in the open directory `parent`, made if missing and `create`."""
    if name in ("", ".", "..") or "/" in name:
        raise ValueError(f"{name!r} is not a single path component")
    try:
        return os.open(name, _BELOW, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except NotADirectoryError:
        # O_NOFOLLOW with O_DIRECTORY answers ENOTDIR for a link too: say which it is.
        if _is_link(name, parent):
            raise LinkBelowRoot(shown) from None
        raise
    try:
        os.mkdir(name, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile (another delivery, or a link planted): opened as any other below
    return _open_directory(name, parent, shown, create=False)


def open_below(root, parts, *, create):
    """A descriptor of the directory root/parts..., each part opened without following links;
    `create`: missing directories are made. Raises LinkBelowRoot for a link, FileNotFoundError
    for a missing part (create False), NotADirectoryError for a part that is a file."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    shown = root.rstrip("/")
    try:
        for part in parts:
            shown = f"{shown}/{part}"
            below = _open_directory(part, fd, shown, create=create)
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def relative_parts(root, path):
    """The components of `path` below `root` (the caller has checked that it is under it)."""
    return [p for p in path[len(root.rstrip("/")):].split("/") if p]


@contextmanager
def parent_below(root, path):
    """(descriptor of the directory `path` goes in, its name there), the directories below
    `root` opened without following links and made if missing; closed on leaving. A delivery
    makes its file with dir_fd=the descriptor (os.open, os.symlink, os.rename...)."""
    *parents, name = relative_parts(root, path)
    directory = open_below(root, parents, create=True)
    try:
        yield directory, name
    finally:
        os.close(directory)


def copy_below(source, root, path):
    """Copy the file `source` to `path`, below the directory `root`, without following a link
    below the root: the copy is written to a new temporary file and renamed over `path` (a
    link there is replaced, not followed), so a reader never sees half a file."""
    with open(source, "rb") as src, parent_below(root, path) as (directory, name):
        temporary = f".carousel-{uuid.uuid4().hex}.part"
        try:
            with open(os.open(temporary, _NEW_FILE, 0o666, dir_fd=directory), "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=directory)
            raise


def check_below(root, path):
    """Raise LinkBelowRoot if a component of `path` below `root` that exists now is a symbolic
    link (the file itself included), NotADirectoryError if a parent is a file: for a program
    that writes `path` itself, which this process cannot make safe, only check beforehand."""
    *parents, name = relative_parts(root, path)
    try:
        directory = open_below(root, parents, create=False)
    except FileNotFoundError:
        return  # the components before the missing one are checked; the program makes the rest
    try:
        if _is_link(name, directory):
            raise LinkBelowRoot(path)
    finally:
        os.close(directory)
