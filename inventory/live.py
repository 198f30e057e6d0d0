"""The latest live sample of every GPU, kept in Redis (never in PostgreSQL).

Agents publish one hash per node every ``GPUADMIN_SAMPLE_INTERVAL_S``; the dashboard and the
seed-compatible device endpoints read them back in one round trip. A node whose agent stops
publishing simply has no samples once the key expires.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from django.conf import settings

from gpuadmin.redis_client import client
from inventory.nvml.scanner import GpuScan, NodeScan

KEY_PREFIX = "gpuadmin:live:"


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


# The UUID this process last saw at each GPU index of each node it published.
_uuid_at: dict[str, dict[int, str]] = {}


def publish(hostname: str, scan: NodeScan, *, ttl_s: int | None = None) -> None:
    """Replace the node's samples with this scan's. A GPU whose queries failed before its
    UUID was read (one that fell off the bus) is published under the UUID last seen at its
    index, so that its NVML error makes it unusable at once; one never seen cannot be shown
    (the scan sent to the catalog names it by index)."""
    at = time.time()
    known = _uuid_at.setdefault(hostname, {})
    known.update((gpu.facts.index, gpu.facts.uuid) for gpu in scan.gpus if gpu.facts.uuid)
    mapping = {
        uuid: json.dumps(sample(gpu, at))
        for gpu in scan.gpus
        if (uuid := gpu.facts.uuid or known.get(gpu.facts.index))
    }
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
