"""Queue policies: the order in which a pass considers waiting jobs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from scheduling.placement.snapshot import PRIORITIES, JobRequest

DEFAULT_PRIORITY_POINTS: Mapping[str, float] = MappingProxyType(
    {"low": 0, "normal": 1000, "high": 2000, "critical": 3000}
)


class Policy(Protocol):
    """Orders the queue; the pass places jobs in this order. Must be deterministic."""

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]: ...


@dataclass(frozen=True, slots=True)
class Fcfs:
    """First come, first served: by submission time, then job id."""

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]:
        return sorted(jobs, key=lambda job: (job.submitted_at, job.id))


@dataclass(frozen=True, slots=True)
class PriorityWithAging:
    """Highest score first: the priority's points plus one point per `aging_interval_s`
    waited (at most `max_age_points`, when set), so that a low job eventually overtakes.
    Ties go to the earlier submission, then the lower id."""

    priority_points: Mapping[str, float] = field(default_factory=lambda: DEFAULT_PRIORITY_POINTS)
    aging_interval_s: float = 60.0
    max_age_points: float | None = None

    def __post_init__(self) -> None:
        missing = [name for name in PRIORITIES if name not in self.priority_points]
        if missing:
            raise ValueError(f"priority_points lacks {', '.join(sorted(missing))}")
        if self.aging_interval_s <= 0:
            raise ValueError("aging_interval_s must be positive")

    def score(self, job: JobRequest, now: float) -> float:
        age_points = max(0.0, now - job.submitted_at) / self.aging_interval_s
        if self.max_age_points is not None:
            age_points = min(age_points, self.max_age_points)
        return self.priority_points[job.priority] + age_points

    def order(self, jobs: Iterable[JobRequest], now: float) -> list[JobRequest]:
        return sorted(jobs, key=lambda job: (-self.score(job, now), job.submitted_at, job.id))


# Policies by the name settings and the UI use. Fair share, SJF and the backfill variants
# register here when they come.
POLICIES: Mapping[str, Callable[..., Policy]] = MappingProxyType(
    {"fcfs": Fcfs, "priority": PriorityWithAging}
)
