"""The classic policies bench/replay.py runs beside the engine, in-process: fifo,
fifo+backfill, sjf and srtf (oracles on true durations), tiresias, and FIFO with first-fit,
best-fit or random placement.

Each one's order, rule for a job that does not fit and placement:
docs/development/design-notes.md, "Trace replay: bench/replay.py and its baselines".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from random import Random
from typing import Literal

from replay_sim import FULL, Cluster, Decision, JobState, Run, las_crossing

Blocking = Literal["strict", "skip", "easy"]
Placing = Literal["best-fit", "first-fit", "random"]
OrderKey = Callable[[JobState, float, Run | None], tuple[float, ...]]

TIRESIAS_THRESHOLDS_GPU_S = (3600.0, 36_000.0)


def by_arrival(state: JobState, now: float, run: Run | None) -> tuple[float, ...]:
    return (state.job.submit, state.job.id)


def by_duration(state: JobState, now: float, run: Run | None) -> tuple[float, ...]:
    return (state.job.duration, state.job.submit, state.job.id)


def by_remaining(state: JobState, now: float, run: Run | None) -> tuple[float, ...]:
    remaining = run.ends - now if run is not None else state.remaining_s
    return (remaining, state.job.submit, state.job.id)


def attained(state: JobState, now: float, run: Run | None) -> float:
    if run is None:
        return state.attained_gpu_s
    return state.attained_gpu_s + (now - run.started) * len(run.gpu_ids) * run.milli / FULL


def by_las_queue(state: JobState, now: float, run: Run | None) -> tuple[float, ...]:
    level = sum(attained(state, now, run) >= t for t in TIRESIAS_THRESHOLDS_GPU_S)
    return (level, state.job.submit, state.job.id)


class Free:
    """The free GPUs during one pass: a working copy the pass takes from."""

    def __init__(self, cluster: Cluster, released: Sequence[Run] = ()) -> None:
        self.cluster = cluster
        self.milli = list(cluster.free_milli)
        self.whole = list(cluster.free_whole)
        self.cpus = list(cluster.free_cpus)
        self.memory = list(cluster.free_memory)
        for run in released:
            self._hold(run.gpu_ids, run.state, +1)
            for gpu in run.gpu_ids:
                if self.milli[gpu] + run.milli == FULL:
                    self.whole[cluster.node_of[gpu]] += 1
                self.milli[gpu] += run.milli
        self.total = sum(self.milli)  # thousandths of a GPU

    def _hold(self, gpu_ids: Sequence[int], state: JobState, sign: int) -> None:
        for node in {self.cluster.node_of[gpu] for gpu in gpu_ids}:
            self.cpus[node] += sign * state.job.cpus
            self.memory[node] += sign * state.job.memory_mib

    def _host_fits(self, node: int, state: JobState) -> bool:
        return self.cpus[node] >= state.job.cpus and self.memory[node] >= state.job.memory_mib

    def take(self, state: JobState, placing: Placing, rng: Random) -> tuple[int, ...] | None:
        gpus = self._take(state, placing, rng)
        if gpus is not None:
            self._hold(gpus, state, -1)
        return gpus

    def _take(self, state: JobState, placing: Placing, rng: Random) -> tuple[int, ...] | None:
        share = state.job.share_milli
        if share < FULL:
            return self._take_share(state, share, placing, rng)
        nodes = [
            n
            for n, free in enumerate(self.whole)
            if free >= state.per_node and self._host_fits(n, state)
        ]
        if len(nodes) < state.nodes:
            return None
        if placing == "best-fit":
            nodes.sort(key=lambda n: (self.whole[n], n))
            chosen = nodes[: state.nodes]
        elif placing == "first-fit":
            chosen = nodes[: state.nodes]
        else:
            chosen = rng.sample(nodes, state.nodes)
        gpus: list[int] = []
        for node in sorted(chosen):
            free = [g for g in self.cluster.node_gpus[node] if self.milli[g] == FULL]
            gpus += free[: state.per_node]
            self.whole[node] -= state.per_node
        for gpu in gpus:
            self.milli[gpu] = 0
        self.total -= FULL * len(gpus)
        return tuple(gpus)

    def _take_share(
        self, state: JobState, share: int, placing: Placing, rng: Random
    ) -> tuple[int, ...] | None:
        node_of = self.cluster.node_of
        fitting = [
            g
            for g, free in enumerate(self.milli)
            if free >= share and self._host_fits(node_of[g], state)
        ]
        if not fitting:
            return None
        if placing == "best-fit":
            gpu = min(fitting, key=lambda g: (self.milli[g], g))
        elif placing == "first-fit":
            gpu = fitting[0]
        else:
            gpu = rng.choice(fitting)
        if self.milli[gpu] == FULL:
            self.whole[self.cluster.node_of[gpu]] -= 1
        self.milli[gpu] -= share
        self.total -= share
        return (gpu,)


class Baseline:
    """One classic policy (see the module docstring)."""

    def __init__(
        self,
        name: str,
        order: OrderKey,
        *,
        blocking: Blocking = "skip",
        placing: Placing = "best-fit",
        preemptive: bool = False,
        las: bool = False,
        seed: int = 1,
    ) -> None:
        self.name = name
        self.order = order
        self.blocking = blocking
        self.placing = placing
        self.preemptive = preemptive
        self.las = las
        self.rng = Random(seed)

    def wake_at(self, cluster: Cluster, now: float) -> float | None:
        if not self.las:
            return None
        return las_crossing(cluster.running.values(), TIRESIAS_THRESHOLDS_GPU_S, now)

    def decide(self, cluster: Cluster, now: float) -> Decision:
        started = time.perf_counter()
        if self.preemptive:
            starts, preempt = self._preemptive(cluster, now)
        else:
            starts, preempt = self._place(cluster, now), []
        return Decision(starts, preempt, time.perf_counter() - started)

    def _place(self, cluster: Cluster, now: float) -> list[tuple[int, tuple[int, ...]]]:
        free = Free(cluster)
        waiting = sorted(cluster.queue.values(), key=lambda s: self.order(s, now, None))
        starts: list[tuple[int, tuple[int, ...]]] = []
        failed: set[tuple[int, ...]] = set()
        head: JobState | None = None
        shadow, extra = 0.0, 0
        for state in waiting:
            if free.total == 0:
                break
            job = state.job
            kind = (state.per_node, state.nodes, job.share_milli, job.cpus, job.memory_mib)
            if head is not None and self.blocking == "easy":
                fits_before = now + state.remaining_s <= shadow
                if not fits_before and state.job.gpus > extra:
                    continue
            gpus = None if kind in failed else free.take(state, self.placing, self.rng)
            if gpus is None:
                failed.add(kind)
                if self.blocking == "strict":
                    break
                if self.blocking == "easy" and head is None:
                    head = state
                    shadow, extra = self._reservation(cluster, free, state, now)
                continue
            if head is not None and now + state.remaining_s > shadow:
                extra -= state.job.gpus
            starts.append((state.job.id, gpus))
        return starts

    @staticmethod
    def _reservation(cluster: Cluster, free: Free, head: JobState, now: float) -> tuple[float, int]:
        """EASY: when the head job could start as running jobs end (counted in GPUs), and
        how many GPUs it leaves free then."""
        available = sum(m == FULL for m in free.milli)
        for run in sorted(cluster.running.values(), key=lambda r: r.ends):
            available += len(run.gpu_ids)
            if available >= head.job.gpus:
                return run.ends, available - head.job.gpus
        return float("inf"), 0

    def _preemptive(
        self, cluster: Cluster, now: float
    ) -> tuple[list[tuple[int, tuple[int, ...]]], list[int]]:
        """Keep the jobs first in order that the fleet holds (counted in GPUs); stop the
        running ones not among them when a waiting job kept needs their GPUs."""
        jobs: list[tuple[tuple[float, ...], JobState, Run | None]] = [
            (self.order(s, now, None), s, None) for s in cluster.queue.values()
        ]
        jobs += [(self.order(r.state, now, r), r.state, r) for r in cluster.running.values()]
        jobs.sort(key=lambda item: item[0])
        budget = float(cluster.gpu_count)
        keep: list[JobState] = []
        losers: list[Run] = []
        for _, state, run in jobs:
            size = state.job.gpus * min(state.job.share_milli, FULL) / FULL
            if size <= budget:
                budget -= size
                if run is None:
                    keep.append(state)
            elif run is not None:
                losers.append(run)
        if not keep:
            return [], []
        free = Free(cluster, losers)
        starts: list[tuple[int, tuple[int, ...]]] = []
        for state in keep:
            gpus = free.take(state, self.placing, self.rng)
            if gpus is not None:
                starts.append((state.job.id, gpus))
        used = {gpu for _, gpus in starts for gpu in gpus}
        preempt = [run.state.job.id for run in losers if used.intersection(run.gpu_ids)]
        return starts, preempt


def baselines(seed: int = 1) -> dict[str, Baseline]:
    """Every baseline by name, fresh (they keep a random generator)."""
    return {
        "fifo": Baseline("fifo", by_arrival, blocking="strict"),
        "fifo+backfill": Baseline("fifo+backfill", by_arrival, blocking="easy"),
        "sjf-oracle": Baseline("sjf-oracle", by_duration),
        "srtf-oracle": Baseline("srtf-oracle", by_remaining, preemptive=True),
        "tiresias": Baseline("tiresias", by_las_queue, preemptive=True, las=True),
        "first-fit": Baseline("first-fit", by_arrival, placing="first-fit"),
        "best-fit": Baseline("best-fit", by_arrival),
        "random": Baseline("random", by_arrival, placing="random", seed=seed),
    }
