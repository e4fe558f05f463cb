import gzip
import io
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from carousel.domain.tapemap import FORMATS, TapeMapError, reader, tape_map_load
from carousel.tape import MEDIA


def _format_of(name, head):
    """The format a file's name says (.csv, .jsonl, .ndjson; a .gz after it), else its first
    character: `{` JSON lines, anything else CSV."""
    suffixes = [s.lower() for s in Path(name).suffixes if s.lower() != ".gz"]
    if suffixes and suffixes[-1] == ".csv":
        return "csv"
    if suffixes and suffixes[-1] in (".jsonl", ".ndjson"):
        return "jsonl"
    return "jsonl" if head.lstrip().startswith("{") else "csv"


class Command(BaseCommand):
    help = ("Load a site's map of files to tapes (CSV with a header, or JSON lines: path, tape, and where known "
            "media, position, size; docs/tape-map.md). Upserts by path: repeat it, or load only what changed. "
            "One bad line stores nothing.")

    def add_arguments(self, parser):
        parser.add_argument("file", help="the map (.csv, .jsonl, either .gz), or - for standard input")
        parser.add_argument("--format", choices=FORMATS,
                            help="csv, jsonl, or a tape system's own listing: cta (cta-admin --json tapefile ls), "
                                 "dcache (path<TAB>HSM URI from Chimera); default: by the name, else the content")
        parser.add_argument("--media", choices=sorted(MEDIA),
                            help="the technology of every tape of a cta or dcache listing (they do not say)")

    def handle(self, *args, file, format, media, **options):
        if media and format not in ("cta", "dcache"):
            raise CommandError("--media applies to the listings of --format cta or dcache; a map gives its own media")
        try:
            stream = self._open(file)
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc}") from exc
        with stream:
            try:
                head = stream.read(4096)
                fmt = format or _format_of(file, head)
                result = tape_map_load(lines=reader(fmt, _Rejoined(head, stream), media=media or ""),
                                       now=timezone.now())
            except TapeMapError as exc:
                raise CommandError(f"{file}: {exc}") from exc
            except (UnicodeDecodeError, EOFError, OSError, gzip.BadGzipFile) as exc:
                raise CommandError(f"{file}: cannot read it ({exc}); nothing was stored") from exc
        if not result.lines and not result.skipped:
            # An export that failed leaves an empty file: said, and not taken as success.
            raise CommandError(f"{file}: no map lines in it; nothing was loaded")
        skipped = f"; {result.skipped} lines named no tape and were skipped" if result.skipped else ""
        self.stdout.write(f"{file}: {result.lines} lines, {result.files} files mapped ({fmt}){skipped}")

    @staticmethod
    def _open(file):
        if file == "-":
            return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8-sig", newline="")
        # utf-8-sig: a byte-order mark first (Excel's "CSV UTF-8") is not part of the header.
        if file.endswith(".gz"):
            return gzip.open(file, "rt", encoding="utf-8-sig", newline="")
        return open(file, encoding="utf-8-sig", newline="")


class _Rejoined(io.TextIOBase):
    """The stream again with its first characters (read to guess the format) in front."""

    def __init__(self, head, rest):
        self._parts = [io.StringIO(head), rest]

    def readable(self):
        return True

    def read(self, size=-1):
        out = []
        for part in self._parts:
            out.append(part.read(size if size is None or size < 0 else size - sum(map(len, out))))
            if size is not None and 0 <= size <= sum(map(len, out)):
                break
        return "".join(out)

    def readline(self, size=-1):
        line = self._parts[0].readline()
        if line.endswith("\n") or not line:
            return line or self._parts[1].readline()
        return line + self._parts[1].readline()

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line
