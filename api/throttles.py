"""Per-account throttling of the API, counted in the shared cache (settings.CACHES), so every
gunicorn worker and every door sees the same count.

DRF's own SimpleRateThrottle keeps, per account, a list of the timestamps of its recent
requests and writes the whole list back on every request: at the rates a service account is
allowed (thousands a minute) that is a large read-modify-write per call, and two workers
racing on it lose counts. Here each account has one counter per window, incremented
atomically (Redis INCR), so a request costs one cache round trip whatever the rate."""
import time

from django.core.cache import cache
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle


class AccountRateThrottle(SimpleRateThrottle):
    """At most `rate` requests per account per window (fixed windows aligned on the clock);
    past it, 429 with Retry-After: the seconds until the window ends."""

    scope = "account"
    cache = cache

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
        key = f"{self.key}_{window}"
        # add() is a no-op when the counter exists; the counter outlives its window a little.
        self.cache.add(key, 0, timeout=self.duration + 1)
        try:
            count = self.cache.incr(key)
        except ValueError:  # expired between add() and incr()
            self.cache.add(key, 1, timeout=self.duration + 1)
            count = 1
        self.window_end = (window + 1) * self.duration
        self.now = now
        return count <= self.num_requests

    def wait(self):
        return max(1.0, self.window_end - self.now)
