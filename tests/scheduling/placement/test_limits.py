"""Pools, quotas with borrowing, and job arrays' caps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.placement import Fcfs, PoolConfig, QuotaLimit, Reason, plan
from scheduling.placement.quotas import gpu_equivalents
from tests.scheduling.placement.builders import Fleet, job, pending, placed
from tests.scheduling.placement.sharing_builders import Shares, mps_job

A100 = {"a100": PoolConfig(policy="fcfs", allow_borrowing=False)}
LENDING = {"a100": PoolConfig(policy="fcfs", allow_borrowing=True)}


def pooled_fleet() -> Fleet:
    fleet = Fleet()
    fleet.dgx("dgx-01", pool="a100")
    fleet.dgx("dgx-02", pool="a100")
    fleet.dgx("dgx-03")
    return fleet


def test_a_job_runs_only_on_the_gpus_of_its_own_pool() -> None:
    fleet = pooled_fleet()

    result = fleet.plan(job(1, gpus=8, pool="a100"), job(2, gpus=8), job(3, gpus=8), pools=A100)

    assert placed(result, 1).nodes == ("dgx-01",)
    assert placed(result, 2).nodes == ("dgx-03",)
    # Job 3 has no pool: dgx-02's free GPUs are not its.
    waiting = pending(result, 3)
    assert (waiting.position, waiting.reason) == (1, Reason.RESOURCES_BUSY)


def test_positions_count_per_pool_and_a_pool_without_gpus_says_so() -> None:
    fleet = pooled_fleet()

    result = fleet.plan(
        job(1, gpus=9, pool="a100"),
        job(2, gpus=9),
        job(3, pool="h100"),
        job(4, gpus=9, pool="a100"),
    )

    assert [(p.job_id, p.position) for p in result.pending] == [(2, 1), (1, 1), (4, 2), (3, 1)]
    assert pending(result, 1).message == "needs 9 GPUs on one node; no node has more than 8"
    assert pending(result, 2).reason == Reason.TOO_LARGE
    assert (pending(result, 3).reason, pending(result, 3).message) == (
        Reason.MODEL,
        "no GPU in pool h100",
    )


def quota(holder: str, **limits: float) -> QuotaLimit:
    kind, name = holder.split(":")
    return QuotaLimit("a100", (kind, name), **limits)  # type: ignore[arg-type]


def test_gpus_placed_in_the_pass_count_towards_the_quota() -> None:
    fleet = pooled_fleet()
    limit = quota("user:alice", max_gpus=8, gpus_in_use=2)

    result = fleet.plan(
        job(1, gpus=4, pool="a100"),
        job(2, gpus=2, pool="a100"),
        job(3, gpus=1, pool="a100"),
        pools=A100,
        quotas=(limit,),
    )

    assert [p.job_id for p in result.placements] == [1, 2]
    waiting = pending(result, 3)
    assert (waiting.reason, waiting.message) == (
        Reason.QUOTA,
        "user alice uses 8 of 8 GPUs in pool a100",
    )
    assert (waiting.estimated_start, waiting.what_if) == (None, None)


def test_a_projects_gpu_hours_are_checked_by_the_jobs_expected_runtime() -> None:
    fleet = pooled_fleet()
    limit = replace(
        quota("project:x", gpu_hours=500, gpu_hours_used=496), name="Project X", period="week"
    )

    result = fleet.plan(
        job(1, gpus=2, pool="a100", project="x", estimated_duration_s=2 * 3600),
        job(2, gpus=1, pool="a100", project="x", estimated_duration_s=3600),
        job(3, gpus=1, pool="a100", project="y", estimated_duration_s=3600),
        pools=A100,
        quotas=(limit,),
    )

    # Job 1 would bring the project to 500 GPU-hours; job 2 to 501.
    assert [p.job_id for p in result.placements] == [1, 3]
    assert pending(result, 2).message == (
        "project Project X used 500 of 500 GPU-hours in pool a100 this week"
    )


def test_over_quota_work_borrows_idle_gpus_where_the_pool_lends_them() -> None:
    fleet = pooled_fleet()

    result = fleet.plan(
        job(1, gpus=8, pool="a100"),
        job(2, gpus=8, pool="a100"),
        job(3, gpus=8, pool="a100"),
        pools=LENDING,
        quotas=(quota("user:alice", max_gpus=8),),
    )

    assert placed(result, 1).borrowed is False
    borrowed = placed(result, 2)
    assert borrowed.borrowed is True
    assert borrowed.explanation.endswith(
        "; borrowed, preemptible: user alice uses 8 of 8 GPUs in pool a100"
    )
    waiting = pending(result, 3)
    assert (waiting.reason, waiting.message) == (
        Reason.QUOTA,
        "user alice uses 8 of 8 GPUs in pool a100; no idle GPUs it could borrow fit it",
    )


@pytest.mark.parametrize("pools", [A100, LENDING], ids=["strict", "lending"])
def test_a_job_its_pool_could_never_run_says_so_before_its_quota(pools) -> None:
    """Queued before its pool shrank to one DGX (drained, with a broken GPU: they still count),
    at its quota: it says that it can never run, not that it waits for quota (nor, where the
    pool lends, for idle GPUs to borrow)."""
    fleet = Fleet()
    fleet.dgx("dgx-01", pool="a100", state="draining", broken=[0])
    at_quota = (quota("user:alice", max_gpus=8, gpus_in_use=8),)

    result = fleet.plan(
        job(1, gpus=8, nodes=2, pool="a100"),
        job(2, gpus=4, pool="a100", topology="numa"),
        job(3, gpus=8, pool="a100"),
        pools=pools,
        quotas=at_quota,
    )

    assert (pending(result, 1).reason, pending(result, 1).message) == (
        Reason.TOO_LARGE,
        "needs 2 nodes with 8 GPUs each; pool a100 has 1",
    )
    assert (pending(result, 2).reason, pending(result, 2).message) == (
        Reason.TOPOLOGY,
        "needs 4 GPUs in one NUMA node; the largest NUMA node has 2",
    )
    # Its hardware could run it: the quota is what holds it.
    assert pending(result, 3).reason == Reason.QUOTA


def test_work_within_quota_comes_before_older_work_that_would_borrow() -> None:
    """Bob's older over-quota job, re-queued by a reclaim, does not take the reclaimed GPUs
    again ahead of Alice's job within quota (which would reclaim them again, every pass):
    borrowers get what the jobs within quota leave idle."""
    fleet = Fleet()
    fleet.dgx("dgx-01", pool="a100")

    result = fleet.plan(
        job(1, gpus=5, pool="a100", owner="bob"),
        job(2, gpus=6, pool="a100"),
        job(3, gpus=2, pool="a100", owner="bob"),
        pools=LENDING,
        quotas=(quota("user:bob", max_gpus=2),),
    )

    assert [(p.job_id, p.borrowed) for p in result.placements] == [(2, False), (3, False)]
    assert not result.preemptions
    waiting = pending(result, 1)
    assert (waiting.reason, waiting.position) == (Reason.QUOTA, 1)
    assert waiting.message == (
        "user bob uses 0 of 2 GPUs in pool a100; no idle GPUs it could borrow fit it"
    )


def test_a_share_counts_as_its_part_of_a_gpu() -> None:
    assert gpu_equivalents(job(1, gpus=4, nodes=2)) == 8
    assert gpu_equivalents(job(2, mps_percent=25, mps_memory_mib=1024)) == 0.25
    assert gpu_equivalents(job(3, mig_profile="3g.40gb")) == 3 / 7


def test_an_arrays_cap_counts_running_tasks_and_those_started_in_the_pass() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1], busy_until=None)
    fleet.run("dgx-01", [2], None, array=7)
    tasks = [job(i, array=7) for i in range(1, 5)]

    result = fleet.plan(*tasks, job(5, array=8), array_limits={7: 3, 8: 1})

    assert [p.job_id for p in result.placements] == [1, 2, 5]
    assert [(p.job_id, p.reason, p.message) for p in result.pending] == [
        (3, Reason.ARRAY_LIMIT, "array 7 runs 3 tasks at once, its cap (%3)"),
        (4, Reason.ARRAY_LIMIT, "array 7 runs 3 tasks at once, its cap (%3)"),
    ]


def test_shares_are_admitted_like_whole_gpus() -> None:
    fleet = Shares()
    fleet.mps("node-01")
    first, second = mps_job(1, 50), mps_job(2, 50)
    snapshot = replace(
        fleet.snapshot(replace(first, array=3), replace(second, array=3), mps_job(4, 30)),
        quotas=(QuotaLimit(None, ("user", "alice"), max_gpus=0.5),),
        array_limits={3: 1},
    )

    result = plan(snapshot, Fcfs())

    assert [(p.job_id, p.borrowed) for p in result.placements] == [(1, False), (4, True)]
    assert [(p.job_id, p.reason) for p in result.pending] == [(2, Reason.ARRAY_LIMIT)]
