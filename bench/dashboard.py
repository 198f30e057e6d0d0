"""Time the fleet dashboard (full page and its HTMX live partial) over a simulated fleet.

    .venv/bin/python bench/dashboard.py [--nodes 128] [--requests 40] [--allocated]

Creates a throwaway database ``gpuadmin_bench_<pid>`` on the configured PostgreSQL server
(DATABASE_URL, or the embedded one when unset), migrates it, loads ``--nodes`` simulated 8-GPU
nodes through ``inventory.services.apply_discovery`` and publishes their live samples with
``inventory.live.publish``, then times Django test-client requests. The database and the Redis
keys are dropped at the end. ``--allocated`` first gives every GPU to a job of its own (the
dashboard then names a job and user on each). Sizes are as served without compression and
gzip-compressed (what browsers ask for). Ends with headline lines ``name: value unit``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import load_sim_fleet, throwaway_database


def _allocate_every_gpu() -> None:
    """One running job per GPU, written directly (the bench measures reads, not placement)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from inventory.models import Gpu
    from scheduling.models import Allocation, Job, JobState

    owner = get_user_model().objects.create_user("bench-user")
    gpus = list(Gpu.objects.select_related("node"))
    jobs = Job.objects.bulk_create(
        Job(owner=owner, command=["true"], state=JobState.RUNNING, attempt=1) for _ in gpus
    )
    now = timezone.now()
    Allocation.objects.bulk_create(
        Allocation(job=job, gpu=gpu, node=gpu.node, attempt=1, allocated_at=now)
        for job, gpu in zip(jobs, gpus, strict=True)
    )


def _median_ms(client, path: str, runs: int, **headers: str) -> tuple[float, int]:  # noqa: ANN001
    timings, size = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(path, **headers)
        timings.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            sys.exit(f"GET {path} answered {response.status_code}")
        size = len(response.content)
    return statistics.median(timings), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
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
            full_ms, full_bytes = _median_ms(client, "/fleet/", args.requests)
            partial_ms, partial_bytes = _median_ms(
                client, "/fleet/", args.requests, HTTP_HX_REQUEST="true"
            )
            _, gzip_bytes = _median_ms(
                client, "/fleet/", 1, HTTP_HX_REQUEST="true", HTTP_ACCEPT_ENCODING="gzip"
            )
            print(f"{args.requests} requests each; full page {full_bytes} bytes")
            print()
            print(f"dashboard_full_median_ms: {full_ms:.1f} ms")
            print(f"dashboard_partial_median_ms: {partial_ms:.1f} ms")
            print(f"dashboard_partial_bytes: {partial_bytes} bytes")
            print(f"dashboard_partial_gzip_bytes: {gzip_bytes} bytes")
        finally:
            if hostnames:
                live.client().delete(*(live.KEY_PREFIX + name for name in hostnames))


if __name__ == "__main__":
    main()
