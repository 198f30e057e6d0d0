"""API token authentication, with resolved tokens cached per process and invalidated
everywhere through an epoch counter in Redis."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Model
from django.utils import timezone
from redis.exceptions import RedisError
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from gpuadmin import redis_client
from gpuadmin.access.models import ApiToken
from gpuadmin.text import unstorable

log = logging.getLogger("gpuadmin.auth")

# Bumped whenever a token, a user or a role changes: cached tokens from an older epoch are
# looked up again.
AUTH_EPOCH_KEY = "gpuadmin:auth:epoch"
M = TypeVar("M", bound=Model)
# Resolved tokens kept per process (the least recently cached are dropped first).
TOKEN_CACHE_ENTRIES = 4096


def forget_cached_tokens() -> None:
    """Make every process look its cached tokens up again."""
    redis_client.bump_epoch(AUTH_EPOCH_KEY, "API tokens")


def forget_cached_tokens_on_change(sender: type, **kwargs: Any) -> None:
    """``post_save``/``post_delete`` receiver for users, roles and tokens."""
    forget_cached_tokens()


@dataclass(frozen=True)
class CachedToken:
    token: ApiToken  # with its user and the user's role, never handed out itself
    epoch: bytes
    cached_at: float


class TokenCache:
    """Resolved API tokens, per process, so a request does not pay a three-table lookup.

    An entry is used only while the auth epoch in Redis is the one it was cached under (any
    change to a token, a user or a role bumps it, so a revocation takes effect on the next
    request everywhere) and for at most ``GPUADMIN_TOKEN_CACHE_S``, the bound for changes that
    bypass signals (``QuerySet.update``) or a bump lost to a Redis outage. Without Redis every
    lookup goes to the database. Callers get copies: the cached instances are never shared.
    """

    def __init__(self) -> None:
        self._entries: dict[str, CachedToken] = {}
        self._lock = threading.Lock()

    def lookup(self, digest: str) -> ApiToken | None:
        """The unrevoked token with this digest, with its user and role loaded, or None."""
        max_age = settings.GPUADMIN_TOKEN_CACHE_S
        if not max_age:
            return self._load(digest)
        try:
            # Read before the database: a change committed meanwhile bumps past this epoch.
            # redis-py types every command as maybe-awaitable; a sync client returns bytes.
            epoch: bytes = redis_client.client().get(AUTH_EPOCH_KEY) or b"0"  # type: ignore[assignment]
        except RedisError:
            return self._load(digest)
        now = time.monotonic()
        entry = self._entries.get(digest)
        if entry is None or entry.epoch != epoch or now - entry.cached_at >= max_age:
            token = self._load(digest)
            with self._lock:
                self._entries.pop(digest, None)
                if token is None:
                    return None
                if len(self._entries) >= TOKEN_CACHE_ENTRIES:
                    del self._entries[next(iter(self._entries))]
                entry = self._entries[digest] = CachedToken(token, epoch, now)
        duplicate = _copy(entry.token)  # a model's copy has its own state and caches
        duplicate.user = _copy(entry.token.user)
        return duplicate

    def touch(self, digest: str, at: datetime) -> None:
        """Record ``last_used_at`` on the cached token too, so it is not written again soon."""
        entry = self._entries.get(digest)
        if entry is not None:
            entry.token.last_used_at = at

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    @staticmethod
    def _load(digest: str) -> ApiToken | None:
        return (
            ApiToken.objects.select_related("user", "user__gpuadmin_role")
            .filter(digest=digest, revoked_at__isnull=True)
            .first()
        )


def _copy(instance: M) -> M:
    """``copy.copy(instance)``: its own state and caches, without copy's detour through
    pickling (``Model.__reduce__`` looks the class up in the app registry again)."""
    duplicate = object.__new__(type(instance))
    duplicate.__dict__.update(instance.__getstate__())
    return duplicate


TOKENS = TokenCache()


class InvalidToken(Exception):
    """A key that is not a usable API token; the message says why, for the caller."""


def authenticate_key(key: str) -> tuple[User, ApiToken]:
    """The user of the unrevoked API token ``key`` (``gpa_...``) and the token, recording when
    it was last used (at most once a minute); ``InvalidToken`` otherwise. The REST API's
    ``Authorization`` header and the gRPC API's metadata both end here."""
    if not key.startswith(ApiToken.PREFIX):
        raise InvalidToken(
            f"Not an API token: they begin {ApiToken.PREFIX} (gpuadmin token create)."
        )
    digest = ApiToken.hash(key)
    token = TOKENS.lookup(digest)
    if token is None or not token.user.is_active:
        raise InvalidToken("Invalid or revoked API token.")
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        TOKENS.touch(digest, now)
    return token.user, token


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer gpa_...`` (or ``Token gpa_...``)."""

    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if len(header) != 2 or header[0].decode(errors="replace").lower() not in self.keywords:
            return None
        try:
            return authenticate_key(header[1].decode(errors="replace"))
        except InvalidToken as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class BasicAuthentication(authentication.BasicAuthentication):
    """DRF's, refusing a user name PostgreSQL cannot store (a NUL) with its usual 401 instead
    of passing it to the database."""

    def authenticate_credentials(
        self, userid: str, password: str, request: Request | None = None
    ) -> tuple[User, None]:
        if unstorable(userid):
            raise exceptions.AuthenticationFailed("Invalid username/password.")
        return super().authenticate_credentials(userid, password, request)
