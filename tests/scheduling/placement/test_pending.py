"""Every waiting job gets a reason code, a sentence, an estimated start and a what-if."""

from __future__ import annotations

from scheduling.placement import Reason
from tests.scheduling.placement.builders import (
    A100_40,
    A100_80,
    GB,
    H100,
    NOW,
    Fleet,
    job,
    pending,
)


def test_the_only_nodes_with_the_model_are_draining() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-a100-01")
    fleet.dgx("dgx-h100-01", H100, state="draining")

    waiting = pending(fleet.plan(job(1, gpus=8, gpu_model=H100)), 1)

    assert waiting.reason == Reason.NODES_UNAVAILABLE
    assert waiting.message == "node dgx-h100-01 is draining"
    assert waiting.estimated_start is None
    assert waiting.what_if is None


def test_unavailable_nodes_are_named_with_their_state() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-h100-01", H100, state="offline")
    fleet.dgx("dgx-h100-02", H100, reachable=False)
    fleet.dgx("dgx-h100-03", H100, broken=[2])
    fleet.dgx("dgx-h100-04", H100, state="offline")

    waiting = pending(fleet.plan(job(1, gpus=8)), 1)

    assert waiting.reason == Reason.NODES_UNAVAILABLE
    assert waiting.message == (
        "4 matching nodes are unavailable: dgx-h100-01 is offline, dgx-h100-02 is unreachable, "
        "dgx-h100-03 has unavailable GPUs (error) and 1 more"
    )


def test_a_gang_needs_more_nodes_than_are_up() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02", state="draining")
    fleet.dgx("dgx-03", state="draining")

    waiting = pending(fleet.plan(job(1, gpus=8, nodes=2)), 1)

    assert waiting.reason == Reason.NODES_UNAVAILABLE
    assert waiting.message == "needs 2 nodes with 8 GPUs each; nodes dgx-02 and dgx-03 are draining"
    assert waiting.what_if == "with 1 node instead of 2 (8 GPUs instead of 16) it could start now"


def test_no_gpu_in_the_fleet_has_that_much_memory() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", A100_40)

    waiting = pending(fleet.plan(job(1, min_memory_mib=70 * GB)), 1)

    assert waiting.reason == Reason.MEMORY
    assert waiting.message == "no GPU with >= 70 GiB in the fleet; the largest has 40 GiB"
    assert waiting.estimated_start is None


def test_no_gpu_has_that_much_memory_free() -> None:
    fleet = Fleet()
    # A free GPU whose memory someone else's process holds.
    fleet.pcie("pcie-01", busy=range(1, 8), memory_free={0: 12 * GB})

    waiting = pending(fleet.plan(job(1, min_memory_mib=70 * GB)), 1)

    assert waiting.reason == Reason.MEMORY
    assert waiting.message == "no GPU with >= 70 GiB free"


def test_no_gpu_of_that_model() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")

    waiting = pending(fleet.plan(job(1, gpu_model="NVIDIA B200")), 1)

    assert waiting.reason == Reason.MODEL
    assert waiting.message == "no NVIDIA B200 GPU in the fleet"
    assert (waiting.estimated_start, waiting.what_if) == (None, None)


def test_more_gpus_than_any_node_has() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02")

    result = fleet.plan(job(1, gpus=16), job(2, gpus=8, nodes=3))

    assert pending(result, 1).reason == Reason.TOO_LARGE
    assert pending(result, 1).message == "needs 16 GPUs on one node; no node has more than 8"
    assert pending(result, 1).what_if == "with 8 GPUs instead of 16 it could start now"
    assert pending(result, 2).reason == Reason.TOO_LARGE
    assert pending(result, 2).message == "needs 3 nodes with 8 GPUs each; the fleet has 2"


def test_no_nvlink_domain_has_a_free_block_that_large() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-a100-01", busy=range(8), busy_until=NOW + 3600)
    fleet.dgx("dgx-a100-02", busy=range(5), busy_until=NOW + 600)
    fleet.pcie("pcie-01", busy=range(4))

    waiting = pending(fleet.plan(job(1, gpus=4, topology="nvlink")), 1)

    assert waiting.reason == Reason.TOPOLOGY
    assert waiting.message == (
        "needs 4 GPUs in one NVLink domain; the largest free block is 3 on dgx-a100-02"
    )
    assert waiting.what_if == "without the NVLink requirement it could start now"
    assert waiting.estimated_start == NOW + 600


def test_no_numa_node_is_that_large() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")

    waiting = pending(fleet.plan(job(1, gpus=4, topology="numa")), 1)

    assert waiting.reason == Reason.TOPOLOGY
    assert waiting.message == "needs 4 GPUs in one NUMA node; the largest NUMA node has 2"
    assert waiting.what_if == "without the NUMA requirement it could start now"


def test_all_gpus_are_busy() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=range(8), busy_until=NOW + 60)

    waiting = pending(fleet.plan(job(1, gpu_model=A100_80)), 1)

    assert waiting.reason == Reason.RESOURCES_BUSY
    assert waiting.message == f"no {A100_80} GPU is free"
    assert waiting.estimated_start == NOW + 60


def test_estimated_start_is_when_enough_gpus_of_the_shape_free_up() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1, 2, 3], busy_until=NOW + 600)
    fleet.run("dgx-01", [4, 5, 6, 7], until=NOW + 1200)
    fleet.dgx("dgx-02", busy=[0, 1], busy_until=NOW + 300)
    fleet.run("dgx-02", [2, 3, 4, 5, 6, 7], until=NOW + 2400)

    result = fleet.plan(job(1, gpus=4), job(2, gpus=8), job(3, gpus=8, nodes=2))

    # Four GPUs: dgx-01's first job ends at +600 (dgx-02 frees only 2 at +300).
    assert pending(result, 1).estimated_start == NOW + 600
    assert pending(result, 2).estimated_start == NOW + 1200
    assert pending(result, 3).estimated_start == NOW + 2400


def test_estimated_start_is_unknown_while_a_needed_job_has_no_expected_end() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1, 2, 3], busy_until=NOW + 600)
    fleet.run("dgx-01", [4, 5, 6, 7], until=None)

    result = fleet.plan(job(1, gpus=4), job(2, gpus=8))

    assert pending(result, 1).estimated_start == NOW + 600
    assert pending(result, 2).estimated_start is None


def test_estimated_start_counts_the_jobs_placed_in_the_same_pass() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")

    result = fleet.plan(job(1, gpus=8, estimated_duration_s=3600), job(2, gpus=8))

    assert pending(result, 2).estimated_start == NOW + 3600


def test_an_overdue_job_could_free_its_gpus_any_moment() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=range(8), busy_until=NOW - 300)

    assert pending(fleet.plan(job(1)), 1).estimated_start == NOW


def test_what_if_names_the_largest_smaller_count_that_fits_now() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1, 2])
    fleet.dgx("dgx-02", busy=[0, 1, 2, 3, 4, 5])

    waiting = pending(fleet.plan(job(1, gpus=8)), 1)

    assert waiting.message == "needs 8 free GPUs on one node; the largest free block is 5 on dgx-01"
    assert waiting.what_if == "with 5 GPUs instead of 8 it could start now"


def test_what_if_for_a_gang_prefers_the_larger_total() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02", busy=range(5))

    waiting = pending(fleet.plan(job(1, gpus=8, nodes=2)), 1)

    # One whole node (8 GPUs) beats 3 GPUs on each of 2 nodes (6 GPUs).
    assert waiting.what_if == "with 1 node instead of 2 (8 GPUs instead of 16) it could start now"


def test_no_what_if_when_nothing_smaller_fits() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=range(8))

    assert pending(fleet.plan(job(1, gpus=2)), 1).what_if is None


def test_jobs_of_one_shape_share_the_explanation_but_keep_their_place() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=range(8), busy_until=NOW + 60)

    result = fleet.plan(job(1, gpus=2), job(2, gpus=4), job(3, gpus=2))

    assert [(p.job_id, p.position) for p in result.pending] == [(1, 1), (2, 2), (3, 3)]
    first, _, third = result.pending
    assert (first.reason, first.message, first.estimated_start) == (
        third.reason,
        third.message,
        third.estimated_start,
    )


def test_a_job_kept_for_a_head_due_now_reads_the_same_as_the_clock_moves() -> None:
    """The head's GPUs are held by a job past its expected end: it is due to start now, at
    every pass; naming the minute would rewrite every job kept for it once a minute."""
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=range(4), busy_until=NOW - 60)
    head, kept = job(1, gpus=8), job(2, gpus=4)

    first = fleet.plan(head, kept)
    later = fleet.plan(head, kept, now=NOW + 600)

    waiting = pending(first, 2)
    assert (waiting.reason, waiting.estimated_start) == (Reason.PRIORITY, NOW)
    assert waiting.message == (
        "the GPUs it fits on are kept for job 1, first in line, due to start as soon as its "
        "GPUs are let go (the jobs holding them are past their expected end)"
    )
    assert pending(later, 2).message == waiting.message
    assert pending(later, 2).estimated_start == NOW + 600
