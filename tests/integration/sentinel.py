"""Redis behind Sentinel for the tests: Debian's redis-server as a primary and a replica, and
two redis-sentinel processes, on loopback ports of the test's own (``REDIS_URL=sentinel://...``
names them)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from gpuadmin.env import RedisTarget, parse_redis_url
from tests.conftest import unused_port
from tests.tools import debian_program
from tests.waiting import wait_for

MASTER = "gpuadmin"
PASSWORD = "redis-secret"
SENTINEL_PASSWORD = "sentinel-secret"


def sentinel_binary() -> str:
    return debian_program("redis-sentinel", "install-redis-sentinel")


def sentinel_table(sentinel: redis.Redis, what: str) -> list[dict[str, str]]:
    """``SENTINEL REPLICAS|SENTINELS <master>`` as dicts (redis-py 6.4's own parser of these
    answers fails)."""
    rows = sentinel.execute_command("SENTINEL", what, MASTER)
    return [{row[i].decode(): row[i + 1].decode() for i in range(0, len(row), 2)} for row in rows]


@dataclass
class SentinelRedis:
    """A primary, its replica and two Sentinels; ``url`` is gpuadmin's REDIS_URL for them."""

    url: str
    target: RedisTarget
    servers: dict[int, subprocess.Popen[bytes]]  # by port
    sentinel_ports: list[int]

    def sentinel(self) -> redis.Redis:
        return redis.Redis(port=self.sentinel_ports[0], password=SENTINEL_PASSWORD)

    def primary_port(self) -> int:
        answer = self.sentinel().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        return int(answer[1])

    def server(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=PASSWORD, socket_timeout=2)


@contextmanager
def sentinel_servers(down_after_ms: tuple[int, int] = (1000, 4000)) -> Iterator[SentinelRedis]:
    """A primary, its replica and two Sentinels on loopback ports of their own, started now
    (about a second), killed on the way out: the primary and replica ask for a password, so
    do the Sentinels (another one), as a production setup would. Each Sentinel takes the
    primary for down after its silence of ``down_after_ms`` (short, for a quick failover; a
    test that wants none gives long ones: on a loaded host a Sentinel can miss a second)."""
    binary = sentinel_binary()
    root = Path(tempfile.mkdtemp(prefix="gpuadmin-sentinel-"))
    primary, replica = unused_port(), unused_port()
    sentinel_ports = [unused_port(), unused_port()]
    processes: list[subprocess.Popen[bytes]] = []
    servers: dict[int, subprocess.Popen[bytes]] = {}

    def start(args: list[str], log: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            args, cwd=root, stdout=(root / log).open("w"), stderr=subprocess.STDOUT
        )
        processes.append(process)
        return process

    try:
        for port, extra in ((primary, []), (replica, ["--replicaof", "127.0.0.1", str(primary)])):
            (root / str(port)).mkdir()
            servers[port] = start(
                [
                    "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                    "--dir", str(root / str(port)), "--save", "", "--appendonly", "no",
                    "--requirepass", PASSWORD, "--masterauth", PASSWORD, *extra,
                ],
                f"redis-{port}.log",
            )  # fmt: skip
        down_after = dict(zip(sentinel_ports, down_after_ms, strict=True))
        for port in sentinel_ports:
            conf = root / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {root}\nrequirepass {SENTINEL_PASSWORD}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary} 1\n"
                f"sentinel auth-pass {MASTER} {PASSWORD}\n"
                # The first Sentinel sees the primary down first and asks the other's vote:
                # alike, both would ask at once, split the vote and wait out the failover
                # timeout to try again (10 s more).
                f"sentinel down-after-milliseconds {MASTER} {down_after[port]}\n"
                f"sentinel failover-timeout {MASTER} 5000\n"
                # Sentinels find each other through the primary with this password.
                f"sentinel sentinel-pass {SENTINEL_PASSWORD}\n"
            )
            start([binary, str(conf)], f"sentinel-{port}.log")
        hosts = ",".join(f"127.0.0.1:{port}" for port in sentinel_ports)
        url = (
            f"sentinel://:{PASSWORD}@{hosts}/0?master={MASTER}"
            f"&sentinel_password={SENTINEL_PASSWORD}"
        )
        setup = SentinelRedis(url, parse_redis_url(url), servers, sentinel_ports)

        def ready() -> bool:
            """Both Sentinels see the replica in sync and each other (a failover needs a
            known replica and a vote)."""
            try:
                for port in sentinel_ports:
                    sentinel = redis.Redis(port=port, password=SENTINEL_PASSWORD)
                    replicas = sentinel_table(sentinel, "REPLICAS")
                    if not (
                        replicas
                        and replicas[0]["master-link-status"] == "ok"
                        and len(sentinel_table(sentinel, "SENTINELS")) == 1
                    ):
                        return False
            except redis.RedisError:
                return False
            return True

        wait_for(ready, 30, "the Sentinels to see the replica and each other")
        yield setup
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
