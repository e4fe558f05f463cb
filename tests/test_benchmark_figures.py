"""The figures docs/benchmarks.md shows for the estimates (benchmarks/all.py): a goal is met
only when every shipped workload's broker replay has its score."""
import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def render_module():
    spec = importlib.util.spec_from_file_location("benchmarks_all", ROOT / "benchmarks" / "all.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def broker(**scores):
    return [{"run": "lower bound", "makespan_s": 1.0}, {"run": "broker TAPEID/GRPW", **scores}]


def test_an_estimate_goal_is_not_met_while_a_workload_has_no_score():
    """A workload whose ranges mostly had no end (width None with requests scored) makes the
    highest width unbounded, not met; one whose broker run failed (no scores) leaves the
    figures without a value ("-"), never met. Both were dropped from the lowest and the
    highest, and the figures said met (a reviewer's finding)."""
    bench = render_module()
    scored = {"a": broker(estimate_coverage_planned=0.95, estimate_width_ratio=0.40, estimate_files_scored=10),
              "b": broker(estimate_coverage_planned=0.92, estimate_width_ratio=0.48, estimate_files_scored=10)}
    lowest = bench.estimates_extreme("estimate_coverage_planned", min)
    widest = bench.estimates_extreme("estimate_width_ratio", max)
    assert lowest(scored) == 0.92 and widest(scored) == 0.48
    unbounded = {**scored, "c": broker(estimate_coverage_planned=0.93, estimate_width_ratio=None,
                                       estimate_files_scored=10)}
    assert widest(unbounded) == math.inf
    figure = next(f for f in bench.BY_NAME["replay"].figures if f.label.startswith("estimates: width"))
    assert figure.met(widest(unbounded)) == "**not met**"
    failed = {**scored, "c": [{"run": "broker TAPEID/GRPW", "error": "the replay failed"}]}
    assert lowest(failed) is None and widest(failed) is None
    assert figure.met(widest(failed)) != "**met**"
    lines = "\n".join(bench.estimates_details(failed))
    assert "| c | the replay failed |" in lines and "| b | 0.920 | - | 0.480 | 10 |" in lines
