"""Limits on running work: quotas per user and project in a pool, and job arrays' caps.

A `QuotaLimit` caps GPUs held at once (`max_gpus`, whole-GPU equivalents) and GPU-hours per
period (`gpu_hours`). A job exceeds it when what its holder uses now, plus what this pass has
already started for it, plus the job itself would pass the limit: its GPUs, and its GPU-hours
by its expected runtime (an unknown runtime adds none; the hours already used still count).
Work started over quota ("borrowed") does not count: it runs on idle GPUs, preemptible.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from inventory.nvml.mig_catalog import compute_share
from scheduling.placement.snapshot import JobRequest, QuotaLimit, RunningJob
from scheduling.placement.text import plural

PERIOD_PHRASES = {"day": "today", "week": "this week", "month": "this month"}


def gpu_equivalents(job: JobRequest) -> float:
    """Whole GPUs a job counts for: its GPUs; an MPS share its percent; a MIG device its
    compute slices out of its GPU's (``mig_catalog.compute_share``: 3g.40gb is 3/7)."""
    if job.mps_percent is not None:
        return job.mps_percent / 100
    if job.mig_profile is not None:
        return compute_share(job.mig_profile) or 1.0
    return float(job.gpu_count)


def gpu_hours(job: JobRequest) -> float:
    """GPU-hours by the job's expected runtime (0 when unknown)."""
    runtime = job.expected_runtime_s
    return 0.0 if runtime is None else gpu_equivalents(job) * runtime / 3600


def _number(value: float) -> str:
    """ "8", "7.5" """
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


class QuotaBook:
    """The quotas of a pass, and what the pass has started within them so far."""

    def __init__(self, quotas: Iterable[QuotaLimit]) -> None:
        self._limits: dict[tuple[str | None, tuple[str, str]], QuotaLimit] = {
            (quota.pool, quota.holder): quota for quota in quotas
        }
        self._gpus: dict[tuple[str | None, tuple[str, str]], float] = defaultdict(float)
        self._hours: dict[tuple[str | None, tuple[str, str]], float] = defaultdict(float)

    def _keys(
        self, pool: str | None, owner: str, project: str
    ) -> list[tuple[str | None, tuple[str, str]]]:
        if not self._limits:
            return []
        holders = [("user", owner)] + ([("project", project)] if project else [])
        return [(pool, holder) for holder in holders if (pool, holder) in self._limits]

    def refusal(self, job: JobRequest) -> str | None:
        """The first limit `job` would exceed, as a sentence ("user alice uses 8 of 8 GPUs in
        pool a100"), or None within quota."""
        return self.refusal_for(
            job.pool, job.owner, job.project, gpu_equivalents(job), gpu_hours(job)
        )

    def refusal_for(
        self, pool: str | None, owner: str, project: str, gpus: float, hours: float = 0.0
    ) -> str | None:
        """`refusal` of work that is no `JobRequest` (a job on an external Ray cluster):
        `gpus` whole-GPU equivalents for `hours` GPU-hours (0: unknown) in `pool`."""
        for key in self._keys(pool, owner, project):
            limit = self._limits[key]
            kind, holder = limit.holder
            who = f"{kind} {limit.name or holder}"
            where = "" if limit.pool is None else f" in pool {limit.pool}"
            if limit.max_gpus is not None:
                using = limit.gpus_in_use + self._gpus[key]
                if using + gpus > limit.max_gpus + 1e-9:
                    return f"{who} uses {_number(using)} of {_number(limit.max_gpus)} GPUs{where}"
            if limit.gpu_hours is not None:
                used = limit.gpu_hours_used + self._hours[key]
                if used + hours > limit.gpu_hours + 1e-9:
                    period = PERIOD_PHRASES[limit.period]
                    return (
                        f"{who} used {_number(used)} of {_number(limit.gpu_hours)} GPU-hours"
                        f"{where} {period}"
                    )
        return None

    def charge(self, job: JobRequest) -> None:
        """Count `job`, started within quota in this pass."""
        for key in self._keys(job.pool, job.owner, job.project):
            self._gpus[key] += gpu_equivalents(job)
            self._hours[key] += gpu_hours(job)


class ArrayCaps:
    """Job arrays' caps (`%N`): tasks running now, plus those started in this pass."""

    def __init__(self, limits: Mapping[int, int], running: Iterable[RunningJob]) -> None:
        self._limits = limits
        self._running = Counter(job.array for job in running if job.array in limits)

    def refusal(self, job: JobRequest) -> str | None:
        """ "array 12 runs 50 tasks at once, its cap (%50)", or None below its cap."""
        if job.array is None or job.array not in self._limits:
            return None
        limit = self._limits[job.array]
        if self._running[job.array] < limit:
            return None
        return (
            f"array {job.array} runs {plural(self._running[job.array], 'task')} at once, its "
            f"cap (%{limit})"
        )

    def charge(self, job: JobRequest) -> None:
        if job.array in self._limits:
            self._running[job.array] += 1
