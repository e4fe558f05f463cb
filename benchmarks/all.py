"""Run the benchmarks and render docs/benchmarks.md, the table of their current figures.

    .venv/bin/python benchmarks/all.py                       # every benchmark (hours), then the table
    .venv/bin/python benchmarks/all.py --only cycle ingest   # some of them, then the table
    .venv/bin/python benchmarks/all.py --render              # the table from the saved results only
    .venv/bin/python benchmarks/all.py --list                # the benchmarks and how long each takes

Every benchmark prints one JSON object as its last line. all.py keeps it in
benchmarks/results/<name>.json with the command, the date, the commit and the machine's load
(the whole output goes to var/bench/<name>.log), then renders every results file into
docs/benchmarks.md. A results file whose "result" is null holds the last figures of the history
(the log this table replaced) until the benchmark runs again; a "note" added to a results file by
hand (what a profile of that run showed) is shown under its figures until the next run.

To add a row: a script in benchmarks/ that prints its JSON last line, an entry in BENCHMARKS (its
figures, and the goal of each where an issue set one), then `all.py --only <name>`; commit the
results file with the table."""
import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LOGS = ROOT / "var" / "bench"
DOC = ROOT / "docs" / "benchmarks.md"
MAX_LINES = 400
# A figure is current while none of these changed since the commit it was measured on.
CODE = ("carousel", "policies", "api", "frontend", "requirements.txt")


@dataclass
class Figure:
    label: str
    value: object  # a key of the result, a dotted path into it, or a function of it
    unit: str = ""
    goal: tuple | None = None  # ("<=", 1.0) or (">=", 300)
    digits: int = 3

    def of(self, result):
        if callable(self.value):
            return self.value(result)
        for key in self.value.split("."):
            result = (result or {}).get(key)
        return result

    def goal_text(self):
        return f"{'≤' if self.goal[0] == '<=' else '≥'} {self.goal[1]}{self.unit}" if self.goal else "-"

    def met(self, value):
        if not self.goal or value is None:
            return "-"
        op, bound = self.goal
        return "**met**" if (value <= bound if op == "<=" else value >= bound) else "**not met**"

    def text(self, value):
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.{self.digits}f}{self.unit}"
        return f"{value}{self.unit}"


@dataclass
class Benchmark:
    name: str
    title: str
    script: str
    about: str
    figures: list
    args: list = field(default_factory=list)
    services: bool = True  # under carousel.infra.localservices (private PostgreSQL and Redis)
    minutes: int = 5  # roughly, on the 2-core machine
    details: object = None  # result -> markdown lines shown under the figures

    def command(self):
        script = " ".join([".venv/bin/python", f"benchmarks/{self.script}", *self.args])
        return f".venv/bin/python -m carousel.infra.localservices -- {script}" if self.services else script

    def argv(self):
        args = [a.replace("{commit}", git("rev-parse", "--short", "HEAD")) for a in self.args]
        script = [sys.executable, str(ROOT / "benchmarks" / self.script), *args]
        return [sys.executable, "-m", "carousel.infra.localservices", "--", *script] if self.services else script


# The details under some figures ---------------------------------------------------------------

def cycle_details(result):
    sizes = list(result["cycles"])
    lines = ["| sort / share | " + " | ".join(f"{int(s):,} queued: first / steady median / worst (most CPU), s"
                                            for s in sizes) + " |",
             "| --- |" + " ---: |" * len(sizes)]
    for pair in result["cycles"][sizes[-1]]:
        cells = []
        for s in sizes:
            cpu = (result.get("worst_cpu") or {}).get(s, {}).get(pair)
            cells.append(f"{result['first'][s][pair]:.3f} / {result['medians'][s][pair]:.3f} / "
                         f"{result['cycles'][s][pair]:.3f}" + (f" ({cpu:.3f})" if cpu is not None else ""))
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    settings = result.get("settings") or {}
    if settings:
        lines += ["", "Settings: " + ", ".join(f"{k} {v}" for k, v in settings.items()) + "."]
    return lines


def cpu_growth(result):
    worst = [max(pairs.values()) for pairs in (result.get("worst_cpu") or {}).values()]
    return round(worst[-1] / worst[0], 2) if len(worst) > 1 and worst[0] else None


def replay_row(result, workload, run):
    return next((r for r in result.get(workload) or [] if r["run"] == run), {})


def replay_vs_eradat(workload):
    def value(result):
        eradat = replay_row(result, workload, "baseline eradat").get("makespan_s")
        broker = replay_row(result, workload, "broker TAPEID/GRPW").get("makespan_s")
        return round(eradat / broker, 2) if eradat and broker else None
    return value


HSM_MAP_RUN = "broker TAPEID/GRPW hsm-fifo+map"


def hsm_map_over_eradat(workload):
    """makespan of the hsm-fifo replay with the tape map over eradat's (issue 23: at most 1.05)."""
    def value(result):
        eradat = replay_row(result, workload, "baseline eradat").get("makespan_s")
        span = replay_row(result, workload, HSM_MAP_RUN).get("makespan_s")
        return round(span / eradat, 3) if eradat and span else None
    return value


def hsm_fifo_details(result):
    lines = ["", "Against the hsm-fifo backend (a tape system hiding its tapes behind one FIFO recall queue): "
             "without and with the workload's tapes as the site's map, beside full control and eradat.", "",
             "| workload | eradat s | full control s | hsm-fifo s | hsm-fifo + map s | + map / eradat | "
             "+ map mounts | + map files failed | + map shares |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for workload in result:
        mapped = replay_row(result, workload, HSM_MAP_RUN)
        if not mapped:
            continue
        spans = [replay_row(result, workload, run).get("makespan_s") for run in (
            "baseline eradat", "broker TAPEID/GRPW", "broker TAPEID/GRPW hsm-fifo", HSM_MAP_RUN)]
        shares = ", ".join(f"{g} {v:.3f}" for g, v in (mapped.get("shares") or {}).items() if v is not None)
        lines.append(" | ".join([f"| {workload}", *(f"{v:,.0f}" if v else "-" for v in spans),
                                 f"{spans[3] / spans[0]:.3f}" if spans[0] and spans[3] else "-",
                                 str(mapped.get("mounts", "-")), str(mapped.get("files_failed", "-")),
                                 f"{shares or '-'} |"]))
    return lines


def most_mounts_per_tape_day(result):
    """The broker's max_mounts_per_tape_day over every workload (issue 23), None before it was reported."""
    values = [replay_row(result, w, "broker TAPEID/GRPW").get("max_mounts_per_tape_day") for w in result]
    values = [v for v in values if v is not None]
    return max(values) if values else None


BROKER_RUN = "broker TAPEID/GRPW"


def estimates_extreme(key, pick):
    """The lowest (pick=min) or highest (max) of an estimate score of the broker's nominal
    replays over every workload (issue 26's goals hold on each); None (no figure, not met)
    while a workload's broker run has none: it failed, or ran before the scores were kept. A
    width ratio of None with files scored is an unbounded one (most ranges had no end)."""
    def value(result):
        values = []
        for workload in result:
            broker = replay_row(result, workload, BROKER_RUN)
            score = broker.get(key)
            if score is None and key == "estimate_width_ratio" and broker.get("estimate_files_scored"):
                score = math.inf
            if score is None:
                return None
            values.append(score)
        return round(pick(values), 3) if values else None
    return value


def estimates_details(result):
    lines = ["", "The estimates the pages showed during the same broker replays (issue 26): for each restored "
             "request, the range shown when it was located and when it was planned, and whether it was done inside "
             "(the section on honest estimates below says how they are scored).", "",
             "| workload | coverage planned | coverage located | width ratio | requests scored |",
             "| --- | ---: | ---: | ---: | ---: |"]
    def cell(value):
        return "-" if value is None else f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"

    for workload in result:
        broker = replay_row(result, workload, BROKER_RUN)
        if not broker.get("estimate_files_scored"):
            lines.append(f"| {workload} | {broker.get('error') or 'not scored'} | - | - | - |")
            continue
        width = broker.get("estimate_width_ratio")
        lines.append(f"| {workload} | {cell(broker.get('estimate_coverage_planned'))} | "
                     f"{cell(broker.get('estimate_coverage_located'))} | "
                     f"{cell(width) if width is not None else 'unbounded'} | {cell(broker['estimate_files_scored'])} |")
    return lines


def replay_details(result):
    lines = ["| workload | lower bound s | eradat s | broker s | broker mounts | × eradat | × bound |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for workload in result:
        bound = replay_row(result, workload, "lower bound").get("makespan_s")
        eradat = replay_row(result, workload, "baseline eradat").get("makespan_s")
        broker = replay_row(result, workload, "broker TAPEID/GRPW")
        span, ratio = broker.get("makespan_s"), broker.get("ratio")
        lines.append(" | ".join([
            f"| {workload}", f"{bound or 0:,.0f}", f"{eradat or 0:,.0f}",
            f"{span:,.0f}" if span else broker.get("error", "-"), str(broker.get("mounts", "-")),
            f"{eradat / span:.2f}" if eradat and span else "-", f"{ratio:.2f} |" if ratio else "- |"]))
    return lines + hsm_fifo_details(result) + estimates_details(result)


def ablation_retained(workload):
    """The smallest, over the departed libraries' seeds, of their speed-up (eradat / broker) over
    the nominal library's, in percent."""
    def value(result):
        def speedup(seed):
            eradat = (result.get(f"{workload}|eradat|{seed}") or {}).get("makespan_s")
            broker = (result.get(f"{workload}|broker|{seed}") or {}).get("makespan_s")
            return eradat / broker if eradat and broker else None
        nominal = speedup("nominal")
        seeds = {key.split("|")[2] for key in result if key.startswith(f"{workload}|")} - {"nominal"}
        kept = [speedup(seed) / nominal * 100 for seed in seeds if nominal and speedup(seed)]
        return round(min(kept), 1) if kept else None
    return value


# The benchmarks -------------------------------------------------------------------------------

BENCHMARKS = [
    Benchmark(
        "cycle", "The loop's cycle at steady state (issue 22)", "cycle.py",
        "The shipped `run_cycle` against the simulated library (16 LTO-8 drives), 1,000 users in 10 groups "
        "over 20,000 tapes, for each of the nine sorting × sharing pairs: the first cycle from an idle "
        "system, then 15 warm-up and 20 measured cycles with the library's clock 60 s further at each, "
        "0.5% of the files missing, 2% of the reads failing, 30% of the files delivered by a slow worker; "
        "nothing is deleted between cycles. Each pair starts from a copy of the same filled database. "
        "The steady worst is the slowest of the measured cycles of the slowest pair.",
        [Figure("steady worst cycle at 1,000,000 queued", "steady_worst_s", " s", ("<=", 1.0)),
         Figure("steady median cycle at 1,000,000 queued (slowest pair)", "steady_median_s", " s"),
         Figure("most CPU time a steady cycle took at 1,000,000 queued (loop and database)", "steady_worst_cpu_s",
                " s"),
         Figure("first cycle from idle at 1,000,000 queued (slowest pair)", "first_worst_s", " s"),
         Figure("growth of the steady worst, 100,000 → 1,000,000 queued", "growth", "×", ("<=", 2.0), 2),
         Figure("growth of the most CPU time a steady cycle took, 100,000 → 1,000,000 queued", cpu_growth, "×",
                None, 2),
         Figure("peak RSS of a measuring process", "peak_rss_mb", " MB", ("<=", 300), 1)],
        minutes=20, details=cycle_details),
    Benchmark(
        "ingest", "Ingest: a 100,000-file stage through both doors (issues 10 and 14)", "ingest.py",
        "One POST of 100,000 new paths to the native API and to the WLCG Tape REST door (gunicorn, 2 sync "
        "workers), from sending to the answer, against a bare `COPY` of the same rows into an unindexed "
        "table; medians of 3. The answer comes once the files are durable in the intake; the move into "
        "the queue that follows (`*_settle_s`) is the loop's work, timed apart; the time until queued is "
        "the slower door's answer plus its move. The moved paths join the path filter's index after "
        "that (`*_index_s`), timed apart too.",
        [Figure("slower door / bare COPY", "x_bare_copy", "×", ("<=", 3.0), 2),
         Figure("until queued (answer + move) / bare COPY", "queued_x_bare_copy", "×", ("<=", 5.0), 2),
         Figure("native API answer", "api_s", " s"),
         Figure("Tape REST answer", "tape_rest_s", " s"),
         Figure("bare COPY", "bare_copy_s", " s"),
         Figure("native API: moving into the queue, after the answer", "api_settle_s", " s"),
         Figure("native API: paths indexed for the path filter, after the move", "api_index_s", " s")],
        minutes=5),
    Benchmark(
        "load", "Polls under load: 200 clients, 100,000 queued for one user (issue 14)", "load.py",
        "gunicorn (4 sync workers) and PostgreSQL on loopback; `wrk` with 200 connections for 30 s "
        "alternating `/api/v1/summary/` and a page of the request list as the big user, throttles as "
        "shipped with the rate raised so that they never answer; then 25 sequential `/summary/` calls "
        "per user. `wrk` shares the two cores with the server.",
        [Figure("answers per second (200s)", "answers_per_s", "", (">=", 300), 1),
         Figure("/summary/ 100,000 queued vs 10", "x_summary", "×", ("<=", 2.0), 2),
         Figure("p99 latency", "p99_ms", " ms", None, 1),
         Figure("server CPU per answer", "server_cpu_ms_per_answer", " ms", None, 2)],
        minutes=4),
    Benchmark(
        "history", "Requests that do not slow down with history (issue 24)", "history.py",
        "A one-file stage through each door (native API, Tape REST) and a Tape REST poll, for a user "
        "with 1,000 past submissions among 1,000,000 finished requests against a user with none, in one "
        "run; the views, services and PostgreSQL called in-process through Django's test client; "
        "medians of 21, each path warmed up once.",
        [Figure("Tape REST stage, with history / fresh", "stage_x_fresh", "×", ("<=", 2.0), 2),
         Figure("native submit, with history / fresh", "submit_x_fresh", "×", ("<=", 2.0), 2),
         Figure("Tape REST poll, with history / fresh", "poll_x_fresh", "×", ("<=", 2.0), 2)],
        minutes=6),
    Benchmark(
        "stress", "The whole broker under real concurrency and failures (issue 24)", "stress.py",
        "gunicorn (4 workers), a Celery worker (celery and control queues), a delivery worker and beat on "
        "PostgreSQL and Redis started by the script, the live simulated library 1,000 times faster than "
        "tape (8 LTO-8 drives), shipped control defaults; 16 clients (the `carousel` client's retries) "
        "submitting small and 5,000-file submissions, cancelling, cancelling and resubmitting the same "
        "paths at once, releasing and polling for 5 minutes, while the worker's process group is killed "
        "and PostgreSQL and Redis are restarted at random moments (each twice); then the queue drains and "
        "the invariants are checked from the database and the library's record of its reads.",
        [Figure("files lost (calls failed after retries, accepted then cancelled or missing)", "lost", "",
                ("<=", 0)),
         Figure("files read more often than sent", "read_twice", "", ("<=", 0)),
         Figure("server errors (500s; 5xx but a 503 with Retry-After during an outage)", "server_errors", "",
                ("<=", 0)),
         Figure("deadlocks in PostgreSQL's log", "deadlocks", "", ("<=", 0)),
         Figure("requests not final after the drain", "stuck", "", ("<=", 0)),
         Figure("files submitted", "submitted", ""),
         Figure("worker kills / PostgreSQL restarts / Redis restarts",
                lambda r: f"{r['worker_kills']} / {r['pg_restarts']} / {r['redis_restarts']}"),
         Figure("slowest statement (auto_explain over 3 s)", "slowest_statement_s", " s", None, 1)],
        services=False, minutes=15),
    Benchmark(
        "faults", "Bad weeks, simulated: seeds of users, operators and faults against the real loop (issue 24)",
        "faults.py",
        "Each seed a short deterministic schedule (carousel/sim/faults.py): a few tapes, drives, users and "
        "groups; submissions through the intake, cancels, resubmissions, releases, retention, operators' "
        "pauses, caps, weights and drives; lost jobs, drive errors, locates saying try later, the stager "
        "down, garbage and timed-out answers, a hanging mail server, failing deliveries and cycles dying "
        "between any two steps; the real run_cycle and services with the shipped control defaults on "
        "SQLite, every invariant checked after every step. Two processes.",
        [Figure("violations", "violations", "", ("<=", 0)),
         Figure("seeds", "seeds", ""),
         Figure("steps (cycles and user actions, all seeds)", "steps", ""),
         Figure("first violation", lambda r: r.get("first_violation") or "none"),
         Figure("wall time", "wall_s", " s", None, 0)],
        args=["--seeds", "10000", "--procs", "2"], services=False, minutes=45),
    Benchmark(
        "tape_rest_poll", "Tape REST polls: GET stage/{id} of a 10,000-file request, 200 clients (issue 10)",
        "tape_rest_poll.py",
        "One stage request of 10,000 files, then `wrk -c200 -d20s` polling it with a bearer token "
        "(gunicorn, 4 workers, persistent connections); each answer is about 630 kB.",
        [Figure("answers per second", "answers_per_s", "", (">=", 300), 1),
         Figure("p99 latency", "p99_ms", " ms", None, 1)],
        minutes=3),
    Benchmark(
        "live_page", "The live page's updating fragment at 1,000,000 queued (issue \"The web UI\")",
        "live_page.py",
        "1,000,000 queued (the fill of the old cycle benchmark), 12 hours of history at 5,000 files an "
        "hour, 750 files in flight; the fragment rendered through Django's test client, no cache, 7 times.",
        [Figure("live fragment, median", "live_fragment_median_ms", " ms", ("<=", 100), 1),
         Figure("my requests (heaviest user), median", "my_requests_median_ms", " ms", None, 1)],
        minutes=6),
    Benchmark(
        "metrics_scrape", "/metrics scrape at 1,000 and 1,000,000 queued (issue 15)", "metrics_scrape.py",
        "100 users in 4 groups, 2,000 tapes; 30 scrapes of the whole `/metrics` view after two warm-ups.",
        [Figure("scrape median at 1,000,000 queued", "sizes.1000000.median_ms", " ms", None, 1),
         Figure("median at 1,000,000 over at 1,000", "ratio_median", "×", None, 2)],
        minutes=4),
    Benchmark(
        "usage_report", "Usage report over a year of 1,000,000 requests (issue 15)", "usage_report.py",
        "1,000,000 requests of 100 users restored over a year through the triggers (per-day rows), then "
        "the report over the whole year as staff, median of 5.",
        [Figure("report by user", "by_user_ms", " ms", None, 1),
         Figure("report by group", "by_group_ms", " ms", None, 1),
         Figure("CSV by user", "csv_ms", " ms", None, 1)],
        minutes=10),
    Benchmark(
        "counter_triggers", "What the usage counters' triggers cost bulk statements (issue 15)",
        "counter_triggers.py",
        "100,000-row statements on the request table, six rounds alternating the usage triggers on and "
        "off (the history, backlog and hourly triggers on in both); medians.",
        [Figure("claim UPDATE, usage triggers on", "on.submit", " s"),
         Figure("claim UPDATE, usage triggers off", "off.submit", " s"),
         Figure("INSERT, usage triggers on", "on.insert", " s"),
         Figure("INSERT, usage triggers off", "off.insert", " s")],
        minutes=4),
    Benchmark(
        "read_order", "Ordering one tape's files (policies.order.read_order)", "read_order.py",
        "CPU time to order 100, 1,000 and 3,000 files scattered over an LTO-7 tape, best of 3.",
        [Figure("1,000 files", "1000_files_ms", " ms", None, 1),
         Figure("3,000 files", "3000_files_ms", " ms", None, 1)],
        services=False, minutes=1),
    Benchmark(
        "allocate", "A sharing policy's allocate() for 1,000 users (a test's timing threshold, moved here)",
        "allocate.py",
        "1,000 users in 10 groups, random demand and room (seed 1), 750 slots; CPU time, best of 5, per policy.",
        [Figure("slowest policy", "most_ms", " ms", ("<=", 10), 2)],
        services=False, minutes=1),
    Benchmark(
        "replay", "Replays of the shipped workloads, shipped defaults (issues 12, 13, 23 and 26)", "replay.py",
        "`manage.py simulate` of every workload in `tests/workloads/` (TAPEID/GRPW) against the "
        "simulated library, with both baselines and the lower bound, and against the hsm-fifo backend without "
        "and with the tape map (`--backend hsm-fifo [--tape-map]`); makespans are simulated seconds and "
        "do not depend on the machine's load. The broker's runs also score the estimates the pages showed "
        "(issue 26).",
        [Figure("bnl-704: × eradat", replay_vs_eradat("bnl-704"), "×", (">=", 1.7), 2),
         Figure("bnl-704: × lower bound", lambda r: replay_row(r, "bnl-704", "broker TAPEID/GRPW").get("ratio"),
                "×", ("<=", 1.35), 2),
         Figure("bnl-large: × eradat", replay_vs_eradat("bnl-large"), "×", (">=", 1.6), 2),
         Figure("bnl-large: × lower bound",
                lambda r: replay_row(r, "bnl-large", "broker TAPEID/GRPW").get("ratio"), "×", ("<=", 1.3), 2),
         Figure("storm: analysts not served within 1,800 s", lambda r: (
             (lambda b: b["analysts"] - b["analysts_within_1800_s"] if b.get("analysts") else None)(
                 replay_row(r, "storm", "broker TAPEID/GRPW"))), "", ("<=", 0)),
         *(Figure(f"{w}: hsm-fifo + map / eradat", hsm_map_over_eradat(w), "×", ("<=", 1.05), 3)
           for w in ("bnl-704", "storm", "groups")),
         Figure("most mounts of one tape in 24 h, any workload", most_mounts_per_tape_day, "", ("<=", 12)),
         Figure("estimates: done inside the range shown when planned, lowest of any workload",
                estimates_extreme("estimate_coverage_planned", min), "", (">=", 0.9), 3),
         Figure("estimates: done inside the range shown when located, lowest of any workload",
                estimates_extreme("estimate_coverage_located", min), "", (">=", 0.8), 3),
         Figure("estimates: width ratio, highest of any workload",
                estimates_extreme("estimate_width_ratio", max), "", ("<=", 0.5), 3)],
        args=["--quick", "--hsm-fifo", "--jobs", "2"], services=False, minutes=70, details=replay_details),
    Benchmark(
        "ablation", "What each gain is worth on a library departing from the model (issue 13)", "replay.py",
        "The broker, eradat in the broker's read order and eradat, on the nominal library and on libraries "
        "departing from the model by P = 0.3 (seeds 1, 2, 3). Retained: a departed library's speed-up over "
        "eradat as a share of the nominal one, the smallest of the three seeds. `--results` keeps finished "
        "replays, so an interrupted run on the same commit (`{commit}`) goes on where it stopped.",
        [Figure("bnl-704: retained at P = 0.3", ablation_retained("bnl-704"), "%", (">=", 85), 1),
         Figure("groups: retained at P = 0.3", ablation_retained("groups"), "%", (">=", 85), 1),
         Figure("storm: retained at P = 0.3", ablation_retained("storm"), "%", (">=", 85), 1)],
        args=["--ablation", "--jobs", "2", "--results", "var/bench/ablation-{commit}.json"], services=False,
        minutes=240),
]
BY_NAME = {b.name: b for b in BENCHMARKS}


# Running --------------------------------------------------------------------------------------

def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def code_paths(benchmark):
    return [*CODE, f"benchmarks/{benchmark.script}"]


def run(benchmark):
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{benchmark.name}.log"
    print(f"== {benchmark.name}: {benchmark.command()}  (about {benchmark.minutes} min; output in {log})",
          flush=True)
    load_before = os.getloadavg()[0]
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    started = time.perf_counter()
    last = ""
    with open(log, "w") as out:
        proc = subprocess.Popen(benchmark.argv(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        for line in proc.stdout:
            out.write(line)
            sys.stdout.write(line)
            if line.strip():
                last = line
    try:
        if proc.wait():
            raise ValueError(f"exit status {proc.returncode}")
        result = json.loads(last)
    except ValueError as exc:
        print(f"== {benchmark.name} failed ({exc}); its results file is unchanged", flush=True)
        return False
    changed = bool(git("status", "--porcelain", "--", *code_paths(benchmark)))
    saved = {"benchmark": benchmark.name, "command": benchmark.command(),
             "date": date,
             "commit": git("rev-parse", "--short", "HEAD") + ("+uncommitted changes" if changed else ""),
             "minutes": round((time.perf_counter() - started) / 60, 1),
             "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)], "result": result}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{benchmark.name}.json").write_text(json.dumps(saved, indent=1, ensure_ascii=False) + "\n")
    return True


# Rendering ------------------------------------------------------------------------------------

def load_results():
    results = {}
    for benchmark in BENCHMARKS:
        path = RESULTS / f"{benchmark.name}.json"
        results[benchmark.name] = json.loads(path.read_text()) if path.exists() else None
    return results


def current(saved, benchmark):
    """Whether a saved result was measured on the code as it is at HEAD."""
    if not saved or saved.get("result") is None or "+" in saved.get("commit", "+"):
        return False
    return subprocess.run(["git", "diff", "--quiet", saved["commit"], "HEAD", "--", *code_paths(benchmark)],
                          cwd=ROOT).returncode == 0


def rows(benchmark, saved):
    """(figure, goal, value text, met, measured text) for each figure."""
    if saved and saved.get("result") is not None:
        when = f"{saved['date']}, {saved['commit']}"
        if not current(saved, benchmark):
            when += " (the code changed since: not measured on this commit)"
        for figure in benchmark.figures:
            value = figure.of(saved["result"])
            yield figure.label, figure.goal_text(), figure.text(value), figure.met(value), when
        return
    last = (saved or {}).get("last_known") or {}
    when = f"last measured {last['date']}, {last['commit']}" if last else "never"
    for figure in benchmark.figures:
        earlier = (last.get("figures") or {}).get(figure.label)
        value = "not measured on this commit" + (f" (last: {earlier})" if earlier else "")
        yield figure.label, figure.goal_text(), value, "-", when


def anchor(title):
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def render(results):
    out = [INTRO.strip(), "", "## Every figure", "",
           "| benchmark | figure | goal | current value | goal met | measured (UTC), commit |",
           "| --- | --- | --- | ---: | --- | --- |"]
    for benchmark in BENCHMARKS:
        for label, goal, value, met, when in rows(benchmark, results[benchmark.name]):
            out.append(f"| [{benchmark.name}](#{anchor(benchmark.title)}) | {label} | {goal} | {value} | {met} | "
                       f"{when} |")
    for benchmark in BENCHMARKS:
        saved = results[benchmark.name]
        out += ["", f"## {benchmark.title}", "", benchmark.about, "", "```sh", benchmark.command(), "```", ""]
        if saved and saved.get("result") is not None:
            out.append(f"Measured {saved['date']} on {saved['commit']} in {saved['minutes']} min; load average "
                       f"{saved['load_average'][0]} before, {saved['load_average'][1]} after (2 cores).")
        else:
            last = (saved or {}).get("last_known")
            out.append("**Not measured on this commit.**" + (f" Last in the history: {last['note']}" if last else ""))
        out += ["", "| figure | goal | value | goal met |", "| --- | --- | ---: | --- |"]
        out += [f"| {label} | {goal} | {value} | {met} |" for label, goal, value, met, _ in
                rows(benchmark, saved)]
        if saved and saved.get("result") is not None:
            if benchmark.details:
                out += ["", *benchmark.details(saved["result"])]
            if saved.get("note"):
                out += ["", saved["note"]]
            last_line = json.dumps(saved["result"], ensure_ascii=False)
            if len(last_line) <= 600:
                out += ["", f"Last line: `{last_line}`"]
            else:
                out += ["", f"Last line: in `benchmarks/results/{benchmark.name}.json`."]
    out += ["", ESTIMATES.strip(), "", DEFAULTS.strip(), ""]
    return "\n".join(out)


INTRO = """
# Benchmarks

The current figure of every benchmark in `benchmarks/`, against its goal. This file is generated:
`make bench` (or `.venv/bin/python benchmarks/all.py`) runs every benchmark and rewrites it;
`benchmarks/all.py --only NAME ...` runs some; `benchmarks/all.py --render` only rewrites it from
`benchmarks/results/*.json`, the last line of each benchmark's latest run with its command, date,
commit and the machine's load. Edit `benchmarks/all.py`, not this file. How each figure came to be
(every earlier pass, its profiles and what changed) is in git: `git log -p docs/benchmarks.md`;
the long log this table replaced is `git show f444372:docs/benchmarks.md`.

Every command starts its own private PostgreSQL 15 and Redis on loopback
(`carousel.infra.localservices`). The machine: 2 vCPUs (AMD EPYC), 24 GB, Debian 12, Python 3.11,
shared with other people's test runs; the load average is kept with each result. Wall times move
by a factor of up to 2 with that load; makespans of replays are simulated seconds and do not.
A figure measured on an older commit whose code (`carousel/`, `policies/`, `api/`, `frontend/`,
`requirements.txt` or its script) has changed since says "not measured on this commit".

The machine's own speed changed too, whatever its load. The goals in seconds were set, and
first met, on the machine of 2026-11-25; on the machine of 2026-11-29 the same commits ran two to
three times as slowly:

- `make test` on a fresh clone of 05b5241, nothing else running: pytest 305 s on 2026-11-25,
  707 s on 2026-11-29 (1,022 tests; ef50e1f's 1,174 tests took 502 s there that day).
- `benchmarks/load.py` on bde3529: 337.7 answers/s and 4.21 ms of server CPU an answer on
  2026-11-25 (load average 5-6); 129.6 and 159.1 answers/s, 14.41 and 11.86 ms, on 2026-11-29,
  in turns with ef50e1f (123.1 and 129.2 answers/s, 15.41 and 14.71 ms).
"""

# How the estimates are scored and what shaped the model; the figures are the replay
# benchmark's (its broker runs score them).
ESTIMATES = """
## Honest estimates on the nominal replays (issue 26)

Each replay of the broker records, per request, the range the pages show
(`carousel/outlook/estimates.py`, read after each cycle; reading changes nothing the broker
does) when the request is first seen located and when it is first seen planned on a chain or
at a later step (a file never seen past located: the located range), and scores them against when
it was done: `estimate_coverage_planned` and `estimate_coverage_located` are the fractions of
restored requests done inside (overlap's 1,500 files are 3,000 requests), `estimate_width_ratio` the median width of the located ranges over
the median wait. Goals: ≥ 0.90, ≥ 0.80 and ≤ 0.5 on every shared workload. The replay
benchmark's broker runs are these replays: its section above has the figures per workload and
the goals' rows, measured with the makespans. One workload alone:

```sh
nice -n 10 .venv/bin/python manage.py simulate tests/workloads/overlap.json.gz --report overlap.json
```

How the latest end allows for files still arriving (`outlook.estimates._growth`, the one part
of the model the workloads pushed on). overlap's twelve analysts send 3,000 requests over its
first 30 s, each file asked for by two of them; 10 s in, about 900 had arrived, every tape's
mount was planned, and the later files joined those mounts, each about twice as long by the
end: the files first seen at 10 s finished at a median 1.41 times their range's end (206 of
897 requests inside, cfe5669). While a tape's files are still arriving, the latest end of a planned
file's range now allows for its mount and the ones before it on its drive to take more, a sent
file's for the ones before it, and a reason says so. The requests are taken to go on at their
rate for as long again as they have gone on, less the silence since the last file's arrival,
at most until the mount ends (of a process seen only this far, the rest is as likely to be
longer as shorter). Taking the new files to go on arriving at their own rate, as many again
(a6d290d-0d55e0c), put 2,962 of the 3,000 requests inside, at a width ratio of 1.00: 20 s in,
1,368 of the 1,500 files had arrived, and the rule allowed for as many again where 132 came. Since 993074f the new files are estimated from how
often the requests so far asked for a file again (`_new_files`: Shen, Chao and Lin's estimator
of new species in further sampling, Ecology 84:798, 2003): the files not asked for yet number
about f1² / (2 f2) (Chao1, from the files asked for once, f1, and twice, f2), and the next
request finds one with the chance f1 / n of the n requests so far (Good-Turing), a chance that
shrinks as they are found. No constant is fitted: both are the standard estimators of what a
sample has not seen; with every file asked for once it is the rule before, bit for bit, so the
seven other workloads (every file asked for once) score as before. On overlap, measured
2026-11-30 with the command above on 60d0370's code: 0.918 / 0.918 / 0.465 (planned / located /
width), makespan 8,531 s; of the 245 requests outside (6 early, 239 late), every one was first
seen planned (state submitted), none being read (the report's estimate_detail). Tried and not
kept: the allowance weighted by the chance that arrivals at their rate leave the silence since
the last one (exp(-rate x silence)): 0.87 / 0.87 / 0.53; the arrivals' recent rate alone (at
20 s the last 5 s still said 50 new files a second). What the rule cannot tell apart: a user
asking again, as it arrives, for another's list that is still arriving (a follower one step
behind a leader) looks like a pool running out, and the latest end then allows too little for
the leader's files to come; no shipped workload does this (in each but overlap every file is
asked for once; in overlap the twelve analysts ask for theirs at the same time), and a variant
of overlap built so (one analyst asking for all 1,500 files, another the same 10 s behind)
still scored 1.000 / 1.000 / 0.381: its mounts did not wait on that growth.

What is left. storm's 1,456 late files (835 on the first tapes, cut by the analysts' short
mounts in the first hour; 603 of the final round, whose taken-back jobs are merged in read
order): see `git log -p docs/benchmarks.md` for 77cb692's analysis. And bursts longer than the
shared ones: overlap's requests stretched over 60 s and 120 s (the same files and users, every
time doubled or quadrupled; not in the repository) score 0.914 / 0.914 / 0.516 and 0.800 /
0.800 / 0.503 on 3146dee's and 8d265aa's code (on 60d0370's, 0.527 and 0.455 inside: each tape's first mount
planned short, made long by the files joining it, cut the mount ahead of it; at 60 s, 15 cuts
and 51 mounts for 30 tapes, now none and 36). What misses at 120 s is mostly the files seen in
the burst's first 40 s, late (387 of the 506 requests late): as long again as the arrivals have gone on is
the median of what the Copernican argument allows, and a burst seen a quarter through has
three times as long to go.
"""

DEFAULTS = """
## Where the defaults come from

Measured, as the history records them (`git show f444372:docs/benchmarks.md`):

- The wear rules' defaults (`carousel/loop/wear.py`, issue 23): `min_mount_bytes` 500 GB and
  `min_mount_files` 10,000 are CTA's mount criteria; `remount_delay_s` 7,200 s is ENDIT's two hours
  before a tape is mounted again: 12 mounts a day at most while other work can use the drives
  (cartridges are rated for about 20,000 loads: 12 a day every day is 4.5 years), except that a
  request that has waited `mount_max_wait_s` goes (users' waits come first: a tape asked for
  again every quarter hour on a busy library is still mounted about every quarter hour);
  `mount_max_wait_s` 900 s bounds what either holds back so that storm's analysts, held behind a
  backlog big enough for the rule, still go as a short mount well within their 1,800 s. No shipped
  workload has a tape run of 500 GB or 10,000 files but `pic-lto4-full` (alone on its drive), so
  min_mount holds nothing in their replays, and a request held by either rule is free after
  900 s. `manage.py simulate W` of the shared workloads on 4ec9f25 (before the rules) and
  5074d62 (with them) gave the same replays: bnl-704 2,984 s, 34 mounts, at most 2 mounts of
  one tape in 24 h; bnl-large 5,515 s, 55, 2; overlap 8,513 s, 30, 1 (the three pic-lto4, one
  tape each, one mount before; not replayed with the rules). storm with the rules, stopped at
  5.6 simulated hours for time: its 30 analysts all served, the longest wait 694 s.
  tests/test_wear.py shows what the rules hold where they bite.
- `carousel/loop/mounts.py::MOUNTS_AHEAD = 2`: on `groups` (weights 0.5 / 0.25 / 0.125 / 0.125), the
  whole window laid out gave cms 0.29 on a departed library; one mount ahead gave 0.43 / 0.25 / 0.16 /
  0.16; two gave 0.50 / 0.25 / 0.12 / 0.12, the smallest depth that keeps the weights.
- `policies/order.py::WRAP_UNCERTAINTY = 1%`: with the exact tape tables the order's gain collapsed
  on a departed library (groups 1.24 for 1.91 nominal); 0.5% kept only 78% on groups and storm; 1%
  costs 4-9% of the order's gain on an exact library, 2% more.
- Drive-time weights: the sharing policy's own proportions, read from `allocate()` with 10^6 slots.
  How far a cycle looks: twice the file grant, at least N (the margin of the earlier rounds).
  A run's estimated drive time: `carousel/tape.py::mount_profile` with an 11 s robot exchange
  (the simulated library's default).
- `CONN_MAX_AGE=60` with health checks on PostgreSQL: a new backend per request cost about 40% of
  a poll's server CPU (21.7 → 13.2 ms per answer, `load.py`).
- Usage rows per day, not per hour: a year of hourly rows is up to 876,000 rows (`usage_report.py`).
- The trigram index on `path` costs about 20% of a 100,000-file submission; it is kept for the
  list's path filter.
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(BY_NAME), metavar="NAME", help="run only these")
    parser.add_argument("--render", action="store_true", help="run nothing: rewrite the table from the results")
    parser.add_argument("--list", action="store_true", help="list the benchmarks")
    parser.add_argument("--args", nargs=argparse.REMAINDER, metavar="ARG",
                        help="with one --only NAME: run it with these arguments instead of its own (a shorter "
                             "run; the table shows the command that ran)")
    args = parser.parse_args()
    if args.args is not None:
        if not args.only or len(args.only) != 1:
            parser.error("--args needs exactly one benchmark named by --only")
        BY_NAME[args.only[0]].args = args.args
    if args.list:
        for b in BENCHMARKS:
            print(f"{b.name:16} ~{b.minutes:>3} min  {b.command()}")
        return
    failed = []
    if not args.render:
        for benchmark in [BY_NAME[n] for n in args.only] if args.only else BENCHMARKS:
            if not run(benchmark):
                failed.append(benchmark.name)
    text = render(load_results())
    DOC.write_text(text)
    lines = text.count("\n") + 1
    print(f"wrote {DOC.relative_to(ROOT)} ({lines} lines)")
    if lines > MAX_LINES:
        print(f"warning: more than {MAX_LINES} lines: shorten the benchmarks' details or notes")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
