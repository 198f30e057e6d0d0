"""Time the charts' history reads (``health.history``) over a month of rollups.

    .venv/bin/python bench/history.py [--gpus 4000] [--days 30] [--reads 30]

Creates a throwaway database ``gpuadmin_bench_history_<pid>`` on the configured PostgreSQL
server, migrates it and fills ``health_gpurollup`` with ``--days`` days of 1-minute rollups of
``--gpus`` GPUs (one daily partition each, rows written minute by minute for every GPU, as the
rollup task writes them, so one GPU's minutes are spread over the heap as in production), and
``health_fleetrollup`` with the fleet's minutes; then times ``gpu_series`` over 7 days for
``--reads`` GPUs picked at random (each GPU read once: its pages are not yet cached by an
earlier read of it), ``node_series`` for 8 GPUs and ``fleet_series``. Ends with headline lines
``name: value unit``. The fill writes every day's rollups first, which takes most of a run.
``--cluster`` rewrites each day's partition in primary-key order (gpu, minute) once filled, so a
GPU's day lies on about 20 neighbouring pages instead of 1,440 scattered ones.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from common import throwaway_database

DAY = timedelta(days=1)


def fill(gpus: int, days: int, end: datetime, *, cluster: bool) -> None:
    from django.db import connection

    first_day = end - days * DAY
    with connection.cursor() as cursor:
        for number in range(days + 1):
            day = first_day + number * DAY
            started = time.perf_counter()
            cursor.execute(
                f"CREATE TABLE health_gpurollup_bench_{number} PARTITION OF health_gpurollup "
                f"FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + DAY).isoformat()}')"
            )
            # One series ordered by minute then GPU: the heap layout of the minute-by-minute writer.
            cursor.execute(
                """
                INSERT INTO health_gpurollup
                SELECT i %% %(gpus)s + 1, %(day)s + (i / %(gpus)s) * interval '1 minute', 30,
                       u - 5, u, u + 5, 1000, 20000 + u * 100, 40000, 40 + u / 5, 45 + u / 5,
                       50 + u / 5, 100, 100 + u * 3, 500, 18000
                FROM generate_series(0, %(gpus)s * 1440 - 1) i,
                     LATERAL (SELECT (i * 7 + i / %(gpus)s) %% 90 + 5 AS u) v
                WHERE %(day)s + (i / %(gpus)s) * interval '1 minute' < %(end)s
                """,
                {"gpus": gpus, "day": day, "end": end},
            )
            if cluster:  # one GPU's minutes of the day on neighbouring pages
                cursor.execute(
                    f"CLUSTER health_gpurollup_bench_{number} "
                    f"USING health_gpurollup_bench_{number}_pkey"
                )
            print(
                f"  day {number + 1}/{days + 1}: {time.perf_counter() - started:.0f} s", flush=True
            )
        cursor.execute(
            "INSERT INTO health_fleetrollup SELECT m, %s, 50, 1000000, 1500000 "
            "FROM generate_series(%s, %s, interval '1 minute') m",
            [gpus, first_day, end - timedelta(minutes=1)],
        )
        cursor.execute("VACUUM ANALYZE health_gpurollup")
        cursor.execute("VACUUM ANALYZE health_fleetrollup")


def timed_ms(call, *args) -> float:  # noqa: ANN001 - any history read
    started = time.perf_counter()
    call(*args)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--reads", type=int, default=30)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="CLUSTER each day's partition on its primary key (gpu, minute) once written",
    )
    args = parser.parse_args()

    with throwaway_database("gpuadmin_bench_history"):
        from django.db import connection

        from health import history
        from inventory.models import Gpu, Node

        end = datetime.now(UTC).replace(second=0, microsecond=0)
        print(f"filling {args.days} days of rollups for {args.gpus} GPUs ...", flush=True)
        started = time.perf_counter()
        fill(args.gpus, args.days, end, cluster=args.cluster)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM health_gpurollup")
            (rows,) = cursor.fetchone()
            cursor.execute(
                "SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits "
                "WHERE inhparent = 'health_gpurollup'::regclass"
            )
            (size,) = cursor.fetchone()
        print(f"filled {rows:,} rollup rows ({size}) in {time.perf_counter() - started:.0f} s")

        week = (end - 7 * DAY, end)
        picked = random.Random(11).sample(range(1, args.gpus + 1), args.reads)
        first_reads = [timed_ms(history.gpu_series, gpu_id, *week) for gpu_id in picked]
        again = [timed_ms(history.gpu_series, picked[0], *week) for _ in range(10)]
        points = len(history.gpu_series(picked[0], *week)["times"])
        # A node of 8 GPUs: its catalog rows, so node_series finds them.
        node = Node.objects.create(hostname="bench-history-node")
        gpu_ids = picked[:8]
        Gpu.objects.bulk_create(
            Gpu(pk=gpu_id, node=node, index=i, uuid=f"GPU-bench-{gpu_id}", pci_bus_id=f"0:{i}")
            for i, gpu_id in enumerate(gpu_ids)
        )
        node_reads = [timed_ms(history.node_series, node.pk, *week) for _ in range(5)]
        fleet_reads = [timed_ms(history.fleet_series, *week) for _ in range(5)]

        print(f"7-day read of one GPU, first read of each of {args.reads} GPUs:")
        print(f"  median {statistics.median(first_reads):.1f} ms, max {max(first_reads):.1f} ms")
        print(f"gpu_history_7d_ms: {statistics.median(first_reads):.1f} ms")
        print(f"gpu_history_7d_max_ms: {max(first_reads):.1f} ms")
        print(f"gpu_history_7d_repeat_ms: {statistics.median(again):.1f} ms")
        print(f"gpu_history_7d_points: {points} points")
        print(f"node_history_7d_ms: {statistics.median(node_reads):.1f} ms (8 GPUs)")
        print(f"fleet_history_7d_ms: {statistics.median(fleet_reads):.1f} ms")


if __name__ == "__main__":
    main()
