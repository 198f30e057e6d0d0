"""The latest live sample of every GPU, kept in Redis (never in PostgreSQL).

Agents publish one hash per node every ``GPUADMIN_SAMPLE_INTERVAL_S``; the dashboard and the
seed-compatible device endpoints read them back in one round trip. A node whose agent stops
publishing simply has no samples once the key expires.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from functools import cache
from typing import Any

import redis
from django.conf import settings

from inventory.nvml.scanner import GpuScan, NodeScan

KEY_PREFIX = "gpuadmin:live:"


@cache
def client() -> redis.Redis:
    """One connection pool per process, to ``REDIS_URL``."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)


def sample(gpu: GpuScan, at: float) -> dict[str, Any]:
    """What the dashboard shows of a GPU right now."""
    facts, metrics = gpu.facts, gpu.metrics
    values: dict[str, Any] = {
        "index": facts.index,
        "memory_total_mib": facts.memory_total_mib,
        "memory_used_mib": facts.memory_used_mib,
        "error_message": facts.error_message,
        "sampled_at": at,
    }
    if metrics is not None:
        values.update(
            utilization_gpu_pct=metrics.utilization_gpu_pct,
            utilization_memory_pct=metrics.utilization_memory_pct,
            temperature_c=metrics.temperature_c,
            power_w=metrics.power_w,
            fan_pct=metrics.fan_pct,
            throttle_reasons=list(metrics.throttle_reasons),
            processes=len(metrics.processes),
        )
    return values


def publish(hostname: str, scan: NodeScan, *, ttl_s: int | None = None) -> None:
    """Replace the node's samples with this scan's (GPUs without a UUID cannot be shown)."""
    at = time.time()
    mapping = {gpu.facts.uuid: json.dumps(sample(gpu, at)) for gpu in scan.gpus if gpu.facts.uuid}
    key = KEY_PREFIX + hostname
    pipe = client().pipeline()
    pipe.delete(key)
    if mapping:
        pipe.hset(key, mapping=mapping)
        pipe.expire(key, ttl_s or settings.GPUADMIN_HEARTBEAT_GRACE_S)
    pipe.execute()


def latest(hostnames: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{hostname: {gpu uuid: sample}}`` for the given nodes, in one round trip."""
    names = list(hostnames)
    pipe = client().pipeline()
    for name in names:
        pipe.hgetall(KEY_PREFIX + name)
    return {
        name: {uuid.decode(): json.loads(raw) for uuid, raw in found.items()}
        for name, found in zip(names, pipe.execute(), strict=True)
    }


def busy_gpu_uuids(hostnames: Iterable[str]) -> set[str]:
    """GPUs of these nodes whose latest sample lists at least one process."""
    return {
        uuid
        for samples in latest(hostnames).values()
        for uuid, values in samples.items()
        if values.get("processes")
    }
