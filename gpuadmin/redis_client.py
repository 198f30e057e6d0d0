"""The process's Redis connection pool (latest samples, wake-ups, the auth epoch)."""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings


@cache
def client() -> redis.Redis:
    """One connection pool per process, to ``REDIS_URL``."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
