"""Preemption: the fewest lower-priority, borrowed or over-share jobs, topology-correct."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations
from random import Random

from hypothesis import given
from hypothesis import strategies as st

from scheduling.placement import GpuSlot, PoolConfig, Reason, RunningJob
from scheduling.placement.policies import PRIORITY_RANK
from scheduling.placement.topology import choose
from tests.scheduling.placement.builders import NOW, Fleet, job, pending
from tests.scheduling.placement.test_properties import PASSES

HOUR = 3600.0
LOW = {"priority": "low", "preemptible": True, "owner": "bob"}
NO_PREEMPTION = {None: PoolConfig(policy="fcfs", preemption=False)}


def gpu_indexes(fleet: Fleet, gpu_ids: Iterable[int]) -> list[int]:
    by_id = {gpu.id: gpu for gpu in fleet.gpus}
    return sorted(by_id[gpu_id].index for gpu_id in gpu_ids)


def test_a_higher_priority_job_preempts_the_smallest_set() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    big = fleet.run("dgx-01", [0, 1, 2, 3], NOW + HOUR, **LOW)
    fleet.run("dgx-01", [4, 5], NOW + HOUR, **LOW)
    fleet.run("dgx-01", [6, 7], NOW + HOUR, **LOW)

    result = fleet.plan(job(1, gpus=4, priority="high"))

    [preemption] = result.preemptions
    # Two 2-GPU jobs cost less each, but one 4-GPU job is the smaller set.
    assert preemption.victims == (big.id,)
    assert gpu_indexes(fleet, preemption.gpu_ids) == [0, 1, 2, 3]
    assert preemption.reason == "higher priority (high over low)"
    waiting = pending(result, 1)
    assert (waiting.reason, waiting.message) == (
        Reason.PREEMPTING,
        "job 900 is being preempted for it: higher priority (high over low)",
    )
    assert result.placements == ()


def test_the_victims_free_a_topology_correct_placement() -> None:
    fleet = Fleet()
    # DGX A100 NUMA pairs: GPUs 0-1, 2-3, 4-5, 6-7. GPUs 1 and 2 are free, in two pairs.
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", [4], NOW + HOUR, priority="low", borrowed=True)  # cheapest, no pair
    pairs_with_1 = fleet.run("dgx-01", [0], NOW + HOUR, **LOW)
    fleet.run("dgx-01", [3], NOW + HOUR, **LOW)
    fleet.run("dgx-01", [5, 6, 7], NOW + HOUR, owner="carol")

    result = fleet.plan(job(1, gpus=2, topology="numa", priority="high"))

    [preemption] = result.preemptions
    assert preemption.victims == (pairs_with_1.id,)
    assert gpu_indexes(fleet, preemption.gpu_ids) == [0, 1]


def test_borrowed_work_is_reclaimed_first() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", [0, 1, 2, 3], NOW + HOUR, **LOW)
    borrowed = fleet.run("dgx-01", [4, 5, 6, 7], NOW + HOUR, borrowed=True, owner="bob")

    [preemption] = fleet.plan(job(1, gpus=4)).preemptions

    assert preemption.victims == (borrowed.id,)
    assert preemption.reason == "reclaims GPUs lent over quota"


def test_never_a_higher_priority_job_nor_one_already_stopping() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", [0, 1, 2, 3], NOW + HOUR, priority="high", preemptible=True)
    fleet.run("dgx-01", [4, 5, 6, 7], NOW + HOUR, priority="high", borrowed=True)
    fleet.dgx("dgx-02")
    fleet.run("dgx-02", range(8), NOW + HOUR, stopping=True, **LOW)

    result = fleet.plan(job(1, gpus=4, priority="normal"), job(2, gpus=8, priority="critical"))

    assert result.preemptions == ()
    assert pending(result, 1).reason == Reason.RESOURCES_BUSY


def test_an_under_share_job_preempts_an_over_share_owners_work_of_equal_priority() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    victim = fleet.run("dgx-01", range(8), NOW + HOUR, preemptible=True, owner="bob")
    usage = {(None, ("user", "bob")): 100.0, (None, ("user", "alice")): 0.0}

    result = fleet.plan(job(1, gpus=8), usage=usage)

    [preemption] = result.preemptions
    assert preemption.victims == (victim.id,)
    assert preemption.reason == "under its fair share (factor 1.00 over 0.25)"
    # Bob, over his share, may not take it back from alice.
    assert fleet.plan(job(2, gpus=8, owner="alice"), usage={}).preemptions == ()


def test_the_victims_gpus_go_to_no_one_else_in_the_pass() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", range(6), NOW + HOUR, **LOW)
    fleet.run("dgx-01", [6, 7], NOW + HOUR, owner="carol")

    result = fleet.plan(job(1, gpus=4, priority="high"), job(2, gpus=2, priority="high"))

    assert [p.job_id for p in result.preemptions] == [1]
    assert result.placements == ()
    assert pending(result, 2).reason == Reason.RESOURCES_BUSY


def test_a_gang_preempts_whole_nodes_for_its_missing_part() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02")
    whole = fleet.run("dgx-02", range(8), NOW + HOUR, **LOW)
    fleet.dgx("dgx-03")
    fleet.run("dgx-03", range(4), NOW + HOUR, **LOW)
    fleet.run("dgx-03", range(4, 8), NOW + HOUR, **LOW)

    result = fleet.plan(job(1, gpus=8, nodes=2, priority="high"))

    [preemption] = result.preemptions
    assert preemption.victims == (whole.id,)
    assert len(preemption.gpu_ids) == 16


def test_a_pool_may_forbid_preemption() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", range(8), NOW + HOUR, **LOW)

    result = fleet.plan(job(1, gpus=8, priority="critical"), pools=NO_PREEMPTION)

    assert result.preemptions == ()


@PASSES
@given(rng=st.randoms())
def test_preemption_picks_a_smallest_allowed_set(rng: Random) -> None:
    """Brute force on small nodes: no smaller set of allowed victims frees a placement, and
    when none is found, no allowed set at all would do."""
    fleet = Fleet()
    for n in range(rng.randint(1, 3)):
        hostname = f"dgx-{n}"
        fleet.dgx(hostname)
        index = 0
        while index < 8:
            size = min(rng.choice((1, 1, 2, 3, 4)), 8 - index)
            if rng.random() < 0.8:
                fleet.run(
                    hostname,
                    range(index, index + size),
                    NOW + HOUR,
                    priority=rng.choice(("low", "normal", "high")),
                    preemptible=rng.random() < 0.6,
                    borrowed=rng.random() < 0.2,
                    stopping=rng.random() < 0.1,
                )
            index += size
    waiting = job(
        1,
        gpus=rng.choice((1, 2, 4, 8)),
        topology=rng.choice(("any", "numa", "nvlink")),
        priority=rng.choice(("normal", "high")),
    )

    result = fleet.plan(waiting)

    def allowed(victim: RunningJob) -> bool:
        rank, mine = PRIORITY_RANK[victim.priority], PRIORITY_RANK[waiting.priority]
        eligible = (victim.preemptible or victim.borrowed) and not victim.stopping
        return eligible and rank <= mine and (victim.borrowed or rank < mine)

    candidates = [victim for victim in fleet.running if allowed(victim)]
    by_id = {victim.id: victim for victim in fleet.running}

    def frees_a_place(victims: Iterable[RunningJob]) -> bool:
        freed = {gpu_id for victim in victims for gpu_id in victim.gpu_ids}
        for hostname in {gpu.node for gpu in fleet.gpus}:
            usable: list[GpuSlot] = [
                gpu
                for gpu in fleet.gpus
                if gpu.node == hostname and (gpu.allocated_to is None or gpu.id in freed)
            ]
            if choose(usable, waiting.gpus_per_node, waiting.topology) is not None:
                return True
        return False

    if result.placements:
        assert not result.preemptions
        return
    if not result.preemptions:
        assert not frees_a_place(candidates)
        return
    [preemption] = result.preemptions
    victims = [by_id[victim_id] for victim_id in preemption.victims]
    assert all(allowed(victim) for victim in victims)
    assert frees_a_place(victims)
    for size in range(len(victims)):
        assert not any(frees_a_place(subset) for subset in combinations(candidates, size))
    # The placement is on the freed GPUs and the free ones, in the job's topology.
    held = {gpu.id for gpu in fleet.gpus if gpu.allocated_to is not None}
    freed = {gpu_id for victim in victims for gpu_id in victim.gpu_ids}
    assert set(preemption.gpu_ids) <= ({gpu.id for gpu in fleet.gpus} - held) | freed
    parts = {gpu.node for gpu in fleet.gpus if gpu.id in set(preemption.gpu_ids)}
    assert len(parts) == 1 and len(preemption.gpu_ids) == waiting.gpus_per_node
    chosen = [gpu for gpu in fleet.gpus if gpu.id in set(preemption.gpu_ids)]
    assert choose(chosen, waiting.gpus_per_node, waiting.topology) is not None
