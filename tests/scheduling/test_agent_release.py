"""A node agent reports a job finished only after its GPUs' live sample shows the job's
processes gone, so the placement pass that the release wakes never takes a freed GPU for busy
(whatever the periodic sample's timing)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from gpuadmin.celery import app
from inventory import live
from inventory.agent import scan_this_node
from inventory.nvml.sim import faults
from scheduling.agent import jobs as agent
from scheduling.agent.wire import FinalState, JobFinished


@pytest.fixture
def sim_agent(settings: Any, tmp_path: Path):
    """This process as the agent of a simulated DGX A100 80GB."""
    hostname = f"release-{uuid.uuid4().hex[:8]}"
    settings.GPUADMIN_NVML = "sim"
    settings.GPUADMIN_SIM_MODEL = "dgx-a100-80gb"
    settings.GPUADMIN_NODE_NAME = hostname
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path / "sim"
    scan_this_node()  # creates the node's simulator state
    yield hostname
    live.client().delete(live.KEY_PREFIX + hostname)


def processes_on_gpu0(hostname: str) -> int:
    [sample] = [s for s in live.latest([hostname])[hostname].values() if s["index"] == 0]
    return sample["processes"]


def test_the_sample_is_fresh_when_the_end_of_a_job_is_reported(sim_agent, settings, monkeypatch):
    state_dir = settings.GPUADMIN_SIM_STATE_DIR
    faults.start_process(state_dir, sim_agent, 0, 4242, used_mib=1000)
    live.publish(sim_agent, scan_this_node(include=("facts", "metrics")))  # while it ran
    faults.stop_process(state_dir, sim_agent, 4242)  # its processes are gone
    seen: list[tuple[str, int]] = []

    def send_task(name: str, args: tuple = (), **_: Any) -> None:
        seen.append(([event["event"] for event in args[0]], processes_on_gpu0(sim_agent)))

    monkeypatch.setattr(app, "send_task", send_task)
    agent.report(JobFinished("7.1", FinalState.COMPLETED, 0, timezone.now()))
    agent.flush_reports()  # what the sender thread does
    assert seen == [(["finished"], 0)]  # the release's pass reads a sample without them
