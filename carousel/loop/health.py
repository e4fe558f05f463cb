"""How the loop judges the stager and sizes the work it sends: pure functions over plain data,
so the rules are tested without a database or a stager.

The lesson of BNL's 2017 incident: tens of thousands of requests in flight and immediate
retries turned a few hours of outage into days at a fraction of the rate. So the number of
jobs in flight adapts: halved when failures or stalls rise, grown back one step per healthy
cycle, and restored at once to the last healthy value when an outage or stall ends."""
from dataclasses import dataclass, replace

HEALTHY, STALLED, DOWN = "healthy", "stalled", "down"


@dataclass(frozen=True)
class Health:
    state: str = HEALTHY
    limit: int = 0  # jobs in flight allowed now
    healthy_limit: int = 0  # the limit before the current incident began
    reason: str = ""


@dataclass(frozen=True)
class Observation:
    """What one cycle saw of the stager."""

    reachable: bool = True
    results: int = 0  # files the stager reported finished this cycle (done or failed)
    failures: int = 0  # of which failed
    progressed: bool = False  # any file moved on (staging, done, failed)
    stalled: bool = False  # jobs in flight, and none progressed for the stall time
    error: str = ""


def judge(health, seen, *, ceiling, failure_ratio):
    """The next Health from the current one and this cycle's observation. `ceiling` is K."""
    limit = min(health.limit or ceiling, ceiling)
    healthy_limit = min(health.healthy_limit or limit, ceiling)
    if not seen.reachable or seen.stalled:
        state = DOWN if not seen.reachable else STALLED
        if health.state == HEALTHY:
            healthy_limit = limit  # remembered, to come back at full speed
        reason = seen.error if not seen.reachable else "jobs in flight made no progress"
        return Health(state=state, limit=max(1, limit // 2), healthy_limit=healthy_limit, reason=reason)
    if health.state != HEALTHY:
        # The first healthy answer after an incident: back to the last healthy limit at once.
        return Health(state=HEALTHY, limit=healthy_limit, healthy_limit=healthy_limit)
    if seen.results and seen.failures > failure_ratio * seen.results:
        return Health(state=HEALTHY, limit=max(1, limit // 2), healthy_limit=healthy_limit,
                      reason=f"{seen.failures} of {seen.results} files failed last cycle")
    if seen.progressed:
        limit = min(ceiling, limit + 1)
        return Health(state=HEALTHY, limit=limit, healthy_limit=limit)
    return replace(health, state=HEALTHY, limit=limit, healthy_limit=healthy_limit, reason="")


def projected_disk_use(*, free, total, incoming):
    """The fraction of the stager's disk buffer in use once the bytes already sent arrive;
    None when the stager does not report its buffer."""
    if not total or free is None:
        return None
    return (total - free + incoming) / total
