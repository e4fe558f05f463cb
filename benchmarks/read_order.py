"""How long policies.order.read_order takes to order one tape's files (CPU time, best of 3).

    .venv/bin/python benchmarks/read_order.py
"""
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from carousel.tape import MEDIA  # noqa: E402
from policies.order import read_order  # noqa: E402

GB = 10**9


def scattered(rng, media, n):
    capacity = media.wraps * media.bytes_per_wrap
    offsets = sorted(rng.sample(range(0, capacity - GB, GB // 100), n))
    return [(i, off, int(0.2 * GB)) for i, off in enumerate(offsets)]


def main():
    results = {}
    for n in (100, 1000, 3000):
        files = scattered(random.Random(n), MEDIA["LTO-7"], n)
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            read_order("LTO-7", files)
            best = min(best, time.process_time() - started)
        results[f"{n}_files_ms"] = round(best * 1000, 1)
        print(f"{n:5} files: {best * 1000:.1f} ms")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
