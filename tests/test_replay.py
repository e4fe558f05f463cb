import copy
import gzip
import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from carousel.infra import plugins
from carousel.loop.cycle import run_cycle
from carousel.sim.lowerbound import lower_bound
from carousel.models import Control, RestoreRequest
from carousel.sim.library import Mismatch
from carousel.sim.replay import ReplayError, drain, replay_baseline, replay_broker, report
from carousel.domain.services import restore_submit
from carousel.stagers import simulated
from carousel.stagers.base import JobSpec
from carousel.stagers.simulated import SimulatedStager, synthetic_location
from carousel.tape import GB
from carousel.sim.workload import WorkloadError, load, parse
from policies.order import read_order

WORKLOADS = Path(__file__).resolve().parent / "workloads"  # the shipped workloads
README_KEYS = {"workload", "policy", "baseline", "makespan_s", "lower_bound_s", "mounts", "tapes", "bytes",
               "files_done", "files_failed", "throughput_mb_s", "drive_busy_fraction", "users", "groups", "wall_s"}


def small():
    """Two groups, three users, four LTO-8 tapes on two drives; an analyst arrives late."""
    tapes = []
    for t in range(4):
        files = [[f"/data/T{t}/f{i}", 2 * GB, (i * 97 % 40) * 60 * GB] for i in range(5)]
        tapes.append({"label": f"T{t}", "media": "LTO-8", "used_bytes": 11_000 * GB, "files": files})
    requests = [{"t": 0, "user": "charlie", "path": f"/data/T{t}/f{i}"} for t in range(3) for i in range(5)]
    requests += [{"t": 30, "user": "alice", "path": "/data/T3/f0"}, {"t": 30, "user": "alice", "path": "/data/T3/f1"},
                 {"t": 45.5, "user": "bob", "path": "/data/T3/f2"}]
    return {"format": "carousel-workload/1", "name": "small", "library": {"drives": {"LTO-8": 2}},
            "groups": {"production": {"weight": 3}, "analysis": {"weight": 1}},
            "users": {"charlie": {"group": "production", "cap": 100}, "alice": {"group": "analysis"},
                      "bob": {"group": "analysis", "cap": 2}},
            "tapes": tapes, "requests": requests}


def broken(change):
    data = small()
    change(data)
    return data


MALFORMED = [
    (lambda d: d.pop("format"), "format: expected 'carousel-workload/1'"),
    (lambda d: d.pop("tapes"), "tapes: missing"),
    (lambda d: d["library"].update(drives=["LTO-8"]), "library.drives: expected an object"),
    (lambda d: d["library"].update(drives={"LTO-3": 2}), "library.drives.LTO-3: unknown technology"),
    (lambda d: d["library"].update(robots=0), "library.robots: must be greater than 0"),
    (lambda d: d["tapes"][1].update(media="LTO-9"), "tapes[1].media: no drive reads LTO-9"),
    (lambda d: d["tapes"][0]["files"][2].__setitem__(1, -5), "tapes[0].files[2][1] (size_bytes): must be at least 0"),
    (lambda d: d["tapes"][0]["files"].__setitem__(0, ["/x", 1]), "tapes[0].files[0]: expected [path, size_bytes"),
    (lambda d: d["tapes"][2]["files"][0].__setitem__(2, 10_999 * GB), "tapes[2].files[0]: ends at byte"),
    (lambda d: d["tapes"][1]["files"].append(["/data/T0/f0", 1, 0]), "tapes[1].files[5][0] (path): '/data/T0/f0' "
                                                                     "is also on tape T0"),
    (lambda d: d["users"]["bob"].update(group="physics"), "users.bob.group: 'physics' is not in groups"),
    (lambda d: d["requests"][0].update(user="mallory"), "requests[0].user: 'mallory' is not in users"),
    (lambda d: d["requests"][1].update(path="/nowhere"), "requests[1].path: '/nowhere' is on no tape"),
    (lambda d: d["requests"][2].pop("t"), "requests[2].t: missing"),
    (lambda d: d["requests"][2].update(t="soon"), "requests[2].t: expected a number"),
    (lambda d: d.update(requests=[]), "requests: empty"),
    # Found by a probe: the replay failed later (a submission refusing a path it did not name), its
    # arithmetic overflowed, or it ran for ever.
    (lambda d: d["tapes"][0]["files"][0].__setitem__(0, "/data/a\nb"), "tapes[0].files[0][0] (path): '/data/a\\nb'"),
    (lambda d: d["tapes"][0]["files"][0].__setitem__(0, "/data//a"), "not normalised (as '/data/a')"),
    (lambda d: d["library"].update(read_rate_mb_s=1e-300), "library.read_rate_mb_s: must lie in 0.001..1e6 MB/s"),
    (lambda d: d["library"]["drives"].update({"LTO-8": 1_000_000}), "library.drives.LTO-8: at most 1000"),
]


@pytest.mark.parametrize("change,message", MALFORMED)
def test_it_rejects_a_malformed_workload_naming_the_key(change, message):
    with pytest.raises(WorkloadError) as caught:
        parse(broken(change))
    assert message in str(caught.value)


def test_the_command_rejects_a_malformed_file_naming_the_key(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(broken(lambda d: d["requests"][0].update(user="mallory"))))
    with pytest.raises(CommandError, match=r"requests\[0\]\.user: 'mallory' is not in users"):
        call_command("simulate", str(path), "--baseline", "direct")
    path.write_text(json.dumps(small()))
    with pytest.raises(CommandError, match="--sort: 'BOGUS' is not in CAROUSEL_SORT_POLICIES"):
        call_command("simulate", str(path), "--sort", "BOGUS")
    path.write_text("{not json")
    with pytest.raises(CommandError, match="not JSON"):
        call_command("simulate", str(path))


@pytest.mark.parametrize("args, says", [
    (["--files-per-job", "0"], "files_per_job = 0: Ensure this value is greater than or equal to 1"),
    (["--cycle", "nan"], "cycle_s = nan: Give a finite number"),
    (["--set", "files_per_job=abc"], "files_per_job = 'abc'"),
    (["--set", "min_mount_bytes=-1"], "min_mount_bytes = -1"),
    (["--set", "policy_params=[1]"], "policy parameters must be a JSON object"),
    # argparse said "invalid _setting value" and "invalid _fraction value" (a probe's finding).
    (["--set", "paused=true"], "'paused=true': expected FIELD=VALUE with FIELD one of"),
    (["--mismatch", "1"], "'1': expected a fraction in [0, 1)"),
    (["--mismatch", "x"], "'x': expected a fraction in [0, 1)"),
    (["--report", "/nonexistent/dir/r.json"], "--report /nonexistent/dir/r.json: no directory /nonexistent/dir"),
    (["--plot", "/nonexistent/p.png"], "--plot /nonexistent/p.png: no directory /nonexistent"),
])
def test_the_command_checks_its_options_before_the_replay(db, args, says, monkeypatch):
    """Each failed in the replay's child with a traceback, and a report or plot with nowhere to go
    was lost at the end of the run (15 to 25 minutes on the long workloads); found by a probe."""
    from carousel.management.commands import simulate
    from carousel.sim import replay as replay_module

    # The broker's replay runs in a child process (simulate.py): neither may start.
    monkeypatch.setattr(replay_module, "replay_broker", lambda *a, **k: pytest.fail("the replay ran"))
    monkeypatch.setattr(simulate.subprocess, "run", lambda *a, **k: pytest.fail("the replay's child started"))
    with pytest.raises(CommandError, match=re.escape(says)):
        call_command("simulate", str(WORKLOADS / "bnl-704.json"), *args)


@pytest.mark.parametrize("name", ["bnl-704.json", "pic-lto4-full.json", "pic-lto4-alternate.json",
                                  "pic-lto4-far.json", "storm.json.gz"])
def test_it_reads_every_shipped_workload(name):
    w = load(WORKLOADS / name)
    assert w.requests and lower_bound(w).seconds > 0


@pytest.mark.parametrize("name,measured", [("full", 72.6), ("alternate", 40.8), ("far", 29.2)])
def test_the_lto4_model_reproduces_pics_overall_rates(name, measured):
    # PIC read its files in logical order in one mount: the eradat baseline does exactly that.
    # (The broker reads in the locate model's order, faster than PIC did on scattered files.)
    w = load(WORKLOADS / f"pic-lto4-{name}.json")
    rate = report(w, replay_baseline(w, "eradat"))["throughput_mb_s"]
    assert rate == pytest.approx(measured, rel=0.15)


def test_direct_sends_each_request_alone_and_eradat_one_job_per_tape():
    w = parse(small())
    direct, eradat = replay_baseline(w, "direct"), replay_baseline(w, "eradat")
    assert len(direct.library.jobs) == 18
    # At the start, one job per tape, longest first, files by offset; the late ones alone.
    assert list(eradat.library.jobs)[:3] == ["tape-T0", "tape-T1", "tape-T2"] and len(eradat.library.jobs) == 6
    first = [p for _, job, p, _ in eradat.library.reads if job == "tape-T0"]
    assert first == sorted(first, key=lambda p: w.files[p].offset)


def test_eradat_rao_reads_each_tape_in_the_brokers_order_and_reports_bytes_read():
    w = parse(small())
    rao, eradat = replay_baseline(w, "eradat-rao"), replay_baseline(w, "eradat")
    assert list(rao.library.jobs)[:3] == list(eradat.library.jobs)[:3]  # the same jobs, longest tape first
    for tape in ("T0", "T1", "T2"):
        files = [w.files[f"/data/{tape}/f{i}"] for i in range(5)]
        read = [p for _, job, p, _ in rao.library.reads if job == f"tape-{tape}"]
        assert read == read_order("LTO-8", [(f.path, f.offset, f.size) for f in files])
    assert read != sorted(read, key=lambda p: w.files[p].offset)  # it is not offset order here
    result = report(w, rao)
    assert result["baseline"] == "eradat-rao" and result["files_done"] == 18
    assert result["bytes_read"] == 18 * 2 * GB and result["mismatch"] == 0 and result["mismatch_seed"] is None
    assert result["makespan_s"] < report(w, eradat)["makespan_s"]


def test_a_file_read_twice_counts_twice_in_bytes_read():
    w = parse(small())
    outcome = replay_baseline(w, "direct")
    outcome.library.submit("again", [w.files["/data/T0/f0"]])
    drain(outcome.library)
    assert report(w, outcome)["bytes_read"] == 19 * 2 * GB


def test_baselines_on_a_departed_library_record_it_and_repeat_with_the_seed():
    w = parse(small())
    nominal = report(w, replay_baseline(w, "eradat"))
    once = report(w, replay_baseline(w, "eradat", mismatch=Mismatch(0.3, 5)))
    twice = report(w, replay_baseline(w, "eradat", mismatch=Mismatch(0.3, 5)))
    assert once["mismatch"] == 0.3 and once["mismatch_seed"] == 5
    assert once["makespan_s"] == twice["makespan_s"] != pytest.approx(nominal["makespan_s"], rel=1e-4)
    assert once["lower_bound_s"] == nominal["lower_bound_s"]  # the bound keeps the nominal model


def test_a_departed_library_that_beats_the_nominal_bound_is_reported_not_failed():
    w = parse(small())
    outcome = replay_baseline(w, "direct", mismatch=Mismatch(0.3, 5))
    outcome.library.reads = [(0.0, *read[1:]) for read in outcome.library.reads]
    result = report(w, outcome)
    assert result["beats_nominal_bound"] is True and "beat the nominal lower bound" in result["note"]


def test_the_broker_replays_on_a_departed_library(db):
    w = parse(small())
    result = report(w, replay_broker(w, control={"files_per_job": 4}, mismatch=Mismatch(0.3, 5)))
    assert result["mismatch"] == 0.3 and result["mismatch_seed"] == 5
    assert result["files_done"] == 18 and result["bytes_read"] == 18 * 2 * GB


def test_the_command_passes_the_mismatch_to_the_replay(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small()))
    call_command("simulate", str(path), "--baseline", "eradat-rao", "--mismatch", "0.3", "--mismatch-seed", "4",
                 "--report", str(tmp_path / "r.json"))
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["baseline"] == "eradat-rao" and result["mismatch"] == 0.3 and result["mismatch_seed"] == 4
    with pytest.raises(CommandError, match="needs --mismatch"):
        call_command("simulate", str(path), "--baseline", "eradat", "--mismatch-seed", "4")


def test_the_broker_replays_through_the_real_loop(db):
    w = parse(small())
    outcome = replay_broker(w, control={"files_per_job": 4})
    result = report(w, outcome)
    assert README_KEYS <= set(result)
    assert result["baseline"] is None and result["policy"]["files_per_job"] == 4
    assert result["policy"]["sort"] == Control._meta.get_field("sort_policy").default
    assert result["files_done"] == 18 and result["files_failed"] == 0
    assert result["tapes"] == 4 and result["mounts"] >= 4
    assert result["makespan_s"] >= result["lower_bound_s"]
    assert result["users"]["bob"]["requests"] == 1 and result["users"]["alice"]["wait_max_s"] > 0
    assert set(result["groups"]) == {"production", "analysis"}
    assert RestoreRequest.objects.filter(state="done").count() == 18
    # Bob's cap and the groups' weights came from the workload.
    assert Control.get().files_per_job == 4


def test_the_broker_refuses_a_database_with_requests(db, alice, now):
    restore_submit(user=alice, now=now, paths=["/x"])
    with pytest.raises(ReplayError, match="empty"):
        replay_broker(parse(small()))


def test_a_makespan_below_the_bound_fails_loudly():
    w = parse(small())
    outcome = replay_baseline(w, "direct")
    outcome.library.reads = [(0.0, *read[1:]) for read in outcome.library.reads]
    with pytest.raises(ReplayError, match="below the lower bound"):
        report(w, outcome)


def test_the_command_replays_a_gzipped_baseline_with_report_and_plots(tmp_path):
    path = tmp_path / "small.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump(small(), handle)
    call_command("simulate", str(path), "--baseline", "eradat", "--report", str(tmp_path / "r.json"),
                 "--plot", str(tmp_path / "p.png"))
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["baseline"] == "eradat" and result["files_done"] == 18
    assert (tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    call_command("simulate", str(path), "--baseline", "direct", "--report", str(tmp_path / "r.json"),
                 "--plot", str(tmp_path / "p.svg"))
    assert b"<svg" in (tmp_path / "p.svg").read_bytes()[:500]


def test_the_command_runs_the_broker_in_a_throwaway_database(tmp_path, db):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small()))
    call_command("simulate", str(path), "--sort", "NONE", "--share", "EQUAL", "--report", str(tmp_path / "r.json"))
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["policy"]["sort"] == "NONE" and result["policy"]["share"] == "EQUAL"
    assert result["files_done"] == 18
    # The configured database saw none of it.
    assert not RestoreRequest.objects.exists()


# The live library ---------------------------------------------------------------------------

@pytest.fixture
def wall(monkeypatch, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    clock = [1_000_000.0]
    monkeypatch.setattr(simulated, "wall_clock", lambda: clock[0])
    return clock


def test_the_live_catalogue_is_deterministic_and_keeps_a_directory_together():
    a, b = synthetic_location("/star/run1/a.daq"), synthetic_location("/star/run1/b.daq")
    assert a == synthetic_location("/star/run1/a.daq")
    assert a.tape == b.tape and a.media == "LTO-8" and GB <= a.size <= 5 * GB
    assert a.position + a.size <= 12_000 * GB


def test_the_live_library_follows_the_wall_clock_and_survives_a_restart(wall):
    stager = SimulatedStager(speedup=100, drives={"LTO-8": 2})
    paths = ["/star/run1/a.daq", "/star/run1/b.daq"]
    stager.submit(JobSpec(id="j1", paths=paths))
    assert {s.state for s in stager.poll([JobSpec(id="j1", paths=paths)])["j1"]} == {"staging"}
    wall[0] += 1.0  # 100 simulated seconds: the robot has fetched the tape, the drive is loading
    status = SimulatedStager(speedup=100, drives={"LTO-8": 2}).status()
    assert status["drives"][0]["tape"] == synthetic_location(paths[0]).tape
    assert status["drives"][0]["activity"] in ("load", "locate", "read")
    wall[0] += 60.0
    restarted = SimulatedStager(speedup=100, drives={"LTO-8": 2})
    assert {s.state for s in restarted.poll([JobSpec(id="j1", paths=paths)])["j1"]} == {"done"}
    assert restarted.poll([JobSpec(id="unknown", paths=paths)]) == {}


def test_the_loop_restores_through_the_live_library(wall, settings, alice, now):
    settings.CAROUSEL_STAGERS = {**settings.CAROUSEL_STAGERS,
                                 "simulated": "carousel.stagers.simulated.SimulatedStager"}
    settings.CAROUSEL_STAGER = "simulated"
    settings.CAROUSEL_STAGER_OPTIONS = {"speedup": 1000}
    restore_submit(user=alice, now=now, paths=["/star/run1/a.daq", "/star/run2/b.daq"])
    assert isinstance(plugins.stager(), SimulatedStager)
    assert run_cycle(now=now).submitted == 2
    wall[0] += 10.0  # 10,000 simulated seconds
    run_cycle(now=now + timedelta(seconds=10))
    assert set(RestoreRequest.objects.values_list("state", flat=True)) == {"done"}
    assert [d["activity"] for d in plugins.stager().status()["drives"]] == ["idle"] * 4


def test_a_replay_is_deterministic():
    w = parse(small())
    first, second = replay_baseline(w, "direct"), replay_baseline(w, "direct")
    assert first.library.reads == second.library.reads
    data = copy.deepcopy(small())
    assert parse(data).requests == w.requests


def test_max_mounts_per_tape_day_counts_the_busiest_sliding_day_of_one_tape():
    from carousel.sim.replay import max_mounts_per_day

    day = 86400.0
    log = [(0.0, "A"), (100.0, "A"), (day - 1, "A"), (day, "A"), (day + 50, "B"), (3 * day, "A")]
    assert max_mounts_per_day(log) == 3  # 0, 100, day - 1; or 100, day - 1, day: never four
    assert max_mounts_per_day([]) == 0
    # In the report: direct sends the late files of a tape alone, so a tape is mounted again.
    w = parse(small())
    direct = report(w, replay_baseline(w, "direct"))
    assert 1 <= direct["max_mounts_per_tape_day"] <= direct["mounts"]
    assert direct["mounts_per_tape"] == direct["mounts"] / direct["tapes"]


def test_the_workloads_bounds_are_the_control_rows_and_the_doors():
    """carousel/sim/workload.py keeps its own copies (it is read without Django set up)."""
    from django.conf import settings

    from carousel.models import CONTROL_BOUNDS
    from carousel.sim import workload

    assert workload.MAX_DRIVES == CONTROL_BOUNDS["drives"][1]
    assert workload.MAX_PATH_BYTES == settings.CAROUSEL_MAX_PATH_BYTES
