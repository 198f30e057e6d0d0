"""The discrete-event simulator behind bench/replay.py: a simulated clock, a fleet of GPUs,
and a `Scheduler` asked what to start (and stop) whenever something changed.

Events are arrivals (batched per second), completions (a heap) and the scheduler's own
wake-ups (a least-attained-service job crossing a threshold). A pass runs only when it could
decide something: after a completion or a preemption, when an arrival fits in the free GPUs
by count, or when the scheduler preempts (then every arrival may displace running work). The
simulator checks every decision (a GPU is never given twice, a job gets exactly its GPUs, a
node never gives more host CPUs or memory than it has) and keeps the figures `Result`
reports.

`EngineScheduler` is the real engine: each pass builds a `Snapshot` of the simulated fleet
(GPU slots and jobs reused between passes, only what changed is rebuilt) and calls
`scheduling.placement.plan` on it, under a `PoolConfig` naming the policy.
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NamedTuple, Protocol

from placement import percentile
from replay_traces import Partition, TraceJob, shape

from scheduling.placement import (
    GpuSlot,
    JobRequest,
    NodeInfo,
    PoolConfig,
    QuotaLimit,
    RunningJob,
    Snapshot,
    plan,
)
from scheduling.placement.decisions import Placement
from scheduling.placement.policies import attained_thresholds
from scheduling.placement.predict import Completed, History, Predictor
from scheduling.placement.sharing import Packing, SharingPass
from scheduling.placement.sharing import unusable_gpus as sharing_unusable_gpus

FULL = 1000  # a whole GPU, in thousandths
GPU_MEMORY_MIB = 81920
# Passes at one instant: a pass that preempts is followed by one that places on the GPUs
# freed (victims stop at once: no grace period is simulated).
MAX_PASSES_PER_INSTANT = 4
# How long the engine's predictions of waiting jobs' runtimes are reused (the loop reads its
# history of finished jobs again at most this often: scheduling/loop/history.py).
HISTORY_MAX_AGE_S = 60.0


@dataclass(slots=True)
class JobState:
    """A job that has arrived: how long it ran so far and what it attained."""

    job: TraceJob
    per_node: int
    nodes: int
    executed_s: float = 0.0
    attained_gpu_s: float = 0.0
    queued_at: float | None = None  # when it was last preempted (None: never)
    preemptions: int = 0
    version: int = 0  # bumped whenever it starts or stops, so stale completions are skipped

    @property
    def remaining_s(self) -> float:
        return self.job.duration - self.executed_s


def arrival(job: TraceJob, node_gpus: int) -> JobState:
    """A job just arrived on nodes of `node_gpus`: a share takes one GPU, a larger job the
    fewest nodes that split it evenly."""
    per_node, nodes = (1, 1) if job.share_milli < FULL else shape(job.gpus, node_gpus)
    return JobState(job, per_node, nodes)


@dataclass(slots=True)
class Run:
    state: JobState
    gpu_ids: tuple[int, ...]
    started: float
    ends: float
    milli: int  # per GPU


class Decision(NamedTuple):
    """Jobs to start on GPUs (ids), running jobs to stop and requeue, and the seconds the
    decision itself took (for the engine: `plan` alone, not building its snapshot)."""

    starts: list[tuple[int, tuple[int, ...]]]
    preempt: list[int]
    seconds: float


class Cluster:
    """The simulated fleet and its jobs. GPU ids are 0.. in node order."""

    def __init__(self, partition: Partition) -> None:
        self.partition = partition
        self.node_of: list[int] = []
        self.node_gpus: list[list[int]] = []
        for index, node in enumerate(partition.nodes):
            first = len(self.node_of)
            self.node_gpus.append(list(range(first, first + node.gpus)))
            self.node_of += [index] * node.gpus
        self.node_size = max(node.gpus for node in partition.nodes)
        self.free_milli = [FULL] * len(self.node_of)
        self.free_whole = [node.gpus for node in partition.nodes]  # fully free GPUs per node
        # Free host CPUs and memory per node (inf: not known, no limit).
        self.free_cpus = [math.inf if n.cpus is None else n.cpus for n in partition.nodes]
        self.free_memory = [
            math.inf if n.memory_mib is None else n.memory_mib for n in partition.nodes
        ]
        self.holders: list[list[int]] = [[] for _ in self.node_of]
        self.used_milli = 0
        self.running: dict[int, Run] = {}
        self.queue: dict[int, JobState] = {}  # arrival order
        self.dirty: set[int] = set()  # GPUs changed since the scheduler last looked
        self.queue_changed = True
        self.whole_needs: Counter[int] = Counter()  # waiting whole-GPU jobs by GPUs per node
        self.received_gpu_s: dict[str, float] = {}  # per project

    @property
    def gpu_count(self) -> int:
        return len(self.node_of)

    def host_fits(self, node: int, job: TraceJob) -> bool:
        """Whether `node`'s free host CPUs and memory hold `job`'s part."""
        return self.free_cpus[node] >= job.cpus and self.free_memory[node] >= job.memory_mib

    def _hold(self, gpu_ids: Iterable[int], job: TraceJob, sign: int) -> None:
        """Take (sign -1) or give back (+1) `job`'s host CPUs and memory on its nodes."""
        for node in {self.node_of[gpu] for gpu in gpu_ids}:
            self.free_cpus[node] += sign * job.cpus
            self.free_memory[node] += sign * job.memory_mib

    def fits_by_count(self, state: JobState) -> bool:
        """Whether the free GPUs could hold the job at all (a cheap necessary condition)."""
        if state.job.share_milli < FULL:
            return any(free >= state.job.share_milli for free in self.free_milli)
        return sum(free >= state.per_node for free in self.free_whole) >= state.nodes

    def fragmented_gpus(self) -> float:
        """Free GPUs no waiting whole-GPU job can use: those on nodes with fewer free GPUs
        than the smallest per-node part any waiting job asks for."""
        needs = [need for need, count in self.whole_needs.items() if count > 0]
        if not needs:
            return 0.0
        smallest = min(needs)
        return float(sum(free for free in self.free_whole if free < smallest))

    def enqueue(self, state: JobState) -> None:
        self.queue[state.job.id] = state
        self.queue_changed = True
        if state.job.share_milli >= FULL:
            self.whole_needs[state.per_node] += 1

    def dequeue(self, job_id: int) -> JobState:
        """Take a job off the queue (it starts, or a fill experiment turns it down)."""
        state = self.queue.pop(job_id)
        self.queue_changed = True
        if state.job.share_milli >= FULL:
            self.whole_needs[state.per_node] -= 1
        return state

    def start(self, job_id: int, gpu_ids: Sequence[int], now: float) -> Run:
        """Give a waiting job its GPUs, checking that they are free and of its shape."""
        if job_id not in self.queue:
            raise AssertionError(f"job {job_id} started but it is not waiting")
        state = self.queue[job_id]
        job = state.job
        milli = min(job.share_milli, FULL)
        if len(gpu_ids) != job.gpus or len(set(gpu_ids)) != len(gpu_ids):
            raise AssertionError(f"job {job_id} needs {job.gpus} GPUs, got {list(gpu_ids)}")
        per_node = Counter(self.node_of[gpu] for gpu in gpu_ids)
        if milli == FULL and set(per_node.values()) != {state.per_node}:
            raise AssertionError(f"job {job_id} is not {state.nodes} x {state.per_node} GPUs")
        for gpu in gpu_ids:
            if self.free_milli[gpu] < milli or (milli == FULL and self.free_milli[gpu] < FULL):
                raise AssertionError(f"GPU {gpu} double-booked: job {job_id} on {self.holders}")
            if not self.host_fits(self.node_of[gpu], job):
                raise AssertionError(f"job {job_id}: node of GPU {gpu} lacks CPUs or memory")
        self.dequeue(job_id)
        self._hold(gpu_ids, job, -1)
        for gpu in gpu_ids:
            if self.free_milli[gpu] == FULL:
                self.free_whole[self.node_of[gpu]] -= 1
            self.free_milli[gpu] -= milli
            self.holders[gpu].append(job_id)
            self.dirty.add(gpu)
        self.used_milli += milli * len(gpu_ids)
        state.version += 1
        run = Run(state, tuple(gpu_ids), now, now + state.remaining_s, milli)
        self.running[job_id] = run
        return run

    def stop(self, job_id: int, now: float) -> Run:
        """Free a running job's GPUs and account for what it ran."""
        run = self.running.pop(job_id)
        state = run.state
        ran = now - run.started
        state.executed_s += ran
        gpu_s = ran * len(run.gpu_ids) * run.milli / FULL
        state.attained_gpu_s += gpu_s
        project = state.job.project
        self.received_gpu_s[project] = self.received_gpu_s.get(project, 0.0) + gpu_s
        state.version += 1
        self._hold(run.gpu_ids, state.job, +1)
        for gpu in run.gpu_ids:
            self.free_milli[gpu] += run.milli
            if self.free_milli[gpu] == FULL:
                self.free_whole[self.node_of[gpu]] += 1
            self.holders[gpu].remove(job_id)
            self.dirty.add(gpu)
        self.used_milli -= run.milli * len(run.gpu_ids)
        return run

    def preempt(self, job_id: int, now: float) -> Run:
        run = self.stop(job_id, now)
        run.state.preemptions += 1
        run.state.queued_at = now
        self.enqueue(run.state)
        return run


class Scheduler(Protocol):
    """What the simulator asks. `preemptive`: it may stop running jobs, so every arrival
    gets a pass."""

    name: str
    preemptive: bool

    def decide(self, cluster: Cluster, now: float) -> Decision: ...

    def wake_at(self, cluster: Cluster, now: float) -> float | None:
        """When its order changes by itself (None: only on arrivals and completions)."""
        ...


def las_crossing(runs: Iterable[Run], thresholds: Sequence[float], now: float) -> float | None:
    """The first time a running job's attained GPU-seconds cross one of `thresholds`."""
    soonest: float | None = None
    for run in runs:
        gpus = len(run.gpu_ids) * run.milli / FULL
        attained = run.state.attained_gpu_s + (now - run.started) * gpus
        for threshold in thresholds:
            if attained < threshold:
                at = now + (threshold - attained) / gpus
                if at < run.ends and (soonest is None or at < soonest):
                    soonest = at
                break
    return soonest


@dataclass
class Result:
    """What one policy did on one workload (all partitions)."""

    policy: str
    jct: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    first_submit: float = math.inf
    last_end: float = -math.inf
    gpu_count: int = 0
    busy_gpu_s: float = 0.0
    waiting_s: float = 0.0  # GPU-weighted: sum over partitions of GPUs x time jobs waited
    busy_while_waiting_gpu_s: float = 0.0
    fragmented_gpu_s: float = 0.0
    preemptions: int = 0
    # Thrashing: how long each preempted run had run when stopped, and the most times one
    # job was stopped.
    preempted_after_s: list[float] = field(default_factory=list)
    most_preemptions: int = 0
    passes: int = 0
    decide_s: float = 0.0
    considered: int = 0  # queued jobs summed over passes
    unfinished: int = 0
    received_gpu_s: dict[str, float] = field(default_factory=dict)
    demand_gpu_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    # The fill experiment (openb): GPUs placed, pods turned down, and the fleet at the end.
    placed_gpus: float = 0.0
    failed: int = 0
    final: list[Cluster] = field(default_factory=list)

    def merge(self, other: Result) -> None:
        self.jct += other.jct
        self.wait += other.wait
        self.preempted_after_s += other.preempted_after_s
        self.most_preemptions = max(self.most_preemptions, other.most_preemptions)
        self.first_submit = min(self.first_submit, other.first_submit)
        self.last_end = max(self.last_end, other.last_end)
        for name in (
            "gpu_count",
            "busy_gpu_s",
            "waiting_s",
            "busy_while_waiting_gpu_s",
            "fragmented_gpu_s",
            "preemptions",
            "passes",
            "decide_s",
            "considered",
            "unfinished",
            "wall_s",
            "placed_gpus",
            "failed",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in (
            (self.received_gpu_s, other.received_gpu_s),
            (self.demand_gpu_s, other.demand_gpu_s),
        ):
            for project, gpu_s in theirs.items():
                mine[project] = mine.get(project, 0.0) + gpu_s
        self.final += other.final

    @property
    def makespan_s(self) -> float:
        return max(0.0, self.last_end - self.first_submit)

    def figures(self) -> dict[str, float]:
        jct, wait = sorted(self.jct), sorted(self.wait)
        span = self.makespan_s

        def mean(values: list[float]) -> float:
            return statistics.fmean(values) if values else math.nan

        return {
            "jobs": float(len(jct)),
            "jct_avg": mean(jct),
            "jct_p50": percentile(jct, 0.5) if jct else math.nan,
            "jct_p99": percentile(jct, 0.99) if jct else math.nan,
            "wait_avg": mean(wait),
            "wait_p50": percentile(wait, 0.5) if wait else math.nan,
            "wait_p99": percentile(wait, 0.99) if wait else math.nan,
            "makespan_s": span,
            "util": self.busy_gpu_s / (self.gpu_count * span) if span else math.nan,
            "util_waiting": (
                self.busy_while_waiting_gpu_s / self.waiting_s if self.waiting_s else math.nan
            ),
            "fragmented": self.fragmented_gpu_s / span if span else math.nan,
            "preemptions": float(self.preemptions),
            "ms_per_pass": self.decide_s * 1000 / self.passes if self.passes else math.nan,
            "us_per_job": self.decide_s * 1e6 / self.considered if self.considered else math.nan,
            "passes": float(self.passes),
            "unfinished": float(self.unfinished),
        }

    def fairness(self, entitled: Mapping[str, float]) -> tuple[float, float]:
        """(lowest, highest) share received / share entitled over the projects that asked
        for at least their entitlement (GPU-seconds demanded vs entitled share)."""
        total_entitled = sum(entitled.values())
        received = sum(self.received_gpu_s.values())
        demanded = sum(self.demand_gpu_s.values())
        if not received or not demanded:
            return (math.nan, math.nan)
        ratios = [
            (self.received_gpu_s.get(project, 0.0) / received) / (gpus / total_entitled)
            for project, gpus in entitled.items()
            if self.demand_gpu_s.get(project, 0.0) / demanded >= gpus / total_entitled
        ]
        return (min(ratios), max(ratios)) if ratios else (math.nan, math.nan)


def simulate(
    partition: Partition, scheduler: Scheduler, *, fill: bool = False, fill_batch: int = 50
) -> Result:
    """Replay `partition`'s jobs through `scheduler`. With `fill`, jobs never end, arrive
    `fill_batch` at a time (placed in arrival order in one pass, which decides what passes
    one per arrival would: nothing leaves), and one that does not start in that pass is
    turned down (FGD's experiment)."""
    started_wall = time.perf_counter()
    cluster = Cluster(partition)
    result = Result(scheduler.name, gpu_count=cluster.gpu_count)
    jobs = sorted(partition.jobs, key=lambda job: (job.submit, job.id))
    for job in jobs:
        demand = job.gpus * job.duration * job.share_milli / FULL
        result.demand_gpu_s[job.project] = result.demand_gpu_s.get(job.project, 0.0) + demand
    if jobs:
        result.first_submit = jobs[0].submit
    completions: list[tuple[float, int, int]] = []  # (end, job id, version)
    index = 0
    now = jobs[0].submit if jobs else 0.0
    while index < len(jobs) or cluster.running or cluster.queue:
        wake = scheduler.wake_at(cluster, now) if cluster.queue else None
        upcoming = [
            t
            for t in (
                jobs[index].submit if index < len(jobs) else None,
                completions[0][0] if completions else None,
                wake,
            )
            if t is not None
        ]
        if not upcoming:
            result.unfinished += len(cluster.queue)  # nothing will ever free GPUs for them
            break
        moment = max(now, min(upcoming))
        _account(result, cluster, moment - now)
        now = moment
        changed = wake is not None and moment >= wake
        while completions and completions[0][0] <= now:
            _, job_id, version = heapq.heappop(completions)
            run = cluster.running.get(job_id)
            if run is None or run.state.version != version:
                continue
            cluster.stop(job_id, now)
            result.jct.append(now - run.state.job.submit)
            result.wait.append(now - run.state.job.submit - run.state.job.duration)
            result.most_preemptions = max(result.most_preemptions, run.state.preemptions)
            result.last_end = max(result.last_end, now)
            changed = True
        arrived = False
        batch_end = len(jobs) if not fill else index + fill_batch
        while index < batch_end and index < len(jobs) and (fill or jobs[index].submit <= now):
            state = arrival(jobs[index], cluster.node_size)
            index += 1
            cluster.enqueue(state)
            arrived = arrived or scheduler.preemptive or cluster.fits_by_count(state)
        if not (changed or arrived) or not cluster.queue:
            continue
        for _ in range(MAX_PASSES_PER_INSTANT):
            result.considered += len(cluster.queue)
            decision = scheduler.decide(cluster, now)
            result.decide_s += decision.seconds
            result.passes += 1
            for job_id in decision.preempt:
                stopped = cluster.preempt(job_id, now)
                result.preemptions += 1
                result.preempted_after_s.append(now - stopped.started)
            for job_id, gpu_ids in decision.starts:
                run = cluster.start(job_id, gpu_ids, now)
                result.placed_gpus += len(gpu_ids) * run.milli / FULL
                if not fill:
                    heapq.heappush(completions, (run.ends, job_id, run.state.version))
            if not decision.preempt or not cluster.queue:
                break
        if fill:
            result.failed += len(cluster.queue)
            for job_id in list(cluster.queue):
                cluster.dequeue(job_id)
    result.received_gpu_s = cluster.received_gpu_s
    if fill:
        result.last_end = now
        result.final.append(cluster)
    result.wall_s = time.perf_counter() - started_wall
    return result


def _account(result: Result, cluster: Cluster, elapsed: float) -> None:
    if elapsed <= 0:
        return
    busy = cluster.used_milli / FULL
    result.busy_gpu_s += busy * elapsed
    if cluster.queue:
        result.waiting_s += cluster.gpu_count * elapsed
        result.busy_while_waiting_gpu_s += busy * elapsed
        result.fragmented_gpu_s += cluster.fragmented_gpus() * elapsed


class EngineScheduler:
    """The placement engine under one pool configuration. `estimates`: give the engine each
    job's true duration as the user's estimate (an oracle, for comparison); otherwise it gets
    what the trace's users declared (nothing). `preemptible`: every job says it may be
    preempted (the traces do not say; by default none does, so only borrowed work is).
    `quotas`: GPUs per project (a QuotaLimit each, weighting fair share too). `history`:
    predict runtimes from the jobs finished so far, as the loop does (`predict.Predictor`
    over a `predict.History` fed by the simulated completions), so that jobs without an
    estimate get a predicted runtime and running jobs a predicted end. A job is predicted
    from the runs that ended before its submission; one submitted before any did is
    predicted afresh at most every `HISTORY_MAX_AGE_S`."""

    def __init__(
        self,
        name: str,
        config: PoolConfig,
        *,
        estimates: bool = False,
        preemptible: bool = False,
        quotas: Mapping[str, float] | None = None,
        history: bool = True,
    ) -> None:
        self.name = name
        self.config = config
        self.preemptive = config.preemption
        self.estimates = estimates
        self.preemptible = preemptible
        self.quotas = dict(quotas or {})
        self._mps = False
        self._cluster: Cluster | None = None
        self._slots: list[GpuSlot] = []
        self._free: list[GpuSlot] = []
        self._nodes: tuple[NodeInfo, ...] = ()
        self._running: dict[int, RunningJob] = {}
        self._requests: dict[int, JobRequest] = {}
        self._usage: dict[str, float] = {}
        self._usage_at = 0.0
        self.history: History | None = History() if history and not estimates else None
        self.predictor = Predictor(self.history or History())
        self._runs: dict[int, Run] = {}
        self._predicted_at = -math.inf

    def _attach(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._mps = cluster.partition.mps
        nodes = cluster.partition.nodes
        self._nodes = tuple(
            NodeInfo(node.hostname, cpus=node.cpus, memory_mib=node.memory_mib) for node in nodes
        )
        self._free = [
            GpuSlot(
                id=gpu,
                uuid=f"GPU-{gpu}",
                node=nodes[cluster.node_of[gpu]].hostname,
                index=gpu - cluster.node_gpus[cluster.node_of[gpu]][0],
                model=nodes[cluster.node_of[gpu]].model,
                memory_total_mib=GPU_MEMORY_MIB,
                memory_free_mib=GPU_MEMORY_MIB,
                unavailable="mps" if cluster.partition.mps else None,
            )
            for gpu in range(cluster.gpu_count)
        ]
        self._slots = list(self._free)
        self._running = {}
        self._requests = {}
        self._usage = {}
        self._runs = {}
        if self.history is not None:
            self.history = History()
            self.predictor = Predictor(self.history)
        cluster.dirty.update(range(cluster.gpu_count))
        cluster.queue_changed = True

    def _slot(self, cluster: Cluster, gpu: int) -> GpuSlot:
        holders = cluster.holders[gpu]
        if not holders:
            return self._free[gpu]
        if cluster.partition.mps:
            used = (FULL - cluster.free_milli[gpu]) * 100 // FULL
            return replace(self._free[gpu], mps_used_percent=used, mps_jobs=tuple(holders))
        return replace(self._free[gpu], allocated_to=holders[0])

    def request(self, state: JobState) -> JobRequest:
        """The job as the engine sees it: what its user declared, and its attained service."""
        job = state.job
        share = job.share_milli * 100 // FULL if self._mps else None
        return JobRequest(
            id=job.id,
            owner=job.project,
            priority="normal",
            submitted_at=job.submit,
            gpus_per_node=state.per_node,
            node_count=state.nodes,
            estimated_duration_s=state.remaining_s if self.estimates else job.estimate,
            predicted_runtime_s=self._predict(job),
            preemptible=self.preemptible,
            project=job.project,
            mps_percent=share,
            attained_service_s=state.attained_gpu_s,
            queued_at=state.queued_at,
            cpus=job.cpus,
            host_memory_mib=job.memory_mib,
        )

    def _predict(self, job: TraceJob) -> float | None:
        """The runtime the history of finished jobs predicts for `job` (the loop's rule)."""
        if self.history is None:
            return None
        return self.predictor.runtime(
            job.id,
            owner=job.project,
            project=job.project,
            pool=None,
            gpus=job.gpus,
            name=job.name,
            submitted_at=job.submit,
        )

    def _learn(self, cluster: Cluster) -> None:
        """Feed the history the runs that ended since the last pass, in order of end (a
        preempted job is back in the queue: not an end)."""
        assert self.history is not None
        ended = [job_id for job_id in self._runs if job_id not in cluster.running]
        for run in sorted((self._runs.pop(job_id) for job_id in ended), key=lambda r: r.ends):
            if run.state.job.id not in cluster.queue:
                job = run.state.job
                self.history.add(
                    Completed(
                        owner=job.project,
                        project=job.project,
                        pool=None,
                        gpus=job.gpus,
                        runtime_s=run.ends - run.started,
                        ended_at=run.ends,
                        name=job.name,
                    )
                )

    def _repredict(self, cluster: Cluster, now: float) -> None:
        """Every `HISTORY_MAX_AGE_S`, give the waiting jobs not yet predicted for good the
        predictions the history makes now."""
        assert self.history is not None
        stale = now - self._predicted_at >= HISTORY_MAX_AGE_S
        if not stale or self.history.latest <= self._predicted_at:
            return
        self._predicted_at = now
        for job_id, request in self._requests.items():
            if self.predictor.is_final(job_id):
                continue
            predicted = self._predict(cluster.queue[job_id].job)
            if predicted != request.predicted_runtime_s:
                self._requests[job_id] = replace(request, predicted_runtime_s=predicted)

    def _decay(self, now: float, cluster: Cluster) -> None:
        """Fair share's usage: GPU-seconds per project, halved every half-life."""
        elapsed = now - self._usage_at
        self._usage_at = now
        if elapsed <= 0:
            return
        factor = 0.5 ** (elapsed / self.config.fairshare_half_life_s)
        for project in self._usage:
            self._usage[project] *= factor
        for run in cluster.running.values():
            gpus = len(run.gpu_ids) * run.milli / FULL
            project = run.state.job.project
            self._usage[project] = self._usage.get(project, 0.0) + gpus * min(
                elapsed, now - run.started
            )

    def snapshot(self, cluster: Cluster, now: float) -> Snapshot:
        if cluster is not self._cluster:
            self._attach(cluster)
        for gpu in cluster.dirty:
            self._slots[gpu] = self._slot(cluster, gpu)
        cluster.dirty.clear()
        if self.history is not None:
            self._learn(cluster)
        for job_id in [job_id for job_id in self._running if job_id not in cluster.running]:
            del self._running[job_id]
        for job_id, run in cluster.running.items():
            if job_id not in self._running:
                job = run.state.job
                predicted = self._predict(job)
                self._runs[job_id] = run
                self._running[job_id] = RunningJob(
                    id=job_id,
                    gpu_ids=run.gpu_ids,
                    started_at=run.started,
                    expected_end=run.ends if self.estimates else _declared_end(run),
                    predicted_end=None if predicted is None else run.started + predicted,
                    owner=job.project,
                    project=job.project,
                    submitted_at=job.submit,
                    preemptible=self.preemptible,
                    attained_service_s=run.state.attained_gpu_s,
                    cpus=job.cpus,
                    host_memory_mib=job.memory_mib,
                )
        if cluster.queue_changed:
            self._requests = {
                job_id: self._requests.get(job_id) or self.request(state)
                for job_id, state in cluster.queue.items()
            }
            # A requeued job comes back with more attained service.
            for job_id, state in cluster.queue.items():
                if self._requests[job_id].attained_service_s != state.attained_gpu_s:
                    self._requests[job_id] = self.request(state)
            cluster.queue_changed = False
        if self.history is not None:
            self._repredict(cluster, now)
        self._decay(now, cluster)
        in_use: Counter[str] = Counter()
        for running in self._running.values():
            in_use[running.project] += len(running.gpu_ids)
        usage: dict[tuple[str | None, tuple[str, str]], float] = {}
        for project, used in self._usage.items():
            usage[(None, ("project", project))] = usage[(None, ("user", project))] = used
        return Snapshot(
            now=now,
            nodes=self._nodes,
            gpus=tuple(self._slots),
            running=tuple(self._running.values()),
            queue=tuple(self._requests.values()),
            pools=MappingProxyType({None: self.config}),
            quotas=tuple(
                QuotaLimit(
                    pool=None,
                    holder=("project", project),
                    max_gpus=gpus,
                    gpus_in_use=float(in_use[project]),
                    fairshare_weight=gpus,
                )
                for project, gpus in self.quotas.items()
            ),
            usage=MappingProxyType(usage),
        )

    def decide(self, cluster: Cluster, now: float) -> Decision:
        snapshot = self.snapshot(cluster, now)
        started = time.perf_counter()
        result = plan(snapshot)
        seconds = time.perf_counter() - started
        preempt = sorted({victim for p in result.preemptions for victim in p.victims})
        return Decision([(p.job_id, p.gpu_ids) for p in result.placements], preempt, seconds)

    def wake_at(self, cluster: Cluster, now: float) -> float | None:
        """When a running job crosses into a lower queue of attained service: under `las`,
        and under `qssf` when the jobs are preemptible (`attained_thresholds`)."""
        thresholds = attained_thresholds(self.config)
        if not thresholds or (self.config.policy != "las" and not self.preemptible):
            return None
        return las_crossing(cluster.running.values(), thresholds, now)


def _declared_end(run: Run) -> float | None:
    """A running job's end by its user's estimate, as the loop reckons it (None: none)."""
    estimate = run.state.job.estimate
    return None if estimate is None else run.started + estimate


class SharingScheduler(EngineScheduler):
    """The engine's MIG/MPS placement (`SharingPass`) alone, jobs in arrival order, under one
    packing, measuring fragmentation against `mix` (the trace's requests) rather than the
    queue of the moment: the openb comparison of packings in the same code."""

    def __init__(self, name: str, packing: Packing, mix: Sequence[TraceJob]) -> None:
        super().__init__(name, PoolConfig(preemption=False))
        self.packing = packing
        self.mix = mix
        self._mix_requests: list[JobRequest] = []

    def decide(self, cluster: Cluster, now: float) -> Decision:
        snapshot = self.snapshot(cluster, now)
        if not self._mix_requests:
            self._mix_requests = mix_requests(self, cluster, self.mix)
        started = time.perf_counter()
        sharing = SharingPass(snapshot, packing=self.packing, workload=self._mix_requests)
        starts = []
        for job in sorted(snapshot.queue, key=lambda job: (job.submitted_at, job.id)):
            placed = sharing.place(job)
            if isinstance(placed, Placement):
                starts.append((job.id, placed.gpu_ids))
        return Decision(starts, [], time.perf_counter() - started)


def mix_requests(
    scheduler: EngineScheduler, cluster: Cluster, jobs: Iterable[TraceJob]
) -> list[JobRequest]:
    """`jobs` as the engine would see them waiting on `cluster`."""
    return [scheduler.request(arrival(job, cluster.node_size)) for job in jobs]


def unusable_gpus(cluster: Cluster, mix: Sequence[TraceJob]) -> float:
    """GPUs' worth of free shared capacity on `cluster` that `mix`'s requests cannot use
    (FGD's measure, the engine's `sharing.unusable_gpus`)."""
    scheduler = EngineScheduler("measure", PoolConfig())
    snapshot = scheduler.snapshot(cluster, 0.0)
    return sharing_unusable_gpus(snapshot, mix_requests(scheduler, cluster, mix))
