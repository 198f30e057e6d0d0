"""Faults end to end through real processes: a central worker and beat, a simulated DGX
A100 80GB node's agent, and faults injected into its simulator the way `gpuadmin sim inject`
does. Each fault class must produce its recovery policy's effect (the GPU's state, its jobs,
an alert, audit rows) within the issue's 5 seconds, and the GPU must come back when the fault
clears."""

from __future__ import annotations

import importlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.contrib.auth import get_user_model

from gpuadmin.audit.models import AuditEvent
from health.choices import AlertState, EventKind, QuarantineState
from health.models import Alert, BreakerTrip, HealthEvent, Quarantine, RecoveryPolicy
from inventory.choices import GpuState
from inventory.models import Gpu, Node
from inventory.nvml.sim import faults
from scheduling.jobs import submission
from scheduling.models import Allocation, Job, JobState
from tests.integration.stack import worker_and_agent
from tests.unix_accounts import runs_as_this_account
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# The bound from a fault to its policy's effect.
WITHIN_S = 5.0


class Fleet:
    """One test's node, the simulator state its agent reads, and the processes by verb."""

    def __init__(self, hostname: str, sim_dir: Path, processes: dict[str, subprocess.Popen]):
        self.hostname, self.sim_dir, self.processes = hostname, sim_dir, processes

    def gpu(self, index: int) -> Gpu:
        return Gpu.objects.get(node__hostname=self.hostname, index=index)

    def state(self, index: int) -> str:
        return self.gpu(index).state


@pytest.fixture
def shipped_defaults() -> None:
    """The recovery policies and alert rules gpuadmin ships are rows its data migrations
    write; an earlier transactional test's flush took them away: write them again."""
    for migration, function in (
        ("0002_default_policies", "add_policies"),
        ("0003_default_alert_rules", "add_rules"),
        ("0006_reset_before_probation", "require_resets"),
    ):
        module = importlib.import_module(f"health.migrations.{migration}")
        getattr(module, function)(django_apps, None)


@pytest.fixture
def fleet(shipped_defaults, gpuadmin_env, tmp_path, request) -> Iterator[Fleet]:
    """A central worker, beat (every periodic task each second) and one simulated node's
    agent sampling every second; a test's indirect parameter overrides settings."""
    sim_dir = Path(gpuadmin_env["GPUADMIN_DATA_DIR"]) / "sim"  # the agent's simulator state
    settings = {
        "GPUADMIN_HEARTBEAT_GRACE_S": "4",
        "GPUADMIN_ALERT_INTERVAL_S": "1",
        "GPUADMIN_QUARANTINE_REVIEW_S": "1",
        "GPUADMIN_PLACEMENT_INTERVAL_S": "2",
        "GPUADMIN_JOB_KILL_GRACE_S": "1",
        "GPUADMIN_BREAKER_MIN_GPUS": "100",
        "GPUADMIN_FLAP_LIMIT": "100",
        **getattr(request, "param", {}),
    }
    hostname = f"faults-{uuid.uuid4().hex[:6]}"
    agent_args = ("--sim", "dgx-a100-80gb")
    with worker_and_agent(
        gpuadmin_env, hostname, agent_args, 8, tmp_path, beat=True, **settings
    ) as processes:
        yield Fleet(hostname, sim_dir, processes)


def audited_by_health(gpu: Gpu) -> list[dict]:
    return list(
        AuditEvent.objects.filter(
            event_type="gpu.state_changed", target_id=gpu.uuid, actor_name="health"
        ).values("before", "after", "message")
    )


def firing(gpu: Gpu) -> bool:
    return Alert.objects.filter(gpu=gpu, state=AlertState.FIRING).exists()


def test_each_fault_class_has_its_policy_effect_within_5_s(fleet):
    owner = get_user_model().objects.create_user("erin")
    runs_as_this_account(owner)

    # A GPU that falls off the bus under a running job: offline and unschedulable, the job
    # requeued (its second attempt goes elsewhere), an alert open, audit rows: within 5 s.
    job = submission.submit_job(owner, command="sleep 600", gpu_count=1, name="lost-gpu")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 60, "the job to run")
    lost = Gpu.objects.get(allocations__job=job)
    faults.fall_off_bus(fleet.sim_dir, fleet.hostname, lost.index)
    took = sum(
        wait_for(condition, 30, what)
        for condition, what in (
            (lambda: fleet.state(lost.index) == GpuState.OFFLINE, "the lost GPU to go offline"),
            (lambda: Job.objects.get(pk=job.pk).attempt == 2, "its job to be requeued"),
            (lambda: firing(lost), "an alert on the lost GPU"),
        )
    )
    assert took < WITHIN_S, f"the lost GPU's policy took {took:.1f} s"
    assert not Gpu.objects.schedulable().filter(pk=lost.pk).exists()
    assert audited_by_health(lost)[0]["after"] == {"state": GpuState.OFFLINE}
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 60, "the second attempt")
    assert Allocation.objects.get(job=job, released_at=None).gpu != lost

    # XID 13 (an application's fault) fails that job only; its GPU stays in service.
    other = submission.submit_job(owner, command="sleep 600", gpu_count=1, name="bystander")
    faulty = submission.submit_job(owner, command="sleep 600", gpu_count=1, name="xid-13")
    for each in (other, faulty):
        wait_for(lambda: Job.objects.get(pk=each.pk).state == JobState.RUNNING, 60, "to run")  # noqa: B023
    xid_gpu = Gpu.objects.get(allocations__job=faulty)
    faults.inject_xid(fleet.sim_dir, fleet.hostname, xid_gpu.index, 13)
    took = wait_for(
        lambda: Job.objects.get(pk=faulty.pk).state == JobState.FAILED, 30, "XID 13 -> job failed"
    )
    assert took < WITHIN_S
    assert Job.objects.get(pk=other.pk).state == JobState.RUNNING
    assert fleet.state(xid_gpu.index) == GpuState.AVAILABLE
    assert HealthEvent.objects.filter(gpu=xid_gpu, xid=13).count() == 1

    # An uncorrectable ECC burst on an idle GPU fences it.
    busy = set(Allocation.objects.filter(released_at=None).values_list("gpu__index", flat=True))
    idle = [index for index in range(8) if index not in busy and index != lost.index]
    ecc, corrected, hot = idle[:3]
    faults.set_ecc(fleet.sim_dir, fleet.hostname, ecc, count=4, error="uncorrected")
    took = wait_for(
        lambda: fleet.state(ecc) != GpuState.AVAILABLE, 30, "uncorrectable ECC -> fenced"
    )
    assert took < WITHIN_S
    assert Quarantine.objects.filter(gpu=fleet.gpu(ecc), closed_at=None).exists()

    # Correctable ECC: a burst under the policy's rate (per hour) is only recorded; bursts
    # over it fence the GPU.
    rate = RecoveryPolicy.objects.get(kind=EventKind.ECC_CORRECTED, enabled=True).threshold
    assert rate
    below = int(rate // 2)
    faults.set_ecc(fleet.sim_dir, fleet.hostname, corrected, count=below, error="corrected")
    wait_for(
        lambda: HealthEvent.objects.filter(
            gpu=fleet.gpu(corrected), kind=EventKind.ECC_CORRECTED
        ).exists(),
        30,
        "the first correctable burst to be recorded",
    )
    time.sleep(1)
    assert fleet.state(corrected) == GpuState.AVAILABLE
    faults.set_ecc(fleet.sim_dir, fleet.hostname, corrected, count=int(rate) + 1, error="corrected")
    took = wait_for(
        lambda: fleet.state(corrected) == GpuState.DEGRADED, 30, "correctable bursts -> degraded"
    )
    assert took < WITHIN_S

    # A thermal ramp stops new work on that GPU until it cools, then probation returns it.
    thermal = RecoveryPolicy.objects.filter(kind=EventKind.THERMAL, enabled=True)
    thermal.update(probation_s=2)
    limit = thermal.exclude(threshold=None).get().threshold
    assert limit
    faults.set_temperature(fleet.sim_dir, fleet.hostname, hot, int(limit) + 5)
    took = wait_for(lambda: fleet.state(hot) == GpuState.DEGRADED, 30, "hot -> degraded")
    assert took < WITHIN_S
    faults.set_temperature(fleet.sim_dir, fleet.hostname, hot, None)
    wait_for(lambda: fleet.state(hot) == GpuState.AVAILABLE, 60, "cooled -> back in service")
    assert Quarantine.objects.get(gpu=fleet.gpu(hot)).state == QuarantineState.RETURNED

    # A lost agent: its node's heartbeats stop; an event and a node alert open.
    fleet.processes["agent"].kill()
    fleet.processes["agent"].wait()
    node = Node.objects.get(hostname=fleet.hostname)
    wait_for(
        lambda: (
            HealthEvent.objects.filter(node=node, kind=EventKind.HEARTBEAT_LOST).exists()
            and Alert.objects.filter(node=node, gpu=None, state=AlertState.FIRING).exists()
        ),
        30,
        "heartbeat lost -> event and alert",
    )


@pytest.mark.parametrize(
    "fleet",
    [{"GPUADMIN_BREAKER_MIN_GPUS": "3", "GPUADMIN_BREAKER_WINDOW_S": "300"}],
    indirect=True,
)
def test_the_circuit_breaker_stops_fencing_when_too_many_gpus_fall_at_once(fleet):
    for index in range(5):
        faults.set_ecc(fleet.sim_dir, fleet.hostname, index, count=2, error="uncorrected")
    wait_for(lambda: BreakerTrip.objects.filter(reset_at=None).exists(), 30, "the breaker to trip")
    time.sleep(2)
    fenced = Gpu.objects.filter(node__hostname=fleet.hostname).exclude(state=GpuState.AVAILABLE)
    assert fenced.count() <= 3
    events = HealthEvent.objects.filter(kind=EventKind.ECC_UNCORRECTED)
    assert events.count() == 5  # recorded all the same
    assert Alert.objects.filter(state=AlertState.FIRING, severity="critical").exists()


@pytest.mark.parametrize("fleet", [{"GPUADMIN_FLAP_LIMIT": "3"}], indirect=True)
def test_a_flapping_gpu_is_held_back(fleet):
    RecoveryPolicy.objects.filter(kind=EventKind.ECC_UNCORRECTED).update(probation_s=1)
    gpu = fleet.gpu(2)
    for count in (1, 2, 3):
        faults.set_ecc(fleet.sim_dir, fleet.hostname, 2, count=count, error="uncorrected")
        wait_for(lambda: fleet.state(2) != GpuState.AVAILABLE, 30, f"fault {count} to fence")  # noqa: B023
        if count < 3:
            wait_for(lambda: fleet.state(2) == GpuState.AVAILABLE, 60, f"return {count}")
    time.sleep(4)
    held = Quarantine.objects.get(gpu=gpu, closed_at=None)
    assert held.state == QuarantineState.HELD
    assert fleet.state(2) != GpuState.AVAILABLE
