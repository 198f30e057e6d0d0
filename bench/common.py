"""What the benchmarks share: a throwaway database on the configured PostgreSQL server, a
simulated fleet loaded into it through the same discovery sync the agents use, and real
``gpuadmin`` processes to wait on."""

from __future__ import annotations

import atexit
import functools
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_DIR))

MODELS = ("dgx-a100-40gb", "dgx-h100", "dgx-a100-80gb")


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` on the same server."""
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def admin_connect(url: str):  # noqa: ANN201 - psycopg connection
    import psycopg

    from gpuadmin.env import parse_database_url

    params = parse_database_url(url)
    return psycopg.connect(
        host=params["HOST"] or None,
        port=params["PORT"] or None,
        user=params["USER"] or None,
        password=params["PASSWORD"] or None,
        dbname=params["NAME"],
        autocommit=True,
    )


@contextmanager
def throwaway_database(prefix: str) -> Iterator[str]:
    """Create ``<prefix>_<pid>`` on the server of DATABASE_URL (the embedded one when unset),
    point DATABASE_URL at it, set Django up and migrate; drop it on the way out. Yields the
    database's URL."""
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-0123456789-abcdefghijklmnopqrstuv")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
    from gpuadmin.embedded import data_dir_from_env, ensure_service_urls

    services = ensure_service_urls(data_dir_from_env())
    server_url = os.environ["DATABASE_URL"]
    name = f"{prefix}_{os.getpid()}"
    with admin_connect(server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = with_database(server_url, name)
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield os.environ["DATABASE_URL"]
    finally:
        from django.db import connections

        connections.close_all()
        with admin_connect(server_url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        os.environ["DATABASE_URL"] = server_url
        if services is not None:
            services.release()


def load_sim_fleet(nodes: int, *, publish_samples: bool = False) -> list[str]:
    """``nodes`` simulated 8-GPU nodes (the models in turn), heartbeating for the next hour,
    each with its credential (as a registered node has: orders are signed for it); with
    ``publish_samples`` their live samples go to Redis too, as their agents publish them
    (every sampled section; delete the keys after). The hostnames."""
    from django.utils import timezone

    from gpuadmin.access.nodes import node_token
    from inventory import live
    from inventory.agent import SAMPLE_SECTIONS
    from inventory.models import Node
    from inventory.nvml.scanner import scan
    from inventory.nvml.sim import SimulatedNvml
    from inventory.services import apply_discovery

    hostnames = []
    for number in range(nodes):
        hostname = f"bench-{os.getpid()}-{number:04d}"
        hostnames.append(hostname)
        nvml = SimulatedNvml.from_model(MODELS[number % len(MODELS)], node_name=hostname)
        apply_discovery(hostname, scan(nvml))
        node_token(hostname, actor_name="bench")
        if publish_samples:
            live.publish(hostname, scan(nvml, include=SAMPLE_SECTIONS), ttl_s=3600)
    Node.objects.update(last_heartbeat_at=timezone.now() + timedelta(hours=1))
    return hostnames


def wait_for(
    condition: Callable[[], object], timeout: float, what: str, *, poll_s: float = 0.02
) -> None:
    """Poll ``condition`` until it holds; a RuntimeError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll_s)


def wait_for_port(port: int, timeout: float, what: str, log: Path | None = None) -> None:
    """Until ``what`` accepts TCP connections on 127.0.0.1:``port``; a RuntimeError naming it,
    the port and ``log``'s tail (where given) after ``timeout``."""

    def accepts() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return False
        return True

    try:
        wait_for(accepts, timeout, f"{what} on port {port}", poll_s=0.1)
    except RuntimeError as error:
        if log is None or not log.exists():
            raise
        raise RuntimeError(f"{error}:\n{log.read_text(errors='replace')[-2000:]}") from None


def start_gpuadmin(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``gpuadmin ARGS`` as a real process of this checkout, its output to ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpuadmin", *args],
        cwd=REPO_DIR,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def delete_redis_keys(names: set[str]) -> None:
    """Every Redis key a run left that is named ``...<name>`` after a ``.`` or ``:`` for one of
    ``names`` (bench queue and host names, ``bench-...``, contain neither): the queues and
    kombu's bindings of them, live samples, the wake key."""
    from inventory import live

    redis = live.client()
    keys = [
        key
        for key in redis.scan_iter(match="*bench-*", count=1000)
        if re.split(r"[.:]", key.decode())[-1] in names
    ]
    for start in range(0, len(keys), 1000):
        redis.delete(*keys[start : start + 1000])


def process_env(database_url: str, scratch: Path, **settings: str) -> dict[str, str]:
    """The environment of the gpuadmin processes a bench starts: its throwaway database, the
    configured Redis, a data folder under ``scratch`` and ``settings``."""
    from django.conf import settings as django_settings

    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": django_settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
        "GPUADMIN_DATA_DIR": str(scratch / "data"),
        "GPUADMIN_CGROUP_ROOT": _cgroup_root(),
        **settings,
    }


@functools.cache
def _cgroup_root() -> str:
    """The agents' job cgroups of this bench run, in a subtree of its own removed at its end
    (as a real agent's jobs, they are confined when the bench runs as root)."""
    from scheduling.agent.isolation.cgroups import host_cgroups, remove_tree

    root = f"gpuadmin-bench-{os.getpid()}"
    atexit.register(remove_tree, host_cgroups("auto", root))
    return root


def start_worker_and_agent(
    env: dict[str, str],
    scratch: Path,
    hostname: str,
    model: str,
    agent_args: tuple[str, ...] = (),
    agent_env: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """A central worker and one simulated node agent (with its credential) as real processes,
    logging to ``scratch``; returns once the agent has registered its node's GPUs."""
    from gpuadmin.access.nodes import node_token
    from gpuadmin.env import node_environment
    from inventory.models import Node

    processes = [
        start_gpuadmin(["worker", "--concurrency", "2"], env, scratch / "worker.log"),
        start_gpuadmin(
            ["agent", "--node", hostname, "--sim", model, *agent_args],
            {  # what a real node gets, as gpuadmin up's agents
                **node_environment(env),
                "GPUADMIN_NODE_TOKEN": node_token(hostname, actor_name="bench"),
                **(agent_env or {}),
            },
            scratch / "agent.log",
        ),
    ]
    try:
        wait_for(
            lambda: (
                (node := Node.objects.filter(hostname=hostname).first()) is not None
                and node.is_reachable()
                and node.gpus.exists()
            ),
            120,
            "the agent to register its node",
        )
    except BaseException:
        stop(processes)
        raise
    return processes


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=60)
