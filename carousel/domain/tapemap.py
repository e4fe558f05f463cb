"""A site's tape map: which tape holds each file, for backends that do not say (Tape REST never
does). `manage.py load-tape-map FILE` reads it (docs/tape-map.md); the locating step reads it
(carousel/loop/locating.py).

A load is one transaction: every line is checked, and one bad line stores nothing (the error
names its line). Lines are upserted by path (a line for a mapped file replaces it: the file was
repacked), so a load may be repeated or carry only what changed; the locations recorded for
mapped files are dropped, so their next requests are located again, through the map. PostgreSQL gets the lines by
COPY into a temporary table, then one INSERT ... ON CONFLICT; SQLite in batches."""
import csv
import io
import json
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max

from carousel.domain.paths import check_path, json_kind
from carousel.infra.db import is_postgres
from carousel.models import FileLocation, TapeMapEntry, path_keys
from carousel.tape import MEDIA

FORMATS = ("csv", "jsonl", "cta", "dcache")
COLUMNS = ("path", "tape", "media", "position", "size")
MAX_TAPE = TapeMapEntry._meta.get_field("tape").max_length
ERRORS_SHOWN = 20
SQLITE_BATCH = 5000
MAX_BIGINT = (1 << 63) - 1


class TapeMapError(ValueError):
    """A map that cannot be loaded: `errors` holds (line number, message) pairs, the first
    ERRORS_SHOWN of `count`."""

    def __init__(self, errors, count):
        self.errors, self.count = errors, count
        shown = "\n".join(f"line {line}: {message}" for line, message in errors)
        more = f"\n... and {count - len(errors)} more" if count > len(errors) else ""
        super().__init__(f"{count} bad line{'s' if count != 1 else ''}; nothing was stored:\n{shown}{more}")


@dataclass(frozen=True)
class MapLine:
    path: str
    tape: str
    media: str = ""
    position: int | None = None
    size: int | None = None


@dataclass(frozen=True)
class LoadResult:
    lines: int  # map lines read (blank lines and converters' skipped lines not counted)
    files: int  # distinct files stored (new or replaced)
    skipped: int = 0  # lines a converter found without a tape (dcache: a URI naming none)


class _Bad(Exception):
    pass


def _count(value, name, unit=" of bytes"):
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _Bad(f"{name} must be a whole number{unit}, not {json_kind(value)[:60]}")
    if isinstance(value, str):
        # ASCII digits only: \d and int() took "１２" (fullwidth) as 12.
        if not re.fullmatch(r"\s*[0-9]+\s*", value):
            raise _Bad(f"{name} must be a whole number{unit}, not {value!r:.60}")
        value = int(value)
    if not 0 <= value <= MAX_BIGINT:
        raise _Bad(f"{name} must lie in 0..{MAX_BIGINT}, not {value}")
    return value


def checked(path, tape, media="", position=None, size=None):
    """A MapLine from raw fields; raises _Bad saying what is wrong."""
    normal, problem = check_path(path, max_bytes=settings.CAROUSEL_MAX_PATH_BYTES)
    if problem:
        raise _Bad(f"path {str(path)[:200]!r}: {problem}")
    if tape is not None and not isinstance(tape, str):
        raise _Bad(f"tape must be a string, not {json_kind(tape)[:60]}")  # not "missing": it was there
    if tape is None or not tape.strip():
        raise _Bad("tape is missing or empty")
    tape = tape.strip()
    if len(tape) > MAX_TAPE or any(not ch.isprintable() for ch in tape):
        raise _Bad(f"tape {tape[:80]!r}: at most {MAX_TAPE} printable characters")
    media = (media or "").strip() if isinstance(media, str) else media
    if media and media not in MEDIA:
        raise _Bad(f"media {str(media)[:40]!r} is not a known technology ({', '.join(MEDIA)}), nor empty")
    return MapLine(normal, tape, media or "", _count(position, "position"), _count(size, "size"))


# Readers: (line number, MapLine | error message | None for a line skipped) per line ------------

def read_csv(stream):
    """CSV with a header row naming its columns (path and tape required; media, position, size
    optional; others ignored), in any order."""
    reader = csv.reader(stream)
    header = None
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # a field past csv's limit (131,072 characters), a NUL, ...
            yield reader.line_num, f"not CSV: {exc}"
            return
        if not row or all(not cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip().lower() for cell in row]
            missing = [c for c in ("path", "tape") if c not in header]
            if missing:
                yield reader.line_num, (f"the first line must name the columns (path,tape[,media,position,size]); "
                                        f"{' and '.join(missing)} missing from {row!r:.200}")
                return
            twice = sorted({c for c in COLUMNS if header.count(c) > 1})
            if twice:
                yield reader.line_num, f"the header names {', '.join(twice)} more than once"
                return
            index = {c: header.index(c) for c in COLUMNS if c in header}
            continue
        if len(row) != len(header):
            yield reader.line_num, f"{len(row)} fields where the header names {len(header)}"
            continue
        try:
            yield reader.line_num, checked(**{c: row[i] for c, i in index.items()})
        except _Bad as exc:
            yield reader.line_num, str(exc)


def read_jsonl(stream):
    """One JSON object per line: {"path", "tape", "media"?, "position"?, "size"?}."""
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, f"not JSON ({exc.msg} at column {exc.colno})"
            continue
        except RecursionError:
            yield number, "not a map line: JSON nested too deeply"
            continue
        if not isinstance(obj, dict):
            yield number, f"expected a JSON object, not {type(obj).__name__}"
            continue
        try:
            yield number, checked(obj.get("path"), obj.get("tape"), obj.get("media") or "", obj.get("position"),
                                  obj.get("size"))
        except _Bad as exc:
            yield number, str(exc)


def read_cta(stream, media=""):
    """CTA's `cta-admin --json tapefile ls --vid V` (a JSON array, or one object per line): each
    item's `df.path`, `tf.vid`, `af.size`; a tape's files in `tf.fSeq` order (a file sequence
    number, not a byte offset: the map keeps the order, not a position)."""
    text = stream.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = list(enumerate(json.loads(text), 1))
        except json.JSONDecodeError as exc:
            yield exc.lineno, f"not JSON ({exc.msg} at column {exc.colno})"
            return
        except RecursionError:
            yield 1, "not a tapefile listing: JSON nested too deeply"
            return
    else:
        items = []
        for number, line in enumerate(io.StringIO(text), 1):
            if line.strip():
                try:
                    items.append((number, json.loads(line)))
                except json.JSONDecodeError as exc:
                    yield number, f"not JSON ({exc.msg} at column {exc.colno})"
                except RecursionError:
                    yield number, "not a tapefile ls item: JSON nested too deeply"
    lines = []
    for number, item in items:
        try:
            tf, df, af = (item.get(k) or {} for k in ("tf", "df", "af")) if isinstance(item, dict) else ({},) * 3
            if not tf:
                raise _Bad("not a tapefile ls item: no \"tf\" (tape file) object")
            line = checked(df.get("path"), tf.get("vid"), media, None, af.get("size"))
            order = _count(tf.get("fSeq"), "tf.fSeq", unit=" (a file sequence number)") or 0
        except (_Bad, AttributeError) as exc:
            yield number, str(exc) if isinstance(exc, _Bad) else "df, tf and af must be objects"
            continue
        lines.append((line.tape, order, number, line))
    for _, _, number, line in sorted(lines, key=lambda x: x[:3]):
        yield number, line


def read_dcache(stream, media=""):
    """dCache's namespace (Chimera) lists each file's tape copy as an HSM URI; a dump of it as
    tab-separated `path<TAB>uri` lines, e.g. from
    `SELECT inumber2path(inumber), ilocation FROM t_locationinfo WHERE itype = 0`. An Enstore URI
    (`enstore://enstore/?volume=V&location_cookie=0000_000000000_0002267&size=N...`) names the
    tape and the file's place on it (the cookie's last part, an order); an OSM or CTA URI names
    none (its HSM's own listing does: for CTA, --format cta): such lines are skipped, counted."""
    lines = []
    for number, raw in enumerate(stream, 1):
        if not raw.strip():
            continue
        path, tab, uri = raw.rstrip("\n").partition("\t")
        if not tab:
            yield number, "expected path<TAB>HSM URI"
            continue
        query = parse_qs(urlsplit(uri.strip()).query)
        volume = (query.get("volume") or [""])[0]
        if not volume:
            yield number, None
            continue
        try:
            line = checked(path, volume, media, None, (query.get("size") or [None])[0])
            cookie = (query.get("location_cookie") or [""])[0]
            order = int(cookie.rsplit("_", 1)[-1]) if re.fullmatch(r"[\d_]+", cookie) else 0
        except _Bad as exc:
            yield number, str(exc)
            continue
        lines.append((line.tape, order, number, line))
    for _, _, number, line in sorted(lines, key=lambda x: x[:3]):
        yield number, line


def reader(fmt, stream, *, media=""):
    if fmt == "csv":
        return read_csv(stream)
    if fmt == "jsonl":
        return read_jsonl(stream)
    if fmt == "cta":
        return read_cta(stream, media)
    if fmt == "dcache":
        return read_dcache(stream, media)
    raise ValueError(f"unknown tape map format {fmt!r}; known: {', '.join(FORMATS)}")


# The load ---------------------------------------------------------------------------------------

def tape_map_load(*, lines, now):
    """Store (upsert by path) the map lines `lines` ((line number, MapLine | error | None) as the
    readers give them), all or nothing: raises TapeMapError naming the bad lines. Lines later in
    the map come later in its order, after everything loaded before."""
    with transaction.atomic():
        base = (TapeMapEntry.objects.aggregate(m=Max("ordinal"))["m"] or 0) + 1
        if is_postgres():
            counts = _load_postgres(lines, base=base, now=now)
        else:
            counts = _load_batches(lines, base=base, now=now)
    return counts


class _Collect:
    def __init__(self):
        self.errors, self.count, self.lines, self.skipped = [], 0, 0, 0

    def rows(self, lines, base):
        """(ordinal, MapLine) of the good lines; the others are recorded."""
        for number, line in lines:
            if line is None:
                self.skipped += 1
                continue
            if isinstance(line, str):
                self.count += 1
                if len(self.errors) < ERRORS_SHOWN:
                    self.errors.append((number, line))
                continue
            self.lines += 1
            yield base + self.lines - 1, line

    def check(self):
        if self.count:
            raise TapeMapError(self.errors, self.count)


def _chunks(rows, size):
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _load_postgres(lines, *, base, now):
    seen = _Collect()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE carousel_tapemap_load (path text, path_key uuid, tape text, media text,"
                       " position bigint, size bigint, ordinal bigint) ON COMMIT DROP")
        with cursor.cursor.copy("COPY carousel_tapemap_load FROM STDIN") as copy:
            for chunk in _chunks(seen.rows(lines, base), SQLITE_BATCH):
                keys = path_keys([line.path for _, line in chunk])
                for (ordinal, line), key in zip(chunk, keys):
                    copy.write_row((line.path, key, line.tape, line.media, line.position, line.size, ordinal))
        seen.check()
        # The last line of a file wins within one load (ON CONFLICT may touch a row once).
        cursor.execute(
            "INSERT INTO carousel_tapemapentry (path, path_key, tape, media, position, size, ordinal, loaded_at) "
            "SELECT DISTINCT ON (path_key) path, path_key, tape, media, position, size, ordinal, %s "
            "FROM carousel_tapemap_load ORDER BY path_key, ordinal DESC "
            "ON CONFLICT (path_key) DO UPDATE SET path = EXCLUDED.path, tape = EXCLUDED.tape, media = EXCLUDED.media, "
            "position = EXCLUDED.position, size = EXCLUDED.size, ordinal = EXCLUDED.ordinal, "
            "loaded_at = EXCLUDED.loaded_at", [now])
        files = cursor.rowcount
        # What the stager said of these files before is located again, through the map.
        cursor.execute("DELETE FROM carousel_filelocation f USING carousel_tapemap_load l WHERE f.path_key = l.path_key")
        cursor.execute("DROP TABLE carousel_tapemap_load")
    return LoadResult(lines=seen.lines, files=files, skipped=seen.skipped)


def _load_batches(lines, *, base, now):
    seen = _Collect()
    files = set()
    for chunk in _chunks(seen.rows(lines, base), SQLITE_BATCH):
        keys = path_keys([line.path for _, line in chunk])
        latest = {key: (ordinal, line) for (ordinal, line), key in zip(chunk, keys)}
        files.update(latest)
        if seen.count:
            continue  # still read to the end, to report every bad line; nothing more is stored
        TapeMapEntry.objects.bulk_create(
            [TapeMapEntry(path=line.path, path_key=key, tape=line.tape, media=line.media, position=line.position,
                          size=line.size, ordinal=ordinal, loaded_at=now) for key, (ordinal, line) in latest.items()],
            update_conflicts=True, unique_fields=["path_key"],
            update_fields=["path", "tape", "media", "position", "size", "ordinal", "loaded_at"])
        FileLocation.objects.filter(path_key__in=list(latest)).delete()
    seen.check()
    return LoadResult(lines=seen.lines, files=len(files), skipped=seen.skipped)
