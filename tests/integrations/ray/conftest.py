"""One real Ray cluster for the session: a head and a second raylet on 127.0.0.1, each with two
declared GPUs (``--num-gpus``) and two CPUs, on ports of their own (6379 is taken on these
machines). Every process it starts carries a marker in its environment, inherited by the
raylets' workers and the jobs' entrypoints; the teardown kills exactly those (never
``ray stop``, which kills every Ray process of the host)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil
import pytest

from scheduling.agent.ray_launch import NODE_PORT_OPTIONS, free_ports
from tests.conftest import REPO_DIR, missing

MARKER = "GPUADMIN_TEST_RAY_CLUSTER"
START_TIMEOUT_S = 60


def ray_binary() -> str:
    """The ``ray`` command of this environment, installed now (.ci/install-ray) if missing; a
    skip (a failure under CI) only when it cannot be installed."""
    found = Path(sys.executable).with_name("ray")
    if not found.exists():
        install = subprocess.run(
            ["sh", str(REPO_DIR / ".ci" / "install-ray")],
            env={**os.environ, "PYTHON": sys.executable},
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if not found.exists():
            missing(f"ray is not installed and .ci/install-ray failed: {install.stderr[-400:]}")
    return str(found)


def node_ports() -> list[str]:
    """The ports one Ray node listens on besides the head's GCS and dashboard (those a
    gpuadmin Ray application's launcher chooses too)."""
    names = NODE_PORT_OPTIONS
    return [f"{name}={port}" for name, port in zip(names, free_ports(len(names)), strict=True)]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def started_by(token: str, sessions: set[int]) -> list[psutil.Process]:
    """The processes of the ``ray start`` commands' sessions (Ray's own daemons and agents:
    those rename themselves, which overwrites their environment) and those whose environment
    carries the marker (the jobs' entrypoints, which Ray starts in sessions of their own)."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) in sessions or process.environ().get(MARKER) == token:
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
            continue
    return found


@pytest.fixture
def admin(db):  # noqa: ANN001, ANN201 - Django's models load with the database
    from django.contrib.auth.models import User

    return User.objects.create_user("root", is_staff=True)


@pytest.fixture
def cluster(ray_cluster: RayTestCluster, admin):  # noqa: ANN001, ANN201
    """The session's Ray cluster registered (and read) as ``lab``."""
    from integrations.ray import services
    from integrations.ray.models import RayCluster

    return services.save_cluster(RayCluster(name="lab", address=ray_cluster.address), actor=admin)


@dataclass(frozen=True)
class RayTestCluster:
    address: str  # the dashboard's, for gpuadmin


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayTestCluster]:
    ray = ray_binary()
    # Ray's socket paths must stay under 107 characters: a short temporary directory.
    temp_dir = Path(tmp_path_factory.mktemp("ray", numbered=True))
    if len(str(temp_dir)) > 40:
        temp_dir = Path(f"/tmp/gpuadmin-ray-{uuid.uuid4().hex[:8]}")
        temp_dir.mkdir()
    token = uuid.uuid4().hex
    gcs_port, dashboard_port, client_port = free_ports(3)
    env = {**os.environ, MARKER: token, "RAY_USAGE_STATS_ENABLED": "0"}
    # A small object store each (Ray's least): the tests pass no objects, and two test
    # processes (pytest-xdist) may each run a cluster.
    common = [
        "--num-gpus=2", "--num-cpus=2", "--object-store-memory=80000000",
        "--node-ip-address=127.0.0.1", "--block",
    ]  # fmt: skip
    head = [
        ray, "start", "--head", f"--port={gcs_port}", f"--dashboard-port={dashboard_port}",
        "--dashboard-host=127.0.0.1", f"--ray-client-server-port={client_port}",
        f"--temp-dir={temp_dir}", "--include-dashboard=true", *common, *node_ports(),
    ]  # fmt: skip
    worker = [ray, "start", f"--address=127.0.0.1:{gcs_port}", *common, *node_ports()]
    log = (temp_dir / "ray-start.log").open("w")
    started = [start(head, env, log)]
    address = f"http://127.0.0.1:{dashboard_port}"
    cluster = RayTestCluster(address)
    try:
        wait_for_nodes(address, 1, started, temp_dir)
        started.append(start(worker, env, log))
        wait_for_nodes(address, 2, started, temp_dir)
        yield cluster
    finally:
        left = started_by(token, {process.pid for process in started})
        for process in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(left, timeout=10)
        for process in started:
            process.wait(timeout=10)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
        alive = [
            process
            for process in started_by(token, {process.pid for process in started})
            if process.status() != psutil.STATUS_ZOMBIE
        ]
        assert not alive, f"Ray processes left behind: {alive}"


def start(command: list[str], env: dict[str, str], log: IO[str]) -> subprocess.Popen:
    """``ray start --block`` in a session of its own: Ray's daemons stay in that session."""
    return subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_for_nodes(
    address: str, count: int, started: list[subprocess.Popen], temp_dir: Path
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for process in started:
            if process.poll() is not None:
                log = (temp_dir / "ray-start.log").read_text()[-2000:]
                raise RuntimeError(f"ray start exited ({process.returncode}):\n{log}")
        try:
            nodes = get_json(f"{address}/api/v0/nodes")["data"]["result"]["result"]
        except (OSError, KeyError, ValueError):
            nodes = []
        if sum(node["state"] == "ALIVE" for node in nodes) >= count:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the Ray cluster did not show {count} nodes in {START_TIMEOUT_S} s")
