"""Queue policies: the order in which a pass considers one pool's waiting jobs.

Each policy scores a job with a bounded part (its priority level, its estimated size, its
owner's fair share, its attained service) and, except FCFS, which needs none, a part that grows
without bound while it waits. So a job that has waited long enough ranks ahead of every job
submitted after it, whatever that job's standing: no policy can starve a job. The pass then
guarantees the first waiting job its start (EASY backfill, or strict order), see `plan`.

    policy = policy_for(snapshot.pools.get(pool, PoolConfig()), snapshot, pool)
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from scheduling.placement.fairshare import FairShareTable
from scheduling.placement.quotas import gpu_equivalents
from scheduling.placement.snapshot import PRIORITIES, JobRequest, PoolConfig, Snapshot

DEFAULT_PRIORITY_POINTS: Mapping[str, float] = MappingProxyType(
    {"low": 0, "normal": 1000, "high": 2000, "critical": 3000}
)
# Priority levels by rank (preemption compares them).
PRIORITY_RANK: Mapping[str, int] = MappingProxyType({name: i for i, name in enumerate(PRIORITIES)})
# SJF: runtimes are scored between a minute and a week (shorter or longer count as those).
SJF_SHORTEST_S = 60.0
SJF_LONGEST_S = 7 * 24 * 3600.0
# QSSF: GPU-services are scored between a GPU-minute and a week of 64 GPUs; each halving of
# the service is worth the pool's points per halving (aging intervals waited; by default a
# job 16 times smaller gains one priority level, and the longest wait its size can cause
# stays near 3.4 days at the default aging minute).
QSSF_SMALLEST_GPU_S = 60.0
QSSF_LARGEST_GPU_S = 7 * 24 * 3600.0 * 64
# LAS: the queues' attained-service thresholds when a pool names none (Tiresias' defaults are
# of this order), and how many times its own service a job must wait to return to the top.
DEFAULT_LAS_THRESHOLDS_GPU_S = (3600.0, 36_000.0)
LAS_STARVE_MULTIPLE = 2.0


class Policy(Protocol):
    """Orders the queue; the pass places jobs in this order. Must be deterministic."""

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]: ...


def _check_las(thresholds_gpu_s: tuple[float, ...], starve_multiple: float) -> None:
    if any(t <= 0 for t in thresholds_gpu_s) or list(thresholds_gpu_s) != sorted(
        set(thresholds_gpu_s)
    ):
        raise ValueError("thresholds_gpu_s must be positive and increasing")
    if starve_multiple <= 0:
        raise ValueError("starve_multiple must be positive")


def las_queue(
    job: JobRequest, now: float, thresholds_gpu_s: tuple[float, ...], starve_multiple: float
) -> int:
    """Tiresias' discretized queue of `job`: how many of `thresholds_gpu_s` its attained
    GPU-seconds reach, but 0 (the top queue) once it has waited `starve_multiple` times its
    own service (its GPU-seconds over its GPU count: the time it ran) since it last went back
    to the queue (`queued_at`, else its submission): Tiresias' STARVELIMIT."""
    service = job.attained_service_s
    level = bisect_right(thresholds_gpu_s, service)
    since = job.submitted_at if job.queued_at is None else job.queued_at
    if level and now - since >= starve_multiple * service / job.gpu_count:
        return 0
    return level


def _age_points(job: JobRequest, now: float, aging_interval_s: float) -> float:
    return max(0.0, now - job.submitted_at) / aging_interval_s


def _check_points(priority_points: Mapping[str, float], aging_interval_s: float) -> None:
    missing = [name for name in PRIORITIES if name not in priority_points]
    if missing:
        raise ValueError(f"priority_points lacks {', '.join(sorted(missing))}")
    if aging_interval_s <= 0:
        raise ValueError("aging_interval_s must be positive")


@dataclass(frozen=True, slots=True)
class Fcfs:
    """First come, first served: by submission time, then job id."""

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]:
        return sorted(jobs, key=lambda job: (job.submitted_at, job.id))


@dataclass(frozen=True, slots=True)
class PriorityWithAging:
    """Highest score first: the priority's points plus one point per `aging_interval_s`
    waited (at most `max_age_points`, when set; a cap gives up the no-starvation guarantee),
    so that a low job eventually overtakes. Ties go to the earlier submission, then the lower
    id."""

    priority_points: Mapping[str, float] = field(default_factory=lambda: DEFAULT_PRIORITY_POINTS)
    aging_interval_s: float = 60.0
    max_age_points: float | None = None

    def __post_init__(self) -> None:
        _check_points(self.priority_points, self.aging_interval_s)

    def score(self, job: JobRequest, now: float) -> float:
        age_points = _age_points(job, now, self.aging_interval_s)
        if self.max_age_points is not None:
            age_points = min(age_points, self.max_age_points)
        return self.priority_points[job.priority] + age_points

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]:
        return sorted(jobs, key=lambda job: (-self.score(job, now), job.submitted_at, job.id))


@dataclass(frozen=True, slots=True)
class Sjf:
    """Shortest job first, by the user's estimate (`estimated_duration_s`, else
    `max_runtime_s`): `points_per_halving` for each halving of the runtime below a week (a
    minute or less scores the most, about 13.3 halvings; an unknown runtime scores 0 and goes
    after known ones of equal score), plus one point per `aging_interval_s` waited, so a long
    job overtakes any shorter job submitted 13.3 x `points_per_halving` intervals after it."""

    aging_interval_s: float = 60.0
    points_per_halving: float = 1000.0

    def __post_init__(self) -> None:
        if self.aging_interval_s <= 0 or self.points_per_halving < 0:
            raise ValueError("aging_interval_s must be positive, points_per_halving >= 0")

    def size_points(self, job: JobRequest) -> float:
        runtime = job.expected_runtime_s
        if runtime is None:
            return 0.0
        clamped = min(max(runtime, SJF_SHORTEST_S), SJF_LONGEST_S)
        return self.points_per_halving * math.log2(SJF_LONGEST_S / clamped)

    def score(self, job: JobRequest, now: float) -> float:
        return self.size_points(job) + _age_points(job, now, self.aging_interval_s)

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]:
        return sorted(
            jobs,
            key=lambda job: (
                -self.score(job, now),
                job.expected_runtime_s is None,
                job.submitted_at,
                job.id,
            ),
        )


@dataclass(frozen=True, slots=True)
class Qssf:
    """Quasi-shortest service first (Helios, SC'21): the least GPU-service first, by the job's
    likely runtime (`likely_runtime_s`: the user's estimate, else the runtime history
    predicts, see scheduling.placement.predict, never beyond the maximum runtime) times its
    GPUs (whole-GPU equivalents). The score is the priority's points, plus
    `points_per_halving` for each halving of the service below `QSSF_LARGEST_GPU_S` (a
    GPU-minute or less scores the most, about 19 halvings; an unknown service scores 0 and
    goes after known ones of equal score), plus one point per `aging_interval_s` waited. So
    a job waits at most the priority and size points' range in aging intervals before it is
    ahead of every job submitted after it, whatever their size: no job starves. With no
    history and no estimates it orders as `PriorityWithAging`.

    With `las_thresholds_gpu_s` (the pool preempts: `policy_for`), preemptible jobs are first
    put in Tiresias' queues of attained service (`las_queue`: lower queues first, a starving
    job back in the top one), and ordered by the score inside a queue; a job that may not be
    preempted is always in the top queue. Predictions are often wrong and a running job's
    service is a fact: a preemptible job that has run past a threshold yields to the work
    that has run less (preemption stops it, `preemption.Victims`), so a long job
    mispredicted as short cannot hold its GPUs against a stream of short ones."""

    priority_points: Mapping[str, float] = field(default_factory=lambda: DEFAULT_PRIORITY_POINTS)
    aging_interval_s: float = 60.0
    points_per_halving: float = PoolConfig().qssf_points_per_halving
    las_thresholds_gpu_s: tuple[float, ...] = ()
    starve_multiple: float = LAS_STARVE_MULTIPLE

    def __post_init__(self) -> None:
        _check_points(self.priority_points, self.aging_interval_s)
        if self.points_per_halving < 0:
            raise ValueError("points_per_halving must be >= 0")
        _check_las(self.las_thresholds_gpu_s, self.starve_multiple)

    @staticmethod
    def service_gpu_s(job: JobRequest) -> float | None:
        """The GPU-seconds the job will likely take (None: unknown)."""
        runtime = job.likely_runtime_s
        return None if runtime is None else runtime * gpu_equivalents(job)

    def size_points(self, job: JobRequest) -> float:
        service = self.service_gpu_s(job)
        if service is None:
            return 0.0
        clamped = min(max(service, QSSF_SMALLEST_GPU_S), QSSF_LARGEST_GPU_S)
        return self.points_per_halving * math.log2(QSSF_LARGEST_GPU_S / clamped)

    def score(self, job: JobRequest, now: float) -> float:
        return (
            self.priority_points[job.priority]
            + self.size_points(job)
            + _age_points(job, now, self.aging_interval_s)
        )

    def queue(self, job: JobRequest, now: float) -> int:
        """The job's queue of attained service (0 without thresholds, or not preemptible)."""
        if not (self.las_thresholds_gpu_s and job.preemptible):
            return 0
        return las_queue(job, now, self.las_thresholds_gpu_s, self.starve_multiple)

    @property
    def starvation_limit_s(self) -> float:
        """How long a job in the top queue waits before its age alone outweighs any priority
        and size (a job in a lower one is back in the top one after `las_queue`'s wait)."""
        points = self.priority_points.values()
        halvings = math.log2(QSSF_LARGEST_GPU_S / QSSF_SMALLEST_GPU_S)
        spread = max(points) - min(points) + self.points_per_halving * halvings
        return spread * self.aging_interval_s

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]:
        def key(job: JobRequest) -> tuple[int, float, bool, float, int]:
            unknown = job.likely_runtime_s is None
            return (self.queue(job, now), -self.score(job, now), unknown, job.submitted_at, job.id)

        return sorted(jobs, key=key)


@dataclass(frozen=True, slots=True)
class FairShare:
    """Highest score first: the priority's points, plus `weight` times the job's fair-share
    factor in [0, 1] (its user's and project's usage against their shares, `FairShareTable`),
    plus one point per `aging_interval_s` waited. Ties as in `PriorityWithAging`. Usage
    changes between passes, so the order of two waiting jobs may too; a job that has waited
    `starvation_limit_s` (its age then beats any standing) goes first, oldest first."""

    shares: FairShareTable = field(default_factory=FairShareTable)
    weight: float = 10_000.0
    priority_points: Mapping[str, float] = field(default_factory=lambda: DEFAULT_PRIORITY_POINTS)
    aging_interval_s: float = 60.0

    def __post_init__(self) -> None:
        _check_points(self.priority_points, self.aging_interval_s)
        if self.weight < 0:
            raise ValueError("weight must be >= 0")

    def score(self, job: JobRequest, now: float) -> float:
        return (
            self.priority_points[job.priority]
            + self.weight * self.shares.factor(job.owner, job.project)
            + _age_points(job, now, self.aging_interval_s)
        )

    @property
    def starvation_limit_s(self) -> float:
        """How long a job waits before its age alone outweighs any standing."""
        points = self.priority_points.values()
        return (max(points) - min(points) + self.weight) * self.aging_interval_s

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]:
        """By score; but jobs that have waited `starvation_limit_s` go first, oldest first, so
        that usage moving between passes cannot reorder them and keep one from its turn."""
        old = now - self.starvation_limit_s

        def key(job: JobRequest) -> tuple[bool, float, float, int]:
            if job.submitted_at <= old:
                return (False, job.submitted_at, job.submitted_at, job.id)
            return (True, -self.score(job, now), job.submitted_at, job.id)

        return sorted(jobs, key=key)


@dataclass(frozen=True, slots=True)
class Las:
    """Least attained service, discretized as in Tiresias (2D-LAS): a job's queue is the number
    of `thresholds_gpu_s` its attained GPU-seconds (`attained_service_s`) reach; lower queues
    first, first come first served inside a queue. Needs no estimate. A job that has waited
    `starve_multiple` times its own service (its GPU-seconds over its GPU count, the time it
    ran) since it last went back to the queue (`queued_at`, else its submission) returns to
    the top queue (Tiresias' STARVELIMIT), where it is ahead of every job submitted after it.

    Preemption ranks a running job as it would wait if stopped now (`preemption.as_waiting`:
    its attained service with this attempt's, queued from now), so a waiting job in a lower
    queue may stop running work in a higher one, and never a job that would go straight
    back ahead of it."""

    thresholds_gpu_s: tuple[float, ...] = DEFAULT_LAS_THRESHOLDS_GPU_S
    starve_multiple: float = LAS_STARVE_MULTIPLE

    def __post_init__(self) -> None:
        _check_las(self.thresholds_gpu_s, self.starve_multiple)

    def queue(self, job: JobRequest, now: float) -> int:
        return las_queue(job, now, self.thresholds_gpu_s, self.starve_multiple)

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]:
        return sorted(jobs, key=lambda job: (self.queue(job, now), job.submitted_at, job.id))


def policy_for(config: PoolConfig, snapshot: Snapshot, pool: str | None = None) -> Policy:
    """The policy `config` names for `pool`, with its parameters (fair share reads the pool's
    usage and quota weights from `snapshot`)."""
    aging = config.aging_interval_s
    if config.policy == "fcfs":
        return Fcfs()
    if config.policy == "priority":
        return PriorityWithAging(aging_interval_s=aging)
    if config.policy == "sjf":
        return Sjf(aging_interval_s=aging)
    if config.policy == "fairshare":
        shares = FairShareTable.of(snapshot, pool)
        return FairShare(shares, weight=config.fairshare_weight, aging_interval_s=aging)
    if config.policy == "las":
        return Las(attained_thresholds(config))
    if config.policy == "qssf":
        return Qssf(
            aging_interval_s=aging,
            points_per_halving=config.qssf_points_per_halving,
            las_thresholds_gpu_s=attained_thresholds(config),
        )
    raise ValueError(f"unknown policy {config.policy!r}")


def attained_thresholds(config: PoolConfig) -> tuple[float, ...]:
    """The queues of attained service (GPU-seconds) the pool's order puts jobs in: `las`
    always puts every job in them; `qssf` puts preemptible jobs in them when the pool
    preempts (else none: `()`)."""
    thresholds = tuple(config.las_thresholds_gpu_s) or DEFAULT_LAS_THRESHOLDS_GPU_S
    if config.policy == "las" or (config.policy == "qssf" and config.preemption):
        return thresholds
    return ()


# Policies by the name settings and the UI use; each builds with defaults (benches, tests).
POLICIES: Mapping[str, Callable[..., Policy]] = MappingProxyType(
    {
        "fcfs": Fcfs,
        "priority": PriorityWithAging,
        "sjf": Sjf,
        "fairshare": FairShare,
        "las": Las,
        "qssf": Qssf,
    }
)
