"""XIDs on a MIG GPU: an error the driver attributes to one GPU instance (NVML's gpuInstanceId,
the kernel line's "GPU-I:05") and that NVIDIA's catalog says is contained (XID 94) touches only
that instance's jobs, and the GPU is not fenced or reset as a whole; an uncontained one (XID 95)
acts on the whole GPU as before. The instance travels from the agent's report into the event."""

from __future__ import annotations

import pytest

from health import policies, xids
from health.models import HealthEvent
from health.wire import HealthReport
from inventory.choices import GpuState
from inventory.models import Gpu
from inventory.nvml.parsers import parse_xid_line
from scheduling.jobs import submission
from scheduling.models import Job, JobState
from tests.health import test_policies
from tests.health.test_policies import gpu_of, job_stopped, report, start
from tests.nvml.captures import OWN
from tests.scheduling import conftest as scheduling_fixtures
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db
broker = scheduling_fixtures.broker
receive = test_policies.receive  # the central side's health.report, its commit's callbacks run
alice = test_policies.alice

# NVIDIA's example of a contained error on a MIG GPU (tests/nvml/captures/xid__nvidia-a100-*).
CONTAINED_LINE = (
    (OWN / "xid__nvidia-a100-mem-error-mgmt__xid94-95-mig-gpu-i.log").read_text().splitlines()[0]
)


def mig_jobs(owner, count: int = 2) -> list[Job]:
    """Running 1g.5gb jobs: the simulated DGX A100's GPU 1 has seven 1g.5gb instances."""
    jobs = []
    for pid in range(100, 100 + count):
        job = submission.submit_job(owner, command=["sleep", "600"], mig_profile="1g.5gb")
        start(job, pid)
        jobs.append(job)
    return jobs


def instance_of(job: Job) -> int:
    allocation = job.allocations.select_related("mig_instance").get(released_at__isnull=True)
    return allocation.mig_instance.gi_id


def test_only_94_of_the_catalog_is_contained():
    assert [info.xid for info in xids.all_xids() if info.contained] == [94]


def test_a_contained_94_requeues_only_its_instances_job(broker, receive, alice):
    add_sim_node("dgx-01", "dgx-a100-40gb")
    hit, spared = mig_jobs(alice)
    gpu = gpu_of(hit)
    assert gpu == gpu_of(spared) and instance_of(hit) != instance_of(spared)
    gi = instance_of(hit)
    line = parse_xid_line(CONTAINED_LINE)
    assert line is not None and (line.xid, line.gpu_instance_id) == (94, 5)
    # As the agent reports an NVML XID event (no pid: NVML's event carries none).
    [event_id] = receive("dgx-01", report(gpu, xid=94, gpu_instance_id=gi, compute_instance_id=0))

    assert job_stopped(hit) == JobState.QUEUED  # its GPUs held until its agent reported
    spared.refresh_from_db()
    gpu.refresh_from_db()
    event = HealthEvent.objects.get(pk=event_id)
    assert event.gpu_instance_id == gi
    assert (spared.state, spared.ending) == (JobState.RUNNING, None)  # not even stopping
    assert gpu.state == GpuState.AVAILABLE  # the shipped policy drains: not the whole GPU here
    assert hit.message == (
        f"XID 94 (Contained memory error) on GPU instance {gi} of GPU {gpu.index} of dgx-01"
    )
    assert event.outcome == [
        "policy 'XID 94: contained memory error'",
        f"requeue the jobs on GPU instance {gi} of GPU {gpu.index}",
        f"drain_gpu: not done to GPU {gpu.index}, the error was contained to its GPU instance {gi}",
    ]


def test_a_contained_error_never_fences_the_whole_gpu(broker, receive, alice):
    add_sim_node("dgx-01", "dgx-a100-40gb")
    hit, spared = mig_jobs(alice)
    gpu, gi = gpu_of(hit), instance_of(hit)
    policy = policies.select_policy("xid", 94)
    assert policy is not None
    policy.actions = ["requeue_job", "degrade_gpu", "reset_gpu"]
    policy.save()

    [event_id] = receive("dgx-01", report(gpu, xid=94, gpu_instance_id=gi))

    gpu.refresh_from_db()
    spared.refresh_from_db()
    assert (gpu.state, spared.state) == (GpuState.AVAILABLE, JobState.RUNNING)
    steps = HealthEvent.objects.get(pk=event_id).outcome
    assert steps[2:] == [
        f"degrade_gpu: not done to GPU {gpu.index}, the error was contained to its "
        f"GPU instance {gi}",
        f"reset_gpu: not done to GPU {gpu.index}, the error was contained to its GPU instance {gi}",
    ]


def test_an_uncontained_95_on_an_instance_acts_on_the_whole_gpu(broker, receive, alice):
    add_sim_node("dgx-01", "dgx-a100-40gb")
    hit, other = mig_jobs(alice)
    gpu = gpu_of(hit)

    [event_id] = receive("dgx-01", report(gpu, xid=95, gpu_instance_id=instance_of(hit)))

    assert (job_stopped(hit), job_stopped(other)) == (JobState.QUEUED, JobState.QUEUED)
    gpu.refresh_from_db()
    assert gpu.state == GpuState.DEGRADED  # fenced for a reset an admin does (simulator)
    assert HealthEvent.objects.get(pk=event_id).outcome[1] == (
        f"requeue the jobs on GPU {gpu.index}"
    )


def test_a_94_without_an_instance_requeues_the_gpus_jobs_as_before(broker, receive, alice):
    add_sim_node("dgx-01", "dgx-a100-40gb")
    first, second = mig_jobs(alice)

    receive("dgx-01", report(gpu_of(first), xid=94))

    assert {job_stopped(first), job_stopped(second)} == {JobState.QUEUED}


def test_the_instance_of_a_non_xid_report_is_not_kept(receive):
    add_sim_node("dgx-01", "dgx-a100-40gb")
    gpu = Gpu.objects.get(index=1)
    ecc = HealthReport(kind="ecc_uncorrected", key="e1", occurred_at=0.0, gpu_uuid=gpu.uuid,
                       data={"gpu_instance_id": 3, "delta": 1})  # fmt: skip
    [event_id] = receive("dgx-01", ecc)
    assert HealthEvent.objects.get(pk=event_id).gpu_instance_id is None
