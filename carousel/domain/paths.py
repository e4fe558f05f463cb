"""Validation of submitted paths: a pure function, so the API, the web form and later front
doors all refuse the same things with the same words."""
import re
from dataclasses import dataclass

_SLASHES = re.compile(r"/{2,}")
# Control characters, C0 and C1, and the Unicode line and paragraph separators: every
# character str.splitlines() breaks a line at is among them, so the one-path-a-line lists (the
# form, `carousel submit --from-file`, the restored.txt download) always hold a path a line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# A path check_path accepts as it is: absolute, components neither empty, '.' nor '..', no
# control character. One match instead of the checks one by one (100,000 paths a submission).
_PLAIN = re.compile(r"(?:/(?!\.\.?(?:/|$))[^/\x00-\x1f\x7f-\x9f\u2028\u2029]+)+")


@dataclass(frozen=True)
class PathError:
    index: int  # 0-based position in the submitted list
    path: str
    message: str

    def as_dict(self):
        # Line numbers help people who pasted a list; index helps programs.
        return {"index": self.index, "line": self.index + 1, "path": self.path[:200], "message": self.message}


def json_kind(value):
    """What a decoded JSON value is, in JSON's words (a Python type name, "NoneType", meant
    nothing to a client that sent null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    return {list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def check_path(path, *, max_bytes):
    """Return (normalised path, None) or (None, message)."""
    if isinstance(path, str) and _PLAIN.fullmatch(path) and (
            4 * len(path) <= max_bytes or len(path.encode("utf-8", "surrogatepass")) <= max_bytes):
        return path, None
    if not isinstance(path, str):
        return None, f"expected a string, got {json_kind(path)}"
    if path == "":
        return None, "empty path"
    if "\x00" in path:
        return None, "contains a NUL byte"
    if _CONTROL.search(path):
        return None, "contains a control character or a line break (newline, tab, U+0085, U+2028, ...)"
    if not path.startswith("/"):
        return None, "not an absolute path: it must start with '/'"
    if len(path.encode("utf-8", "surrogatepass")) > max_bytes:
        return None, f"longer than {max_bytes} bytes"
    # Duplicate slashes name the same file; collapse them as tape endpoints do.
    path = _SLASHES.sub("/", path)
    parts = path.split("/")
    if ".." in parts:
        return None, "contains a '..' component"
    if "." in parts[1:]:
        return None, "contains a '.' component"
    if path.endswith("/"):
        return None, "ends with '/': a restore names a file, not a directory"
    return path, None


def check_place(path, *, max_bytes):
    """As check_path, for a path naming a place (a destination, a granted prefix): a trailing
    '/' is allowed and dropped, and '/' itself is a place."""
    trimmed = path.rstrip("/") if isinstance(path, str) else path
    if trimmed == "" and path:
        return "/", None
    return check_path(trimmed, max_bytes=max_bytes)


def check_destination(destination, *, max_bytes):
    """Return (normalised destination, None) or (None, message). Empty: no destination (the
    file is used where the stager puts it). Otherwise an absolute, normalised path with no
    control character: it can never be read as an option, and names no place through '..'."""
    if destination == "":
        return "", None
    return check_place(destination, max_bytes=max_bytes)


def delivery_target(destination, layout, path):
    """The file a request for `path` is delivered to: under the directory `destination`, by the
    file's whole path (layout "path": /dest/star/run1/a.root) or by its name ("name": /dest/a.root)."""
    name = path.rsplit("/", 1)[1] if layout == "name" else path.lstrip("/")
    return f"{destination.rstrip('/')}/{name}"


def target_collisions(paths, *, destination, layout):
    """[PathError] for the paths of one submission (normalised, distinct) whose delivery would
    meet another's: the same file as an earlier one (files delivered by their name), or a file
    where another needs a directory (layout "path": /x/a and /x/a/b; by name, a file named as a
    directory the destination holds cannot arise, but it is checked alike). Each names the other."""
    if not destination:
        return []
    first = {}
    targets = []
    errors = []
    for index, path in enumerate(paths):
        target = delivery_target(destination, layout, path)
        targets.append(target)
        if target in first:
            errors.append(PathError(index, path, f"delivered to {target[:200]}, as {paths[first[target]][:200]} "
                                                 "is: two files of one submission may not share a name"))
        else:
            first[target] = index
    # A target that is a parent directory of another: one set look-up per component.
    for index, target in enumerate(targets):
        end = target.find("/", 1)
        while end > 0:
            parent = first.get(target[:end])
            if parent is not None:
                errors.append(PathError(index, paths[index], f"delivered to {target[:200]}, under "
                                        f"{targets[parent][:200]} where {paths[parent][:200]} is delivered: a file "
                                        "of one submission may not be where another needs a directory"))
                break
            end = target.find("/", end + 1)
    return sorted(errors, key=lambda e: e.index)


def under_any(path, prefixes):
    """Whether `path` is one of the set `prefixes` (normalised places) or inside one, by whole
    components (/data/al is not under /data/a): one set look-up per component of the path,
    however many prefixes there are."""
    if "/" in prefixes or path in prefixes:
        return True
    end = path.find("/", 1)
    while end > 0:
        if path[:end] in prefixes:
            return True
        end = path.find("/", end + 1)
    return False


def validate_paths(paths, *, max_count, max_bytes):
    """Check a whole submission. Returns (unique normalised paths in first-seen order, errors).
    The caller stores nothing unless errors is empty."""
    if not isinstance(paths, list):
        return [], [PathError(-1, "", "expected a list of paths")]
    if not paths:
        return [], [PathError(-1, "", "the list of paths is empty")]
    if len(paths) > max_count:
        return [], [PathError(-1, "", f"{len(paths)} paths in one submission; the limit is {max_count}: "
                                      "split it into several submissions")]
    seen = {}
    errors = []
    for index, raw in enumerate(paths):
        path, message = check_path(raw, max_bytes=max_bytes)
        if message:
            errors.append(PathError(index, raw if isinstance(raw, str) else repr(raw), message))
        elif path not in seen:
            seen[path] = None
    return list(seen), errors
