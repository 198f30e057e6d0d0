"""EASY backfill: the first waiting job's shadow start, and the GPUs it will start on.

A later job may start now only if it ends by the shadow start or keeps off those GPUs, so the
head's start is never delayed. See docs/development/design-notes.md, "EASY backfill".
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Iterable
from typing import NamedTuple

from scheduling.placement.fleet import Fleet, FleetNode, Shape, available, matches
from scheduling.placement.snapshot import GpuSlot, JobRequest, PoolConfig
from scheduling.placement.topology import choose


class Shadow(NamedTuple):
    """The head job's start at the latest (`start`; math.inf when a holder's end is unknown),
    the GPUs it will start on, and when it was submitted."""

    job_id: int
    start: float
    gpu_ids: frozenset[int]
    submitted_at: float = -math.inf


def ends_before(job: JobRequest, head: Shadow, now: float, config: PoolConfig) -> bool:
    """Whether `job`, started now, ends by the head's start: by its likely runtime, or, once
    the head has waited the pool's `prediction_trust_intervals` aging intervals, by its
    estimate or maximum runtime only (a prediction no longer counts)."""
    runtime = job.likely_runtime_s
    if runtime is None or now + runtime > head.start:
        return False
    if job.estimated_duration_s is not None or job.predicted_runtime_s is None:
        return True
    if now - head.submitted_at < config.prediction_trust_intervals * config.aging_interval_s:
        return True
    return job.max_runtime_s is not None and now + job.max_runtime_s <= head.start


def shadow(fleet: Fleet, job: JobRequest, now: float, closed: frozenset[int]) -> Shadow | None:
    """When and where `job` would start if no other job started first, on `fleet` with every
    free GPU in reach, keeping off `closed` GPUs; None when it never could.

    Host CPUs and memory count only as capacity (a node that could never hold the job's
    part is skipped), not over time: a node is taken to be ready once its GPUs are, as if
    the CPUs and memory held there freed up with them. The start may so come early when
    jobs on the node's other GPUs (another pool, MIG or MPS) hold its CPUs longer."""
    shape = Shape.of(job)
    count, wanted, min_memory, model, requirement, *_ = shape
    host = shape.host
    # Hardware that can never hold the job's part (model, memory, size, topology, host CPUs
    # and memory) is skipped.
    key = (count, requirement, model, min_memory)
    pools = {id(pool) for pool in fleet.pools if pool.ideal(key) is not None}
    # Per node: each usable GPU with when it is free (-inf: now), by time then index.
    timelines: list[tuple[float, int, FleetNode, list[tuple[float, GpuSlot]]]] = []
    for node in fleet.nodes:
        if id(node.pool) not in pools or not node.host.could_fit(host):
            continue
        free = {gpu.id for gpu in node.free}
        timeline = []
        for gpu in available(node.info, node.gpus):
            if gpu.id in closed or not matches(gpu, model, min_memory):
                continue
            if gpu.id in free:
                # Memory some other process holds may never be given back.
                at = -math.inf if gpu.memory_free_mib >= min_memory else math.inf
            else:
                at = fleet.release_at.get(gpu.id, math.inf)
            timeline.append((at, gpu))
        if len(timeline) >= count:
            timeline.sort(key=lambda pair: pair[0])
            # No node is ready before its count-th GPU is free: a lower bound to visit by.
            timelines.append((timeline[count - 1][0], node.index, node, timeline))
    timelines.sort(key=lambda entry: entry[:2])

    ready: list[tuple[float, int, int, FleetNode]] = []
    by_node: dict[int, list[tuple[float, GpuSlot]]] = {}
    for lower, _, node, timeline in timelines:
        if len(ready) >= wanted and lower > ready[wanted - 1][0]:
            break
        found = _ready_at(timeline, count, requirement, lower)
        if found is None:
            continue
        at, gpus = found
        # Ties: the node that keeps fewest GPUs idle until then (for an unknown end: the node
        # with most GPUs that free up at all), then the hostname.
        if at == math.inf:
            idle = -sum(gpu_at < math.inf for gpu_at, _ in timeline)
        else:
            idle = sum(gpu.id in {g.id for g in node.free} for gpu in gpus)
        insort(ready, (at, idle, node.index, node))
        by_node[node.index] = timeline
    if len(ready) < wanted:
        return None
    chosen = ready[:wanted]
    start = max(now, max(entry[0] for entry in chosen))
    gpu_ids: set[int] = set()
    for _, _, index, _ in chosen:
        by_then = _by_index(gpu for at, gpu in by_node[index] if at <= start)
        choice = choose(by_then, count, requirement)
        assert choice is not None, "a node ready by the start holds the job then"
        gpu_ids.update(gpu.id for gpu in choice.gpus)
    return Shadow(job.id, start, frozenset(gpu_ids), job.submitted_at)


def _by_index(gpus: Iterable[GpuSlot]) -> list[GpuSlot]:
    return sorted(gpus, key=lambda gpu: (gpu.index, gpu.id))


def _ready_at(
    timeline: list[tuple[float, GpuSlot]], count: int, requirement: str, lower: float
) -> tuple[float, tuple[GpuSlot, ...]] | None:
    """The first time (from `lower` on) the node's GPUs free by then hold `count` in
    `requirement`, with the GPUs chosen then."""
    for moment in sorted({at for at, _ in timeline if at >= lower}):
        choice = choose(_by_index(gpu for at, gpu in timeline if at <= moment), count, requirement)
        if choice is not None:
            return moment, choice.gpus
    return None
