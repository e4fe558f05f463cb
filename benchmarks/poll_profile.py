"""Where one poll's time goes, in process: the two answers of the load mix (benchmarks/load.py)
through Django's whole request handler (middleware, authentication, throttle, view, rendering).

    python -m carousel.infra.localservices -- .venv/bin/python benchmarks/poll_profile.py

Queues --queued requests (default 100,000) for one user as load.py does, then for each URL:
the SQL statements and cache round trips one answer makes, the mean wall time of --calls
answers, and cProfile's top functions (cumulative) over them. Note: Django's test client keeps
the database connection open between requests (it does not close it at request end), so the
cost of opening a connection per request (CONN_MAX_AGE=0) is not in these figures; load.py
measures it."""
import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import setup_django  # noqa: E402
from load import fill  # noqa: E402

URLS = ["/api/v1/summary/", "/api/v1/requests/?state=queued"]


class CacheCounter:
    """Counts the calls made on the shared cache (each one a round trip to Redis)."""

    def __init__(self, cache):
        self.cache, self.calls = cache, []

    def __enter__(self):
        self.saved = {}
        for name in ("get", "set", "add", "incr", "delete", "get_many", "set_many", "touch"):
            original = getattr(self.cache, name)
            self.saved[name] = original

            def wrapped(*a, _name=name, _original=original, **kw):
                self.calls.append(_name)
                return _original(*a, **kw)
            setattr(self.cache, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, original in self.saved.items():
            setattr(self.cache, name, original)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    setup_django()
    from django.conf import settings
    from django.core.cache import cache
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    settings.ALLOWED_HOSTS = ["*"]
    settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["account"] = "1000000000/minute"
    call_command("migrate", interactive=False, verbosity=0)
    token, _ = fill(args.queued)
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    for url in URLS:
        for _ in range(5):
            assert client.get(url).status_code == 200
        with CaptureQueriesContext(connection) as queries, CacheCounter(cache) as counter:
            r = client.get(url)
        assert r.status_code == 200, r.content[:300]
        print(f"\n== {url}: {len(queries)} SQL statements, {len(counter.calls)} cache calls ({', '.join(counter.calls)}), "
              f"{len(r.content):,} bytes")
        for q in queries:
            print(f"   {q['time']}s  {q['sql'][:160]}")
        start = time.perf_counter()
        for _ in range(args.calls):
            client.get(url)
        print(f"   mean {1000 * (time.perf_counter() - start) / args.calls:.2f} ms per answer (wall, in process)")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            client.get(url)
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue())


if __name__ == "__main__":
    main()
