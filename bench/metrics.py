"""Time a Prometheus scrape of ``GET /metrics`` over a simulated fleet, and per node.

    .venv/bin/python bench/metrics.py [--nodes 500] [--requests 10] [--profile]

Creates a throwaway database ``gpuadmin_bench_<pid>`` on the configured PostgreSQL server
(DATABASE_URL, or the embedded one when unset), migrates it, loads ``--nodes`` simulated 8-GPU
nodes through ``inventory.services.apply_discovery`` and publishes a live sample of every
section (facts, metrics, health: what an agent publishes) with ``inventory.live.publish``,
then times Django test-client scrapes as Prometheus makes them (gzip-compressed; the middleware
compresses): ``/metrics`` (the whole fleet) ``--requests`` times, and ``/metrics/nodes/<hostname>``
(what a per-node target scrapes) once for each of about ``--requests`` x 10 nodes spread over
the fleet; and, for a ratio under the same load, the old way's work (prometheus-client's text,
gzip level 6) without the HTTP request. Each is timed by the wall clock and by the process's
CPU time (``time.process_time``: the test client serves in this process, so it is the server's
work, less sensitive to other processes on a loaded host); the medians are printed. The database
and the Redis keys are dropped at the end. Ends with headline lines ``name: value unit``.
``--profile`` prints cProfile's 25 costliest functions of one scrape first.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable

from common import load_sim_fleet, throwaway_database

# Main before the text format was written directly (issue 30), this machine, 500 nodes.
BEFORE_MS, BEFORE_BYTES = 2007, 22_708_132


def _timed(work: Callable[[], object]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def _medians(timings: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(t[0] for t in timings), statistics.median(t[1] for t in timings)


def _prometheus_client_ms(runs: int) -> tuple[float, float]:
    """The scrape's work as main did it before issue 30, timed in this run (the same load):
    prometheus-client writing every collector's families, then GZipMiddleware's level 6.
    Median (wall ms, CPU ms)."""
    from django.utils.text import compress_string
    from prometheus_client import generate_latest

    from gpuadmin.metrics import REGISTRY

    return _medians(
        [_timed(lambda: compress_string(generate_latest(REGISTRY))) for _ in range(runs)]
    )


def _median_ms(client, paths: list[str], **headers: str) -> tuple[float, float]:  # noqa: ANN001
    """Median (wall ms, CPU ms) of a GET of each path."""
    timings = []
    for path in paths:
        wall, cpu = time.perf_counter(), time.process_time()
        response = client.get(path, **headers)
        timings.append(((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000))
        if response.status_code != 200:
            sys.exit(f"GET {path} answered {response.status_code}")
    return _medians(timings)


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
            # What start-up built is frozen out of the cycle collector, as gpuadmin/wsgi.py does.
            gc.collect()
            gc.freeze()
            if args.profile:
                _profile(client)
            gzip = {"HTTP_ACCEPT_ENCODING": "gzip"}
            scrape_ms, scrape_cpu_ms = _median_ms(client, ["/metrics"] * args.requests, **gzip)
            gzip_bytes = len(client.get("/metrics", HTTP_ACCEPT_ENCODING="gzip").content)
            text = client.get("/metrics").content
            samples = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
            picked = sorted(hostnames)[:: max(1, len(hostnames) // (args.requests * 10))]
            node_ms, node_cpu_ms = _median_ms(
                client, [f"/metrics/nodes/{name}" for name in picked], **gzip
            )
            node_text = client.get(f"/metrics/nodes/{picked[0]}").content
            old_ms, old_cpu_ms = _prometheus_client_ms(max(3, args.requests // 3))
            load = os.getloadavg()[0]
            print(
                f"{args.requests} fleet scrapes, {len(picked)} node scrapes; "
                f"load average {load:.1f} on {os.cpu_count()} CPUs"
            )
            print()
            print(f"metrics_samples: {samples}")
            print(f"metrics_bytes: {len(text)} bytes ({gzip_bytes} gzip-compressed)")
            print(f"metrics_node_bytes: {len(node_text)} bytes")
            print(
                f"metrics_prometheus_client_median_ms: {old_ms:.0f} ms ({old_cpu_ms:.0f} ms CPU; "
                "the pre-issue-30 text and gzip, this run)"
            )
            before = f"; before issue 30 at 500 nodes: {BEFORE_MS} ms" if args.nodes == 500 else ""
            print(
                f"metrics_scrape_median_ms: {scrape_ms:.0f} ms ({old_ms / scrape_ms:.1f}x faster "
                f"than this run's prometheus-client{before})"
            )
            print(
                f"metrics_scrape_cpu_median_ms: {scrape_cpu_ms:.0f} ms "
                f"({old_cpu_ms / scrape_cpu_ms:.1f}x less than this run's prometheus-client)"
            )
            before = f" (before: {BEFORE_BYTES / 1e6:.1f} MB)" if args.nodes == 500 else ""
            print(f"metrics_scrape_mb: {len(text) / 1e6:.1f} MB{before}")
            print(f"metrics_node_scrape_median_ms: {node_ms:.1f} ms")
            print(f"metrics_node_scrape_cpu_median_ms: {node_cpu_ms:.1f} ms")
        finally:
            redis = live.client()
            if hostnames:
                redis.delete(*(live.KEY_PREFIX + name for name in hostnames))
            redis.delete(stream)


if __name__ == "__main__":
    main()
