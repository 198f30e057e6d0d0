"""The history of finished jobs the placement loop predicts runtimes from.

The engine's predictor (``scheduling.placement.predict.History``) learns the runs of recently
finished jobs: one query of the last ``HISTORY_RUNS`` jobs submitted in the last
``HISTORY_DAYS`` days that started and ended (completed, failed or canceled while running),
read again at most every ``HISTORY_MAX_AGE_S`` (a minute's new ends barely move a prediction).
A run's runtime is its last attempt's, from its start to its end. Only ended jobs count: a
running or waiting job's own duration is never known.

Each pass then asks it for every waiting job that gave no estimate (`predicted_runtime`)
and every running one (`predicted_end`). A job is predicted from the runs that ended before
its submission (as Tsafrir's predictor: the user's last jobs before this one), so its
prediction is made once and kept while the job waits and runs.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Protocol

from scheduling.models import TERMINAL_STATES, Job
from scheduling.placement.predict import Completed, History, Predictor

# How long a pass reuses the history an earlier pass read.
HISTORY_MAX_AGE_S = 60.0
# The most recent finished jobs read, and how far back.
HISTORY_RUNS = 5000
HISTORY_DAYS = 30


class JobRow(Protocol):
    """What a prediction reads of a job row (the loop's rows; times in epoch seconds)."""

    @property
    def pk(self) -> int: ...
    @property
    def owner_id(self) -> int: ...
    @property
    def project(self) -> str: ...
    @property
    def pool__name(self) -> str | None: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def node_count(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def submitted_at(self) -> float: ...
    @property
    def estimated_duration_s(self) -> int | None: ...


def predicted_runtime(predictor: Predictor, job: JobRow) -> float | None:
    """The runtime history predicts for `job`; None when its user gave an estimate (the
    estimate wins) or its pool has no history."""
    if job.estimated_duration_s is not None:
        return None
    known = predictor.known(job.pk)
    if known is not None:
        return known
    return predictor.runtime(
        job.pk,
        owner=str(job.owner_id),
        project=job.project,
        pool=job.pool__name,
        gpus=job.gpu_count * job.node_count,
        name=job.name,
        submitted_at=job.submitted_at,
    )


def predicted_end(predictor: Predictor, job: JobRow, started_at: float | None) -> float | None:
    """The predicted end (epoch seconds) of `job`, running since `started_at`: its start plus
    its predicted runtime (the engine grows it once passed, ``predict.release_at``)."""
    runtime = predicted_runtime(predictor, job)
    if runtime is None or started_at is None:
        return None
    return started_at + runtime


def recent_runs(now: datetime) -> list[Completed]:
    """The runs of the last ``HISTORY_RUNS`` jobs submitted in the last ``HISTORY_DAYS``
    days that ended, in one query."""
    rows = (
        Job.objects.filter(
            state__in=TERMINAL_STATES,
            submitted_at__gte=now - timedelta(days=HISTORY_DAYS),
            started_at__isnull=False,
            finished_at__isnull=False,
        )
        .order_by("-submitted_at")
        .values_list(
            "owner_id",
            "project",
            "pool__name",
            "gpu_count",
            "node_count",
            "name",
            "started_at",
            "finished_at",
        )[:HISTORY_RUNS]
    )
    runs = []
    for owner_id, project, pool, gpus, nodes, name, started, finished in rows:
        if started is None or finished is None:
            continue
        runtime = (finished - started).total_seconds()
        ended = finished.timestamp()
        runs.append(Completed(str(owner_id), project, pool, gpus * nodes, runtime, ended, name))
    return runs


_cached: tuple[float, Predictor | None] = (0.0, None)


def predictor(now: datetime) -> Predictor:
    """The predictor over the recent runs, read again at most every ``HISTORY_MAX_AGE_S``
    (a new reading keeps the predictions made of the jobs asked about since the last)."""
    global _cached
    read_at, cached = _cached
    if cached is None or time.monotonic() - read_at > HISTORY_MAX_AGE_S:
        history, read_at = History(recent_runs(now)), now.timestamp()
        if cached is None:
            cached = Predictor(history, read_at=read_at)
        else:
            cached = cached.renewed(history, read_at)
        _cached = (time.monotonic(), cached)
    return cached


def forget() -> None:
    """Drop the cached history and predictions (the next pass reads them again)."""
    global _cached
    _cached = (0.0, None)
