"""Run one node's part of a Ray application inside its job: the executor starts this script,
as the job's account and in its confinement, in place of the job's command.

On the job's first node it starts a Ray head (``ray start --head --block``) on the ports
gpuadmin chose for the job's attempt, waits until every node of the job has joined, then runs
the job's command, the entrypoint, against it (``RAY_ADDRESS``); its output is the job's log and
its exit status the job's. On the other nodes it starts a worker that joins the head. Ray sees
only the job's GPUs (``CUDA_VISIBLE_DEVICES``, set by the executor) and CPUs (this process's
affinity), keeps its temporary files in ``--temp-dir`` and authenticates with the job's token
(``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN`` in the environment).

At the end it stops only the Ray it started: ``ray start`` runs in a session of its own (so the
job's stop signal, e.g. SIGUSR1 for a checkpoint, reaches the entrypoint and not Ray's daemons)
and dies with this process (``PR_SET_PDEATHSIG``), stopping its daemons as it goes; never
``ray stop``, which stops every Ray of the host. The executor kills whatever the job's cgroup
still holds.

Standard library only: it runs under the interpreter that has Ray, which need not be the
agent's, and must not import gpuadmin.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from types import FrameType

#: The signals a stop may use (gpuadmin's cancel and preemption): each is passed on to the
#: entrypoint's process group, which the executor signals already, and only noted here.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
#: How long ``ray start`` has to stop its daemons after SIGTERM before it is killed.
RAY_STOP_GRACE_S = 20.0
#: The ports a node of the job listens on besides the head's fixed three: free ones, chosen
#: when it starts (Ray's defaults are fixed numbers that two jobs on one host would share).
NODE_PORT_OPTIONS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
)
#: How much of ``ray start``'s log the job's log shows when it fails.
RAY_SAID_BYTES = 4000
_PR_SET_PDEATHSIG = 1

_stop_signal: signal.Signals | None = None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _note_stop)
    ray = _start_ray(args)
    try:
        if not args.head:
            if (code := _wait(ray)) != 0:
                _said_by_ray(args)
            return code
        if not _all_joined(args, ray):
            _said_by_ray(args)
            return 1
        if _stop_signal is not None:
            return 128 + _stop_signal
        return _run_entrypoint(args)
    finally:
        _stop_ray(ray)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ray", required=True, help="the `ray` command")
    parser.add_argument("--temp-dir", required=True)
    parser.add_argument("--head-address", required=True, help="where the head's GCS listens")
    parser.add_argument("--port", type=int, required=True, help="GCS; dashboard +1, client +2")
    parser.add_argument("--node-address", required=True, help="this node's address")
    parser.add_argument("--nodes", type=int, required=True, help="nodes of the job's cluster")
    parser.add_argument("--head", action="store_true", help="start the head and the entrypoint")
    parser.add_argument("--wait-s", type=float, default=120.0, help="for the nodes to join")
    parser.add_argument("entrypoint", nargs="*", help="after --: the job's command (head)")
    return parser


def _note_stop(signum: int, frame: FrameType | None) -> None:
    global _stop_signal
    _stop_signal = signal.Signals(signum)


def _start_ray(args: argparse.Namespace) -> subprocess.Popen[bytes]:
    """``ray start --block`` for this node, in a session of its own that dies with us."""
    gpus = [gpu for gpu in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if gpu]
    ports = free_ports(len(NODE_PORT_OPTIONS))
    command = [
        args.ray, "start", "--block", "--disable-usage-stats",
        f"--node-ip-address={args.node_address}",
        f"--num-gpus={len(gpus)}",
        f"--num-cpus={len(os.sched_getaffinity(0))}",
        f"--temp-dir={args.temp_dir}",
        *(f"{name}={port}" for name, port in zip(NODE_PORT_OPTIONS, ports, strict=True)),
    ]  # fmt: skip
    if memory_mib := os.environ.get("GPUADMIN_HOST_MEMORY_MIB"):
        command.append(f"--memory={int(memory_mib) << 20}")
    if args.head:
        command += [
            "--head", f"--port={args.port}", f"--dashboard-port={args.port + 1}",
            f"--ray-client-server-port={args.port + 2}", "--dashboard-host=0.0.0.0",
            "--include-dashboard=true",
        ]  # fmt: skip
    else:
        _wait_for_head(args)
        command.append(f"--address={args.head_address}:{args.port}")
    _say(f"starting Ray {'head' if args.head else 'worker'} on {args.node_address}")
    with open(_start_log(args), "ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def _start_log(args: argparse.Namespace) -> str:
    """Where ``ray start`` writes what it says (the job's log is the entrypoint's)."""
    return os.path.join(args.temp_dir, "ray-start.log")


def _said_by_ray(args: argparse.Namespace) -> None:
    """The end of ``ray start``'s own words, in the job's log, when it failed."""
    try:
        with open(_start_log(args), "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - RAY_SAID_BYTES))
            said = log.read().decode(errors="replace")
    except OSError:
        return
    _say(f"ray start said (the end of {_start_log(args)}):\n{said}")


def _die_with_parent() -> None:
    """In ``ray start``'s child process: SIGTERM when the launcher dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def free_ports(count: int) -> list[int]:
    """``count`` ports free now (the kernel's choice; another process may take one before
    its user binds it)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _wait_for_head(args: argparse.Namespace) -> None:
    """Until the head's GCS accepts connections (the parts start at about the same time)."""
    deadline = time.monotonic() + args.wait_s
    while _stop_signal is None:
        try:
            socket.create_connection((args.head_address, args.port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                _say(f"the Ray head {args.head_address}:{args.port} did not answer")
                return  # ray start says why it cannot join
            time.sleep(0.5)


def _all_joined(args: argparse.Namespace, ray: subprocess.Popen[bytes]) -> bool:
    """Wait until the cluster shows ``--nodes`` live nodes (the dashboard's state API)."""
    url = f"http://{args.head_address}:{args.port + 1}/api/v0/nodes?limit=10000"
    headers = {}
    if token := os.environ.get("RAY_AUTH_TOKEN"):
        headers["Authorization"] = f"Bearer {token}"
    deadline = time.monotonic() + args.wait_s
    alive = 0
    while _stop_signal is None:
        if ray.poll() is not None:
            _say(f"the Ray head exited ({ray.returncode}) before the job ran")
            return False
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=5) as response:
                nodes = json.load(response)["data"]["result"]["result"]
            alive = sum(node["state"] == "ALIVE" for node in nodes)
        except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
            pass  # not up yet
        if alive >= args.nodes:
            _say(f"Ray cluster up: {alive} nodes; running the entrypoint")
            return True
        if time.monotonic() > deadline:
            _say(f"only {alive} of the job's {args.nodes} Ray nodes joined in {args.wait_s:g} s")
            return False
        time.sleep(0.5)
    return True  # stopped: main() says so


def _run_entrypoint(args: argparse.Namespace) -> int:
    """The job's command against this cluster; its exit status (a signal as the shell's
    128+N)."""
    ray_bin = os.path.dirname(args.ray)
    env = {
        **os.environ,
        "RAY_ADDRESS": f"{args.head_address}:{args.port}",
        # `python` and `ray` in the entrypoint are those of the environment that has Ray.
        "PATH": os.pathsep.join([ray_bin, os.environ.get("PATH", os.defpath)]),
    }
    sys.stdout.flush()
    try:
        entrypoint = subprocess.Popen(args.entrypoint, env=env)
    except OSError as exc:
        _say(f"cannot start {args.entrypoint[0]!r}: {exc}")
        return 127
    code = entrypoint.wait()
    return code if code >= 0 else 128 - code


def _wait(ray: subprocess.Popen[bytes]) -> int:
    """A worker: until its ``ray start`` ends (its head went away) or the job is stopped."""
    while ray.poll() is None and _stop_signal is None:
        time.sleep(0.5)
    return 0 if ray.returncode in (None, 0, -signal.SIGTERM) else 1


def _stop_ray(ray: subprocess.Popen[bytes]) -> None:
    if ray.poll() is None:
        ray.terminate()
        try:
            ray.wait(timeout=RAY_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(ray.pid, signal.SIGKILL)
            ray.wait()


def _say(message: str) -> None:
    print(f"gpuadmin ray: {message}", flush=True)  # noqa: T201 (the job's log)


if __name__ == "__main__":
    sys.exit(main())
