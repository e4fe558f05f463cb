"""Activities end to end on the simulated library (issue 23): the real loop and the real turn
policy, through carousel/sim/replay.py, on small synthetic workloads."""
import pytest

from carousel.loop.mounts import MOUNTS_AHEAD
from carousel.sim.replay import replay_broker, report
from carousel.sim.workload import WorkloadError, parse
from carousel.tape import GB


def tapes_of(prefix, count, files=3):
    return [{"label": f"{prefix}{t:02d}", "media": "LTO-8", "used_bytes": 11_000 * GB,
             "files": [[f"/{prefix}/T{t}/f{i}", 4 * GB, i * 50 * GB] for i in range(files)]} for t in range(count)]


def workload(*, activities, users, requests, tapes, drives=2):
    return {"format": "carousel-workload/1", "name": "activities", "library": {"drives": {"LTO-8": drives}},
            "groups": {"atlas": {"weight": 1}, "other": {"weight": 1}}, "users": users, "activities": activities,
            "tapes": tapes, "requests": requests}


def every_file(data, prefix):
    return [f[0] for tape in data if tape["label"].startswith(prefix) for f in tape["files"]]


def test_two_activities_of_one_user_get_drive_time_by_their_weights(db):
    tapes = tapes_of("EX", 24) + tapes_of("BK", 24)
    requests = [{"t": 0, "user": "rucio", "path": p, "activity": "Express"} for p in every_file(tapes, "EX")]
    requests += [{"t": 0, "user": "rucio", "path": p, "activity": "Bulk"} for p in every_file(tapes, "BK")]
    w = parse(workload(activities=[{"name": "Express", "group": "atlas", "weight": 3},
                                   {"name": "Bulk", "group": "atlas", "weight": 1}],
                       users={"rucio": {"group": "atlas"}}, requests=requests, tapes=tapes))

    result = report(w, replay_broker(w, control={"files_per_job": 50}))

    assert result["files_failed"] == 0
    shares = result["activities"]
    assert shares["Express"]["share"] == pytest.approx(0.75, rel=0.10)
    assert shares["Bulk"]["share"] == pytest.approx(0.25, rel=0.10)
    assert shares["Express"]["drive_s"] > 0 and shares["Bulk"]["drive_s"] > 0


def test_a_priority_2_activitys_files_go_before_a_priority_0_backlog_of_the_group(db):
    tapes = tapes_of("BK", 30) + tapes_of("UR", 8)
    arrive = 600.0
    requests = [{"t": 0, "user": "bulk", "path": p, "activity": "Bulk"} for p in every_file(tapes, "BK")]
    requests += [{"t": arrive, "user": "express", "path": p, "activity": "Urgent"} for p in every_file(tapes, "UR")]
    w = parse(workload(activities=[{"name": "Urgent", "group": "atlas", "priority": 2, "weight": 1},
                                   {"name": "Bulk", "group": "atlas", "priority": 0, "weight": 1}],
                       users={"bulk": {"group": "atlas"}, "express": {"group": "atlas"}},
                       requests=requests, tapes=tapes))

    # Jobs of 3 files: the urgent user soon has a job's worth in flight, so their mounts are
    # not an analyst's short ones (which go first whatever the activity); a window of 4 jobs:
    # the backlog waits in the broker, where the turns can still put the urgent files first.
    outcome = replay_broker(w, control={"files_per_job": 3, "jobs_in_flight": 4})

    urgent_done = max(r[2] for r in outcome.requests if r[0] == "express")
    bulk_done = max(r[2] for r in outcome.requests if r[0] == "bulk")
    assert urgent_done < bulk_done
    # Once the urgent files are in, the drives mount only their tapes until they are read, but
    # for the mounts the plan had laid out already (MOUNTS_AHEAD: the current and the next one
    # per drive).
    bulk_mounts = [s for s in outcome.library.segments
                   if s.phase == "fetch" and s.tape.startswith("BK") and arrive < s.start < urgent_done]
    assert len(bulk_mounts) <= MOUNTS_AHEAD * sum(w.drives.values())
    urgent_mounts = [s for s in outcome.library.segments if s.phase == "fetch" and s.tape.startswith("UR")]
    assert len(urgent_mounts) == 8


def test_a_workload_without_activities_stays_valid_and_reports_none():
    tapes = tapes_of("EX", 1)
    w = parse({"format": "carousel-workload/1", "name": "old", "library": {"drives": {"LTO-8": 1}},
               "users": {"u": {}}, "tapes": tapes, "requests": [{"t": 0, "user": "u", "path": "/EX/T0/f0"}]})
    assert w.activities == () and w.requests[0].activity == ""


@pytest.mark.parametrize("change, message", [
    (lambda d: d["activities"][0].update(priority=4), "activities[0].priority: expected 0 to 3"),
    (lambda d: d["activities"][0].update(group="nobody"), "activities[0].group: 'nobody' is not in groups"),
    (lambda d: d["activities"][0].update(weight=0), "activities[0].weight: must be greater than 0"),
    (lambda d: d["requests"][0].update(activity=3), "requests[0].activity: expected a name"),
])
def test_it_rejects_a_malformed_activity_naming_the_key(change, message):
    data = workload(activities=[{"name": "Express", "group": "atlas", "weight": 3}], users={"u": {"group": "atlas"}},
                    requests=[{"t": 0, "user": "u", "path": "/EX/T0/f0", "activity": "Express"}],
                    tapes=tapes_of("EX", 1))
    change(data)
    with pytest.raises(WorkloadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(data)
