#!/usr/bin/env python3
"""cancel BACKEND_ID: paths on standard input; withdraws them from the job. Exit 0 also when the
job or a path is unknown: there is nothing left to withdraw."""
import sys

from _site import load_job, read_lines, save_job

backend_id = sys.argv[1]
job = load_job(backend_id)
if job is not None:
    for path in read_lines():
        job["files"].pop(path, None)
    save_job(backend_id, job)
