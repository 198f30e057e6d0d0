"""Runtime prediction from history: how long a job that declared no estimate will likely hold
its GPUs, from the runtimes of similar jobs that have already ended.

See docs/development/design-notes.md, "Runtime predictions".
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from scheduling.placement.snapshot import RunningJob

# How many of the last runtimes a prediction takes the mean of: an owner's own jobs (short:
# their sweeps and their changes of work show at once), and a project's or pool's (longer:
# many owners' jobs mixed).
RECENT_OWN = 10
RECENT_SHARED = 50
# A prediction is never below this (a job that ended at once still takes a pass to replace).
SHORTEST_PREDICTION_S = 1.0


@dataclass(frozen=True, slots=True)
class Completed:
    """One finished run: who ran it, where, its shape (GPUs, whole-GPU equivalents: a MIG
    device or an MPS share counts 1), its name, how long it held its GPUs, and when it
    ended (epoch seconds)."""

    owner: str
    project: str
    pool: str | None
    gpus: int
    runtime_s: float
    ended_at: float
    name: str = ""


class History:
    """Completed runs indexed for prediction. Feed it in order of `ended_at` (`add`; the
    constructor sorts what it is given)."""

    def __init__(self, records: Iterable[Completed] = ()) -> None:
        # Per similarity key: the ends and the runtimes of its runs, in order of end.
        self._ends: dict[Hashable, list[float]] = {}
        self._runtimes: dict[Hashable, list[float]] = {}
        self._means: dict[tuple[Hashable, int], float] = {}
        self.ends: list[float] = []  # every run's end, in order
        self.latest = -math.inf  # the latest end fed
        self.size = 0
        for record in sorted(records, key=lambda r: r.ended_at):
            self.add(record)

    def add(self, record: Completed) -> None:
        """Learn one finished run (ending no earlier than those learned before)."""
        ended = record.ended_at
        if ended < self.latest:
            raise ValueError(f"runs are learned in order of end: {ended} < {self.latest}")
        runtime = max(record.runtime_s, SHORTEST_PREDICTION_S)
        ends, runtimes = self._ends, self._runtimes
        for key, _ in _keys(record.owner, record.project, record.pool, record.gpus, record.name):
            known = ends.get(key)
            if known is None:
                ends[key] = [ended]
                runtimes[key] = [runtime]
            else:
                known.append(ended)
                runtimes[key].append(runtime)
        self.ends.append(ended)
        self.latest = ended
        self.size += 1

    def runtime(
        self,
        *,
        owner: str,
        project: str,
        pool: str | None,
        gpus: int,
        name: str = "",
        before: float = math.inf,
    ) -> float | None:
        """The predicted runtime (seconds) of a job of this owner, project, pool, GPU count
        and name, from the runs that ended before `before` (a job's submission: what was
        known when it was submitted): the mean of the most similar runs' last runtimes;
        None when the pool has none."""
        for key, length in _keys(owner, project, pool, gpus, name):
            ends = self._ends.get(key)
            if not ends:
                continue
            count = len(ends) if before > ends[-1] else bisect_left(ends, before)
            if not count:
                continue
            mean = self._means.get((key, count))
            if mean is None:
                runtimes = self._runtimes[key][max(0, count - length) : count]
                mean = self._means[(key, count)] = statistics.fmean(runtimes)
            return mean
        return None


def _keys(
    owner: str, project: str, pool: str | None, gpus: int, name: str
) -> tuple[tuple[Hashable, int], ...]:
    """The similarity keys of a job, most specific first, with how many runtimes each keeps."""
    common: tuple[tuple[Hashable, int], ...] = (
        (("gpus", pool, gpus), RECENT_SHARED),
        (("pool", pool), RECENT_SHARED),
    )
    if project:
        common = ((("project", pool, project, gpus), RECENT_SHARED), *common)
    mine = (("owner", pool, owner, gpus), RECENT_OWN)
    if name:
        return ((("name", pool, owner, name, gpus), RECENT_OWN), mine, *common)
    return (mine, *common)


def grown(started_at: float, runtime: float, now: float) -> float:
    """The end of a run predicted to take `runtime` from `started_at`, as seen at `now`: the
    prediction while it lies ahead; once the run outlives it, the prediction doubled as
    many times as it takes to lie ahead again (EASY++ lengthens a passed prediction rather
    than taking the job to end now)."""
    runtime = max(runtime, SHORTEST_PREDICTION_S)
    elapsed = now - started_at
    if elapsed >= runtime:
        runtime *= 2.0 ** (math.floor(math.log2(elapsed / runtime)) + 1)
    return started_at + runtime


def release_at(job: RunningJob, now: float) -> float:
    """When `job`'s GPUs are expected back (math.inf: unknown): its `expected_end` (its
    user's estimate, else its maximum runtime) unless a prediction was made for it, then the
    prediction grown past `now` (see `grown`), never beyond `expected_end`."""
    predicted = job.predicted_end
    if predicted is None:
        return math.inf if job.expected_end is None else job.expected_end
    end = grown(job.started_at, predicted - job.started_at, now)
    return end if job.expected_end is None else min(end, job.expected_end)


class Predictor:
    """Predicted runtimes of jobs, each made from the runs that ended before the job was
    submitted (what was known then, as Tsafrir's predictor uses the user's last jobs before
    this one): made once, then kept by job id. `read_at`: the history holds every run that
    ended by then (a job submitted later is predicted again from the next reading). A job
    submitted before its pool had any history is predicted from the whole history instead,
    afresh as it grows, until a reading holds a run that ended before its submission."""

    def __init__(
        self,
        history: History,
        kept: Mapping[int, float] | None = None,
        read_at: float = math.inf,
    ) -> None:
        self.history = history
        self.read_at = read_at
        self.by_job: dict[int, float] = dict(kept or {})
        self._asked: set[int] = set()
        # Predictions from the whole history, by kind of job, with the history's size then;
        # and from the runs before a submission, by kind and how many runs had ended then.
        self._latest: dict[Hashable, tuple[int, float | None]] = {}
        self._before: dict[tuple[Hashable, int], float | None] = {}

    def runtime(
        self,
        job_id: int,
        *,
        owner: str,
        project: str,
        pool: str | None,
        gpus: int,
        name: str,
        submitted_at: float,
    ) -> float | None:
        """The runtime predicted for job `job_id` (None: its pool has no history at all)."""
        self._asked.add(job_id)
        known = self.by_job.get(job_id)
        if known is not None:
            return known
        kind = (owner, project, pool, gpus, name)
        ends = self.history.ends
        ended = (
            len(ends) if not ends or submitted_at > ends[-1] else bisect_left(ends, submitted_at)
        )
        if (kind, ended) in self._before:
            found = self._before[(kind, ended)]
        else:
            found = self._before[(kind, ended)] = self.history.runtime(
                owner=owner, project=project, pool=pool, gpus=gpus, name=name, before=submitted_at
            )
        if found is not None:
            if submitted_at <= self.read_at:
                self.by_job[job_id] = found
            return found
        latest = self._latest.get(kind)
        if latest is None or latest[0] != self.history.size:
            predicted = self.history.runtime(
                owner=owner, project=project, pool=pool, gpus=gpus, name=name
            )
            latest = self._latest[kind] = (self.history.size, predicted)
        return latest[1]

    def known(self, job_id: int) -> float | None:
        """The prediction made for good of job `job_id`, if any (the cheap path of
        `runtime`, for a job asked about before)."""
        self._asked.add(job_id)
        return self.by_job.get(job_id)

    def is_final(self, job_id: int) -> bool:
        """Whether the job's prediction is made for good (from runs before its submission)."""
        return job_id in self.by_job

    def renewed(self, history: History, read_at: float = math.inf) -> Predictor:
        """A predictor over a new reading of the history that keeps the predictions made of
        the jobs asked about since this one was made (the others are no longer waiting or
        running)."""
        kept = {job_id: self.by_job[job_id] for job_id in self._asked if job_id in self.by_job}
        return Predictor(history, kept, read_at)
