"""Typed readers for settings that come from the environment, and which of them a node agent
is given.

Every reader fails loudly (``ImproperlyConfigured``) on a value it cannot parse, so a typo in a
deployment stops the process at start-up instead of silently falling back to a default.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import redis
from django.core.exceptions import ImproperlyConfigured
from redis.sentinel import Sentinel

#: Every setting a node agent reads: the broker, its credential, what it scans, how it samples
#: and reports, and how it runs jobs. Never the database or ``SECRET_KEY``: the one list of what
#: a GPU node is given (docs/administration/agents.md; docker-compose's agent service sets
#: some of them), and all that ``gpuadmin up`` gives its demo agents.
NODE_SETTINGS = frozenset(
    {
        "REDIS_URL",
        "GPUADMIN_NODE_NAME",
        "GPUADMIN_NODE_TOKEN",
        "GPUADMIN_NODE_TOKEN_FILE",
        "GPUADMIN_NODE_REPORT_MAX_AGE_S",
        "GPUADMIN_AGENT",
        "GPUADMIN_CENTRAL_QUEUE",
        "GPUADMIN_DATA_DIR",
        "GPUADMIN_NVML",
        "GPUADMIN_SIM_FLEET",
        "GPUADMIN_SIM_MODEL",
        "GPUADMIN_HEARTBEAT_INTERVAL_S",
        "GPUADMIN_RESCAN_INTERVAL_S",
        "GPUADMIN_SAMPLE_INTERVAL_S",
        "GPUADMIN_SAMPLE_STREAM",
        "GPUADMIN_SAMPLE_STREAM_MAX",
        "GPUADMIN_QUERY_FAILURES",
        "GPUADMIN_GPU_RESET",
        "GPUADMIN_JOB_KILL_GRACE_S",
        "GPUADMIN_JOB_LOG_MAX_BYTES",
        "GPUADMIN_JOB_LOG_BACKUPS",
        "GPUADMIN_JOBS_AS_OWNER",
        "GPUADMIN_CONTAINER_RUNTIME",
        "GPUADMIN_CGROUP_VERSION",
        "GPUADMIN_CGROUP_ROOT",
        "GPUADMIN_JOB_PIDS_MAX",
        "GPUADMIN_JOB_EXTRA_DEVICES",
        "GPUADMIN_CONTAINER_CGROUP_PARENT",
        "GPUADMIN_RAY_PYTHON",
        "LOG_LEVEL",
        "TIME_ZONE",
    }
)
#: What any process of the host needs besides (where programs and Python's modules are, whose
#: account it is, locale, time zone, temporary files), by name or name prefix.
PROCESS_VARIABLES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "VIRTUAL_ENV"}
    | {"DJANGO_SETTINGS_MODULE"}
)
PROCESS_PREFIXES = ("LC_", "PYTHON")


def node_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` a node agent is given: :data:`NODE_SETTINGS` (or their
    ``_FILE`` forms) and :data:`PROCESS_VARIABLES`; nothing of the central side's."""
    return {
        name: value
        for name, value in environ.items()
        if name in NODE_SETTINGS
        or name.removesuffix("_FILE") in NODE_SETTINGS
        or name in PROCESS_VARIABLES
        or name.startswith(PROCESS_PREFIXES)
    }


# Where `gpuadmin up` and `gpuadmin serve` listen unless told (--bind, GPUADMIN_BIND).
DEFAULT_BIND = "127.0.0.1:8000"


def split_bind(bind: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[::1]:8000`` for IPv6) as the address and port to listen on; None
    when it is not one."""
    host, sep, port = bind.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not (sep and host and port.isdecimal() and 0 < int(port) < 65536):
        return None
    return host, int(port)


def public_url(bind: str) -> str:
    """The address people reach a web server listening on ``bind`` at, GPUADMIN_PUBLIC_URL's
    default: ``http://HOST:PORT``, the machine's host name for every address (``0.0.0.0``,
    ``::``), IPv6 addresses in brackets."""
    address = split_bind(bind)
    if address is None:
        raise ImproperlyConfigured(f"GPUADMIN_BIND={bind!r} is not HOST:PORT")
    host, port = address
    if host in ("0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def export_public_url(bind: str) -> None:
    """Set GPUADMIN_PUBLIC_URL, unless it is set, to that of ``bind`` (``public_url``), for
    this process's settings and the children it starts (`up`: its worker sends the webhooks
    that link to it)."""
    if not os.environ.get("GPUADMIN_PUBLIC_URL"):
        os.environ["GPUADMIN_PUBLIC_URL"] = public_url(bind)


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


# A portable Unix user name (POSIX's portable file name characters, not starting with '-'),
# at most 32 characters as in Linux's utmp; it only ever reaches ``pwd.getpwnam`` on a node.
UNIX_USERNAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}$"


def env_unix_user(name: str) -> str:
    """A Unix user name (:data:`UNIX_USERNAME_PATTERN`), or ``""`` when unset."""
    raw = env_str(name).strip()
    if raw and not re.fullmatch(UNIX_USERNAME_PATTERN, raw):
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a Unix user name (letters, digits, '.', '_' and '-', not "
            "starting with '.' or '-', at most 32 characters)"
        )
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


SENTINEL_PORT = 26379
# How long a Redis Sentinel may take to answer which server is the primary: a Sentinel that
# does not answer is skipped for the next one (the URL lists several), not waited on.
SENTINEL_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class RedisTarget:
    """The Redis gpuadmin uses (``REDIS_URL``), parsed once for its three users: Celery's
    broker, its result backend, and the processes' own client (latest samples, marks,
    throttles). Either one server (``redis://``, ``rediss://``, ``unix://``: the URL as
    given) or the primary that a set of Redis Sentinels names (``sentinel://``), found again
    through them after a failover."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    username: str = ""
    password: str = ""
    sentinel_password: str = ""

    @property
    def celery_url(self) -> str:
        """Celery's form: the URL itself, or one ``sentinel://`` URL per Sentinel joined by
        ``;`` (kombu and Celery's result backend read the database and the credentials from
        the first)."""
        if not self.sentinels:
            return self.url
        auth = ""
        if self.username or self.password:
            auth = f"{quote(self.username, safe='')}:{quote(self.password, safe='')}@"
        return ";".join(
            f"sentinel://{auth}{_url_host(host)}:{port}/{self.db}" for host, port in self.sentinels
        )

    @property
    def celery_transport_options(self) -> dict[str, Any]:
        """Celery's ``broker_transport_options`` and ``result_backend_transport_options``."""
        if not self.sentinels:
            return {}
        return {"master_name": self.master, "sentinel_kwargs": self._sentinel_kwargs()}

    def client(self, **options: Any) -> redis.Redis:
        """A client (its own connection pool) with ``options`` (``socket_timeout``...); on
        Sentinels, it asks them for the primary on each new connection and again after a
        connection error, so it follows a failover."""
        if not self.sentinels:
            return redis.Redis.from_url(self.url, **options)
        sentinel = Sentinel(self.sentinels, sentinel_kwargs=self._sentinel_kwargs())
        return sentinel.master_for(
            self.master,
            db=self.db,
            username=self.username or None,
            password=self.password or None,
            **options,
        )

    def _sentinel_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "socket_timeout": SENTINEL_TIMEOUT_S,
            "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        }
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        return kwargs


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_redis_url(url: str) -> RedisTarget:
    """``REDIS_URL``: ``redis://[:PASSWORD@]HOST:PORT/DB`` (``rediss://``, ``unix://`` too) or
    ``sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/DB?master=NAME`` (Redis Sentinels,
    port 26379 unless given; ``sentinel_password=`` when the Sentinels ask for one: the
    password before the ``@`` is the Redis servers')."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("redis", "rediss", "unix", "sentinel"):
        raise ImproperlyConfigured(
            f"REDIS_URL scheme {scheme!r} is not supported: use redis://HOST:6379/0, rediss://, "
            "unix:// or sentinel://HOST:26379,HOST:26379/0?master=NAME"
        )
    if scheme != "sentinel":
        return RedisTarget(url)
    location, _, query_string = rest.partition("?")
    netloc, _, path = location.partition("/")
    credentials, _, hosts = netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    query = {key: values[-1] for key, values in parse_qs(query_string).items()}
    master = query.pop("master", "")
    sentinel_password = query.pop("sentinel_password", "")
    if query:
        raise ImproperlyConfigured(f"REDIS_URL has unknown parameters: {', '.join(query)}")
    if not master:
        raise ImproperlyConfigured(
            "REDIS_URL names no primary: add ?master=NAME (the name the Sentinels monitor)"
        )
    path = path.strip("/") or "0"
    if not path.isdecimal():
        raise ImproperlyConfigured(f"REDIS_URL database {path!r} is not a number")
    return RedisTarget(
        url,
        sentinels=tuple(_sentinel_address(item) for item in hosts.split(",")),
        master=master,
        db=int(path),
        username=unquote(username),
        password=unquote(password),
        sentinel_password=sentinel_password,
    )


def _sentinel_address(item: str) -> tuple[str, int]:
    """``HOST[:PORT]`` (``[IPv6]:PORT``) of one Sentinel."""
    parts = urlsplit(f"//{item.strip()}")
    try:
        port = parts.port or SENTINEL_PORT
    except ValueError:
        port = 0
    if not parts.hostname or not port:
        raise ImproperlyConfigured(f"REDIS_URL: {item!r} is not a Sentinel's HOST:PORT")
    return parts.hostname, port
