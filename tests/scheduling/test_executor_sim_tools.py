"""A simulated node's jobs find an ``nvidia-smi`` on their ``PATH`` that answers from the
node's simulator (``inventory.nvml.smi``): every GPU for a job that is not confined, its own
only for a job whose cgroup confines its devices, as NVML shows them. Real subprocesses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from inventory.nvml import smi
from inventory.nvml.sim import SimulatedNvml
from scheduling.agent.isolation.cgroups import host_cgroups
from scheduling.agent.wire import FinalState, JobSpec
from tests.scheduling.executors import MakeExecutor
from tests.scheduling.test_isolation import cgroup_root, needs_root  # noqa: F401 - fixture

SCRIPT = "nvidia-smi -L && nvidia-smi --query-gpu=name,memory.total --format=csv"
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def node(tmp_path: Path) -> tuple[SimulatedNvml, Path]:
    """A simulated DGX A100 80GB (its state shared in a directory, as an agent's) and the
    folder of its nvidia-smi."""
    state = tmp_path / "sim"
    nvml = SimulatedNvml.from_model("dgx-a100-80gb", node_name="sim-01", state_dir=str(state))
    nvml.nvmlInit()
    shim = smi.write_shim(
        tmp_path / "sim-bin",
        python=sys.executable,
        node="sim-01",
        state_dir=str(state),
        sim_model="dgx-a100-80gb",
    )
    return nvml, shim.parent


def uuids(nvml: SimulatedNvml) -> list[str]:
    return [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]


def test_an_unconfined_job_sees_every_gpu_of_the_node(
    make_executor: MakeExecutor, node: tuple[SimulatedNvml, Path], tmp_path: Path
) -> None:
    nvml, tools = node
    executor, events = make_executor(sim_tools_dir=tools)
    all_gpus = uuids(nvml)
    spec = JobSpec(
        job_id="1.1", argv=["sh", "-c", SCRIPT], cwd=str(tmp_path), gpu_uuids=all_gpus[2:3]
    )

    executor.launch(spec)

    assert events.finished("1.1").state == FinalState.COMPLETED, executor.tail("1.1")
    listed = [f"GPU {i}: {A100} (UUID: {uuid})" for i, uuid in enumerate(all_gpus)]
    assert executor.tail("1.1").splitlines() == [
        *listed,
        "name, memory.total [MiB]",
        *[f"{A100}, 81920 MiB"] * 8,
    ]


def test_without_the_tools_there_is_no_nvidia_smi(
    make_executor: MakeExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    executor, events = make_executor()
    executor.launch(JobSpec(job_id="2.1", argv=["nvidia-smi", "-L"], cwd=str(tmp_path)))
    finished = events.finished("2.1")
    assert finished.state == FinalState.FAILED
    assert "nvidia-smi" in (finished.message or "")


@needs_root
def test_a_confined_job_sees_its_own_gpus_only(
    make_executor: MakeExecutor,
    node: tuple[SimulatedNvml, Path],
    cgroup_root: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    nvml, tools = node
    executor, events = make_executor(
        sim_tools_dir=tools, cgroups=host_cgroups("auto", cgroup_root), node_name="sim-01"
    )
    all_gpus = uuids(nvml)
    spec = JobSpec(
        job_id="3.1",
        argv=["sh", "-c", SCRIPT],
        cwd=str(tmp_path),
        gpu_uuids=[all_gpus[1], all_gpus[5]],
        gpu_minors=[1, 5],
    )

    executor.launch(spec)

    assert events.finished("3.1").state == FinalState.COMPLETED, executor.tail("3.1")
    assert executor.tail("3.1").splitlines() == [
        f"GPU 1: {A100} (UUID: {all_gpus[1]})",
        f"GPU 5: {A100} (UUID: {all_gpus[5]})",
        "name, memory.total [MiB]",
        f"{A100}, 81920 MiB",
        f"{A100}, 81920 MiB",
    ]
