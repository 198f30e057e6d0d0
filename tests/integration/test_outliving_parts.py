"""No job's process outlives what gpuadmin decided about it, through real processes: a central
worker and simulated nodes' agents running jobs as real subprocesses. A multi-node gang's part
that fails ends the job once the agent of its other node has killed its part (its GPUs held
until then); an agent stopped while
its job ran (the job re-queued meanwhile, no cancel could reach it) re-adopts the job's process
when it starts again, and kills it at gpuadmin's word."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node
from scheduling.jobs import control, submission
from scheduling.models import Job, JobState
from tests.integration.stack import node_agent, stop_warmly, worker_and_agent
from tests.unix_accounts import runs_as_this_account
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SIM = ("--sim", "dgx-a100-80gb")


def state_of(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pid_in(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip(), 30, f"{path.name} written")
    return int(path.read_text())


@pytest.fixture
def owner() -> User:
    user = get_user_model().objects.create_user("erin")
    runs_as_this_account(user)
    return user


@pytest.fixture
def hostname() -> str:
    return f"outlive-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def two_nodes(gpuadmin_env, tmp_path, hostname) -> Iterator[tuple[str, str]]:
    """A central worker and two simulated DGX A100 80GB agents."""
    first, second = f"{hostname}-a", f"{hostname}-b"
    with (
        worker_and_agent(gpuadmin_env, first, SIM, 8, tmp_path, GPUADMIN_JOB_KILL_GRACE_S="2"),
        node_agent(gpuadmin_env, second, SIM, 8, tmp_path, GPUADMIN_JOB_KILL_GRACE_S="2"),
    ):
        yield first, second


def test_a_gangs_failed_part_makes_the_agent_of_its_other_node_kill_its_part(
    two_nodes, owner, tmp_path
):
    first, second = two_nodes
    # Rank 1 (the second node) fails after its start; rank 0 would run for 10 minutes.
    script = (
        f"echo $$ > {tmp_path}/pid.$GPUADMIN_NODE_RANK; "
        'if [ "$GPUADMIN_NODE_RANK" = 1 ]; then sleep 1; exit 3; fi; exec sleep 600'
    )
    job = submission.submit_job(owner, command=script, use_shell=True, gpu_count=8, node_count=2)
    wait_for(lambda: state_of(job) == JobState.RUNNING, 60, "the gang to start")
    survivor = pid_in(tmp_path / "pid.0")
    assert alive(survivor)

    wait_for(lambda: state_of(job) == JobState.FAILED, 60, "the failed part to end the job")
    # The job ended (its GPUs released) only once its agent reported its other part gone.
    assert not alive(survivor)
    stopping = AuditEvent.objects.get(event_type="job.stopping", target_id=str(job.pk))
    assert stopping.after["nodes"] == [first]
    job.refresh_from_db()
    assert (job.exit_code, job.message) == (3, "exited with code 3")
    assert not job.allocations.filter(released_at__isnull=True).exists()
    # Its end is reported: stale for the job, which stays as its failed part left it, but
    # its usage counts (where the node measures it: a cgroup's).
    parts = AuditEvent.objects.filter(event_type="job.part_usage", target_id=str(job.pk))
    if parts.filter(after__node=second).exists():
        wait_for(parts.filter(after__node=first).exists, 30, f"the usage of {first}'s part")
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.message) == (JobState.FAILED, 3, "exited with code 3")


def test_an_agent_back_with_a_job_gpuadmin_requeued_kills_it(
    gpuadmin_env, tmp_path, hostname, owner
):
    with worker_and_agent(gpuadmin_env, hostname, SIM, 8, tmp_path) as processes:
        job = submission.submit_job(
            owner,
            command=f"echo $$ > {tmp_path}/pid; exec sleep 600",
            use_shell=True,
            gpu_count=2,
        )
        wait_for(lambda: state_of(job) == JobState.RUNNING, 60, "the job to start")
        pid = pid_in(tmp_path / "pid")
        stop_warmly([processes["agent"]])  # without --stop-jobs-on-exit: its job runs on
        assert alive(pid)

        # gpuadmin gives up on the silent node: the job is re-queued (no cancel can reach it),
        # then canceled by its owner while it waits.
        Node.objects.filter(hostname=hostname).update(
            last_heartbeat_at=timezone.now() - timedelta(hours=1)
        )
        gpus = Gpu.objects.filter(node__hostname=hostname).values_list("pk", flat=True)
        assert control.stop_jobs_on_gpus(list(gpus), requeue=True, reason="node lost") == [job.pk]
        control.cancel_job(job, actor=owner)
        assert state_of(job) == JobState.CANCELED
        assert alive(pid)

        with node_agent(gpuadmin_env, hostname, SIM, 8, tmp_path):
            wait_for(lambda: not alive(pid), 60, "the re-adopted job to be killed")
        stray = AuditEvent.objects.get(event_type="job.stray_canceled", target_id=str(job.pk))
        assert stray.message == (
            f"gpuadmin ended this attempt while the agent of {hostname} was away: "
            "the job is canceled: canceled by erin"
        )
        assert state_of(job) == JobState.CANCELED
