"""Time the fleet dashboard (full page and its HTMX live partial) over a simulated fleet.

    .venv/bin/python bench/dashboard.py [--nodes 128] [--requests 40]

Creates a throwaway database ``gpuadmin_bench_<pid>`` on the configured PostgreSQL server
(DATABASE_URL, or the embedded one when unset), migrates it, loads ``--nodes`` simulated 8-GPU
nodes through ``inventory.services.apply_discovery`` and publishes their live samples with
``inventory.live.publish``, then times Django test-client requests. The database and the Redis
keys are dropped at the end. Ends with headline lines ``name: value unit``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODELS = ("dgx-a100-40gb", "dgx-h100", "dgx-a100-80gb")


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def _admin_connect(url: str):  # noqa: ANN202 - psycopg connection
    import psycopg

    from gpuadmin.env import parse_database_url

    params = parse_database_url(url)
    return psycopg.connect(
        host=params["HOST"] or None,
        port=params["PORT"] or None,
        user=params["USER"] or None,
        password=params["PASSWORD"] or None,
        dbname=params["NAME"],
        autocommit=True,
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
    args = parser.parse_args()

    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-0123456789-abcdefghijklmnopqrstuv")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
    from gpuadmin.embedded import data_dir_from_env, ensure_service_urls

    services = ensure_service_urls(data_dir_from_env())
    server_url = os.environ["DATABASE_URL"]
    bench_db = f"gpuadmin_bench_{os.getpid()}"
    with _admin_connect(server_url) as admin:
        admin.execute(f'CREATE DATABASE "{bench_db}"')
    os.environ["DATABASE_URL"] = _with_database(server_url, bench_db)
    hostnames: list[str] = []
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.test import Client
        from django.test.utils import setup_test_environment
        from django.utils import timezone

        from inventory import live
        from inventory.models import Node
        from inventory.nvml.scanner import scan
        from inventory.nvml.sim import SimulatedNvml
        from inventory.services import apply_discovery

        setup_test_environment()
        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        for number in range(args.nodes):
            hostname = f"bench-{os.getpid()}-{number:04d}"
            hostnames.append(hostname)
            nvml = SimulatedNvml.from_model(MODELS[number % len(MODELS)], node_name=hostname)
            apply_discovery(hostname, scan(nvml))
            live.publish(hostname, scan(nvml, include=("facts", "metrics")), ttl_s=3600)
        Node.objects.update(last_heartbeat_at=timezone.now() + timezone.timedelta(hours=1))
        from inventory.models import Gpu

        gpus = Gpu.objects.count()
        print(f"loaded {args.nodes} nodes, {gpus} GPUs in {time.perf_counter() - started:.1f} s")

        client = Client()
        for _ in range(args.warmup):
            client.get("/fleet/")
            client.get("/fleet/", HTTP_HX_REQUEST="true")
        full_ms, full_bytes = _median_ms(client, "/fleet/", args.requests)
        partial_ms, partial_bytes = _median_ms(
            client, "/fleet/", args.requests, HTTP_HX_REQUEST="true"
        )
        print(f"{args.requests} requests each; full page {full_bytes} bytes")
        print()
        print(f"dashboard_full_median_ms: {full_ms:.1f} ms")
        print(f"dashboard_partial_median_ms: {partial_ms:.1f} ms")
        print(f"dashboard_partial_bytes: {partial_bytes} bytes")
    finally:
        from django.db import connections

        connections.close_all()
        if hostnames:
            from inventory import live

            live.client().delete(*(live.KEY_PREFIX + name for name in hostnames))
        with _admin_connect(server_url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{bench_db}" WITH (FORCE)')
        if services is not None:
            services.release()


if __name__ == "__main__":
    main()
