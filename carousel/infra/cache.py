"""The shared cache's Redis backend: Django's, with one redis client per connection pool.

Django's RedisCacheClient builds a new redis.Redis for every cache call, and redis-py's
constructor fills a table of some 170 response callbacks each time: on a poll (the token's
look-up, the throttle) that cost more than the loopback round trips themselves. A redis.Redis
is safe to share between threads (it takes a connection from its pool per command) and its
pool reconnects after a fork, so one per pool serves every call of the process."""
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class _ClientPerPool(RedisCacheClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = _ClientPerPool
