"""A central worker (and beat) and one node's agent as real processes, for tests of a job's
whole life and of faults end to end."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from django.db import connection

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
    commands = {
        "worker": (("worker", "--concurrency", "2"), env),
        **({"beat": (("beat",), env)} if beat else {}),
        "agent": (("agent", "--node", hostname, *agent_args), agent_env(env, hostname)),
    }
    with running(commands, logs) as processes:
        wait_until_registered(hostname, gpus)
        yield processes


@contextmanager
def running(
    commands: Mapping[str, tuple[Sequence[str], dict[str, str]]], logs: Path
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """`gpuadmin ARGS...` for each name, on its environment, all started at once, each one's
    output in `logs`/<name>.log; the processes by name. Those still running are stopped on
    the way out (``stop_warmly``; one the test killed is left), and every log is shown."""
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, (args, env) in commands.items():
            processes[name] = _start(args, env, logs, f"{name}.log")
        yield processes
    finally:
        stop_warmly(process for process in processes.values() if process.poll() is None)
        # What the processes said: pytest shows it with a failure (a fixture's too).
        for name in processes:
            _show_log(logs / f"{name}.log")


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


def wait_until_ready(workers: list[subprocess.Popen], logs: list[Path], timeout: float) -> None:
    """Every worker consumes its queue: Celery logs "<name> ready." when it sends worker_ready
    (the shared broker has other sessions' workers, so a ping could be answered by those)."""
    deadline = time.monotonic() + timeout
    while not all(" ready." in log.read_text() for log in logs):
        texts = "\n".join(log.read_text() for log in logs)
        assert all(worker.poll() is None for worker in workers), f"a worker exited:\n{texts}"
        assert time.monotonic() < deadline, f"workers not ready in {timeout} s:\n{texts}"
        time.sleep(0.1)


def wait_until_serving(base: str, server: subprocess.Popen[bytes], timeout: float) -> None:
    """Until `gpuadmin serve` at ``base`` answers its health check."""

    def healthy() -> bool:
        assert server.poll() is None, f"the web server at {base} exited"
        try:
            return urllib.request.urlopen(f"{base}/-/health", timeout=5).status == 200
        except OSError:
            return False

    wait_for(healthy, timeout, f"the web server at {base} to answer")


def submit_over_http(base: str, key: str, body: dict[str, Any]) -> tuple[str, int | None]:
    """``POST /api/v1/jobs/``: the status (``"no answer"`` when none came) and the job's id."""
    request = urllib.request.Request(
        f"{base}/api/v1/jobs/",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(response.status), json.load(response)["id"]
    except urllib.error.HTTPError as exc:
        return str(exc.code), None
    except OSError:
        return "no answer", None


def kill_hard(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process and its children (a worker's pool), as losing its machine does."""
    for child in psutil.Process(process.pid).children(recursive=True):
        child.send_signal(signal.SIGKILL)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def overlapping_allocations() -> list[tuple]:
    """Pairs of allocations of one GPU whose lifetimes overlap (released ones included)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT a.gpu_id, a.job_id, b.job_id FROM scheduling_allocation a
            JOIN scheduling_allocation b ON a.gpu_id = b.gpu_id AND a.id < b.id
            WHERE tstzrange(a.allocated_at, a.released_at)
               && tstzrange(b.allocated_at, b.released_at)
            """
        )
        return cursor.fetchall()


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
