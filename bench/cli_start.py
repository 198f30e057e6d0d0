"""Time ``gpuadmin status`` as a person runs it (a new process each time, through the HTTP API)
against a running ``gpuadmin serve``.

    .venv/bin/python bench/cli_start.py [--runs 30] [--nodes 5] [--url URL --token KEY]

Without ``--url``: creates a throwaway database on the configured PostgreSQL server
(DATABASE_URL, or the embedded one when unset), loads ``--nodes`` simulated 8-GPU nodes (the
demo fleet has 5) with their live samples in Redis, an operator and an API token, and starts
``gpuadmin serve`` (1 worker, 2 threads) on a free port; with ``--url`` and ``--token``, times
the server given. Each run is ``python -m gpuadmin status`` into a pipe, timed from the
process's start to its exit; ``--json``, the command's start alone (``import gpuadmin.cli``)
and the interpreter's own (``python -c pass``) are timed alike for comparison, one of each in
turn per round (a shared host's load weighs on all alike). Ends with headline lines ``name:
value unit``: the median and p90 of ``gpuadmin status`` (wall clock, and its CPU time) and the
median's ratio to the 300 ms target (under 1 is met).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO_DIR, load_sim_fleet, process_env, throwaway_database, wait_for

TARGET_MS = 300.0
COMMANDS = {
    "status": ["-m", "gpuadmin", "status"],
    "status_json": ["-m", "gpuadmin", "status", "--json"],
    "import": ["-c", "import gpuadmin.cli"],  # the command's own start, without the request
    "python": ["-c", "pass"],
}


def time_runs(env: dict[str, str], runs: int) -> dict[str, list[tuple[float, float]]]:
    """(wall-clock, CPU) milliseconds of each run of each command, interleaved. The CPU time
    (the process's user and system time) is what a busy shared host inflates least."""
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, argv in COMMANDS.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, *argv], env=env, cwd=REPO_DIR, capture_output=True, check=False
            )
            wall = (time.perf_counter() - start) * 1000
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
            found[name].append((wall, cpu))
            if done.returncode != 0:
                sys.exit(f"{' '.join(argv)} failed: {done.stderr.decode()}")
    return found


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def report(timed: dict[str, list[tuple[float, float]]]) -> None:
    found = {name: [wall for wall, _ in runs] for name, runs in timed.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in timed.items()}
    for name, values in found.items():
        print(
            f"{name:12} median {statistics.median(values):6.1f} ms  p90 {p90(values):6.1f} ms"
            f"  CPU median {cpu[name]:6.1f} ms"
        )
    print(f"cli_status_cpu_median_ms: {cpu['status']:.1f} ms")
    status = found["status"]
    print(f"cli_status_median_ms: {statistics.median(status):.1f} ms")
    print(f"cli_status_p90_ms: {p90(status):.1f} ms")
    print(f"cli_status_json_median_ms: {statistics.median(found['status_json']):.1f} ms")
    print(f"cli_import_median_ms: {statistics.median(found['import']):.1f} ms")
    print(f"python_start_median_ms: {statistics.median(found['python']):.1f} ms")
    print(f"cli_status_ratio_to_target: {statistics.median(status) / TARGET_MS:.2f}")


def client_env(url: str, token: str) -> dict[str, str]:
    """What a person's shell has: the server and token, nothing of the server's own."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")
    }
    return {**env, "GPUADMIN_URL": url, "GPUADMIN_TOKEN": token, "PYTHONPATH": str(REPO_DIR)}


def with_own_server(args: argparse.Namespace) -> None:
    with throwaway_database("gpuadmin_bench_cli") as database:
        from django.contrib.auth import get_user_model

        from gpuadmin.access.models import Membership, Role
        from gpuadmin.access.services import create_token
        from inventory import live

        hostnames = load_sim_fleet(args.nodes, publish_samples=True)
        user = get_user_model().objects.create_user("bench-ops")
        Membership.objects.create(user=user, role=Role.OPERATOR)
        _, token = create_token(user, "bench")
        port = free_port()
        scratch = Path(tempfile.mkdtemp(prefix="gpuadmin-bench-cli-"))
        server = subprocess.Popen(
            [sys.executable, "-m", "gpuadmin", "serve", "--bind", f"127.0.0.1:{port}"]
            + ["--workers", "1", "--threads", "2"],
            cwd=REPO_DIR,
            env=process_env(database, scratch, LOG_LEVEL="warning"),
            stdout=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            env = client_env(url, token)
            probe = [sys.executable, "-m", "gpuadmin", "status"]

            def answers() -> bool:
                return subprocess.run(probe, env=env, capture_output=True).returncode == 0

            wait_for(answers, 60, "gpuadmin serve", poll_s=0.5)
            print(f"{args.nodes} nodes ({args.nodes * 8} GPUs), {args.runs} runs each")
            report(time_runs(env, args.runs))
        finally:
            server.terminate()
            server.wait(timeout=30)
            live.client().delete(*(live.KEY_PREFIX + name for name in hostnames))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=5, help="simulated 8-GPU nodes (default 5)")
    parser.add_argument("--url", help="time this running server instead (with --token)")
    parser.add_argument("--token", help="an API token of that server")
    args = parser.parse_args()
    if args.url:
        if not args.token:
            parser.error("--url needs --token")
        report(time_runs(client_env(args.url, args.token), args.runs))
        return
    with_own_server(args)


if __name__ == "__main__":
    main()
