"""A job's whole life through real processes: a central Celery worker runs the placement loop,
a simulated node's agent runs the job as a real subprocess, the simulator shows it on its GPUs,
and the reports bring it to its end."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from inventory import live
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from scheduling.checks import run_checks
from scheduling.jobs import control, submission
from scheduling.models import TERMINAL_STATES, Job, JobState
from tests.integration.stack import worker_and_agent
from tests.unix_accounts import new_name, requires_root, runs_as_this_account, unix_user
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def state_of(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


@pytest.fixture
def sim_node(gpuadmin_env, tmp_path, request) -> Iterator[str]:
    """A central worker and one simulated DGX A100 80GB agent, heartbeating (no beat); a
    test's indirect parameter overrides their settings."""
    settings = {"GPUADMIN_JOB_KILL_GRACE_S": "2", **getattr(request, "param", {})}
    hostname = f"run-{uuid.uuid4().hex[:6]}"
    agent_args = ("--sim", "dgx-a100-80gb")
    with worker_and_agent(gpuadmin_env, hostname, agent_args, 8, tmp_path, **settings):
        yield hostname


def test_a_job_is_placed_run_watched_and_finished(sim_node, tmp_path):
    owner = get_user_model().objects.create_user("carol")
    runs_as_this_account(owner)
    out = tmp_path / "seen.txt"
    job = submission.submit_job(
        owner,
        command=["sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES $JOB_VAR" > {out}; sleep 4'],
        gpu_count=2,
        env={"JOB_VAR": "hello"},
        working_dir=str(tmp_path),
    )
    wait_for(lambda: state_of(job) == JobState.RUNNING, 60, "the job to start")
    job.refresh_from_db()
    uuids = sorted(job.allocations.values_list("gpu__uuid", flat=True))
    assert len(uuids) == 2
    assert job.placement["topology_class"] in ("nvlink", "numa")

    # The simulator follows the real process: its GPUs show it in the live samples.
    def busy_gpus() -> set[str]:
        samples = live.latest([sim_node])[sim_node]
        return {uuid for uuid, sample in samples.items() if sample.get("processes")}

    wait_for(lambda: busy_gpus() == set(uuids), 30, "the live samples to show the job")
    wait_for(lambda: state_of(job) == JobState.COMPLETED, 60, "the job to finish")
    job.refresh_from_db()
    assert job.exit_code == 0
    assert sorted(out.read_text().split()[0].split(",")) == uuids
    assert out.read_text().split()[1] == "hello"
    assert not job.allocations.active().exists()
    wait_for(lambda: busy_gpus() == set(), 30, "the GPUs to be idle again")

    # A job that ignores SIGTERM is killed after the grace when canceled.
    stubborn = submission.submit_job(
        owner, command="trap '' TERM; sleep 60", use_shell=True, gpu_count=8
    )
    wait_for(lambda: state_of(stubborn) == JobState.RUNNING, 60, "the second job to start")
    control.cancel_job(stubborn, actor=owner)
    wait_for(lambda: state_of(stubborn) == JobState.CANCELED, 30, "the cancel to land")
    stubborn.refresh_from_db()
    assert stubborn.exit_code == -9  # SIGKILL after the 2 s grace
    assert {name: found for name, found in run_checks().items() if found} == {}
    # The agent ran without DATABASE_URL, and started no PostgreSQL of its own.
    assert not (tmp_path / "data" / "pgdata").exists()


@pytest.mark.parametrize(
    "sim_node",
    # Samples 30 s apart (heard from within the grace all the same): only the release itself
    # can start the waiting job before beat's backstop pass, and beat does not run here.
    [{"GPUADMIN_SAMPLE_INTERVAL_S": "30", "GPUADMIN_HEARTBEAT_GRACE_S": "120"}],
    indirect=True,
)
def test_a_jobs_nvidia_smi_answers_from_the_simulator(sim_node, gpuadmin_env, tmp_path):
    """Real job scripts run in the demo: ``nvidia-smi`` on a simulated node lists the job's
    own GPUs (its cgroup confines its devices) from the node's simulator."""
    owner = get_user_model().objects.create_user("frank")
    runs_as_this_account(owner)
    job = submission.submit_job(
        owner,
        command="nvidia-smi -L && nvidia-smi --query-gpu=name,memory.total --format=csv",
        use_shell=True,
        gpu_count=2,
        working_dir=str(tmp_path),
    )
    wait_for(lambda: state_of(job) in TERMINAL_STATES, 60, "the job to end")
    job.refresh_from_db()
    agent = Path(gpuadmin_env["GPUADMIN_DATA_DIR"]) / "agent" / sim_node
    log = (agent / "logs" / f"{job.pk}.1.log").read_text()
    assert job.state == JobState.COMPLETED, log
    held = dict(job.allocations.values_list("gpu__index", "gpu__uuid"))
    assert log.splitlines() == [
        *(f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: {uuid})" for i, uuid in sorted(held.items())),
        "name, memory.total [MiB]",
        "NVIDIA A100-SXM4-80GB, 81920 MiB",
        "NVIDIA A100-SXM4-80GB, 81920 MiB",
    ]


def test_gpus_freed_by_a_job_go_to_the_waiting_job_at_once(sim_node, gpuadmin_env, tmp_path):
    owner = get_user_model().objects.create_user("dave")
    runs_as_this_account(owner)
    flag = tmp_path / "done"
    first = submission.submit_job(
        owner, command=f"while [ ! -e {flag} ]; do sleep 0.05; done", use_shell=True, gpu_count=8
    )
    wait_for(lambda: state_of(first) == JobState.RUNNING, 60, "the first job to start")
    # The node's latest sample, as the agent's sampler took it while the job ran.
    simulator = SimulatedNvml.from_model(
        "dgx-a100-80gb",
        node_name=sim_node,
        state_dir=Path(gpuadmin_env["GPUADMIN_DATA_DIR"]) / "sim",
    )
    live.publish(sim_node, scan(simulator, include=("facts", "metrics")))
    assert all(sample["processes"] for sample in live.latest([sim_node])[sim_node].values())
    second = submission.submit_job(owner, command=["true"], gpu_count=8)
    wait_for(
        lambda: Job.objects.get(pk=second.pk).pending_code == "resources_busy",
        30,
        "a pass to find the second job no room",
    )

    flag.touch()
    wait_for(lambda: state_of(first) == JobState.COMPLETED, 30, "the first job to finish")
    wait_for(lambda: state_of(second) != JobState.QUEUED, 5, "the freed GPUs to be given")
    first.refresh_from_db()
    second.refresh_from_db()
    assert second.scheduled_at - first.finished_at < timedelta(seconds=5)


# The agent's data folder for the next test: jobs of other accounts must be able to enter their
# scratch folders in it, which they cannot under pytest's private temporary folder.
OPEN_DATA_DIR = Path(tempfile.gettempdir()) / f"gpuadmin-accounts-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def open_data_dir() -> Iterator[Path]:
    yield OPEN_DATA_DIR
    shutil.rmtree(OPEN_DATA_DIR, ignore_errors=True)


@requires_root
@pytest.mark.parametrize("sim_node", [{"GPUADMIN_DATA_DIR": str(OPEN_DATA_DIR)}], indirect=True)
def test_a_job_submitted_through_the_api_runs_as_its_owners_unix_account(open_data_dir, sim_node):
    name = new_name()  # a person whose Unix account has their user name (the default)
    with unix_user(name) as account:
        client = APIClient()
        client.force_authenticate(get_user_model().objects.create_user(name))
        response = client.post(
            "/api/v1/jobs/",
            {"command": "id -u; id -g; id -G; pwd", "use_shell": True, "gpu_count": 1},
            format="json",
        )
        assert response.status_code == 201, response.content
        job = Job.objects.get(pk=response.json()["id"])
        wait_for(lambda: state_of(job) in TERMINAL_STATES, 60, "the job to end")

        job.refresh_from_db()
        assert (job.state, job.message) == (JobState.COMPLETED, "")
        log = open_data_dir / "agent" / sim_node / "logs" / f"{job.pk}.1.log"
        uid, gid, groups, cwd = log.read_text().splitlines()
        assert (int(uid), int(gid)) == (account.pw_uid, account.pw_gid)
        assert {int(g) for g in groups.split()} == set(os.getgrouplist(name, account.pw_gid))
        assert (log.stat().st_uid, Path(cwd).stat().st_uid) == (account.pw_uid, account.pw_uid)


def test_a_job_is_confined_to_its_memory_and_the_node_says_what_confines_it(sim_node, tmp_path):
    # The agent runs as root (as CI does): its jobs get cgroups of the session's own subtree.
    from inventory.models import Node

    owner = get_user_model().objects.create_user("erin")
    runs_as_this_account(owner)
    greedy = submission.submit_job(
        owner,
        command=[sys.executable, "-c", "data = b'x' * (512 << 20); print('allocated')"],
        gpu_count=1,
        host_memory_mib=64,
        working_dir=str(tmp_path),
    )
    wait_for(lambda: state_of(greedy) in TERMINAL_STATES, 60, "the greedy job to end")
    greedy.refresh_from_db()
    assert greedy.state == JobState.FAILED
    assert greedy.message == "stopped: it used more than its 64 MiB of host memory"
    assert greedy.max_memory_bytes is not None and greedy.max_memory_bytes <= 64 << 20
    assert greedy.cpu_seconds is not None and greedy.cpu_seconds > 0
    node = Node.objects.get(hostname=sim_node)
    assert node.isolation.startswith("cgroup v"), node.isolation
