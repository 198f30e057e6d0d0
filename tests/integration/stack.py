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
    env = stack_env(gpuadmin_env, **settings)
    commands = [
        ("worker", "--concurrency", "2"),
        *([("beat",)] if beat else []),
        ("agent", "--node", hostname, *agent_args),
    ]
    processes = {
        args[0]: _start(args, agent_env(env, hostname) if args[0] == "agent" else env, logs)
        for args in commands
    }
    try:
        wait_until_registered(hostname, gpus)
        yield processes
    finally:
        stop_warmly(processes.values())
        # What the processes said: pytest shows it with a failure (a fixture's too).
        for args in commands:
            _show_log(logs / f"{args[0]}.log")


@contextmanager
def node_agent(
    gpuadmin_env: dict[str, str],
    hostname: str,
    agent_args: Sequence[str],
    gpus: int,
    logs: Path,
    **settings: str,
) -> Iterator[subprocess.Popen[bytes]]:
    """One more node's agent beside ``worker_and_agent``'s (another node of a gang), or its
    node's agent started again: as ``worker_and_agent`` starts its agent, its output in
    `logs`/agent-<hostname>.log (appended to), stopped on the way out."""
    env = agent_env(stack_env(gpuadmin_env, **settings), hostname)
    log = logs / f"agent-{hostname}.log"
    process = _start(("agent", "--node", hostname, *agent_args), env, logs, log.name)
    try:
        wait_until_registered(hostname, gpus)
        yield process
    finally:
        stop_warmly([process])
        _show_log(log)


def stack_env(gpuadmin_env: dict[str, str], **settings: str) -> dict[str, str]:
    """The environment of the stack's processes: this session's database, heartbeats and
    samples every second, ``settings`` added or overriding."""
    return {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_HEARTBEAT_INTERVAL_S": "1",
        "GPUADMIN_SAMPLE_INTERVAL_S": "1",
        **settings,
    }


def wait_until_registered(hostname: str, gpus: int) -> None:
    """Until the node is reachable with its ``gpus`` GPUs."""
    wait_for(
        lambda: (
            (node := Node.objects.filter(hostname=hostname).first()) is not None
            and node.is_reachable()
            and node.gpus.count() == gpus
        ),
        90,
        f"the node {hostname} to register",
    )


def _start(
    args: Sequence[str], env: dict[str, str], logs: Path, log_name: str | None = None
) -> subprocess.Popen[bytes]:
    """`gpuadmin ARGS...`, its output appended to `logs`/<log_name> (default <verb>.log)."""
    return subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "gpuadmin", *args],
        env=env,
        cwd=REPO_DIR,
        stdout=(logs / (log_name or f"{args[0]}.log")).open("a"),
        stderr=subprocess.STDOUT,
    )


def _show_log(log: Path) -> None:
    sys.stderr.write(f"--- {log.name}\n{log.read_text()[-LOG_TAIL_CHARS:]}\n")
