"""A central worker (and beat) and one node's agent as real processes, for tests of a job's
whole life and of faults end to end."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from inventory.models import Node
from tests.conftest import REPO_DIR, agent_env, session_database_url
from tests.waiting import wait_for

# How much of each process's log a failing test shows.
LOG_TAIL_CHARS = 6000


@contextmanager
def worker_and_agent(
    gpuadmin_env: dict[str, str],
    hostname: str,
    agent_args: Sequence[str],
    gpus: int,
    logs: Path,
    *,
    beat: bool = False,
    **settings: str,
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A central worker (`gpuadmin worker`), `gpuadmin beat` with ``beat``, and `hostname`'s agent
    (`gpuadmin agent --node hostname *agent_args`) on this session's database, heartbeating
    and sampling every second (`settings` add to their environment or override it), each
    one's output in `logs`/<verb>.log; ready once the node is reachable with its `gpus`
    GPUs; the processes by verb. All are stopped on the way out: a warm shutdown finishes
    the worker's tasks in flight, and one may be waiting on the agent stopped beside it (CI:
    over 30 s), so what outlives a minute is killed."""
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_HEARTBEAT_INTERVAL_S": "1",
        "GPUADMIN_SAMPLE_INTERVAL_S": "1",
        **settings,
    }
    commands = [
        ("worker", "--concurrency", "2"),
        *([("beat",)] if beat else []),
        ("agent", "--node", hostname, *agent_args),
    ]
    processes = {
        args[0]: subprocess.Popen(
            [sys.executable, "-m", "gpuadmin", *args],
            env=agent_env(env, hostname) if args[0] == "agent" else env,
            cwd=REPO_DIR,
            stdout=(logs / f"{args[0]}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for args in commands
    }
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
        yield processes
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
        # What the processes said: pytest shows it with a failure (a fixture's too).
        for args in commands:
            log = logs / f"{args[0]}.log"
            sys.stderr.write(f"--- {log.name}\n{log.read_text()[-LOG_TAIL_CHARS:]}\n")
