#!/usr/bin/env python3
"""stage JOB_ID [TAPE]: paths on standard input; prints the backend's id for the job. The same
JOB_ID again is the same job: answer the same id and change nothing."""
import os
import sys
import time

from _site import STATE, load_job, read_lines, save_job

job_id = sys.argv[1]
tape = sys.argv[2] if len(sys.argv) > 2 else ""
paths = read_lines()
backend_id = f"be-{job_id}"
if load_job(backend_id) is None:
    save_job(backend_id, {"job": job_id, "tape": tape, "files": {path: "queued" for path in paths}})
with open(STATE / "stage-calls.log", "a") as log:
    log.write(job_id + "\n")
# A tape system that takes its time to answer: a broker killed now has committed the job
# but not recorded the answer, and must send it again with the same id.
time.sleep(float(os.environ.get("FAKE_SITE_STAGE_DELAY", "0")))
print(backend_id)
