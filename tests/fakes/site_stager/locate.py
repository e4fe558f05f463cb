#!/usr/bin/env python3
"""locate: paths on standard input; one JSON line per path, its place on tape or an error."""
import json

from _site import STATE, answer, read_lines

catalogue = json.loads((STATE / "catalogue.json").read_text())
for path in read_lines():
    if path in catalogue:
        tape, position, size = catalogue[path]
        answer({"path": path, "tape": tape, "position": position, "size": size, "media": "LTO-8"})
    else:
        answer({"path": path, "error": "no such file in the tape catalogue", "class": "permanent"})
