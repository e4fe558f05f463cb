#!/usr/bin/env python3
"""poll BACKEND_ID...: "BACKEND_ID<TAB>PATH" lines on standard input; one JSON line per file
of each job this tape system knows. Each poll moves a file one step: queued, staging, done;
a file named "unreadable..." fails instead. Unknown jobs are not mentioned."""
from _site import answer, load_job, read_lines, save_job

NEXT = {"queued": "staging", "staging": "done", "done": "done", "failed": "failed"}

asked = {}
for line in read_lines():
    backend_id, path = line.split("\t", 1)  # only the first tab: paths may hold tabs
    asked.setdefault(backend_id, []).append(path)

for backend_id, paths in asked.items():
    job = load_job(backend_id)
    if job is None:
        continue
    for path in paths:
        if path not in job["files"]:
            continue
        state = NEXT[job["files"][path]]
        if path.rsplit("/", 1)[-1].startswith("unreadable"):
            state = "failed"
        job["files"][path] = state
        line = {"job": backend_id, "path": path, "state": state}
        if state == "failed":
            line.update({"class": "permanent", "message": "tape read error at block 1234"})
        answer(line)
    save_job(backend_id, job)
