"""Where a command writes its result, checked before the work that makes it (a replay may run
for half an hour; an export reads a period's requests): a file in a directory that exists."""
from pathlib import Path

from django.core.management.base import CommandError


def check_output(path, option=""):
    """CommandError unless `path` names a file whose directory exists; `option` leads the message."""
    target = Path(path)
    if target.is_dir() or not target.parent.is_dir():
        raise CommandError(f"{option + ' ' if option else ''}{target}: "
                           + ("is a directory" if target.is_dir() else f"no directory {target.parent}"))
