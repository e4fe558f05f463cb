import argparse
import re
from datetime import datetime, timezone

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_date, parse_datetime

from carousel.management.targets import check_output
from carousel.ops.export import ExportError, export_workload, write_workload
from carousel.sim.workload import MAX_DRIVES
from carousel.tape import MEDIA


def _moment(text):
    """An ISO 8601 date-time (UTC when no offset is given) or a date (its midnight, UTC)."""
    parsed = parse_datetime(text)
    if parsed is None and (day := parse_date(text)) is not None:
        parsed = datetime(day.year, day.month, day.day)
    if parsed is None:
        # argparse shows an ArgumentTypeError's words; a ValueError's were "invalid _moment value".
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 date-time or date, e.g. 2026-11-30 or "
                                         "2026-11-30T17:00Z")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _drives(text):
    """MEDIA=N,...: technologies the simulated library knows, each with at least one drive (a
    file written with LTO-8=0 or LTO-99=4 was refused by `simulate`, after the export)."""
    out = {}
    for part in text.split(","):
        media, sep, count = part.partition("=")
        media = media.strip()
        # At most what `simulate` reads back (carousel/sim/workload.py): the file exists to be replayed.
        if not sep or not re.fullmatch(r"[0-9]+", count.strip()) or not 1 <= int(count) <= MAX_DRIVES:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected MEDIA=N with N from 1 to {MAX_DRIVES}, e.g. LTO-8=10")
        if media not in MEDIA:
            raise argparse.ArgumentTypeError(f"{media!r} is not a known technology ({', '.join(MEDIA)})")
        out[media] = int(count)
    return out


class Command(BaseCommand):
    help = ("Write the requests created from --since to --until as a carousel-workload/1 file (.json or .json.gz), "
            "to replay with `manage.py simulate` under another policy.")

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--since", type=_moment, required=True, help="ISO 8601 date-time or date (UTC)")
        parser.add_argument("--until", type=_moment, required=True, help="ISO 8601 date-time or date (UTC), excluded")
        parser.add_argument("--drives", type=_drives, help="the library's drives, e.g. LTO-8=10,LTO-9=4 "
                                                           "(default: as the stager reports them)")
        parser.add_argument("--media", choices=sorted(MEDIA), help="the technology of tapes the stager gave none for")
        parser.add_argument("--name", help="the workload's name")

    def handle(self, *args, file, since, until, drives, media, name, **options):
        if since >= until:
            raise CommandError("--since must be before --until")
        check_output(file)  # said before the export, not as a traceback after
        try:
            data = export_workload(since=since, until=until, drives=drives, media=media, name=name)
        except ExportError as exc:
            raise CommandError(str(exc)) from exc
        write_workload(data, file)
        self.stdout.write(f"{file}: {len(data['requests'])} requests of {len(data['users'])} users, "
                          f"{sum(len(t['files']) for t in data['tapes'])} files on {len(data['tapes'])} tapes")
        if not data["positions_known"]:
            self.stderr.write("warning: the stager reported no positions; this workload is only good for questions "
                              "of sharing (see its description)")
