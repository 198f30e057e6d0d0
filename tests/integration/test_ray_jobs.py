"""Ray applications on gpuadmin's GPUs, through real processes: a central worker places a
2-node gang on two simulated nodes, their agents start a real Ray head and worker inside the
job's cgroups, the entrypoint runs on that cluster and sees exactly the job's GPUs; a canceled
Ray application leaves no Ray process behind."""

from __future__ import annotations

import json
import random
import socket
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from inventory.models import Node
from scheduling.agent.wire import executor_id
from scheduling.jobs import control, ray, submission
from scheduling.models import Job, JobState
from tests.integration.stack import node_agent, worker_and_agent
from tests.integrations.ray.conftest import ray_binary
from tests.unix_accounts import runs_as_this_account
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Each task holds one GPU for a while, so that the four run at once, on both nodes.
ENTRYPOINT = """
import json, os, time, ray
ray.init()
@ray.remote(num_gpus=1, num_cpus=0)
def where():
    time.sleep(3)
    return ray.get_runtime_context().get_node_id(), os.environ["CUDA_VISIBLE_DEVICES"]
seen = ray.get([where.remote() for _ in range(4)])
print("SEEN", json.dumps({"tasks": seen, "gpus": ray.cluster_resources().get("GPU")}))
"""
WAITS = "import ray, time; ray.init(); print('UP', flush=True); time.sleep(600)"


def head_ports() -> str:
    """A first port whose three (GCS, dashboard, client) are free, below the ephemeral range:
    each test process's agents start heads of their own."""
    while True:
        first = random.randrange(20000, 30000, 3)
        try:
            for port in range(first, first + ray.PORTS_PER_HEAD):
                with socket.socket() as sock:
                    sock.bind(("", port))
        except OSError:
            continue
        return str(first)


@pytest.fixture
def ray_nodes(gpuadmin_env, tmp_path) -> Iterator[list[str]]:
    """A central worker and two simulated DGX A100 agents, reached at 127.0.0.1."""
    ray_binary()  # installed, or the test is skipped (fails under CI)
    prefix = uuid.uuid4().hex[:6]
    hostnames = [f"ray-{prefix}-a", f"ray-{prefix}-b"]
    settings = {
        "GPUADMIN_JOB_KILL_GRACE_S": "5",
        "GPUADMIN_RAY_HEAD_PORT": head_ports(),
        "GPUADMIN_RAY_PYTHON": sys.executable,
    }
    sim = ("--sim", "dgx-a100-80gb")
    with (
        worker_and_agent(gpuadmin_env, hostnames[0], sim, 8, tmp_path, **settings),
        node_agent(gpuadmin_env, hostnames[1], sim, 8, tmp_path, **settings),
    ):
        Node.objects.filter(hostname__in=hostnames).update(address="127.0.0.1")
        yield hostnames


def job_processes(job: Job) -> list[psutil.Process]:
    """The processes in the job's cgroups (on any node: they share this host)."""
    marker = f"/{executor_id(job.pk, job.attempt)}"
    found = []
    for process in psutil.process_iter():
        try:
            if marker in Path(f"/proc/{process.pid}/cgroup").read_text():
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def ray_processes_of(job: Job) -> list[psutil.Process]:
    """Processes anywhere on the host whose command line names the job's Ray folder."""
    folder = f"gpuadmin-ray-{executor_id(job.pk, job.attempt)}"
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(folder in arg for arg in process.info["cmdline"] or ()):
            found.append(process)
    return found


def dashboard_nodes(url: str, token: str | None) -> list[dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{url}api/v0/nodes", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)["data"]["result"]["result"]


def test_a_ray_application_runs_on_its_own_cluster_and_leaves_nothing(ray_nodes, tmp_path):
    owner = get_user_model().objects.create_user("rosa", password="pw")
    runs_as_this_account(owner)
    script = tmp_path / "entrypoint.py"
    script.write_text(ENTRYPOINT)
    env = {"RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": "80000000"}  # Ray's own cap
    job = submission.submit_job(
        owner,
        command=[sys.executable, str(script)],
        gpu_count=2,
        node_count=2,
        ray=True,
        env=env,
        working_dir=str(tmp_path),
        max_runtime_s=240,
    )
    wait_for(lambda: Job.objects.get(pk=job.pk).is_terminal, 180, "the Ray application to end")
    job.refresh_from_db()
    log = control_log(job)
    assert job.state == JobState.COMPLETED, (job.message, log)
    seen = json.loads(log.split("SEEN ", 1)[1].splitlines()[0])
    assert seen["gpus"] == 4
    held = job.allocations.filter(attempt=job.attempt).values_list("gpu__uuid", flat=True)
    tasks = seen["tasks"]
    assert len({node_id for node_id, _ in tasks}) == 2  # both nodes ran tasks
    assert {device for _, device in tasks} == set(held)  # each saw one of the job's GPUs
    # The head's part ended with its cluster; the worker's is stopped as the gang ends.
    wait_for(lambda: not job_processes(job) and not ray_processes_of(job), 30, "Ray to stop")

    # A second one, canceled while its entrypoint runs: its dashboard first (token required).
    long = submission.submit_job(
        owner,
        command=[sys.executable, "-c", WAITS],
        gpu_count=1,
        node_count=2,
        ray=True,
        env=env,
        working_dir=str(tmp_path),
    )
    wait_for(lambda: "UP" in control_log(Job.objects.get(pk=long.pk)), 120, "the entrypoint to run")
    long.refresh_from_db()
    url = ray.dashboard_url(long, long.allocations.select_related("node"))
    assert url == f"http://127.0.0.1:{long.ray_port + 1}/"
    assert sum(node["state"] == "ALIVE" for node in dashboard_nodes(url, ray.token(long))) == 2
    with pytest.raises(urllib.error.HTTPError) as refused:
        dashboard_nodes(url, None)
    assert refused.value.code == 401
    client = Client()
    client.force_login(owner)
    page = client.get(reverse("scheduling:job-detail", args=[long.pk])).content.decode()
    assert f'href="{url}" id="ray-dashboard"' in page and ray.token(long) in page
    running = job_processes(long)
    assert len(running) > 6, running  # launchers, entrypoint, ray start, GCS, raylets, ...

    control.cancel_job(long, actor=owner)
    wait_for(lambda: Job.objects.get(pk=long.pk).state == JobState.CANCELED, 60, "the cancel")
    gone, alive = psutil.wait_procs(running, timeout=10)
    assert not alive, alive
    assert not job_processes(long) and not ray_processes_of(long)


def control_log(job: Job) -> str:
    """The head's log (the entrypoint's output), read through its agent."""
    from scheduling.jobs import queries

    try:
        return queries.job_log(job, lines=400).text
    except (queries.NoLog, queries.LogUnavailable):
        return ""
