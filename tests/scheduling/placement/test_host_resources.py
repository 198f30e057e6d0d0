"""Host CPUs and memory as placement dimensions: whole GPUs, MPS shares, preemption, the
reasons jobs wait, and FGD's fragmentation with the node rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.placement import (
    MigCreate,
    NodeInfo,
    Placement,
    PoolConfig,
    Reason,
    RunningJob,
    plan,
)
from scheduling.placement.sharing import unusable_gpus
from tests.scheduling.placement.builders import (
    GB,
    NOW,
    Fleet,
    indexes,
    job,
    pending,
    placed,
)
from tests.scheduling.placement.sharing_builders import Shares, mps_job

HOUR = 3600.0
LOW = {"priority": "low", "preemptible": True, "owner": "bob"}


def placement(result: Placement | MigCreate | None) -> Placement:
    assert isinstance(result, Placement), result
    return result


def limit(fleet: Fleet, hostname: str, cpus: int | None, memory_mib: int | None = None) -> None:
    """Give `hostname` these host figures (None: unknown)."""
    fleet.nodes = [
        replace(info, cpus=cpus, memory_mib=memory_mib) if info.hostname == hostname else info
        for info in fleet.nodes
    ]


def hold(fleet: Fleet, running: RunningJob, cpus: int, memory_mib: int = 0) -> None:
    """Make the running job hold host CPUs and memory on its nodes."""
    fleet.running = [
        replace(r, cpus=cpus, host_memory_mib=memory_mib) if r.id == running.id else r
        for r in fleet.running
    ]


def test_a_job_that_fits_by_gpus_but_not_by_cpus_waits_and_says_so() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    limit(fleet, "dgx-01", 32, 256 * GB)
    hold(fleet, fleet.run("dgx-01", [0, 1], NOW + HOUR), 24, 200 * GB)

    result = fleet.plan(job(1, gpus=2, cpus=16), job(2, gpus=2, host_memory_mib=64 * GB))

    assert not result.placements
    assert pending(result, 1).reason == Reason.HOST_RESOURCES
    assert pending(result, 1).message == (
        "needs 16 CPUs per node; of the node with at least 2 free GPUs, the most free is 8 CPUs"
    )
    assert pending(result, 2).message == (
        "needs 64 GiB of host memory per node; of the node with at least 2 free GPUs, "
        "the most free is 56 GiB"
    )
    # What the job asks for within what is free: it starts.
    result = fleet.plan(job(3, gpus=2, cpus=8, host_memory_mib=56 * GB))
    assert [p.job_id for p in result.placements] == [3]


def test_a_node_whose_capacity_is_unknown_is_no_limit() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02")
    limit(fleet, "dgx-01", 8)
    hold(fleet, fleet.run("dgx-02", [0], NOW + HOUR), 500)

    result = fleet.plan(job(1, gpus=7, cpus=64, host_memory_mib=1024 * GB))

    # Best fit by GPUs alone would take dgx-02 (7 free) too; dgx-01 has too few CPUs.
    assert indexes(fleet, placed(result, 1)) == {"dgx-02": [1, 2, 3, 4, 5, 6, 7]}


def test_jobs_placed_in_a_pass_take_the_cpus_of_their_node() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02")
    limit(fleet, "dgx-01", 32)
    limit(fleet, "dgx-02", 32)

    result = fleet.plan(*(job(i, gpus=1, cpus=16) for i in range(1, 6)))

    # Two jobs per node by CPUs, though each node has 8 GPUs.
    assert [p.nodes for p in result.placements] == [("dgx-01",)] * 2 + [("dgx-02",)] * 2
    assert pending(result, 5).reason == Reason.HOST_RESOURCES
    assert pending(result, 5).message == (
        "needs 16 CPUs per node; of the 2 nodes with at least 1 free GPU, the most free is 0 CPUs"
    )


def test_a_running_job_holds_its_cpus_on_each_of_its_nodes() -> None:
    fleet = Fleet()
    for hostname in ("dgx-01", "dgx-02", "dgx-03"):
        fleet.dgx(hostname)
        limit(fleet, hostname, 128)
    gang = fleet.run("dgx-01", [0, 1, 2, 3], NOW + HOUR, cpus=100)
    second = [gpu.id for gpu in fleet.gpus if gpu.node == "dgx-02" and gpu.index < 4]
    fleet.gpus = [
        replace(gpu, allocated_to=gang.id) if gpu.id in second else gpu for gpu in fleet.gpus
    ]
    fleet.running = [replace(gang, gpu_ids=(*gang.gpu_ids, *second))]

    result = fleet.plan(job(1, gpus=4, cpus=64))

    # dgx-01 and dgx-02 have 4 free GPUs each (the best fit) but 28 free CPUs.
    assert placed(result, 1).nodes == ("dgx-03",)


def test_a_job_no_node_could_ever_hold_is_too_large_and_blocks_no_one() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1, 2, 3, 4, 5], busy_until=NOW + HOUR)
    limit(fleet, "dgx-01", 128, 1024 * GB)

    result = fleet.plan(
        job(1, gpus=8, cpus=256, host_memory_mib=64 * GB),
        job(2, gpus=2, max_runtime_s=10 * HOUR),
        policy=None,
    )

    assert pending(result, 1).reason == Reason.TOO_LARGE
    assert pending(result, 1).message == (
        "needs 256 CPUs and 64 GiB of host memory per node; no node with 8 GPUs has that much "
        "(at most 128 CPUs and 1 TiB)"
    )
    assert pending(result, 1).estimated_start is None
    # Job 1 never starts, so it keeps no GPUs from job 2 (it is no backfill head; as one, it
    # would keep every GPU of the node).
    assert [p.job_id for p in result.placements] == [2]


def test_preemption_counts_the_cpus_its_victims_free() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    limit(fleet, "dgx-01", 32)
    hungry = fleet.run("dgx-01", [0, 1], NOW + HOUR, **LOW)
    hold(fleet, hungry, 24)
    fleet.run("dgx-01", [2], NOW + HOUR, **LOW)  # cheaper (one GPU), but holds no CPUs

    result = fleet.plan(job(1, gpus=1, cpus=16, priority="high"))

    [preemption] = result.preemptions
    assert preemption.victims == (hungry.id,)
    assert pending(result, 1).reason == Reason.PREEMPTING


def test_no_preemption_when_the_victims_would_not_free_enough_cpus() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    limit(fleet, "dgx-01", 32)
    hold(fleet, fleet.run("dgx-01", [0], NOW + HOUR), 30)  # not preemptible
    hold(fleet, fleet.run("dgx-01", [1], NOW + HOUR, **LOW), 1)

    result = fleet.plan(job(1, gpus=1, cpus=16, priority="high"))

    assert not result.preemptions
    # Stopping the job that holds the CPUs would let it start, but that job is not
    # preemptible: the code says so, the sentence still names what the node lacks.
    waiting = pending(result, 1)
    assert waiting.reason == Reason.NOT_PREEMPTIBLE
    assert "no job is preempted for it: normal-priority job 900 is not preemptible" in (
        waiting.message
    )


def test_two_mps_shares_on_one_node_are_limited_by_its_cpus() -> None:
    fleet = Shares()
    fleet.nodes["node-01"] = NodeInfo("node-01", cpus=16)
    first = fleet.mps("node-01")
    fleet.mps("node-01")

    sharing, results = fleet.place(mps_job(1, 30, cpus=10), mps_job(2, 30, cpus=10))

    assert placement(results[0]).gpu_ids == (first.id,)
    # The node's second GPU is idle, but its CPUs are not.
    assert results[1] is None
    waiting = sharing.explain(mps_job(2, 30, cpus=10), 1)
    assert waiting.reason == Reason.HOST_RESOURCES
    assert waiting.message == (
        "needs an MPS share of 30 % and 10 CPUs on its node; of the node with a GPU that has "
        "room for it, the most free is 6 CPUs"
    )


def test_whole_gpus_and_shares_draw_on_the_same_node_cpus() -> None:
    fleet = Shares()
    fleet.nodes["node-01"] = NodeInfo("node-01", cpus=16)
    fleet.whole("node-01")
    fleet.mps("node-01")
    result = plan(fleet.snapshot(job(1, gpus=1, cpus=12), mps_job(2, 20, cpus=8)))

    assert [p.job_id for p in result.placements] == [1]
    assert pending(result, 2).reason == Reason.HOST_RESOURCES


def test_fgd_keeps_a_node_usable_where_best_fit_strands_its_gpu() -> None:
    """The queue asks for 50 % shares with 8 CPUs. A 10 % share asking 12 CPUs: best fit
    takes node-01's fuller GPU and leaves it 4 CPUs, so its 50 % is lost to every request;
    FGD puts it on node-02, whose CPUs are plenty, and both nodes still take a 50 % share."""
    fleet = Shares(queue=[mps_job(i, 50, cpus=8) for i in range(10, 14)])
    fleet.nodes["node-01"] = NodeInfo("node-01", cpus=16)
    fleet.nodes["node-02"] = NodeInfo("node-02", cpus=32)
    fuller = fleet.mps("node-01", [(900, 40, 0)])
    roomier = fleet.mps("node-02")
    small = mps_job(1, 10, cpus=12)

    fgd, [result] = fleet.place(small)
    assert placement(result).gpu_ids == (roomier.id,)
    best_fit, [result] = fleet.place(small, packing="best-fit")
    assert placement(result).gpu_ids == (fuller.id,)
    assert fgd.unusable_gpus() == 0
    # node-01: 50 % free and 4 CPUs: none of the 5 requests can use it.
    assert best_fit.unusable_gpus() == pytest.approx(0.5)


def test_best_fit_keeps_to_nodes_with_the_cpus() -> None:
    fleet = Shares()
    fleet.nodes["node-01"] = NodeInfo("node-01", cpus=4)
    fleet.mps("node-01", [(900, 60, 0)])
    roomier = fleet.mps("node-02")

    for packing in ("best-fit", "first-fit", "fragmentation"):
        _, [result] = fleet.place(mps_job(1, 30, cpus=8), packing=packing)
        assert placement(result).gpu_ids == (roomier.id,), packing


def test_the_measure_counts_a_gpu_whose_node_lacks_cpus_as_unusable() -> None:
    fleet = Shares()
    fleet.nodes["node-01"] = NodeInfo("node-01", cpus=4, memory_mib=512 * GB)
    fleet.mps("node-01", [(900, 25, 0)])
    requests = [mps_job(1, 50, cpus=8), mps_job(2, 50)]

    # The 8-CPU request can use none of the 75 % free, the other all of it.
    assert unusable_gpus(fleet.snapshot(), requests) == pytest.approx(0.75 / 2)
    fleet.nodes["node-01"] = NodeInfo("node-01")
    assert unusable_gpus(fleet.snapshot(), requests) == 0


def test_jobs_without_host_figures_are_placed_as_before() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    limit(fleet, "dgx-01", 0, 0)

    result = fleet.plan(job(1, gpus=8), policy=None, pools={None: PoolConfig()})

    assert [p.job_id for p in result.placements] == [1]
