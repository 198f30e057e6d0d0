"""Preemption: the fewest lower-priority, borrowed or over-share jobs, topology-correct."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from itertools import combinations
from random import Random

import pytest
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
    assert pending(result, 1).reason == Reason.NOT_PREEMPTIBLE
    assert pending(result, 1).message.endswith(
        "no job is preempted for it: job 901 is of a higher priority (high over normal), "
        "and 1 more job likewise"
    )
    # The stopping job frees its GPUs anyway: the critical job is told nothing of preemption.
    assert pending(result, 2).reason == Reason.RESOURCES_BUSY


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
    assert pending(result, 2).reason == Reason.NOT_PREEMPTIBLE  # carol's job, not job 1's


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


LAS = {None: PoolConfig(policy="las", las_thresholds_gpu_s=(3600.0,))}


def las(exempt_s: float) -> dict[str | None, PoolConfig]:
    return {None: replace(LAS[None], preempt_exempt_s=exempt_s)}


def test_las_preempts_running_work_in_a_higher_queue_only() -> None:
    """Tiresias' 2D-LAS: a waiting job in queue 0 stops running work that attained more than
    the threshold (4 GPUs for an hour: 14,400 GPU-seconds, queue 1), not work still in its
    own queue (4 GPUs for 800 s: 3,200)."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    served = fleet.run(
        "dgx-01",
        range(4),
        None,
        preemptible=True,
        started_at=NOW - HOUR,
        submitted_at=NOW - 2 * HOUR,
    )
    fleet.run("dgx-01", range(4, 8), None, preemptible=True, started_at=NOW - 800)

    [preemption] = fleet.plan(job(1, gpus=4), pools=LAS).preemptions
    assert preemption.victims == (served.id,)
    assert preemption.reason == "less attained service (queue 0 before queue 1)"
    # A whole node would need the job still in queue 0 too: nothing is stopped.
    assert fleet.plan(job(1, gpus=8), pools=LAS).preemptions == ()
    # A job that itself attained the threshold waits in queue 1, behind nobody it may stop.
    served_too = job(1, gpus=4, attained_service_s=HOUR, queued_at=NOW - 60)
    assert fleet.plan(served_too, pools=LAS).preemptions == ()


def test_las_counts_earlier_attempts_and_spares_a_fresh_start() -> None:
    """Service from earlier attempts counts (`attained_service_s`), but a job is not stopped
    for attained service within `preempt_exempt_s` of its latest start; borrowed GPUs are
    reclaimed at once."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    again = fleet.run(
        "dgx-01", range(4), None, preemptible=True, started_at=NOW - 900, attained_service_s=HOUR
    )
    fleet.run("dgx-01", range(4, 8), None, borrowed=True, owner="bob", started_at=NOW - 10)

    [preemption] = fleet.plan(job(1, gpus=4), pools=las(1200)).preemptions
    assert preemption.reason == "reclaims GPUs lent over quota"
    assert fleet.plan(job(1, gpus=8), pools=las(1200)).preemptions == ()
    [preemption] = fleet.plan(job(1, gpus=8), pools=las(900)).preemptions
    assert again.id in preemption.victims


@pytest.mark.parametrize(
    ("min_run_s", "ran_s", "stopped"),
    [
        (None, 540.0, False),  # the default, 600 s
        (None, 600.0, True),
        (1800.0, 900.0, False),  # the pool's own
        (1800.0, 1800.0, True),
        (0.0, 0.0, True),  # none: at once
    ],
)
def test_a_run_is_not_stopped_for_attained_service_in_its_first_minutes(
    min_run_s, ran_s, stopped
) -> None:
    """A job resumed (or backfilled) a moment ago is not stopped for less attained service,
    whatever `preempt_exempt_s`: the pool's `las_min_run_s` of its run first (default 600 s),
    then it may be."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    resumed = fleet.run(
        "dgx-01", range(8), None, preemptible=True, started_at=NOW - ran_s, attained_service_s=HOUR
    )
    pools = LAS if min_run_s is None else {None: replace(LAS[None], las_min_run_s=min_run_s)}
    preemptions = fleet.plan(job(1, gpus=8), pools=pools).preemptions
    assert [p.victims for p in preemptions] == ([(resumed.id,)] if stopped else [])


def test_the_default_policy_stops_preemptible_work_past_a_threshold_for_fresh_work() -> None:
    """The default pool (qssf, preemption on) puts preemptible jobs in Tiresias' queues: a
    fresh job stops the preemptible job that attained 14,400 GPU-seconds (queue 1), not the
    one at 3,200 (queue 0), nor work that may not be preempted; a pool that does not preempt
    stops nothing."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    served = fleet.run("dgx-01", range(4), None, preemptible=True, started_at=NOW - HOUR)
    fleet.run("dgx-01", range(4, 8), None, preemptible=True, started_at=NOW - 800)
    fresh = job(1, gpus=4, predicted_runtime_s=10 * HOUR)
    default = {None: PoolConfig()}

    [preemption] = fleet.plan(fresh, pools=default).preemptions
    assert preemption.victims == (served.id,)
    assert preemption.reason == "less attained service (queue 0 before queue 1)"
    assert fleet.plan(fresh, pools={None: PoolConfig(preemption=False)}).preemptions == ()
    assert fleet.plan(replace(fresh, gpus_per_node=8), pools=default).preemptions == ()

    fleet.running = [replace(served, preemptible=False), *fleet.running[1:]]
    assert fleet.plan(fresh, pools=default).preemptions == ()


def test_never_a_victim_that_would_wait_ahead_of_the_job() -> None:
    """The rule follows the pool's own order: a job is stopped only for one that would come
    first were both waiting. FCFS ignores priorities, so a high job submitted after a low
    running one may not stop it; priority with aging lets an old enough low job outrank a
    newer normal one."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", range(8), None, preemptible=True, priority="low", submitted_at=NOW - HOUR)
    high = job(1, gpus=8, priority="high", submitted_at=NOW - 60)

    assert fleet.plan(high, pools={None: PoolConfig(policy="fcfs")}).preemptions == ()
    [preemption] = fleet.plan(high, pools={None: PoolConfig(policy="priority")}).preemptions
    assert preemption.reason == "higher priority (high over low)"

    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", range(8), None, preemptible=True, priority="low", submitted_at=NOW - 2e5)
    normal = job(1, gpus=8, submitted_at=NOW - 60)
    # 200,000 s at a point a minute: 3,333 points, over normal's 1,000 + 1.
    assert fleet.plan(normal, pools={None: PoolConfig(policy="priority")}).preemptions == ()


def test_las_never_stops_a_job_for_one_it_would_wait_ahead_of() -> None:
    """Two jobs in queue 1: the running one came first, so a waiting one submitted later may
    not stop it, though it attained less."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run(
        "dgx-01",
        range(8),
        None,
        preemptible=True,
        started_at=NOW - HOUR,
        submitted_at=NOW - 2 * HOUR,
    )
    later = job(1, gpus=8, submitted_at=NOW - 60, attained_service_s=HOUR, queued_at=NOW - 60)

    assert fleet.plan(later, pools=LAS).preemptions == ()


def test_fair_share_needs_a_margin() -> None:
    """Alice used 45 % of the pool and Bob 55 % (factors 0.54 and 0.47): too close to stop
    Bob's job; at 30 % and 70 % (0.66 and 0.38) she may."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", range(8), None, preemptible=True, owner="bob")
    fair = {None: PoolConfig(policy="fcfs")}

    def usage(alice: float, bob: float) -> dict[tuple[None, tuple[str, str]], float]:
        return {(None, ("user", "alice")): alice, (None, ("user", "bob")): bob}

    assert fleet.plan(job(1, gpus=8), pools=fair, usage=usage(45, 55)).preemptions == ()
    [preemption] = fleet.plan(job(1, gpus=8), pools=fair, usage=usage(30, 70)).preemptions
    assert preemption.reason == "under its fair share (factor 0.66 over 0.38)"


def test_by_default_a_job_is_preempted_the_moment_it_starts() -> None:
    """`preempt_exempt_s` defaults to 0 (Slurm's PreemptExemptTime): a critical job does not
    wait behind low-priority preemptible work that started a second ago."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fresh = fleet.run("dgx-01", range(8), None, started_at=NOW - 1, **LOW)

    result = fleet.plan(job(1, gpus=8, priority="critical"), pools={None: PoolConfig()})

    [preemption] = result.preemptions
    assert preemption.victims == (fresh.id,)


def test_a_waiting_job_is_told_until_when_its_victims_are_exempt() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", range(4), None, started_at=NOW - 100, **LOW)
    fleet.run("dgx-01", range(4, 8), None, started_at=NOW - 300, **LOW)
    exempt = {None: PoolConfig(policy="priority", preempt_exempt_s=600)}

    result = fleet.plan(job(1, gpus=8, priority="critical"), pools=exempt)

    assert result.preemptions == ()
    waiting = pending(result, 1)
    assert waiting.reason == Reason.PREEMPT_EXEMPT
    # The one whose exemption ends first is named (NOW is 2023-11-14 22:13:20 UTC).
    assert waiting.message == (
        "needs 8 free GPUs on one node; none is free; no job is preempted for it: "
        "low-priority job 901 is exempt from preemption until 2023-11-14 22:18 UTC "
        "(preempt_exempt_s 600), and 1 more job likewise"
    )
    # One victim: its own sentence.
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", range(8), None, started_at=NOW - 300, **LOW)
    waiting = pending(fleet.plan(job(1, gpus=8, priority="critical"), pools=exempt), 1)
    assert waiting.message.endswith(
        "no job is preempted for it: low-priority job 900 is exempt from preemption until "
        "2023-11-14 22:18 UTC (preempt_exempt_s 600)"
    )


def test_a_gang_is_told_of_the_exempt_job_on_the_node_it_lacks() -> None:
    """A 2-node gang: dgx-01 is free, dgx-02 held by a low job still exempt."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02")
    fleet.run("dgx-02", range(8), None, started_at=NOW - 300, **LOW)
    exempt = {None: PoolConfig(policy="priority", preempt_exempt_s=600)}

    waiting = pending(fleet.plan(job(1, gpus=8, nodes=2, priority="high"), pools=exempt), 1)

    assert waiting.reason == Reason.PREEMPT_EXEMPT
    assert waiting.message.endswith(
        "no job is preempted for it: low-priority job 900 is exempt from preemption until "
        "2023-11-14 22:18 UTC (preempt_exempt_s 600)"
    )


def test_a_waiting_job_is_told_the_pools_order_or_policy_keeps_it_from_preempting() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.run("dgx-01", range(8), None, submitted_at=NOW - HOUR, **LOW)
    high = job(1, gpus=8, priority="high", submitted_at=NOW - 60)

    # FCFS ignores priorities: the running job came first.
    waiting = pending(fleet.plan(high, pools={None: PoolConfig(policy="fcfs")}), 1)
    assert waiting.reason == Reason.PREEMPT_ORDER
    assert waiting.message.endswith(
        "no job is preempted for it: the pool's order does not rank it ahead of job 900 "
        "(low priority)"
    )
    # The pool does not preempt at all.
    waiting = pending(fleet.plan(high, pools=NO_PREEMPTION), 1)
    assert waiting.reason == Reason.PREEMPT_ORDER
    assert waiting.message.endswith(
        "no job is preempted for it: its pool's policy does not preempt"
    )

    # Preemption is named only where stopping running jobs would let the job start: one
    # asking for more memory than any GPU has waits for the hardware, whatever runs.
    waiting = pending(fleet.plan(job(1, gpus=8, priority="critical", min_memory_mib=10**7)), 1)
    assert waiting.reason == Reason.MEMORY
    assert "preempted" not in waiting.message
