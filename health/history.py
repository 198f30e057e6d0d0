"""Telemetry history for the charts: a time range of one GPU, one node or the fleet, bucketed
on the database side into at most ~1,000 points, as the arrays uPlot draws.

``gpu_series``, ``node_series`` and ``fleet_series`` answer the history endpoints; where the
data comes from (raw samples or 1-minute rollups) and the payload's fields:
docs/operations/telemetry.md, "Charts and the GPU page".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from health.choices import Severity
from health.models import HealthEvent
from inventory.models import Gpu

RANGES = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
MAX_SPAN = timedelta(days=31)  # the rollups' default retention, and a day to spare
MAX_POINTS = 1100  # 7 days in 10-minute buckets: 1,008 points
# Bucket widths in seconds: the smallest that keeps a range under MAX_POINTS is used.
STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600)
ROLLUP_STEP = 60
MAX_EVENTS = 500  # markers on one chart; the newest are kept


@dataclass(frozen=True)
class Metric:
    name: str
    raw_column: str  # in health_gpusample
    rollup_prefix: str  # health_gpurollup's <prefix>_min / _avg / _max
    divisor: int  # stored unit -> charted unit
    digits: int

    def sql(self, aggregate: str) -> str:
        """``aggregate`` in the charted unit, rounded on the database side."""
        return f"round(({aggregate} / {self.divisor})::numeric, {self.digits})::float8"


METRICS = (
    Metric("utilization", "utilization_gpu_pct", "utilization", 1, 1),
    Metric("memory", "memory_used_mib", "memory_used", 1024, 2),  # MiB -> GiB
    Metric("temperature", "temperature_c", "temperature", 1, 1),
    Metric("power", "power_w", "power", 1, 1),
)
STATS = ("avg", "min", "max")


def bucket_step(span: timedelta) -> int:
    """The bucket width (seconds) for ``span``: the finest that keeps it under MAX_POINTS and
    holds two sampling intervals (so that a bucket of a GPU that reports is never empty)."""
    floor = max(span.total_seconds() / MAX_POINTS, 2 * settings.GPUADMIN_SAMPLE_INTERVAL_S)
    return next((step for step in STEPS if step >= floor), STEPS[-1])


def _floor(moment: datetime, step: int) -> datetime:
    seconds = moment.timestamp()
    return datetime.fromtimestamp(seconds - seconds % step, tz=moment.tzinfo)


def _raw_select(gpu_filter: str) -> str:
    stats = ", ".join(m.sql(f"{stat}({m.raw_column})") for m in METRICS for stat in STATS)
    return (
        "SELECT gpu_id, extract(epoch FROM date_bin(%(step)s, at, 'epoch'))::bigint AS t, "
        f"{stats} FROM health_gpusample WHERE {gpu_filter} "
        "AND at >= %(raw_from)s AND at < %(end)s GROUP BY 1, 2"
    )


def _rollup_select(gpu_filter: str) -> str:
    # avg of the minutes' averages, min of their minimums, max of their maximums
    stats = ", ".join(m.sql(f"{stat}({m.rollup_prefix}_{stat})") for m in METRICS for stat in STATS)
    return (
        "SELECT gpu_id, extract(epoch FROM date_bin(%(step)s, minute, 'epoch'))::bigint AS t, "
        f"{stats} FROM health_gpurollup WHERE {gpu_filter} "
        "AND minute >= %(start)s AND minute < %(cutoff)s GROUP BY 1, 2"
    )


def _gpu_rows(
    gpu_ids: Sequence[int], start: datetime, end: datetime
) -> tuple[int, str, datetime, list[tuple[Any, ...]]]:
    """``(step, source, bucketed start, rows)``; a row is ``(gpu_id, t, avg, min, max, ...)``
    in METRICS order, sorted by time."""
    step = bucket_step(end - start)
    start = _floor(start, step)
    gpu_filter = "gpu_id = ANY(%(gpus)s)"
    params: dict[str, Any] = {
        "gpus": list(gpu_ids),
        "step": timedelta(seconds=step),
        "start": start,
        "end": end,
    }
    raw_from = timezone.now() - timedelta(hours=settings.GPUADMIN_RAW_RETENTION_H)
    with connection.cursor() as cursor:
        if step < ROLLUP_STEP and start >= raw_from:
            source, sql = "raw", _raw_select(gpu_filter)
            params["raw_from"] = start
        else:
            source = "rollup"
            step = max(step, ROLLUP_STEP)
            params["step"] = timedelta(seconds=step)
            start = _floor(start, step)
            params["start"] = start
            # Raw samples take over from the last minute rolled up (in whole buckets).
            cursor.execute(
                "SELECT max(minute) FROM health_gpurollup "
                f"WHERE {gpu_filter} AND minute >= %(start)s AND minute < %(end)s",
                params,
            )
            (last_minute,) = cursor.fetchone()
            cutoff = (
                start
                if last_minute is None
                else _floor(last_minute + timedelta(seconds=ROLLUP_STEP), step)
            )
            params["cutoff"] = cutoff
            params["raw_from"] = max(cutoff, start)
            sql = f"{_rollup_select(gpu_filter)} UNION ALL {_raw_select(gpu_filter)}"
        cursor.execute(f"{sql} ORDER BY 2, 1", params)
        return step, source, start, cursor.fetchall()


def _axis(start: datetime, end: datetime, step: int) -> list[int]:
    """Every bucket's start from ``start`` (bucket-aligned) to ``end``: a bucket without
    samples stays a gap in the chart, where a line drawn across it would show values nobody
    measured (an agent down, a GPU gone)."""
    return list(range(math.floor(start.timestamp()), math.ceil(end.timestamp()), step))


def _column(at: dict[int, tuple[Any, ...]], times: list[int], k: int) -> list[Any]:
    """Column ``k`` of the rows ``at`` each bucket start, ``None`` where there is none."""
    return [row[k] if (row := at.get(t)) is not None else None for t in times]


def _series(
    rows: list[tuple[Any, ...]], labels: dict[int, str], times: list[int], *, bands: bool
) -> list[dict[str, Any]]:
    """Rows ``(gpu_id, t, avg, min, max, ...)`` as a series per (metric, GPU) on ``times``."""
    by_gpu: dict[int, dict[int, tuple[Any, ...]]] = {gpu_id: {} for gpu_id in labels}
    for row in rows:
        by_gpu[row[0]][row[1]] = row
    stats = STATS if bands else STATS[:1]
    return [
        {
            "metric": metric.name,
            "label": label,
            **{stat: _column(by_gpu[gpu_id], times, 2 + 3 * m + s) for s, stat in enumerate(stats)},
        }
        for m, metric in enumerate(METRICS)
        for gpu_id, label in labels.items()
    ]


def _events(
    events: QuerySet[HealthEvent], start: datetime, end: datetime, *, with_gpu: bool
) -> list[dict[str, Any]]:
    rows = events.filter(occurred_at__gte=start, occurred_at__lt=end).select_related("gpu")
    return [
        {
            "at": event.occurred_at.timestamp(),
            "kind": event.kind,
            "label": f"XID {event.xid}" if event.xid is not None else event.get_kind_display(),
            "xid": event.xid,
            "severity": event.severity,
            "message": event.message,
            "gpu": f"GPU {event.gpu.index}" if with_gpu and event.gpu else None,
        }
        for event in reversed(rows.order_by("-occurred_at", "-pk")[:MAX_EVENTS])
    ]


def _payload(
    start: datetime,
    end: datetime,
    step: int,
    source: str,
    times: list[int],
    series: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "start": math.floor(start.timestamp()),
        "end": math.ceil(end.timestamp()),
        "step": step,
        "source": source,
        "times": times,
        "series": series,
        "events": events,
    }


def gpu_series(gpu_id: int, start: datetime, end: datetime) -> dict[str, Any]:
    """One GPU's utilization, memory, temperature and power with min/max bands, and its
    health events."""
    step, source, bucketed, rows = _gpu_rows([gpu_id], start, end)
    times = _axis(bucketed, end, step)
    series = _series(rows, {gpu_id: "GPU"}, times, bands=True)
    events = _events(HealthEvent.objects.filter(gpu_id=gpu_id), start, end, with_gpu=False)
    return _payload(bucketed, end, step, source, times, series, events)


def node_series(node_id: int, start: datetime, end: datetime) -> dict[str, Any]:
    """A node's GPUs, one line each (which GPU sits idle or runs hot is what an admin looks
    for on a node), and the health events of the node and its GPUs."""
    gpus = Gpu.objects.filter(node_id=node_id).present().order_by("index")
    labels = {gpu.pk: f"GPU {gpu.index}" for gpu in gpus.only("pk", "index")}
    step, source, bucketed, rows = _gpu_rows(list(labels), start, end)
    times = _axis(bucketed, end, step)
    series = _series(rows, labels, times, bands=False)
    events = _events(HealthEvent.objects.filter(node_id=node_id), start, end, with_gpu=True)
    return _payload(bucketed, end, step, source, times, series, events)


def fleet_series(start: datetime, end: datetime) -> dict[str, Any]:
    """The fleet's mean utilization (GPUs whose utilization NVML measures), with the band of
    its minutes' lowest and highest means per bucket, and the fleet's critical events."""
    # Only the fleet's own rollup (one row a minute), never raw samples: averaging the raw
    # samples of thousands of GPUs is too slow for a page.
    step = max(bucket_step(end - start), ROLLUP_STEP)
    bucketed = _floor(start, step)
    utilization = METRICS[0]
    stats = ", ".join(utilization.sql(f"{stat}(utilization_avg)") for stat in STATS)
    params: dict[str, Any] = {"step": timedelta(seconds=step), "start": bucketed, "end": end}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM date_bin(%(step)s, minute, 'epoch'))::bigint AS t, "
            f"{stats} "
            "FROM health_fleetrollup WHERE minute >= %(start)s AND minute < %(end)s "
            "GROUP BY 1 ORDER BY 1",
            params,
        )
        at = {row[0]: row for row in cursor.fetchall()}
    times = _axis(bucketed, end, step)
    series = [
        {
            "metric": utilization.name,
            "label": "Fleet",
            **{stat: _column(at, times, 1 + s) for s, stat in enumerate(STATS)},
        }
    ]
    events = _events(
        HealthEvent.objects.filter(severity=Severity.CRITICAL), start, end, with_gpu=False
    )
    return _payload(bucketed, end, step, "rollup", times, series, events)
