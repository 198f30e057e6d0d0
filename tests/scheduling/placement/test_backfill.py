"""EASY backfill keeps the first waiting job's start; without it, the pool runs in strict order."""

from __future__ import annotations

import math
from dataclasses import replace
from random import Random

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from scheduling.placement import (
    JobRequest,
    PoolConfig,
    PriorityWithAging,
    Reason,
    RunningJob,
    Snapshot,
    plan,
)
from scheduling.placement.backfill import shadow
from scheduling.placement.engine import EVERYWHERE
from scheduling.placement.fleet import Fleet as Index
from scheduling.placement.planner import _Partition
from tests.scheduling.placement.builders import H100, NOW, Fleet, job, pending, placed
from tests.scheduling.placement.test_properties import PASSES, random_snapshot

HOUR = 3600.0
STRICT = {None: PoolConfig(policy="fcfs", backfill=False)}
EASY = {None: PoolConfig(policy="fcfs", backfill=True)}


def two_nodes_one_busy_for_an_hour() -> Fleet:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1, 2, 3], busy_until=NOW + HOUR)
    fleet.dgx("dgx-02", busy=[0, 1, 2, 3, 4, 5], busy_until=NOW + 2 * HOUR)
    return fleet


def test_a_later_job_that_ends_before_the_head_starts_runs_on_its_gpus() -> None:
    fleet = two_nodes_one_busy_for_an_hour()

    result = fleet.plan(
        job(1, gpus=8),
        job(2, gpus=4, estimated_duration_s=HOUR),
        job(3, gpus=2, estimated_duration_s=HOUR + 1),
        pools=EASY,
    )

    # Job 1 starts on dgx-01 in an hour. Job 2 is gone by then; job 3 would not be, so it
    # takes the two GPUs of dgx-02 that job 1 will not need.
    assert placed(result, 2).nodes == ("dgx-01",)
    assert placed(result, 3).nodes == ("dgx-02",)
    assert pending(result, 1).estimated_start == NOW + HOUR


def test_a_later_job_that_would_delay_the_head_waits_with_priority() -> None:
    fleet = two_nodes_one_busy_for_an_hour()

    result = fleet.plan(job(1, gpus=8), job(2, gpus=4, max_runtime_s=2 * HOUR), pools=EASY)

    assert result.placements == ()
    waiting = pending(result, 2)
    assert (waiting.position, waiting.reason) == (2, Reason.PRIORITY)
    assert waiting.message == (
        "the GPUs it fits on are kept for job 1, first in line, due to start by "
        "2023-11-14 23:13 UTC; only jobs that end by then may use them"
    )
    assert waiting.estimated_start == NOW + HOUR


def test_without_backfill_nothing_starts_behind_the_first_waiting_job() -> None:
    fleet = two_nodes_one_busy_for_an_hour()

    result = fleet.plan(job(1, gpus=8), job(2, gpus=1, estimated_duration_s=60), pools=STRICT)

    assert result.placements == ()
    waiting = pending(result, 2)
    assert waiting.reason == Reason.PRIORITY
    assert waiting.message == "waits behind job 1: this pool starts jobs in queue order"


def test_a_job_no_working_hardware_can_hold_blocks_nobody_even_in_strict_order() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-h100", H100, state="draining")

    result = fleet.plan(
        job(1, gpu_model="NVIDIA B200"), job(2, gpu_model=H100), job(3, gpus=8), pools=STRICT
    )

    assert [p.job_id for p in result.placements] == [3]
    assert [(p.job_id, p.reason) for p in result.pending] == [
        (1, Reason.MODEL),
        (2, Reason.NODES_UNAVAILABLE),
    ]


def test_an_unknown_end_keeps_jobs_without_a_runtime_off_the_heads_gpus() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0], busy_until=None)

    result = fleet.plan(
        job(1, gpus=8), job(2, gpus=2), job(3, gpus=2, max_runtime_s=HOUR), pools=EASY
    )

    # Job 1's start is unknown: job 3 is sure to end before it, job 2 is not.
    assert [p.job_id for p in result.placements] == [3]
    waiting = pending(result, 2)
    assert (waiting.reason, waiting.estimated_start) == (Reason.PRIORITY, None)
    assert waiting.message == "the GPUs it fits on are kept for job 1, first in line"


def test_only_the_first_waiting_job_holds_gpus() -> None:
    fleet = two_nodes_one_busy_for_an_hour()

    # Job 2 (second in line) also waits; job 3 may take the GPUs job 2 would want.
    result = fleet.plan(job(1, gpus=8), job(2, gpus=8), job(3, gpus=2, max_runtime_s=9 * HOUR))

    assert placed(result, 3).nodes == ("dgx-02",)


def snapshot_with(snapshot: Snapshot, placed_jobs: list[JobRequest], result_gpus: dict) -> Snapshot:
    """`snapshot` with `placed_jobs` running on the GPUs the pass gave them, until their
    likely ends (estimate, else prediction, else maximum runtime)."""
    gpus = []
    for gpu in snapshot.gpus:
        holder = result_gpus.get(gpu.id)
        gpus.append(gpu if holder is None else replace(gpu, allocated_to=holder))
    running = list(snapshot.running)
    for placed_job in placed_jobs:
        runtime = placed_job.likely_runtime_s
        ids = tuple(gpu_id for gpu_id, holder in result_gpus.items() if holder == placed_job.id)
        end = None if runtime is None else snapshot.now + runtime
        running.append(RunningJob(placed_job.id, ids, snapshot.now, end))
    return replace(snapshot, gpus=tuple(gpus), running=tuple(running), queue=())


def shadow_start(snapshot: Snapshot, head: JobRequest) -> float | None:
    found = shadow(Index(snapshot), head, snapshot.now, frozenset())
    return None if found is None else found.start


def never_delays_the_head(rng: Random) -> None:
    """Whatever starts behind the head, the head can start no later than if only the jobs
    ahead of it had started (by likely runtimes: estimates, else predictions)."""
    snapshot = random_snapshot(rng)
    snapshot = replace(
        snapshot,
        queue=tuple(
            replace(
                j,
                estimated_duration_s=rng.choice((None, 600.0, 3600.0, 7200.0)),
                predicted_runtime_s=rng.choice((None, None, 300.0, 1800.0, 5400.0)),
            )
            for j in snapshot.queue
        ),
    )
    policy = PriorityWithAging()
    result = plan(snapshot, policy)
    given_to = {gpu_id: p.job_id for p in result.placements for gpu_id in p.gpu_ids}
    placed_ids = {p.job_id for p in result.placements}
    ahead: list[JobRequest] = []
    for candidate in policy.order(snapshot.queue, snapshot.now):
        if candidate.id in placed_ids:
            ahead.append(candidate)
            continue
        before = snapshot_with(
            snapshot, ahead, {g: j for g, j in given_to.items() if j in {a.id for a in ahead}}
        )
        start_before = shadow_start(before, candidate)
        if start_before is None:
            continue  # never fits the working hardware: not a head
        after = snapshot_with(snapshot, [j for j in snapshot.queue if j.id in placed_ids], given_to)
        start_after = shadow_start(after, candidate)
        assert start_after is not None
        assert start_after <= start_before or start_before == math.inf
        return


@PASSES
@given(rng=st.randoms())
def test_backfill_never_delays_the_first_waiting_job(rng: Random) -> None:
    never_delays_the_head(rng)


def test_the_property_catches_a_backfill_that_ignores_the_head() -> None:
    """Proof the check can fail: a job of unknown runtime put on the head's node delays it."""
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1], busy_until=NOW + HOUR)
    snapshot = fleet.snapshot()
    head, intruder = job(1, gpus=8), job(2, gpus=2)
    intruder_gpus: dict[int, int] = {gpu.id: 2 for gpu in snapshot.gpus if gpu.index in (2, 3)}

    before = shadow_start(snapshot, head)
    after = shadow_start(snapshot_with(snapshot, [intruder], intruder_gpus), head)

    assert before == NOW + HOUR
    assert after == math.inf


def test_the_property_test_catches_an_engine_that_ignores_the_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proof the property test can fail: a pass that lets every job use the head's GPUs."""
    monkeypatch.setattr(_Partition, "view", lambda self, job: EVERYWHERE)
    search = settings(PASSES, max_examples=500, phases=[Phase.generate], report_multiple_bugs=False)
    with pytest.raises(AssertionError):
        search(given(rng=st.randoms())(never_delays_the_head))()


def test_a_job_predicted_to_end_before_the_head_starts_runs_on_its_gpus() -> None:
    fleet = two_nodes_one_busy_for_an_hour()

    result = fleet.plan(
        job(1, gpus=8),
        job(2, gpus=4, predicted_runtime_s=HOUR / 2),
        job(3, gpus=4),
        pools=EASY,
    )

    # Job 1 starts on dgx-01 in an hour: job 2 is predicted gone by then; job 3, of unknown
    # runtime, and job 4, predicted to run past it, may not use its GPUs.
    assert placed(result, 2).nodes == ("dgx-01",)
    assert [p.job_id for p in result.placements] == [2]
    assert pending(result, 1).estimated_start == NOW + HOUR
    without = fleet.plan(
        job(1, gpus=8), job(3, gpus=4), job(4, gpus=4, predicted_runtime_s=2 * HOUR), pools=EASY
    )
    assert without.placements == ()
    for other in (3, 4):
        assert pending(without, other).reason == Reason.PRIORITY


def test_a_running_jobs_predicted_end_gives_the_head_a_start() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", [0, 1, 2, 3], None, predicted_end=NOW + HOUR)

    result = fleet.plan(
        job(1, gpus=8), job(2, gpus=4, predicted_runtime_s=HOUR / 2), job(3, gpus=4), pools=EASY
    )

    # Without the prediction the head's start would be unknown.
    assert [p.job_id for p in result.placements] == [2]
    assert pending(result, 1).estimated_start == NOW + HOUR
    # Estimated starts read predictions too: job 2's GPUs are due back in half an hour.
    assert pending(result, 3).estimated_start == NOW + HOUR / 2


def test_a_running_job_that_outlived_its_prediction_is_not_taken_to_end_now() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    # Started 600 s ago, predicted to take 300 s: doubled twice, to 1,200 s.
    fleet.run("dgx-01", [0, 1, 2, 3], None, predicted_end=NOW - 300)

    result = fleet.plan(
        job(1, gpus=8),
        job(2, gpus=4, predicted_runtime_s=600),
        job(3, gpus=4, predicted_runtime_s=601),
        pools=EASY,
    )

    assert pending(result, 1).estimated_start == NOW + 600
    assert [p.job_id for p in result.placements] == [2]


@pytest.mark.parametrize(
    "config",
    [
        EASY[None],
        # A pool's own window, in its own aging intervals: 5 hours.
        replace(EASY[None], prediction_trust_intervals=600, aging_interval_s=30),
    ],
    ids=["default", "pool's"],
)
def test_a_head_that_waited_long_is_passed_by_estimates_and_limits_only(
    config: PoolConfig,
) -> None:
    long_ago = NOW - config.prediction_trust_intervals * config.aging_interval_s
    fleet = two_nodes_one_busy_for_an_hour()
    jobs = (
        job(2, gpus=4, predicted_runtime_s=60),
        job(3, gpus=4, predicted_runtime_s=60, max_runtime_s=HOUR, submitted_at=NOW),
    )
    pools = {None: config}

    fresh = fleet.plan(job(1, gpus=8, submitted_at=long_ago + 1), *jobs, pools=pools)
    waited = fleet.plan(job(1, gpus=8, submitted_at=long_ago), *jobs, pools=pools)

    assert [p.job_id for p in fresh.placements] == [2]
    # Job 2 is only predicted to end in time; job 3 is sure to, by its maximum runtime.
    assert [p.job_id for p in waited.placements] == [3]
