"""Per-account throttling of the API, counted in the shared cache (settings.CACHES), so every
gunicorn worker and every door sees the same count.

DRF's own SimpleRateThrottle keeps, per account, a list of the timestamps of its recent
requests and writes the whole list back on every request: at the rates a service account is
allowed (thousands a minute) that is a large read-modify-write per call, and two workers
racing on it lose counts. Here each account has one counter per window, incremented
atomically (Redis INCR), so a request costs one cache round trip whatever the rate: on Redis
(django-redis), INCR and EXPIRE go in one pipeline of its client (Django's cache API would take
two or three: add, then incr); on other caches (the embedded default's file cache), add and
incr through Django's API."""
import logging
import time

from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django_redis import get_redis_connection
from django_redis.cache import RedisCache
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from carousel.infra.outages import outage

log = logging.getLogger(__name__)


class AccountRateThrottle(SimpleRateThrottle):
    """At most `rate` requests per account per window (fixed windows aligned on the clock);
    past it, 429 with Retry-After: the seconds until the window ends."""

    scope = "account"

    def get_rate(self):
        # Read at each request, not at import: the rate is a setting (and tests override it).
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return None  # the API refuses anonymous callers before throttling
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        now = time.time()
        window = int(now // self.duration)
        try:
            count = self.count(f"{self.key}_{window}")
        except Exception as exc:
            if outage(exc) is None:
                raise
            # Redis is down: nothing can be counted, and refusing every call would turn a cache
            # outage into an outage of the doors. Let the call through.
            log.warning("throttle not counted: %s", exc)
            return True
        self.window_end = (window + 1) * self.duration
        self.now = now
        return count <= self.num_requests

    def count(self, key):
        """Adds one to the window's counter and returns it; the counter outlives its window a little."""
        backend = caches[DEFAULT_CACHE_ALIAS]
        if isinstance(backend, RedisCache):
            # The key as the cache API writes it (prefix, version): cache.get() reads it.
            key = backend.make_key(key)
            pipeline = get_redis_connection(DEFAULT_CACHE_ALIAS).pipeline(transaction=False)
            pipeline.incr(key)
            pipeline.expire(key, self.duration + 1)
            return pipeline.execute()[0]
        # add() is a no-op when the counter exists.
        backend.add(key, 0, timeout=self.duration + 1)
        try:
            return backend.incr(key)
        except ValueError:  # expired between add() and incr()
            backend.add(key, 1, timeout=self.duration + 1)
            return 1

    def wait(self):
        return max(1.0, self.window_end - self.now)
