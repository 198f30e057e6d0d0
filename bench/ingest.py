"""Telemetry ingest: GPU samples per second the central side absorbs into the history.

    .venv/bin/python bench/ingest.py [--nodes 500] [--seconds 30] [--runs 3] [--senders 4]

Its two phases (capacity, real time), the rollup and storage figures:
docs/development/design-notes.md, "Telemetry ingest: bench/ingest.py".
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import psutil
from common import MODELS, delete_redis_keys, load_sim_fleet, throwaway_database

STREAM = f"bench-samples-{os.getpid()}"
TARGET_SAMPLES_PER_S = 2000
TARGET_CPU_PCT = 50.0
CORES = psutil.cpu_count() or 1


def ingest_process(conn: Connection) -> None:
    """The central side: answers ("drain",) and ("beat", until, interval) with its figures."""
    from django.db import connection

    from health import telemetry

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        conn.send(cursor.fetchone()[0])
    while (command := conn.recv()) is not None:
        if command[0] == "drain":
            started, rows = time.monotonic(), 0
            while written := telemetry.ingest():
                rows += written
            conn.send({"rows": rows, "wall_s": time.monotonic() - started})
        else:
            _, until, interval = command
            rows, runs, longest = 0, 0, 0.0
            while (now := time.time()) < until:
                rows += telemetry.ingest()
                runs += 1
                longest = max(longest, time.time() - now)
                time.sleep(max(0.0, now + interval - time.time()))
            conn.send({"rows": rows, "runs": runs, "longest_run_s": longest})


def sender_process(
    nodes: list[tuple[str, Any]], start: float, until: float, interval: float, conn: Connection
) -> None:
    """An agent per node: publishes its sample once per interval, the nodes spread over it."""
    from inventory import live

    published, behind = 0, 0.0
    for round_number in range(10**9):
        for position, (hostname, scanned) in enumerate(nodes):
            due = start + interval * (round_number + position / len(nodes))
            if due >= until:
                conn.send({"samples": published, "max_behind_s": behind})
                return
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
            behind = max(behind, -wait)
            live.publish(hostname, scanned, ttl_s=60)
            published += len(scanned.gpus)


def cpu_s(processes: list[psutil.Process]) -> float:
    return sum(sum(process.cpu_times()[:2]) for process in processes)


def oldest_unread_age_s(redis: Any) -> float:
    """Seconds since the oldest entry the ingest has not read yet was published (0: none)."""
    groups = redis.xinfo_groups(STREAM)
    last = groups[0]["last-delivered-id"] if groups else b"0-0"
    entries = redis.xrange(STREAM, min=b"(" + last, count=1)
    return time.time() - float(entries[0][1][b"at"]) if entries else 0.0


def run_once(
    args: argparse.Namespace,
    nodes: list[tuple[str, Any]],
    ingest: Connection,
    measured: list[psutil.Process],
    interval: float,
    ingest_interval: float,
) -> dict[str, float]:
    from inventory import live

    redis = live.client()
    figures: dict[str, float] = {}

    # Capacity: a backlog of --backlog-s seconds of the fleet's samples, drained at full speed.
    for _ in range(int(args.backlog_s / interval)):
        for hostname, scanned in nodes:
            live.publish(hostname, scanned, ttl_s=60)
    cpu_before, wall_before = cpu_s(measured), time.monotonic()
    ingest.send(("drain",))
    drained = ingest.recv()
    wall = time.monotonic() - wall_before
    spent = cpu_s(measured) - cpu_before
    figures["capacity_samples_per_s"] = drained["rows"] / drained["wall_s"]
    figures["capacity_cpu_pct"] = 100 * spent / wall / CORES
    figures["samples_per_cpu_s"] = drained["rows"] / spent

    # Real time: the senders publish while the ingest runs on its beat.
    start = time.time() + 1.0
    until = start + args.seconds
    context = multiprocessing.get_context("fork")
    pipes, senders = [], []
    for number in range(args.senders):
        receiver, sender = context.Pipe(duplex=False)
        share = nodes[number :: args.senders]
        process = context.Process(
            target=sender_process,
            args=(share, start + number * interval / len(nodes), until, interval, sender),
        )
        process.start()
        pipes.append(receiver)
        senders.append(process)
    ingest.send(("beat", until, ingest_interval))
    time.sleep(max(0.0, start - time.time()))
    cpu_before, wall_before = cpu_s(measured), time.monotonic()
    senders_cpu = [psutil.Process(process.pid) for process in senders]
    senders_before = cpu_s(senders_cpu)
    psutil.cpu_percent()
    lags = []
    while time.time() < until:
        lags.append(oldest_unread_age_s(redis))
        time.sleep(0.2)
    machine_pct = psutil.cpu_percent()
    senders_spent = cpu_s(senders_cpu) - senders_before
    sent = [pipe.recv() for pipe in pipes]
    beat = ingest.recv()
    wall = time.monotonic() - wall_before
    ingest_spent = cpu_s(measured) - cpu_before
    for process in senders:
        process.join()
    figures["offered_samples_per_s"] = sum(found["samples"] for found in sent) / args.seconds
    figures["senders_max_behind_s"] = max(found["max_behind_s"] for found in sent)
    ingest.send(("drain",))  # what was published after the last beat, as the next beat would
    tail = ingest.recv()
    # Every sample published in the window, absorbed (the last beat's by the drain).
    figures["samples_per_s"] = (beat["rows"] + tail["rows"]) / args.seconds
    figures["cpu_pct"] = 100 * ingest_spent / wall / CORES
    figures["senders_cpu_pct"] = 100 * senders_spent / wall / CORES
    figures["machine_cpu_pct"] = machine_pct
    figures["lag_s_median"] = statistics.median(lags)
    figures["lag_s_max"] = max(lags)
    figures["longest_ingest_run_s"] = beat["longest_run_s"]
    return figures


def storage() -> dict[str, float]:
    """Bytes per raw and per rollup row (table + indexes over rows), after one rollup run."""
    from django.db import connection
    from django.utils import timezone

    from health import telemetry

    started = time.perf_counter()
    minutes = telemetry.rollup(timezone.now() + timedelta(minutes=2))
    rollup_ms = (time.perf_counter() - started) * 1000
    figures: dict[str, float] = {"rollup_ms": rollup_ms, "rollup_minutes": minutes}
    with connection.cursor() as cursor:
        for name, table in (("raw", "health_gpusample"), ("rollup", "health_gpurollup")):
            cursor.execute(
                "SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits "
                "WHERE inhparent = %s::regclass",
                [table],
            )
            (total,) = cursor.fetchone()
            cursor.execute(f"SELECT count(*), avg(pg_column_size(t.*)) FROM {table} t")
            rows, row_bytes = cursor.fetchone()
            figures[f"{name}_rows"] = rows
            figures[f"{name}_bytes_per_row"] = float(total) / rows
            figures[f"{name}_tuple_bytes"] = float(row_bytes)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30, help="real-time phase per run")
    parser.add_argument("--backlog-s", type=float, default=20, help="capacity phase's backlog")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--senders", type=int, default=4)
    args = parser.parse_args()

    os.environ["GPUADMIN_SAMPLE_STREAM"] = STREAM  # read when Django is set up
    os.environ.setdefault("LOG_LEVEL", "warning")
    with throwaway_database("gpuadmin_bench_ingest"):
        from django.conf import settings
        from django.db import connections

        from health import telemetry
        from inventory.nvml.scanner import scan
        from inventory.nvml.sim import SimulatedNvml

        interval = float(settings.GPUADMIN_SAMPLE_INTERVAL_S)
        ingest_interval = float(settings.GPUADMIN_INGEST_INTERVAL_S)
        hostnames = load_sim_fleet(args.nodes)
        nodes = [
            (
                hostname,
                scan(
                    SimulatedNvml.from_model(MODELS[number % len(MODELS)], node_name=hostname),
                    include=("facts", "metrics", "health"),
                ),
            )
            for number, hostname in enumerate(hostnames)
        ]
        gpus = sum(len(scanned.gpus) for _, scanned in nodes)
        connections.close_all()  # the children open their own
        context = multiprocessing.get_context("fork")
        ingest, child_end = context.Pipe()
        child = context.Process(target=ingest_process, args=(child_end,))
        child.start()
        measured = [psutil.Process(child.pid), psutil.Process(ingest.recv())]
        print(
            f"{args.nodes} simulated nodes, {gpus} GPUs, a sample every {interval:.0f} s "
            f"({gpus / interval:.0f} samples/s), ingest every {ingest_interval:.0f} s; "
            f"{args.senders} senders; {CORES} cores "
            f"(load average {os.getloadavg()[0]:.1f})"
        )
        runs = []
        try:
            for number in range(args.runs):
                figures = run_once(args, nodes, ingest, measured, interval, ingest_interval)
                runs.append(figures)
                print(
                    f"run {number + 1}: capacity {figures['capacity_samples_per_s']:,.0f}/s "
                    f"(cpu {figures['capacity_cpu_pct']:.0f}%, "
                    f"{figures['samples_per_cpu_s']:,.0f}/cpu-s), real time "
                    f"{figures['samples_per_s']:,.0f}/s of {figures['offered_samples_per_s']:,.0f}"
                    f" offered, ingest cpu {figures['cpu_pct']:.1f}%, senders cpu "
                    f"{figures['senders_cpu_pct']:.0f}%, "
                    f"machine {figures['machine_cpu_pct']:.0f}%, "
                    f"lag median {figures['lag_s_median']:.2f} s max {figures['lag_s_max']:.2f} s, "
                    f"longest ingest run {figures['longest_ingest_run_s'] * 1000:.0f} ms"
                )
            ingest.send(None)
            child.join()
            stored = storage()
        finally:
            if child.is_alive():
                child.terminate()
            telemetry.client().delete(STREAM, telemetry.stats_key())
            delete_redis_keys(set(hostnames))

    def median(name: str) -> float:
        return statistics.median(run[name] for run in runs)

    demand = TARGET_SAMPLES_PER_S * args.nodes / 500
    # What the whole machine's CPU would absorb, whatever else ran during the capacity phase.
    capacity = median("samples_per_cpu_s") * CORES
    cpu = median("cpu_pct")
    raw_per_hour = 500 * 8 * 3600 / interval
    raw_kept_h = settings.GPUADMIN_RAW_RETENTION_H + 1  # whole hourly partitions are dropped
    rollups_kept = 500 * 8 * 1440 * (settings.GPUADMIN_ROLLUP_RETENTION_D + 1)
    raw_gb = raw_per_hour * raw_kept_h * stored["raw_bytes_per_row"] / 1e9
    rollup_gb = rollups_kept * stored["rollup_bytes_per_row"] / 1e9
    print(
        f"\nrollup of {stored['rollup_minutes']:.0f} minutes: {stored['rollup_ms']:.0f} ms; raw "
        f"{stored['raw_bytes_per_row']:.0f} B/row over {stored['raw_rows']:,.0f} rows (tuple "
        f"{stored['raw_tuple_bytes']:.0f} B), rollup {stored['rollup_bytes_per_row']:.0f} B/row "
        f"over {stored['rollup_rows']:,.0f} rows (tuple {stored['rollup_tuple_bytes']:.0f} B)"
    )
    print(
        f"500 nodes: {raw_per_hour / 1e6:.1f} M raw rows/hour x {raw_kept_h} h = {raw_gb:.1f} GB; "
        f"{500 * 8 * 1440 / 1e6:.2f} M rollup rows/day x "
        f"{settings.GPUADMIN_ROLLUP_RETENTION_D + 1} days = {rollup_gb:.1f} GB"
    )
    print(
        f"target: {demand:,.0f} samples/s in real time with the ingest under "
        f"{TARGET_CPU_PCT:.0f}% of the CPU; medians over {len(runs)} runs\n"
    )
    print(f"samples_per_s: {median('samples_per_s'):.0f} samples/s")
    print(f"capacity_samples_per_s: {median('capacity_samples_per_s'):.0f} samples/s")
    print(f"samples_per_cpu_s: {median('samples_per_cpu_s'):.0f} samples/cpu-s")
    print(f"cpu_pct: {cpu:.1f} %")
    print(f"cpu_spare_pct: {100 - cpu:.1f} %")
    print(f"headroom_ratio: {capacity / demand:.1f} x")
    print(f"lag_s_max: {median('lag_s_max'):.2f} s")
    print(f"storage_500_nodes_gb: {raw_gb + rollup_gb:.1f} GB")


if __name__ == "__main__":
    main()
