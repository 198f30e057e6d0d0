"""A policy's GPU reset on the node's agent: the simulator's reset on a simulated node (on by
default there), refused while processes run on the GPU and on real NVML unless allowed; the
agent reports the result to the central side."""

from __future__ import annotations

import pytest

from health import resets
from health import tasks as health_tasks
from inventory.agent import node_backend
from inventory.nvml.sim import faults
from tests.scheduling import conftest as scheduling_fixtures

broker = scheduling_fixtures.broker


@pytest.fixture
def sim_node(settings, tmp_path) -> str:
    """This process as the agent of simulated node dgx-01."""
    settings.GPUADMIN_NVML = "sim"
    settings.GPUADMIN_SIM_MODEL = "dgx-a100-80gb"
    settings.GPUADMIN_NODE_NAME = "dgx-01"
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path
    faults.ensure_node(tmp_path, "dgx-01", "dgx-a100-80gb")
    return str(tmp_path)


def lost(index: int) -> bool:
    nvml = node_backend()
    return bool(nvml.state["gpus"][index]["lost"])


def test_the_agent_resets_a_simulated_gpu_that_fell_off_the_bus(sim_node):
    faults.fall_off_bus(sim_node, "dgx-01", 2)
    assert lost(2)
    assert resets.reset_on_this_node(2) is None
    assert not lost(2)


def test_a_reset_waits_for_the_gpus_processes_then_refuses(sim_node):
    faults.start_process(sim_node, "dgx-01", 3, 4242, used_mib=1000)
    assert resets.reset_on_this_node(3, wait_s=0.3) == "processes still run on it (pids 4242)"
    faults.stop_process(sim_node, "dgx-01", 4242)
    assert resets.reset_on_this_node(3, wait_s=0) is None


def test_real_hardware_is_not_reset_unless_allowed(sim_node, settings):
    settings.GPUADMIN_NVML = "real"
    assert resets.reset_on_this_node(0) == (
        "GPU resets are off on this node (GPUADMIN_GPU_RESET=auto)"
    )
    settings.GPUADMIN_NVML = "sim"
    settings.GPUADMIN_GPU_RESET = "off"
    assert (
        resets.reset_on_this_node(0) == "GPU resets are off on this node (GPUADMIN_GPU_RESET=off)"
    )


def test_the_reset_task_reports_how_it_went(sim_node, broker):
    faults.fall_off_bus(sim_node, "dgx-01", 1)
    health_tasks.reset_gpu(1, "GPU-uuid-1", 7)
    assert broker.named("health.reset_finished") == [(("dgx-01", "GPU-uuid-1", None, 7), None)]
    assert not lost(1)
