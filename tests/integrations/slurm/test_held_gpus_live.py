"""A real Slurm job holding 2 GPUs of a node gpuadmin also manages (conftest.py's cluster, its
node catalogued as a simulated 8-GPU node whose minor numbers run backwards): the GPU page, the
fleet page and the API name the Slurm job as the GPUs' occupant; a gpuadmin job asking for all
8 GPUs of the node waits, saying which Slurm job holds them, and is placed once the Slurm job
ended and the next poll woke the loop."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from slurm import SlurmCluster as BenchCluster  # bench/slurm.py (see __init__.py)

from gpuadmin.audit.models import AuditEvent
from integrations.slurm import services
from integrations.slurm.models import AuthKind, PollState, SlurmCluster, SlurmJob
from inventory import live
from inventory.models import Gpu
from scheduling.jobs import submission
from scheduling.loop import dispatch
from scheduling.loop import passes as loop
from scheduling.models import JobState
from tests.integrations.slurm.mirror import add_reversed_node
from tests.integrations.slurm.test_live import WAIT_S, scontrol
from tests.inventory.test_pages_fleet import live_row
from tests.scheduling.conftest import broker  # noqa: F401  (a fixture)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

NODE = "localhost"  # bench/slurm.py's only node
CLUSTER = "bench-held"


@pytest.fixture
def slurm_job(slurm_cluster: BenchCluster) -> Iterator[int]:
    """``sbatch --gres=gpu:2 --wrap 'sleep 120'``, running; canceled at the end if the test
    did not."""
    job_id = int(
        slurm_cluster.client().sbatch(["-D", "/tmp", "--gres=gpu:2", "--wrap", "sleep 120"])
    )
    try:
        wait_for(
            lambda: "JobState=RUNNING" in scontrol(slurm_cluster, "show", "job", str(job_id)),
            WAIT_S,
            f"job {job_id} to run",
        )
        yield job_id
    finally:
        subprocess.run(["scancel", str(job_id)], env=slurm_cluster.env, check=False)


@pytest.fixture
def registered(admin_user, slurm_cluster: BenchCluster) -> SlurmCluster:
    add_reversed_node(NODE)
    live.client().delete(dispatch.wake_key())  # a wake an earlier test asked for coalesces ours
    cluster = SlurmCluster(name=CLUSTER, unix_socket=slurm_cluster.socket, auth=AuthKind.LOCAL)
    return services.save_cluster(cluster, actor=admin_user)


def test_gpus_a_slurm_job_holds_are_its_own_until_it_ends(
    registered,
    slurm_cluster,
    slurm_job,
    admin_user,
    admin_client,
    broker,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    assert services.poll(registered) == PollState.OK
    mirrored = SlurmJob.objects.get(cluster=registered, job_id=slurm_job)
    held = sorted(mirrored.gpus.values_list("gpu_id", flat=True))
    holder = f"Slurm job {slurm_job} on {CLUSTER}"
    assert len(held) == 2
    gpus = Gpu.objects.filter(node__hostname=NODE).order_by("pk")
    assert dict(gpus.values_list("pk", "held_outside")) == {
        gpu.pk: holder if gpu.pk in held else "" for gpu in gpus
    }
    audited = AuditEvent.objects.filter(event_type="gpu.held_outside_changed")
    uuids = set(gpus.filter(pk__in=held).values_list("uuid", flat=True))
    assert sorted(event.target_id for event in audited) == sorted(uuids)  # one row per GPU
    assert {(event.actor_name, event.after["held_outside"]) for event in audited} == {
        ("slurm-sync", holder)
    }

    # The pages and the API name the Slurm job as the occupant.
    gpu = Gpu.objects.get(pk=held[0])
    link = f'<a href="/jobs/#slurm-job-{CLUSTER}-{slurm_job}">'
    page = admin_client.get(f"/gpus/{gpu.uuid}/").content.decode()
    assert f'<p class="occupant">Held by {link}{holder}</a> ({mirrored.user})</p>' in page
    _, cells = live_row(admin_client.get("/fleet/").content.decode(), gpu.uuid)
    assert cells["status"] == "busy"
    assert cells["procs"] == f"{link}Slurm {CLUSTER}/{slurm_job}</a> {mirrored.user}"
    answer = admin_client.get(f"/api/v1/gpus/{gpu.uuid}/").json()["live"]
    assert {key: answer[key] for key in ("status", "job", "user", "held_by", "held_by_kind")} == {
        "status": "busy",
        "job": None,  # no gpuadmin job
        "user": mirrored.user,
        "held_by": holder,
        "held_by_kind": "slurm",
    }
    assert answer["unusable"] == f"it is held by {holder}"

    # A gpuadmin job asking for the whole node waits, and says why.
    job = submission.submit_job(admin_user, command=["sleep", "60"], gpu_count=8)
    loop.run_pass()
    job.refresh_from_db()
    assert (job.state, job.pending_code) == (JobState.QUEUED, "nodes_unavailable")
    assert f"node {NODE} has unavailable GPUs (held by {holder})" in job.pending_reason

    # The Slurm job ends: the next poll gives the GPUs back and wakes the loop.
    subprocess.run(["scancel", str(slurm_job)], env=slurm_cluster.env, check=True)
    broker.sent.clear()

    def released() -> bool:
        with django_capture_on_commit_callbacks(execute=True):
            services.poll(registered)
        return not gpus.exclude(held_outside="").exists()

    wait_for(released, WAIT_S, f"Slurm job {slurm_job} to release its GPUs")
    assert len(broker.named("scheduling.placement_pass")) == 1
    loop.run_pass()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert sorted(job.allocations.active().values_list("gpu_id", flat=True)) == [
        gpu.pk for gpu in gpus
    ]
