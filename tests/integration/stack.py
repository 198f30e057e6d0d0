"""A central worker and one node's agent as real processes, for tests of a job's whole life."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from inventory.models import Node
from tests.conftest import REPO_DIR, agent_env, session_database_url
from tests.waiting import wait_for


@contextmanager
def worker_and_agent(
    gpuadmin_env: dict[str, str],
    hostname: str,
    agent_args: Sequence[str],
    gpus: int,
    logs: Path,
    **settings: str,
) -> Iterator[None]:
    """A central worker (`gpuadmin worker`) and `hostname`'s agent (`gpuadmin agent --node
    hostname *agent_args`) on this session's database, heartbeating and sampling every second
    (`settings` add to their environment or override it), their output in `logs`/worker.log
    and agent.log; ready once the node is reachable with its `gpus` GPUs. Both are stopped on
    the way out."""
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_HEARTBEAT_INTERVAL_S": "1",
        "GPUADMIN_SAMPLE_INTERVAL_S": "1",
        **settings,
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "gpuadmin", *args],
            env=agent_env(env, hostname) if args[0] == "agent" else env,
            cwd=REPO_DIR,
            stdout=(logs / f"{args[0]}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for args in (
            ("worker", "--concurrency", "2"),
            ("agent", "--node", hostname, *agent_args),
        )
    ]
    try:
        wait_for(
            lambda: (
                (node := Node.objects.filter(hostname=hostname).first()) is not None
                and node.is_reachable()
                and node.gpus.count() == gpus
            ),
            90,
            "the node to register",
        )
        yield
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)
