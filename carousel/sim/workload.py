"""Workloads in the format `carousel-workload/1` (workloads/README.md): a tape library, the
requested files on its tapes, and the restore requests in time. load() reads a .json or
.json.gz file and checks it whole; a malformed one raises WorkloadError naming the key and
what is wrong with it, so a person can fix the file."""
import gzip
import json
from dataclasses import dataclass
from numbers import Real

from carousel.domain.paths import check_path
from carousel.sim.library import DEFAULT_EXCHANGE_S, DEFAULT_ROBOTS, File
from carousel.tape import MEDIA

FORMAT = "carousel-workload/1"


class WorkloadError(ValueError):
    pass


@dataclass(frozen=True)
class User:
    name: str
    group: str | None
    cap: int | None


@dataclass(frozen=True)
class Request:
    t: float
    user: str
    path: str
    activity: str = ""  # the activity the submission names ("": none)


@dataclass(frozen=True)
class Activity:
    name: str
    group: str | None  # None: every group's
    priority: int
    weight: float


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    drives: dict  # technology -> count
    read_rate_mb_s: float | None
    robots: int
    exchange_s: float
    groups: dict  # name -> weight
    users: dict  # name -> User
    tape_media: dict  # label -> technology
    files: dict  # path -> library.File
    requests: tuple  # Requests by arrival time (ties: file order)
    activities: tuple = ()  # Activity rows of the site's table (optional)

    def requested_files(self):
        """The distinct requested files, per tape label."""
        per_tape = {}
        for path in dict.fromkeys(r.path for r in self.requests):
            file = self.files[path]
            per_tape.setdefault(file.tape, []).append(file)
        return per_tape


def load(path):
    path = str(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, EOFError) as exc:
        raise WorkloadError(f"{path}: cannot read it: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: not JSON: {exc}") from exc
    return parse(data)


def _need(condition, key, problem):
    if not condition:
        raise WorkloadError(f"{key}: {problem}")


# The control row's bound on drives (carousel/models.py CONTROL_BOUNDS; tests/test_replay.py checks
# they agree). Not imported: this module is read without Django set up (benchmarks/replay.py).
MAX_DRIVES = 1000
# The doors' default longest path (settings.CAROUSEL_MAX_PATH_BYTES), for the same reason.
MAX_PATH_BYTES = 4096


def _number(value, key, *, positive=False, integer=False):
    _need(isinstance(value, Real) and not isinstance(value, bool), key, f"expected a number, got {value!r}")
    _need(value == value and abs(value) != float("inf"), key, f"expected a finite number, got {value!r}")
    if integer:
        _need(float(value).is_integer(), key, f"expected a whole number, got {value!r}")
        value = int(value)
    _need(value > 0 if positive else value >= 0, key,
          f"must be {'greater than 0' if positive else 'at least 0'}, got {value!r}")
    return value


def _object(value, key):
    _need(isinstance(value, dict), key, f"expected an object, got {type(value).__name__}")
    return value


def _list(value, key):
    _need(isinstance(value, list), key, f"expected a list, got {type(value).__name__}")
    return value


def _text(value, key):
    _need(isinstance(value, str) and value != "", key, f"expected a non-empty string, got {value!r}")
    return value


def parse(data):
    """Check a workload given as plain JSON data; return a Workload."""
    _object(data, "(top level)")
    _need(data.get("format") == FORMAT, "format", f"expected {FORMAT!r}, got {data.get('format')!r}")
    for key in ("name", "library", "tapes", "requests"):
        _need(key in data, key, "missing")
    name = _text(data["name"], "name")
    library = _object(data["library"], "library")
    _need("drives" in library, "library.drives", "missing")
    drives = {}
    for media, count in _object(library["drives"], "library.drives").items():
        _need(media in MEDIA, f"library.drives.{media}", f"unknown technology; known: {', '.join(MEDIA)}")
        drives[media] = _number(count, f"library.drives.{media}", integer=True)
        # The control row's bound on drives: a million made the replay run for ever.
        _need(drives[media] <= MAX_DRIVES, f"library.drives.{media}", f"at most {MAX_DRIVES}, got {drives[media]}")
    _need(sum(drives.values()) > 0, "library.drives", "no drives")
    rate = library.get("read_rate_mb_s")
    rate = None if rate is None else _number(rate, "library.read_rate_mb_s", positive=True)
    # Tape drives read tens to hundreds of MB/s: 1e-300 overflowed the library's arithmetic.
    _need(rate is None or 0.001 <= rate <= 1e6, "library.read_rate_mb_s", f"must lie in 0.001..1e6 MB/s, got {rate!r}")
    robots = _number(library.get("robots", DEFAULT_ROBOTS), "library.robots", positive=True, integer=True)
    exchange_s = _number(library.get("exchange_s", DEFAULT_EXCHANGE_S), "library.exchange_s")

    groups = {}
    for group, spec in _object(data.get("groups", {}), "groups").items():
        _object(spec, f"groups.{group}")
        groups[group] = _number(spec.get("weight", 1), f"groups.{group}.weight", positive=True)
    users = {}
    for user, spec in _object(data.get("users", {}), "users").items():
        _object(spec, f"users.{user}")
        group = spec.get("group")
        _need(group is None or group in groups, f"users.{user}.group", f"{group!r} is not in groups")
        cap = spec.get("cap")
        cap = None if cap is None else _number(cap, f"users.{user}.cap", positive=True, integer=True)
        users[user] = User(user, group, cap)

    tape_media, files = {}, {}
    for i, tape in enumerate(_list(data["tapes"], "tapes")):
        key = f"tapes[{i}]"
        _object(tape, key)
        label = _text(tape.get("label"), f"{key}.label")
        _need(label not in tape_media, f"{key}.label", f"{label!r} appears twice")
        media = tape.get("media")
        _need(media in MEDIA, f"{key}.media", f"{media!r} is not a known technology; known: {', '.join(MEDIA)}")
        _need(media in drives, f"{key}.media", f"no drive reads {media} (library.drives has {', '.join(drives)})")
        used = _number(tape.get("used_bytes", MEDIA[media].capacity_bytes), f"{key}.used_bytes", integer=True)
        tape_media[label] = media
        for j, entry in enumerate(_list(tape.get("files", []), f"{key}.files")):
            fkey = f"{key}.files[{j}]"
            _need(isinstance(entry, list) and len(entry) == 3, fkey,
                  f"expected [path, size_bytes, offset_bytes], got {entry!r}")
            path = _text(entry[0], f"{fkey}[0] (path)")
            # As every door checks a path (a line break passed here, and the replay's submission
            # then failed without naming it).
            normal, problem = check_path(path, max_bytes=MAX_PATH_BYTES)
            _need(problem is None and normal == path, f"{fkey}[0] (path)",
                  f"{path[:200]!r}: {problem or 'not normalised (as ' + repr(normal) + ')'}")
            size = _number(entry[1], f"{fkey}[1] (size_bytes)", integer=True)
            offset = _number(entry[2], f"{fkey}[2] (offset_bytes)", integer=True)
            _need(offset + size <= used, fkey, f"ends at byte {offset + size}, past the tape's used_bytes {used}")
            _need(path not in files, f"{fkey}[0] (path)",
                  f"{path!r} is also on tape {files.get(path, File('', '', '', 0, 0)).tape}: a path lies on one tape")
            files[path] = File(path, label, media, offset, size)

    activities = []
    for i, spec in enumerate(_list(data.get("activities", []), "activities")):
        key = f"activities[{i}]"
        _object(spec, key)
        group = spec.get("group")
        _need(group is None or group in groups, f"{key}.group", f"{group!r} is not in groups")
        priority = _number(spec.get("priority", 0), f"{key}.priority", integer=True)
        _need(0 <= priority <= 3, f"{key}.priority", "expected 0 to 3")
        activities.append(Activity(_text(spec.get("name"), f"{key}.name"), group, priority,
                                   float(_number(spec.get("weight", 1), f"{key}.weight", positive=True))))
    requests = []
    for i, entry in enumerate(_list(data["requests"], "requests")):
        key = f"requests[{i}]"
        _object(entry, key)
        for part in ("t", "user", "path"):
            _need(part in entry, f"{key}.{part}", "missing")
        t = _number(entry["t"], f"{key}.t")
        _need(entry["user"] in users, f"{key}.user", f"{entry['user']!r} is not in users")
        _need(entry["path"] in files, f"{key}.path", f"{entry['path']!r} is on no tape in tapes")
        activity = entry.get("activity", "")
        _need(isinstance(activity, str), f"{key}.activity", "expected a name (text)")
        requests.append(Request(float(t), entry["user"], entry["path"], activity))
    _need(requests, "requests", "empty: nothing to replay")
    requests.sort(key=lambda r: r.t)  # stable: ties keep the file's order
    return Workload(name=name, description=str(data.get("description", "")), drives=drives, read_rate_mb_s=rate,
                    robots=robots, exchange_s=float(exchange_s), groups=groups, users=users,
                    tape_media=tape_media, files=files, requests=tuple(requests), activities=tuple(activities))
