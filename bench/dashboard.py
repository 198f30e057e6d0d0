"""Time the fleet dashboard (full page and its HTMX live partial) over a simulated fleet.

    .venv/bin/python bench/dashboard.py [--nodes 500] [--requests 40] [--allocated]

Creates a throwaway database ``gpuadmin_bench_<pid>`` on the configured PostgreSQL server
(DATABASE_URL, or the embedded one when unset), migrates it, loads ``--nodes`` simulated 8-GPU
nodes through ``inventory.services.apply_discovery`` and publishes their live samples with
``inventory.live.publish`` (as an agent does: facts, metrics and health counters), then times
Django test-client requests. The database and the Redis keys are dropped at the end.
``--allocated`` first gives every GPU to a job of its own (the dashboard then names a job and
user on each). Sizes are as served without compression and gzip-compressed (what browsers ask
for). Ends with headline lines ``name: value unit``, each median with its ratio to the target
(full page under 500 ms, live partial under 100 ms at 500 nodes x 8 GPUs: under 1 is met).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

from common import load_sim_fleet, throwaway_database

FULL_TARGET_MS = 500.0
PARTIAL_TARGET_MS = 100.0


def _allocate_every_gpu() -> None:
    """One running job per GPU, written directly (the bench measures reads, not placement)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from inventory.models import Gpu
    from scheduling.models import Allocation, Job, JobState

    owner = get_user_model().objects.create_user("bench-user")
    gpus = list(Gpu.objects.select_related("node"))
    jobs = Job.objects.bulk_create(
        (Job(owner=owner, command=["true"], state=JobState.RUNNING, attempt=1) for _ in gpus),
        batch_size=500,  # PostgreSQL takes at most 65,535 parameters a statement
    )
    now = timezone.now()
    Allocation.objects.bulk_create(
        (
            Allocation(job=job, gpu=gpu, node=gpu.node, attempt=1, allocated_at=now)
            for job, gpu in zip(jobs, gpus, strict=True)
        ),
        batch_size=500,
    )


@dataclasses.dataclass
class Timing:
    """Medians over the requests: wall-clock time, and this process's CPU time (what a busy
    machine does not inflate: PostgreSQL's and Redis's own work is left out)."""

    wall_ms: float
    cpu_ms: float
    size: int


def _median_ms(client, path: str, runs: int, **headers: str) -> Timing:  # noqa: ANN001
    walls, cpus, size = [], [], 0
    for _ in range(runs):
        started, cpu_started = time.perf_counter(), time.process_time()
        response = client.get(path, **headers)
        walls.append((time.perf_counter() - started) * 1000)
        cpus.append((time.process_time() - cpu_started) * 1000)
        if response.status_code != 200:
            sys.exit(f"GET {path} answered {response.status_code}")
        size = len(response.content)
    return Timing(statistics.median(walls), statistics.median(cpus), size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--allocated", action="store_true", help="a job on every GPU")
    args = parser.parse_args()

    hostnames: list[str] = []
    with throwaway_database("gpuadmin_bench"):
        from django.test import Client
        from django.test.utils import setup_test_environment

        from inventory import live
        from inventory.models import Gpu

        try:
            setup_test_environment()
            started = time.perf_counter()
            hostnames = load_sim_fleet(args.nodes, publish_samples=True)
            gpus = Gpu.objects.count()
            elapsed = time.perf_counter() - started
            print(f"loaded {args.nodes} nodes, {gpus} GPUs in {elapsed:.1f} s")
            if args.allocated:
                _allocate_every_gpu()
                print("every GPU given to a job of its own")

            client = Client()
            for _ in range(args.warmup):
                client.get("/fleet/")
                client.get("/fleet/", HTTP_HX_REQUEST="true")
            full = _median_ms(client, "/fleet/", args.requests)
            partial = _median_ms(client, "/fleet/", args.requests, HTTP_HX_REQUEST="true")
            gzipped = _median_ms(
                client, "/fleet/", 1, HTTP_HX_REQUEST="true", HTTP_ACCEPT_ENCODING="gzip"
            )
            print(f"{args.requests} requests each; full page {full.size} bytes")
            print(f"live partial: {partial.wall_ms * 1000 / gpus:.1f} us per GPU")
            print(f"load average while timing: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
            print()
            print(f"dashboard_full_median_ms: {full.wall_ms:.1f} ms")
            print(f"dashboard_full_cpu_median_ms: {full.cpu_ms:.1f} ms")
            print(f"dashboard_full_ratio_to_target: {full.wall_ms / FULL_TARGET_MS:.2f}")
            print(f"dashboard_partial_median_ms: {partial.wall_ms:.1f} ms")
            print(f"dashboard_partial_cpu_median_ms: {partial.cpu_ms:.1f} ms")
            print(f"dashboard_partial_ratio_to_target: {partial.wall_ms / PARTIAL_TARGET_MS:.2f}")
            print(f"dashboard_partial_bytes: {partial.size} bytes")
            print(f"dashboard_partial_gzip_bytes: {gzipped.size} bytes")
        finally:
            if hostnames:
                live.client().delete(*(live.KEY_PREFIX + name for name in hostnames))


if __name__ == "__main__":
    main()
