"""A job (any process that reaches the broker) cannot order a node's agent about: a forged
``scheduling.run_jobs`` put on a live agent's queue, asking for root, runs nothing and is
logged once, nor stop it by Celery's remote control, while the jobs the central side places
there still run."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from gpuadmin.access.node_signing import parse_token
from gpuadmin.access.nodes import node_token
from inventory.models import Gpu
from scheduling.jobs import submission
from scheduling.models import Job, JobState
from tests.conftest import REPO_DIR
from tests.integration.stack import worker_and_agent
from tests.unix_accounts import runs_as_this_account
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# What a job that reaches the broker can send, with Celery alone (no credential, no key).
FORGE = """
import socket
import sys
import time

from celery import Celery

url, queue, touched, gpu, key_id = sys.argv[1:]
spec = {"job_id": "999999.1", "argv": ["touch", touched], "gpu_uuids": [gpu], "cwd": "/",
        "unix_user": "root", "allow_root": True}
forger = Celery(broker=url)
forger.send_task("scheduling.run_jobs", args=([spec],), queue=queue)
# And one under a made-up signature for that node's credential (its id is no secret: it
# starts every token of the node).
header = {"node": queue.removeprefix("node."), "at": time.time(), "sigs": {key_id: "0" * 64}}
forger.send_task("scheduling.run_jobs", args=([spec],), queue=queue,
                 headers={"gpuadmin_order": header})
# A central task on the agent's queue (it reads and acknowledges the central samples stream).
forger.send_task("health.ingest_samples", queue=queue)
# And Celery's remote control: stop the agent.
forger.control.shutdown(destination=[f"agent.{header['node']}@{socket.gethostname()}"])
"""


@pytest.fixture
def sim_node(gpuadmin_env, tmp_path) -> Iterator[tuple[str, Path]]:
    """A central worker and one simulated agent; the node's name and the agent's log."""
    hostname = f"orders-{uuid.uuid4().hex[:6]}"
    with worker_and_agent(gpuadmin_env, hostname, ("--sim", "dgx-a100-80gb"), 8, tmp_path):
        yield hostname, tmp_path / "agent.log"


def test_a_forged_order_runs_nothing_and_a_placed_job_still_runs(sim_node, gpuadmin_env, tmp_path):
    hostname, agent_log = sim_node
    forged, placed = tmp_path / "forged-as-root", tmp_path / "placed"
    gpu = Gpu.objects.filter(node__hostname=hostname).order_by("index").first()
    assert gpu is not None
    key_id, _ = parse_token(node_token(hostname, actor_name="tests"))  # the agent's
    subprocess.run(
        [sys.executable, "-c", FORGE, gpuadmin_env["REDIS_URL"], f"node.{hostname}",
         str(forged), gpu.uuid, str(key_id)],
        cwd=REPO_DIR,
        check=True,
        timeout=60,
    )  # fmt: skip

    def refusals() -> list[str]:
        return [line for line in agent_log.read_text().splitlines() if "refused order" in line]

    wait_for(lambda: len(refusals()) == 2, 60, "the agent to refuse both forged orders")
    owner = get_user_model().objects.create_user("erin")
    runs_as_this_account(owner)
    job = submission.submit_job(owner, command=["touch", str(placed)], gpu_count=1)
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.COMPLETED, 60, "the job to run")
    assert placed.exists()
    assert not forged.exists()
    unsigned, bad = refusals()
    assert "refused order scheduling.run_jobs[" in unsigned
    assert unsigned.endswith(": unsigned order")
    assert bad.endswith(": bad signature")
    log = agent_log.read_text()
    assert "unregistered task of type 'health.ingest_samples'" in log
    assert "Task health.ingest_samples" not in log  # never run there
