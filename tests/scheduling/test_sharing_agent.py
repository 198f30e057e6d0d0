"""A simulated node's agent runs shares through the same code as a real one: an MPS job's GPU
gets its control daemon (the stand-in), which shows on the simulated GPU as the MPS server
does, beside the job's own process with its share of the memory; a MIG job's process shows
on its MIG device."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuadmin.celery import app
from inventory import live
from inventory.agent import scan_this_node
from scheduling.agent import jobs as agent
from scheduling.agent.mps import MpsDaemons
from scheduling.agent.wire import FinalState, JobFinished, JobSpec
from tests.waiting import wait_for


@pytest.fixture
def sim_agent(settings: Any, tmp_path: Path, monkeypatch):
    """This process as the agent of a simulated DGX A100 40GB (GPUs 0 and 1 in MIG mode);
    what it reports is kept."""
    hostname = f"share-{uuid.uuid4().hex[:8]}"
    settings.GPUADMIN_NVML = "sim"
    settings.GPUADMIN_SIM_MODEL = "dgx-a100-40gb"
    settings.GPUADMIN_NODE_NAME = hostname
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path / "sim"
    settings.GPUADMIN_DATA_DIR = tmp_path / "data"
    settings.GPUADMIN_JOBS_AS_OWNER = "off"
    reported: list[dict[str, Any]] = []

    def send_task(name: str, args: tuple = (), **_: Any) -> None:
        if name == "scheduling.job_events":
            reported.extend(args[0])

    monkeypatch.setattr(app, "send_task", send_task)
    monkeypatch.setattr(agent, "_executor", None)
    scan_this_node()  # creates the node's simulator state
    yield reported
    if agent._executor is not None:
        agent._executor.shutdown(kill=True)
    agent.flush_reports()  # to this test's broker
    live.client().delete(live.KEY_PREFIX + hostname)


def processes(index: int) -> dict[int, int | None]:
    """pid -> MiB of the processes the simulated GPU ``index`` shows."""
    [gpu] = [g for g in scan_this_node(include=("facts", "metrics")).gpus if g.facts.index == index]
    assert gpu.metrics is not None
    return {p.pid: p.used_memory_mib for p in gpu.metrics.processes}


def finished(reported: list[dict[str, Any]], job_id: str) -> bool:
    return any(e["event"] == "finished" and e["job_id"] == job_id for e in reported)


def started_events(reported: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in reported if e["event"] == "started"]


def test_an_mps_share_and_its_daemon_show_on_the_simulated_gpu(sim_agent, settings):
    gpu = next(g for g in scan_this_node(include=("facts",)).gpus if g.facts.index == 2)
    spec = JobSpec(
        job_id="11.1",
        argv=["sleep", "1"],
        gpu_uuids=[gpu.facts.uuid],
        cwd="/",
        mps_percent=25,
        mps_memory_mib=2048,
    )
    agent.run_job(spec.to_dict())
    wait_for(lambda: len(processes(2)) == 2, 10, "the daemon and the job on GPU 2")
    # The process shows on the GPU before the agent has sent its start.
    wait_for(lambda: started_events(sim_agent), 10, "the job's start")
    daemons = MpsDaemons(agent.agent_dir(settings.GPUADMIN_NODE_NAME) / "mps")
    daemon = daemons.pid(gpu.facts.uuid)
    assert daemon is not None
    [started] = started_events(sim_agent)
    assert processes(2) == {daemon: agent.SIM_MPS_SERVER_MIB, started["pid"]: 2048}
    wait_for(lambda: finished(sim_agent, "11.1"), 10, "the job's end")
    [end] = [e for e in sim_agent if e["event"] == "finished"]
    assert JobFinished.from_dict(end).state is FinalState.COMPLETED
    assert processes(2) == {}  # the last share ended: its daemon quit
    assert daemons.pid(gpu.facts.uuid) is None


def test_a_mig_job_shows_on_its_device(sim_agent):
    gpu = next(g for g in scan_this_node(include=("facts", "mig")).gpus if g.facts.index == 0)
    gi = gpu.mig.gpu_instances[0]
    device = gi.compute_instances[0].uuid
    agent.run_job(
        JobSpec(job_id="12.1", argv=["sleep", "1"], gpu_uuids=[device], cwd="/").to_dict()
    )
    wait_for(lambda: len(processes(0)) == 1, 10, "the job on its MIG device")
    wait_for(lambda: started_events(sim_agent), 10, "the job's start")
    [started] = started_events(sim_agent)
    assert processes(0) == {started["pid"]: int(gi.memory_mib * agent.SIM_MEMORY_FRACTION)}
    wait_for(lambda: finished(sim_agent, "12.1"), 10, "the job's end")
    assert processes(0) == {}
