#!/usr/bin/env python3
"""release BACKEND_ID: paths on standard input; the broker no longer needs their disk copies."""
import json
import sys

from _site import STATE, read_lines

with open(STATE / "released.jsonl", "a") as log:
    for path in read_lines():
        log.write(json.dumps({"job": sys.argv[1], "path": path}) + "\n")
