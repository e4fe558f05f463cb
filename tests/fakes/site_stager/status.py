#!/usr/bin/env python3
"""status: prints one JSON object about the drives, queue and disk buffer."""
import json

from _site import JOBS, answer

jobs = [json.loads(job.read_text()) for job in JOBS.glob("*.json")]
queued = sum(state == "queued" for job in jobs for state in job["files"].values())
answer({"drives": [{"name": "drive0", "tape": "", "activity": "idle"}], "queued_files": queued,
        "disk_free_bytes": 7 * 10**12, "disk_total_bytes": 10 * 10**12})
