"""The process's Redis connection pool (latest samples, wake-ups, the cache epochs)."""

from __future__ import annotations

import logging
from functools import cache

import redis
from django.conf import settings
from django.db import transaction
from redis.exceptions import RedisError

log = logging.getLogger("gpuadmin.auth")


@cache
def client() -> redis.Redis:
    """One connection pool per process, to ``REDIS_URL`` (its primary, on Sentinels)."""
    return settings.REDIS_TARGET.client(socket_timeout=2)


def bump_epoch(key: str, what: str) -> None:
    """Make every process look ``what`` up again (their caches read the epoch ``key``): now,
    and once the caller's transaction commits (a lookup between the two could cache the state
    being replaced)."""

    def bump() -> None:
        try:
            client().incr(key)
        except RedisError as exc:
            log.warning(
                "cannot invalidate cached %s (%s): they expire within %s s",
                what,
                exc,
                settings.GPUADMIN_TOKEN_CACHE_S,
            )

    bump()
    transaction.on_commit(bump)
