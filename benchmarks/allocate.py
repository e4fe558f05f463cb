"""How long each sharing policy's allocate() takes for 1,000 users in 10 groups (CPU time, best
of 5): the cycle calls it once per cycle. It was a test's timing threshold (10 ms); timings
belong here, where a loaded machine cannot fail the suite.

    .venv/bin/python benchmarks/allocate.py
"""
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.sharing import Equal, Group, GroupLimit, GroupWeighted, UserDemand  # noqa: E402


def demand(rng, users=1000, groups=10):
    wants = [UserDemand(user=u, group=u % groups, pending=rng.randint(0, 3000), room=rng.randint(0, 500))
             for u in range(users)]
    limits = {g: GroupLimit(weight=rng.uniform(0.5, 4), room=rng.randint(0, 2000)) for g in range(groups)}
    return wants, limits


def main():
    results = {}
    for policy in (Equal(), Group(), GroupWeighted()):
        wants, limits = demand(random.Random(1))
        best = float("inf")
        for _ in range(5):
            start = time.process_time()
            policy.allocate(wants, limits, 750)
            best = min(best, time.process_time() - start)
        results[f"{policy.name}_ms"] = round(best * 1000, 3)
        print(f"{policy.name}: {best * 1000:.3f} ms for 1,000 users, 750 slots")
    results["most_ms"] = max(results.values())
    print(json.dumps(results))


if __name__ == "__main__":
    main()
