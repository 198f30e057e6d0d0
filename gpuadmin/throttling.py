"""Per-user rate limits on job submission and token creation, counted in Redis.

A fixed window per user and scope: one ``INCR`` and ``EXPIRE`` in one round trip, atomic
across web processes. Rates are settings (``GPUADMIN_SUBMIT_RATE``, ``GPUADMIN_TOKEN_RATE``);
``None`` is no limit. When Redis cannot be reached requests are let through (fail open) and a
warning is logged at most once a minute per process: a broken limiter must not stop the lab.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from gpuadmin import redis_client

log = logging.getLogger("gpuadmin.throttling")
RATE_SETTINGS = {"submit": "GPUADMIN_SUBMIT_RATE", "token": "GPUADMIN_TOKEN_RATE"}
WARN_EVERY_S = 60.0
_last_warning = float("-inf")


def hit(scope: str, user: User | AnonymousUser) -> float | None:
    """Count one request of ``user`` in ``scope``: ``None`` when allowed, else the seconds
    until the window ends (for ``Retry-After``)."""
    rate: tuple[int, int] | None = getattr(settings, RATE_SETTINGS[scope])
    if rate is None or not user.is_authenticated:
        return None
    limit, period = rate
    now = time.time()
    window = int(now // period)
    # The database's name keeps deployments (and test sessions) sharing one Redis apart.
    key = f"gpuadmin:throttle:{connection.settings_dict['NAME']}:{scope}:{user.pk}:{window}"
    try:
        pipe = redis_client.client().pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, period)
        count = pipe.execute()[0]
    except RedisError as exc:
        _warn_failing_open(scope, exc)
        return None
    if count <= limit:
        return None
    return (window + 1) * period - now


def _warn_failing_open(scope: str, exc: RedisError) -> None:
    global _last_warning
    if time.monotonic() - _last_warning >= WARN_EVERY_S:
        _last_warning = time.monotonic()
        log.warning("rate limit %r not enforced: Redis unreachable (%s)", scope, exc)


def retry_after(wait: float) -> str:
    """``Retry-After`` in whole seconds, never 0."""
    return str(max(1, math.ceil(wait)))


class UserRateThrottle(BaseThrottle):
    """A DRF throttle for ``scope``; DRF answers 429 with ``detail`` and ``Retry-After``."""

    scope = ""

    def allow_request(self, request: Request, view: Any) -> bool:
        self._wait = hit(self.scope, request.user)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait


class SubmitThrottle(UserRateThrottle):
    scope = "submit"


class TokenThrottle(UserRateThrottle):
    scope = "token"
