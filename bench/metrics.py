"""Time a Prometheus scrape of ``GET /metrics`` over a simulated fleet.

    .venv/bin/python bench/metrics.py [--nodes 500] [--requests 10] [--profile]

Creates a throwaway database ``gpuadmin_bench_<pid>`` on the configured PostgreSQL server
(DATABASE_URL, or the embedded one when unset), migrates it, loads ``--nodes`` simulated 8-GPU
nodes through ``inventory.services.apply_discovery`` and publishes a live sample of every
section (facts, metrics, health: what an agent publishes) with ``inventory.live.publish``,
then times Django test-client scrapes as Prometheus makes them (gzip-compressed; the middleware
compresses). The database and the Redis keys are dropped at the end. Ends with headline lines
``name: value unit``. ``--profile`` prints cProfile's 25 costliest functions of one scrape first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from common import load_sim_fleet, throwaway_database


def _median_ms(client, runs: int, **headers: str) -> tuple[float, int]:  # noqa: ANN001
    timings, size = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get("/metrics", **headers)
        timings.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            sys.exit(f"GET /metrics answered {response.status_code}")
        size = len(response.content)
    return statistics.median(timings), size


def _profile(client) -> None:  # noqa: ANN001
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(client.get, "/metrics")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="cProfile one scrape")
    args = parser.parse_args()

    # Agents' samples also go to the history stream: this run's own, deleted at the end.
    stream = os.environ["GPUADMIN_SAMPLE_STREAM"] = f"gpuadmin:bench-samples-{os.getpid()}"
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
            elapsed = time.perf_counter() - started
            print(f"loaded {args.nodes} nodes, {Gpu.objects.count()} GPUs in {elapsed:.1f} s")

            client = Client()
            client.get("/metrics")  # warm-up
            if args.profile:
                _profile(client)
            scrape_ms, gzip_bytes = _median_ms(client, args.requests, HTTP_ACCEPT_ENCODING="gzip")
            text = client.get("/metrics").content
            samples = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
            print(f"{args.requests} scrapes")
            print()
            print(f"metrics_scrape_median_ms: {scrape_ms:.0f} ms")
            print(f"metrics_samples: {samples}")
            print(f"metrics_bytes: {len(text)} bytes ({gzip_bytes} gzip-compressed)")
        finally:
            redis = live.client()
            if hostnames:
                redis.delete(*(live.KEY_PREFIX + name for name in hostnames))
            redis.delete(stream)


if __name__ == "__main__":
    main()
