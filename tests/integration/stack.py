"""A central worker (and beat) and one node's agent as real processes, for tests of a job's
whole life and of faults end to end."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from inventory.models import Node
from tests.conftest import REPO_DIR, agent_env, session_database_url
from tests.waiting import wait_for

# How much of each process's log a failing test shows.
LOG_TAIL_CHARS = 6000


def stop_warmly(
    processes: Iterable[subprocess.Popen[Any]], grace_s: float = 60
) -> list[subprocess.Popen[Any]]:
    """SIGTERM: a warm shutdown, which lets a worker's pool processes finish their tasks in
    flight (one waiting on a node's agent stopped beside it, or absent, may wait its whole
    timeout: up to 30 s, longer on a loaded host). Those not ended after ``grace_s`` get
    SIGABRT, their own children first: started with ``-X faulthandler``, each writes where
    its threads were stuck to its log. The processes that had to be aborted."""
    processes = list(processes)
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace_s
    aborted = []
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for child in psutil.Process(process.pid).children(recursive=True):
                child.send_signal(signal.SIGABRT)
            time.sleep(1)  # the children's stacks reach the log first
            process.send_signal(signal.SIGABRT)
            process.wait(timeout=30)
            aborted.append(process)
    return aborted


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
    GPUs; the processes by verb. All are stopped on the way out (``stop_warmly``)."""
    with worker_and_agents(
        gpuadmin_env, [hostname], agent_args, gpus, logs, beat=beat, **settings
    ) as processes:
        yield processes


@contextmanager
def worker_and_agents(
    gpuadmin_env: dict[str, str],
    hostnames: Sequence[str],
    agent_args: Sequence[str],
    gpus: int,
    logs: Path,
    *,
    beat: bool = False,
    **settings: str,
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """``worker_and_agent`` with an agent for each of ``hostnames``, each with ``gpus`` GPUs:
    the first one's process is ``agent``, the others' ``agent-<hostname>``."""
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_HEARTBEAT_INTERVAL_S": "1",
        "GPUADMIN_SAMPLE_INTERVAL_S": "1",
        **settings,
    }
    commands: dict[str, tuple[tuple[str, ...], str | None]] = {
        "worker": (("worker", "--concurrency", "2"), None),
        **({"beat": (("beat",), None)} if beat else {}),
    }
    for rank, hostname in enumerate(hostnames):
        name = "agent" if rank == 0 else f"agent-{hostname}"
        commands[name] = (("agent", "--node", hostname, *agent_args), hostname)
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", "gpuadmin", *args],
            env=env if hostname is None else agent_env(env, hostname),
            cwd=REPO_DIR,
            stdout=(logs / f"{name}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for name, (args, hostname) in commands.items()
    }

    def registered(hostname: str) -> bool:
        node = Node.objects.filter(hostname=hostname).first()
        return node is not None and node.is_reachable() and node.gpus.count() == gpus

    try:
        wait_for(lambda: all(map(registered, hostnames)), 90, "the nodes to register")
        yield processes
    finally:
        stop_warmly(processes.values())
        # What the processes said: pytest shows it with a failure (a fixture's too).
        for name in commands:
            log = logs / f"{name}.log"
            sys.stderr.write(f"--- {log.name}\n{log.read_text()[-LOG_TAIL_CHARS:]}\n")
