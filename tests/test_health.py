"""The stager's health and the adaptive jobs-in-flight limit, as pure rules (carousel/loop/health.py)."""
from carousel.loop.health import DOWN, HEALTHY, STALLED, Health, Observation, judge, projected_disk_use

K = 16


def step(health, seen):
    return judge(health, seen, ceiling=K, failure_ratio=0.5)


def test_it_starts_at_k():
    assert step(Health(), Observation()).limit == K


def test_an_outage_halves_the_limit_and_remembers_the_healthy_one():
    h = step(Health(limit=12, healthy_limit=12), Observation(reachable=False, error="connection refused"))
    assert (h.state, h.limit, h.healthy_limit) == (DOWN, 6, 12)
    assert "connection refused" in h.reason
    h = step(h, Observation(reachable=False))
    assert (h.state, h.limit, h.healthy_limit) == (DOWN, 3, 12)


def test_the_first_healthy_answer_restores_the_last_healthy_limit_at_once():
    h = Health(state=DOWN, limit=1, healthy_limit=12)
    h = step(h, Observation(progressed=True))
    assert (h.state, h.limit) == (HEALTHY, 12)


def test_a_stall_halves_and_recovery_restores():
    h = step(Health(limit=8, healthy_limit=8), Observation(stalled=True))
    assert (h.state, h.limit) == (STALLED, 4)
    assert step(h, Observation(progressed=True)).limit == 8


def test_failures_above_the_ratio_halve_without_changing_the_healthy_limit():
    h = step(Health(limit=10, healthy_limit=10), Observation(results=10, failures=6, progressed=True))
    assert (h.state, h.limit, h.healthy_limit) == (HEALTHY, 5, 10)
    assert "6 of 10" in h.reason


def test_healthy_progress_grows_the_limit_one_step_per_cycle_up_to_k():
    h = Health(limit=K - 2, healthy_limit=K - 2)
    limits = []
    for _ in range(4):
        h = step(h, Observation(results=5, progressed=True))
        limits.append(h.limit)
    assert limits == [K - 1, K, K, K]


def test_the_limit_never_falls_below_one():
    h = Health(limit=1, healthy_limit=1)
    for _ in range(5):
        h = step(h, Observation(reachable=False))
    assert h.limit == 1


def test_a_lowered_k_caps_the_limit_at_once():
    assert step(Health(limit=40, healthy_limit=40), Observation(progressed=True)).limit == K


def test_projected_disk_use_counts_what_is_on_its_way():
    assert projected_disk_use(free=40, total=100, incoming=30) == 0.9
    assert projected_disk_use(free=None, total=None, incoming=30) is None
