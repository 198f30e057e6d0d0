"""Inside a node: one NVLink domain, then one NUMA node, then one socket; best fit within."""

from __future__ import annotations

from scheduling.placement import Reason, TopologyClass
from tests.scheduling.placement.builders import (
    A100_80,
    DGX_A100_NUMA,
    Fleet,
    indexes,
    job,
    pending,
    placed,
)


def test_a_two_gpu_job_gets_a_numa_pair_of_a_dgx() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")

    placement = placed(fleet.plan(job(1, gpus=2)), 1)

    assert indexes(fleet, placement) == {"dgx-01": [0, 1]}
    assert placement.topology_class == TopologyClass.NVLINK
    assert placement.numa_nodes == (3,)
    assert placement.explanation == (
        "2 GPUs in one NVLink domain on dgx-01 (GPUs 0-1), NUMA node 3; "
        "best fit: leaves 6 free GPUs on that node"
    )


def test_a_four_gpu_job_gets_both_numa_pairs_of_one_socket() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")

    placement = placed(fleet.plan(job(1, gpus=4)), 1)

    assert indexes(fleet, placement) == {"dgx-01": [0, 1, 2, 3]}
    assert placement.numa_nodes == (1, 3)
    assert placement.score == (0, 4, 1, 2)
    assert placement.explanation == (
        "4 GPUs in one NVLink domain on dgx-01 (GPUs 0-3), NUMA nodes 1 and 3 on one socket; "
        "best fit: leaves 4 free GPUs on that node"
    )


def test_a_four_gpu_job_stays_on_one_socket_when_the_other_is_half_used() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 2])

    placement = placed(fleet.plan(job(1, gpus=4)), 1)

    assert indexes(fleet, placement) == {"dgx-01": [4, 5, 6, 7]}


def test_a_two_gpu_job_fills_the_socket_with_fewer_free_gpus() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0])

    placement = placed(fleet.plan(job(1, gpus=2)), 1)

    # GPUs 2-3 (NUMA 1) leave socket 1 whole for a 4-GPU job.
    assert indexes(fleet, placement) == {"dgx-01": [2, 3]}


def test_a_single_gpu_completes_a_half_used_numa_pair() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[4])

    placement = placed(fleet.plan(job(1)), 1)

    assert indexes(fleet, placement) == {"dgx-01": [5]}
    assert placement.topology_class == TopologyClass.SINGLE
    assert placement.explanation == (
        "1 GPU on dgx-01 (GPU 5), NUMA node 7; best fit: leaves 6 free GPUs on that node"
    )


def test_the_numa_requirement_waits_when_every_numa_pair_is_split() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 2, 4, 6])

    # Job 2 ends before job 1 could start (never: the busy GPUs' end is unknown), so it may
    # use the GPUs job 1 will need.
    result = fleet.plan(job(1, gpus=2, topology="numa"), job(2, gpus=2, estimated_duration_s=60))

    waiting = pending(result, 1)
    assert waiting.reason == Reason.TOPOLOGY
    assert waiting.message == (
        "needs 2 GPUs in one NUMA node; the largest free block is 1 on dgx-01"
    )
    # Job 2 asks for no NUMA node and takes two GPUs of socket 0 across NUMA nodes 3 and 1.
    assert indexes(fleet, placed(result, 2)) == {"dgx-01": [1, 3]}
    assert placed(result, 2).numa_nodes == (1, 3)


def test_without_nvlink_the_class_follows_numa_then_socket_then_node() -> None:
    fleet = Fleet()
    fleet.pcie("pcie-01")
    fleet.pcie("pcie-02")
    fleet.pcie("pcie-03")

    result = fleet.plan(job(1, gpus=2), job(2, gpus=4), job(3, gpus=6))

    # Each job takes the node with the fewest free GPUs that still offers its best class.
    assert placed(result, 1).topology_class == TopologyClass.NUMA
    assert placed(result, 2).topology_class == TopologyClass.SOCKET
    assert placed(result, 3).topology_class == TopologyClass.NODE
    assert placed(result, 3).score == (3, 2, 2, 3)
    assert placed(result, 2).explanation == (
        "4 GPUs on one socket on pcie-01 (GPUs 4-7), NUMA nodes 2 and 3; "
        "best fit: leaves 2 free GPUs on that node"
    )


def test_a_bridged_nvlink_pair_beats_a_numa_pair() -> None:
    fleet = Fleet()
    # Four GPUs on one NUMA node; NVLink bridges join GPUs 1-2 only.
    fleet.machine(
        "ws-01",
        A100_80,
        numa=[0, 0, 0, 0],
        sockets=[0, 0, 0, 0],
        nvlink=[None, "ws-01/bridge-a", "ws-01/bridge-a", None],
    )

    result = fleet.plan(job(1, gpus=2), job(2, gpus=2, topology="nvlink"))

    assert indexes(fleet, placed(result, 1)) == {"ws-01": [1, 2]}
    assert placed(result, 1).topology_class == TopologyClass.NVLINK
    assert pending(result, 2).reason == Reason.TOPOLOGY
    assert pending(result, 2).message == (
        "needs 2 GPUs in one NVLink domain; the largest free block is 1 on ws-01"
    )


def test_the_nvlink_requirement_cannot_be_met_by_pcie_boxes() -> None:
    fleet = Fleet()
    fleet.pcie("pcie-01")

    waiting = pending(fleet.plan(job(1, gpus=2, topology="nvlink")), 1)

    assert waiting.reason == Reason.TOPOLOGY
    assert waiting.message == "needs 2 GPUs in one NVLink domain; no matching GPU has NVLink"
    assert waiting.estimated_start is None
    assert waiting.what_if == "without the NVLink requirement it could start now"


def test_without_socket_information_numa_nodes_still_guide_the_choice() -> None:
    fleet = Fleet()
    fleet.machine(
        "dgx-01",
        A100_80,
        numa=DGX_A100_NUMA,
        sockets=[None] * 8,
        nvlink=["dgx-01/nvswitch"] * 8,
        busy=[0, 2],
    )

    result = fleet.plan(job(1, gpus=2), job(2))

    assert indexes(fleet, placed(result, 1)) == {"dgx-01": [4, 5]}
    assert placed(result, 1).numa_nodes == (7,)
    assert indexes(fleet, placed(result, 2)) == {"dgx-01": [1]}
