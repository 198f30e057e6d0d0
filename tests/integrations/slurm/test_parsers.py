"""Each version's parser on real servers' answers (captures/SOURCES.md says where each is
from): states, reasons, GPU indexes per node, times, partitions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from integrations.slurm.rest.model import SlurmJob, SlurmNode, SlurmPartition
from integrations.slurm.rest.versions import PARSERS, newest_known

CAPTURES = Path(__file__).parent / "captures"


def capture(version: str, name: str) -> dict[str, Any]:
    return json.loads((CAPTURES / version / f"{name}.json").read_text())


def nodes(version: str, name: str = "slurm-nodes") -> dict[str, SlurmNode]:
    parse = PARSERS[version].node
    return {node.name: node for node in map(parse, capture(version, name)["nodes"])}


def partitions(version: str) -> dict[str, SlurmPartition]:
    parse = PARSERS[version].partition
    return {
        part.name: part for part in map(parse, capture(version, "slurm-partitions")["partitions"])
    }


def jobs(version: str, name: str) -> list[SlurmJob]:
    return [PARSERS[version].job(job) for job in capture(version, name)["jobs"]]


def test_every_version_read_has_captures_and_every_capture_parses() -> None:
    assert sorted(PARSERS) == sorted(
        folder.name for folder in CAPTURES.iterdir() if folder.is_dir()
    )
    for path in CAPTURES.glob("*/*.json"):
        parser = PARSERS[path.parent.name]
        answer = json.loads(path.read_text())
        for kind, parse in (
            ("nodes", parser.node),
            ("partitions", parser.partition),
            ("jobs", parser.job),
        ):
            for item in answer.get(kind, []):
                parse(item)


# ---------------------------------------------------------------------------- v0.0.38 (22.05)


def test_v0_0_38_jobs_hold_their_gpu_indexes() -> None:
    train, evaluate, sweep = jobs("v0.0.38", "slurm-jobs")
    assert (train.job_id, train.name, train.user, train.state) == (1, "train", "root", "RUNNING")
    assert train.gpus == {"localhost": (0, 1)}
    assert train.gpus_requested == 2
    assert train.time_limit_min is None  # no limit asked, partition MaxTime=INFINITE
    assert train.start_time is not None and train.start_time.tzinfo is UTC
    assert evaluate.gpus == {"localhost": (2, 3, 4)}
    assert evaluate.time_limit_min == 90
    assert (sweep.state, sweep.reason, sweep.nodes, sweep.gpus) == ("PENDING", "Resources", (), {})
    assert sweep.gpus_requested == 4  # tres_per_node gres:gpu:4
    assert (sweep.array_job_id, sweep.array_task_id, sweep.start_time) == (3, None, None)


def test_v0_0_38_drained_node_keeps_state_flags_and_reason() -> None:
    node = nodes("v0.0.38")["localhost"]
    assert node.states == ("MIXED", "DRAIN")
    assert (node.reason, node.reason_set_by) == ("fan 3 failed", "root")
    assert node.reason_changed_at is not None
    assert (node.gpus, node.cpus, node.alloc_cpus, node.real_memory_mib) == (8, 8, 2, 8000)
    assert node.gpus_used == ()  # gres_used "gpu:5": no indexes in v0.0.38 (the client adds them)


def test_v0_0_38_partition() -> None:
    assert partitions("v0.0.38")["batch"] == SlurmPartition(
        "batch", ("localhost",), state="UP", total_cpus=8, total_nodes=1
    )


# ---------------------------------------------------------------------------- v0.0.40 and after


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.41"])
def test_multi_node_job_holds_each_nodes_indexes(version: str) -> None:
    (job,) = jobs(version, "slurm-job-gpus-multi-nodes")
    assert job.nodes == ("ia1", "ia2")
    # gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5) on each node
    assert job.gpus == {"ia1": (0, 1, 2, 3, 4, 5), "ia2": (0, 1, 2, 3, 4, 5)}
    assert job.gpus_requested == 12
    assert (job.state, job.state_flags, job.reason) == ("RUNNING", (), "")
    assert job.time_limit_min == 1
    assert job.start_time is not None and job.end_time is not None
    assert (job.end_time - job.start_time).total_seconds() == 60
    assert (job.array_job_id, job.array_task_id) == (None, None)


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.41"])
def test_job_with_two_gpu_types_holds_both(version: str) -> None:
    (job,) = jobs(version, "slurm-job-gpus-multi-types")
    assert job.gpus == {"ia2": (0, 2)}  # gpu:h100:1(IDX:0),gpu:h200:1(IDX:2)
    assert job.gpus_requested == 2


def test_v0_0_41_empty_idx_lists_and_per_node_requests() -> None:
    (per_socket,) = jobs("v0.0.41", "slurm-job-gpus-per-socket")
    assert per_socket.gpus == {"ia1": (0, 1)}  # gpu:h100:2(IDX:0-1),gpu:h200:0(IDX:)
    (per_node,) = jobs("v0.0.41", "slurm-job-gpus-per-node")
    assert per_node.gpus == {"ia1": (0,), "ia2": (0,)}


@pytest.mark.parametrize(("version", "job_id"), [("v0.0.40", 791), ("v0.0.41", 16)])
def test_pending_gpu_job_asks_from_tres_per_job(version: str, job_id: int) -> None:
    (job,) = jobs(version, "slurm-job-gpus-pending")
    assert (job.job_id, job.state, job.reason) == (job_id, "PENDING", "BeginTime")
    assert (job.nodes, job.gpus, job.gpus_requested) == ((), {}, 6)  # tres_per_job gres/gpu:6


@pytest.mark.parametrize(
    ("version", "name", "changed_at"),
    [("v0.0.40", "cn1", 1746621136), ("v0.0.41", "cn2", 1747762249)],
)
def test_drained_node_reason(version: str, name: str, changed_at: int) -> None:
    node = nodes(version, "slurm-node-drain")[name]
    assert node.states == ("IDLE", "DRAIN")
    assert (node.reason, node.reason_set_by) == ("ECC memory error", "root")
    assert node.reason_changed_at == datetime.fromtimestamp(changed_at, UTC)


def test_v0_0_41_node_gpus_in_use() -> None:
    node = nodes("v0.0.41", "slurm-node-with-gpus-model-mixed")["gpu1"]
    assert node.states == ("MIXED", "PLANNED")
    assert (node.gpus, node.gpus_used) == (4, (0, 1))  # gres gpu:h100:4, gres_used IDX:0-1


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.43", "v0.0.44"])
def test_later_versions_read_alike(version: str) -> None:
    gpu1 = nodes(version)["gpu1"]
    assert (gpu1.states, gpu1.gpus, gpu1.gpus_used) == (("IDLE",), 4, ())  # IDX:N/A
    assert partitions(version)["gpu"].nodes == ("gpu1", "gpu2")
    (job,) = jobs(version, "slurm-job-gpus-multi-types")
    assert (job.state, job.gpus, job.gpus_requested) == ("RUNNING", {"gpu1": (0,)}, 1)


def test_newest_known_version_wins() -> None:
    assert newest_known(["v0.0.37", "v0.0.38"]) == "v0.0.38"
    assert newest_known(["v0.0.40", "v0.0.41", "v0.0.99"]) == "v0.0.41"
    assert newest_known(["v0.0.39", "v0.0.9"]) is None
