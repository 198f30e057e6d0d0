"""Typed readers for settings that come from the environment.

Every reader fails loudly (``ImproperlyConfigured``) on a value it cannot parse, so a typo in a
deployment stops the process at start-up instead of silently falling back to a default.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def env_str(name: str, default: str = "") -> str:
    """A string; ``NAME_FILE`` (a Docker/Kubernetes secret file) wins over ``NAME``."""
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in TRUE_WORDS:
        return True
    if raw in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false, 1/0, yes/no)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum of {minimum}")
    return value


def env_float(
    name: str, default: float, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum of {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum of {maximum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    raw = os.environ.get(name, "").strip().lower() or default
    if raw not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} must be one of: {', '.join(choices)}")
    return raw


RATE_PERIODS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
}


def env_rate(name: str, default: str) -> tuple[int, int] | None:
    """A rate ``N/period`` (period: s, min, hour or day) as ``(N, seconds)``; ``off`` is
    ``None`` (no limit)."""
    raw = os.environ.get(name, "").strip().lower() or default
    if raw == "off":
        return None
    count, _, period = raw.partition("/")
    if not count.isdecimal() or int(count) < 1 or period not in RATE_PERIODS:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a rate: use N/s, N/min, N/hour or N/day (N >= 1), or off"
        )
    return int(count), RATE_PERIODS[period]


def parse_database_url(url: str) -> dict[str, Any]:
    """Turn ``postgresql://user:pass@host:port/name?host=/socket/dir`` into Django's dict.

    Only PostgreSQL is accepted: gpuadmin relies on its constraints, range types and advisory
    locks, so another engine is a configuration error, not a fallback.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ImproperlyConfigured(
            f"DATABASE_URL scheme {parts.scheme!r} is not supported: gpuadmin needs PostgreSQL "
            "(postgresql://user:password@host:5432/dbname)"
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL has no database name (…/dbname)")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    host = query.pop("host", None) or unquote(parts.hostname or "")
    options: dict[str, str] = {}
    if "sslmode" in query:
        options["sslmode"] = query.pop("sslmode")
    if query:
        raise ImproperlyConfigured(f"DATABASE_URL has unknown parameters: {', '.join(query)}")
    return {
        "ENGINE": "gpuadmin.postgres",  # Django's, with a cheaper health check
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }
