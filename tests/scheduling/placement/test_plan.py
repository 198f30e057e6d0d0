"""Across nodes: best fit keeps whole nodes free, gangs are all or nothing, nothing is given
twice or given when it is down."""

from __future__ import annotations

import pytest

from scheduling.placement import (
    Fcfs,
    GpuSlot,
    JobRequest,
    NodeInfo,
    PlacementPass,
    Reason,
    Snapshot,
    TopologyClass,
    plan,
)
from tests.scheduling.placement.builders import (
    A100_40,
    H100,
    NOW,
    Fleet,
    indexes,
    job,
    pending,
    placed,
)


def test_best_fit_keeps_a_whole_node_free_for_an_eight_gpu_job() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02", busy=[0, 1, 2, 3])

    result = fleet.plan(job(1, gpus=4), job(2, gpus=8))

    assert indexes(fleet, placed(result, 1)) == {"dgx-02": [4, 5, 6, 7]}
    assert placed(result, 1).explanation.endswith("best fit: leaves 0 free GPUs on that node")
    assert indexes(fleet, placed(result, 2)) == {"dgx-01": list(range(8))}
    assert result.pending == ()


def test_a_single_gpu_goes_to_the_node_with_the_fewest_free_gpus() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02", busy=[0, 1, 2, 3, 4, 5])
    fleet.dgx("dgx-03", busy=[0, 1, 2, 3])

    placement = placed(fleet.plan(job(1)), 1)

    assert indexes(fleet, placement) == {"dgx-02": [6]}
    assert placement.score == (0, 1, 1, 1)


def test_ties_go_to_the_first_hostname_whatever_the_input_order() -> None:
    fleet = Fleet()
    fleet.dgx("node-b")
    fleet.dgx("node-a")
    snapshot = fleet.snapshot(job(1, gpus=2))
    reversed_input = Snapshot(
        NOW, snapshot.nodes[::-1], snapshot.gpus[::-1], snapshot.running, snapshot.queue
    )

    result = plan(snapshot, Fcfs())

    assert indexes(fleet, placed(result, 1)) == {"node-a": [0, 1]}
    assert plan(reversed_input, Fcfs()) == result


def test_a_gang_takes_whole_nodes() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02", busy=[0])
    fleet.dgx("dgx-03")

    placement = placed(fleet.plan(job(1, gpus=8, nodes=2)), 1)

    assert placement.nodes == ("dgx-01", "dgx-03")
    assert len(placement.gpu_ids) == 16
    assert placement.topology_class == TopologyClass.MULTI_NODE
    assert placement.score == (0, 0, 4, 8)
    assert placement.explanation == (
        "16 GPUs on 2 nodes, 8 per node (dgx-01 and dgx-03), each node's GPUs in one NVLink "
        "domain; best fit: leaves 0 free GPUs on those nodes"
    )


def test_a_gang_waits_all_or_nothing_while_only_one_node_is_whole() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02", busy=[3], busy_until=NOW + 900)

    result = fleet.plan(job(1, gpus=8, nodes=2))

    assert result.placements == ()
    waiting = pending(result, 1)
    assert waiting.reason == Reason.RESOURCES_BUSY
    assert waiting.message == (
        "needs 2 nodes with 8 free GPUs each; only 1 node has them now (dgx-01)"
    )
    assert waiting.estimated_start == NOW + 900
    assert waiting.what_if == "with 7 GPUs per node instead of 8 it could start now"


def test_a_waiting_gang_keeps_the_node_it_will_start_on() -> None:
    """EASY backfill: the first waiting job's GPUs go to no job that would delay its start."""
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02", busy=[3], busy_until=NOW + 900)

    result = fleet.plan(job(1, gpus=8, nodes=2), job(2, gpus=8))

    assert result.placements == ()
    waiting = pending(result, 2)
    assert waiting.reason == Reason.PRIORITY
    assert waiting.message == (
        "the GPUs it fits on are kept for job 1, first in line, due to start by "
        "2023-11-14 22:28 UTC; only jobs that end by then may use them"
    )
    assert waiting.estimated_start == NOW + 900
    assert pending(result, 1).reason == Reason.RESOURCES_BUSY


def test_a_job_that_ends_before_the_gang_starts_may_use_its_node() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01")
    fleet.dgx("dgx-02", busy=[3], busy_until=NOW + 900)

    result = fleet.plan(job(1, gpus=8, nodes=2), job(2, gpus=8, estimated_duration_s=900))

    assert [p.job_id for p in result.placements] == [2]
    assert placed(result, 2).nodes == ("dgx-01",)
    # Pending reasons describe the fleet after the pass.
    assert pending(result, 1).message == "needs 2 nodes with 8 free GPUs each; no node has them now"


def test_a_gang_prefers_identical_machines() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-a100-01", A100_40)
    fleet.dgx("dgx-h100-01", H100)
    fleet.dgx("dgx-h100-02", H100)

    placement = placed(fleet.plan(job(1, gpus=8, nodes=2)), 1)

    assert placement.nodes == ("dgx-h100-01", "dgx-h100-02")


def test_a_gang_mixes_machines_when_no_kind_has_enough() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-a100-01", A100_40)
    fleet.dgx("dgx-h100-01", H100)

    placement = placed(fleet.plan(job(1, gpus=8, nodes=2)), 1)

    assert placement.nodes == ("dgx-a100-01", "dgx-h100-01")


def test_unavailable_and_allocated_gpus_are_never_placed() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1, 2, 3], broken=[4])
    fleet.dgx("dgx-02", state="draining")
    fleet.dgx("dgx-03", state="offline")
    fleet.dgx("dgx-04", reachable=False)

    result = fleet.plan(*[job(i) for i in range(1, 7)])

    given = sorted(gpu_id for p in result.placements for gpu_id in p.gpu_ids)
    assert [fleet.gpus[gpu_id - 1].index for gpu_id in given] == [5, 6, 7]
    assert {fleet.gpus[gpu_id - 1].node for gpu_id in given} == {"dgx-01"}
    assert [p.job_id for p in result.pending] == [4, 5, 6]
    assert [p.position for p in result.pending] == [1, 2, 3]


def test_jobs_behind_a_waiting_job_start_when_they_do_not_delay_it() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1], busy_until=NOW + 3600)

    result = fleet.plan(
        job(1, gpus=8),
        job(2, gpus=4, estimated_duration_s=600),
        job(3, gpus=8),
        job(4, gpus=2, estimated_duration_s=7200),
    )

    assert [p.job_id for p in result.placements] == [2]
    assert [(p.job_id, p.position, p.reason) for p in result.pending] == [
        (1, 1, Reason.RESOURCES_BUSY),
        (3, 2, Reason.RESOURCES_BUSY),
        (4, 3, Reason.PRIORITY),
    ]


def test_a_gpu_model_and_memory_are_matched_exactly() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-a100-01", A100_40)
    fleet.dgx("dgx-h100-01", H100, busy=[0, 1, 2, 3, 4, 5])

    result = fleet.plan(job(1, gpu_model=H100), job(2, min_memory_mib=70 * 1024), job(3))

    assert placed(result, 1).nodes == ("dgx-h100-01",)
    assert placed(result, 2).nodes == ("dgx-h100-01",)
    assert placed(result, 3).nodes == ("dgx-a100-01",)


def test_place_one_job_at_a_time() -> None:
    fleet = Fleet()
    fleet.dgx("dgx-01", busy=[0, 1, 2, 3])
    placement_pass = PlacementPass(fleet.snapshot())

    first = placement_pass.place(job(1, gpus=4))
    second = placement_pass.place(job(2, gpus=4))

    assert first is not None
    assert indexes(fleet, first) == {"dgx-01": [4, 5, 6, 7]}
    assert second is None
    assert placement_pass.explain(job(2, gpus=4), 1).message == (
        "needs 4 free GPUs on one node; none is free"
    )


def test_a_snapshot_must_name_the_node_of_every_gpu() -> None:
    gpu = GpuSlot(1, "GPU-1", "ghost", 0, H100, 81_559, 81_559)
    snapshot = Snapshot(NOW, (NodeInfo("dgx-01"),), (gpu,))

    with pytest.raises(ValueError, match="GPU 1 is on unknown node 'ghost'"):
        plan(snapshot, Fcfs())


def test_a_snapshot_must_not_list_a_gpu_twice() -> None:
    gpu = GpuSlot(1, "GPU-1", "dgx-01", 0, H100, 81_559, 81_559)
    snapshot = Snapshot(NOW, (NodeInfo("dgx-01"),), (gpu, gpu))

    with pytest.raises(ValueError, match="lists GPU 1 twice"):
        plan(snapshot, Fcfs())


@pytest.mark.parametrize(
    ("_case", "fields", "error"),
    [
        ("no GPUs", {"gpus_per_node": 0}, "gpus_per_node >= 1"),
        ("no nodes", {"node_count": 0}, "node_count >= 1"),
        ("negative memory", {"min_memory_mib": -1}, "host_memory_mib must be >= 0"),
        ("negative CPUs", {"cpus": -1}, "cpus and host_memory_mib must be >= 0"),
        ("negative host memory", {"host_memory_mib": -2}, "host_memory_mib must be >= 0"),
        ("priority", {"priority": "urgent"}, "unknown priority 'urgent'"),
        ("topology", {"topology": "rack"}, "unknown topology 'rack'"),
    ],
)
def test_a_job_request_rejects_nonsense(_case: str, fields: dict, error: str) -> None:
    values = {"id": 1, "owner": "alice", "priority": "normal", "submitted_at": NOW}
    values |= {"gpus_per_node": 1} | fields

    with pytest.raises(ValueError, match=error):
        JobRequest(**values)
