"""A real node agent (Celery worker on the real Redis) runs a real task end to end."""

import subprocess
import sys
import uuid

import pytest

from gpuadmin.access.nodes import create_credential, send_order
from tests.conftest import REPO_DIR

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_agent_serves_its_node_queue_and_returns_a_simulated_scan(gpuadmin_env):
    node = f"it-{uuid.uuid4().hex[:8]}"
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpuadmin", "agent", "--node", node, "--sim", "dgx-a100-40gb"],
        # No central worker here checks its reports; the token signs the order below.
        env={**gpuadmin_env, "GPUADMIN_NODE_TOKEN": create_credential(node, actor_name="tests")[1]},
        cwd=REPO_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        result = send_order(node, "inventory.scan_node", ignore_result=False).get(timeout=120)
    finally:
        agent.terminate()
        output, _ = agent.communicate(timeout=30)

    assert f"agent {node}: 8 GPUs" in output
    assert "celery@" in output or f"agent.{node}@" in output
    gpus = result["gpus"]
    assert [gpu["facts"]["index"] for gpu in gpus] == list(range(8))
    assert {gpu["facts"]["name"] for gpu in gpus} == {"NVIDIA A100-SXM4-40GB"}
    assert result["system"]["error"] is None
    # A second agent of another node never receives this node's work: queues are per node.
    assert agent.returncode in (0, -15)
