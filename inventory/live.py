"""The latest live sample of every GPU, kept in Redis (never in PostgreSQL).

Agents publish one hash per node every ``GPUADMIN_SAMPLE_INTERVAL_S``; the dashboard and the
seed-compatible device endpoints read them back in one round trip. A node whose agent stops
publishing simply has no samples once the key expires.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

import orjson
from django.conf import settings

from gpuadmin.redis_client import client
from inventory.nvml.scanner import GpuScan, NodeScan

KEY_PREFIX = "gpuadmin:live:"
# The field of a node's hash that holds its GPUs' samples cut to ``LOOP_FIELDS``, as one JSON
# object by GPU UUID (no GPU's UUID is this name): what the placement loop reads every pass.
LOOP_FIELD = "loop"
# What the placement loop reads of a sample: the memory used (its free memory) and what
# ``inventory.usability.sample_unusable`` reads.
LOOP_FIELDS = ("memory_used_mib", "error_message", "processes")


class MigDeviceSample(TypedDict):
    """One MIG device of a sample (``scanner.MigDeviceMetrics``)."""

    gi_id: int
    ci_id: int
    uuid: str | None
    profile: str | None
    memory_used_mib: int | None
    memory_total_mib: int | None


class _Facts(TypedDict):
    """From the scan's facts, in every sample."""

    index: int
    memory_total_mib: int | None
    memory_used_mib: int | None
    error_message: str | None
    sampled_at: float  # seconds since the epoch


class _Metrics(TypedDict, total=False):
    """From the scan's metrics section (``scanner.GpuMetrics``)."""

    utilization_gpu_pct: int | None  # None on a MIG-enabled GPU: NVML cannot measure it
    utilization_memory_pct: int | None
    temperature_c: int | None
    memory_temperature_c: int | None
    power_w: float | None
    energy_mj: int | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    pstate: str | None
    pcie_tx_kbps: int | None
    pcie_rx_kbps: int | None
    fan_pct: int | None
    throttle_reasons: list[str]
    processes: int  # a count: the usability rule reads it
    pids: list[list[Any]]  # [pid, used memory MiB or None] per process
    mig: list[MigDeviceSample]


class _Health(TypedDict, total=False):
    """From the scan's health section (``scanner.HealthCounters``): volatile and aggregate
    ECC counts, retired pages, remapped rows, NVLink errors."""

    ecc_corrected: int | None
    ecc_uncorrected: int | None
    ecc_corrected_total: int | None
    ecc_uncorrected_total: int | None
    retired_pages_sbe: int | None
    retired_pages_dbe: int | None
    retired_pages_pending: bool | None
    remapped_rows_correctable: int | None
    remapped_rows_uncorrectable: int | None
    remapped_rows_pending: bool | None
    remapped_rows_failure: bool | None
    nvlink_errors: int | None


class LiveSample(_Facts, _Metrics, _Health):
    """One GPU's live sample, as JSON in Redis: the facts always; the metrics and health
    fields when the scan read those sections, each None where the GPU does not report it."""


def sample(gpu: GpuScan, at: float) -> LiveSample:
    """What the dashboard shows of a GPU right now, and what the history keeps of it."""
    facts, metrics, health = gpu.facts, gpu.metrics, gpu.health
    values: LiveSample = {
        "index": facts.index,
        "memory_total_mib": facts.memory_total_mib,
        "memory_used_mib": facts.memory_used_mib,
        "error_message": facts.error_message,
        "sampled_at": at,
    }
    if metrics is not None:
        mig = facts.mig_enabled or bool(metrics.mig_devices)
        values.update(
            {
                # NVML cannot measure a MIG-enabled GPU's utilization: None ("not measurable").
                "utilization_gpu_pct": None if mig else metrics.utilization_gpu_pct,
                "utilization_memory_pct": None if mig else metrics.utilization_memory_pct,
                "temperature_c": metrics.temperature_c,
                "memory_temperature_c": metrics.memory_temperature_c,
                "power_w": metrics.power_w,
                "energy_mj": metrics.energy_mj,
                "sm_clock_mhz": metrics.sm_clock_mhz,
                "mem_clock_mhz": metrics.mem_clock_mhz,
                "pstate": metrics.pstate,
                "pcie_tx_kbps": metrics.pcie_tx_kbps,
                "pcie_rx_kbps": metrics.pcie_rx_kbps,
                "fan_pct": metrics.fan_pct,
                "throttle_reasons": list(metrics.throttle_reasons),
                "processes": len(metrics.processes),
                "pids": [[p.pid, p.used_memory_mib] for p in metrics.processes],
                "mig": [
                    {
                        "gi_id": device.gi_id,
                        "ci_id": device.ci_id,
                        "uuid": device.uuid,
                        "profile": device.profile,
                        "memory_used_mib": device.memory_used_mib,
                        "memory_total_mib": device.memory_total_mib,
                    }
                    for device in metrics.mig_devices
                ],
            }
        )
    if health is not None:
        values.update(
            {
                "ecc_corrected": health.ecc_volatile_corrected,
                "ecc_uncorrected": health.ecc_volatile_uncorrected,
                "ecc_corrected_total": health.ecc_aggregate_corrected,
                "ecc_uncorrected_total": health.ecc_aggregate_uncorrected,
                "retired_pages_sbe": health.retired_pages_sbe,
                "retired_pages_dbe": health.retired_pages_dbe,
                "retired_pages_pending": health.retired_pages_pending,
                "remapped_rows_correctable": health.remapped_rows_correctable,
                "remapped_rows_uncorrectable": health.remapped_rows_uncorrectable,
                "remapped_rows_pending": health.remapped_rows_pending,
                "remapped_rows_failure": health.remapped_rows_failure,
                "nvlink_errors": health.nvlink_errors,
            }
        )
    return values


# The UUID this process last saw at each GPU index of each node it published.
_uuid_at: dict[str, dict[int, str]] = {}


def publish(hostname: str, scan: NodeScan, *, ttl_s: int | None = None) -> None:
    """Replace the node's samples with this scan's and append them to the sample stream, in
    one round trip. A GPU whose queries failed before its UUID was read (one that fell off the
    bus) is published under the UUID last seen at its index, so that its NVML error makes it
    unusable at once; one never seen cannot be shown (the scan sent to the catalog names it by
    index)."""
    at = time.time()
    samples = {uuid: sample(gpu, at) for gpu in scan.gpus if (uuid := gpu_uuid(hostname, gpu))}
    mapping = {uuid: json.dumps(values) for uuid, values in samples.items()}
    key = KEY_PREFIX + hostname
    pipe = client().pipeline()
    pipe.delete(key)
    if mapping:
        pipe.hset(key, mapping={**mapping, LOOP_FIELD: json.dumps(loop_samples(samples))})
        pipe.expire(key, ttl_s or settings.GPUADMIN_HEARTBEAT_GRACE_S)
        gpus = "{" + ",".join(f"{json.dumps(uuid)}:{raw}" for uuid, raw in mapping.items()) + "}"
        # The telemetry history's source: one entry per publish (node, at, {uuid: sample}).
        pipe.xadd(
            settings.GPUADMIN_SAMPLE_STREAM,
            {"node": hostname, "at": repr(at), "gpus": gpus},
            maxlen=settings.GPUADMIN_SAMPLE_STREAM_MAX,
            approximate=True,
        )
    pipe.execute()


def gpu_uuid(hostname: str, gpu: GpuScan) -> str | None:
    """The GPU's UUID, or the one last seen at its index on this node when its queries failed
    before the UUID was read; None for a GPU never seen."""
    known = _uuid_at.setdefault(hostname, {})
    if gpu.facts.uuid:
        known[gpu.facts.index] = gpu.facts.uuid
        return gpu.facts.uuid
    return known.get(gpu.facts.index)


def loop_samples(samples: Mapping[str, Mapping[str, object]]) -> dict[str, dict[str, object]]:
    """Each sample of ``samples`` (by GPU UUID) cut to the ``LOOP_FIELDS`` it has."""
    return {
        uuid: {name: values[name] for name in LOOP_FIELDS if name in values}
        for uuid, values in samples.items()
    }


def latest(hostnames: Iterable[str]) -> dict[str, dict[str, LiveSample]]:
    """``{hostname: {gpu uuid: sample}}`` for the given nodes, in one round trip."""
    names = list(hostnames)
    pipe = client().pipeline()
    for name in names:
        pipe.hgetall(KEY_PREFIX + name)
    loop_field = LOOP_FIELD.encode()
    return {
        # orjson: the fleet poll decodes every GPU's sample every 2 s, several times faster
        # than the json module.
        name: {
            uuid.decode(): orjson.loads(raw) for uuid, raw in found.items() if uuid != loop_field
        }
        for name, found in zip(names, pipe.execute(), strict=True)
    }


def latest_for_loop(hostnames: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``latest`` of the given nodes cut to ``LOOP_FIELDS``, in one round trip: the placement
    loop reads every GPU's every pass, and the whole samples cost its snapshot a third of its
    time to fetch and decode (a sample is some 30 fields, the loop reads 3). A node whose hash
    lacks the field (an agent older than it: agents are upgraded with the central side) reads
    as one that published nothing."""
    names = list(hostnames)
    pipe = client().pipeline(transaction=False)
    for name in names:
        pipe.hget(KEY_PREFIX + name, LOOP_FIELD)
    return {
        name: orjson.loads(raw) if raw else {}
        for name, raw in zip(names, pipe.execute(), strict=True)
    }


def latest_of(gpus: Iterable[tuple[str, str]]) -> dict[str, dict[str, LiveSample]]:
    """``latest`` of the named GPUs alone, given as (hostname, gpu uuid): ``{hostname: {gpu
    uuid: sample}}``, a GPU without a sample left out, in one round trip. The commit of a
    placement checks a few GPUs of each node it reads, and decoding every GPU's sample cost it
    more than the rest."""
    uuids_by_host: dict[str, list[str]] = {}
    for hostname, uuid in gpus:
        uuids_by_host.setdefault(hostname, []).append(uuid)
    pipe = client().pipeline()
    for hostname, uuids in uuids_by_host.items():
        pipe.hmget(KEY_PREFIX + hostname, uuids)
    return {
        hostname: {uuid: orjson.loads(raw) for uuid, raw in zip(uuids, found, strict=True) if raw}
        for (hostname, uuids), found in zip(uuids_by_host.items(), pipe.execute(), strict=True)
    }


def busy_gpu_uuids(hostnames: Iterable[str]) -> set[str]:
    """GPUs of these nodes whose latest sample lists at least one process."""
    return {
        uuid
        for samples in latest(hostnames).values()
        for uuid, values in samples.items()
        if values.get("processes")
    }
