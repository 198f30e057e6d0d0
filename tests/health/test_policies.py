"""Recovery policies: a health report is stored once and acted on once by the most specific
enabled policy (the shipped defaults of migration 0002), through the GPU state machine, the job
services (on commit) and the alerts, every step audited and written to the event's outcome."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from health import alerts, policies, quarantine, resets, services
from health import tasks as health_tasks
from health.choices import AlertState, EventKind, QuarantineState
from health.models import Alert, BreakerTrip, HealthEvent, Quarantine, RecoveryPolicy
from health.wire import HealthReport
from inventory.choices import GpuState, NodeState
from inventory.models import Gpu, Node
from scheduling.jobs import reports as job_reports
from scheduling.jobs import submission
from scheduling.loop import passes as loop
from scheduling.models import Job, JobState
from tests.scheduling import conftest as scheduling_fixtures
from tests.scheduling import test_lock_order as lock_order
from tests.scheduling import test_node_reports as node_reports
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db
broker = scheduling_fixtures.broker  # records what is sent to agents and the loop
signed = node_reports.signed  # reports as an agent holding a node's credential sends them


def report(
    gpu: Gpu | None,
    kind: str = EventKind.XID,
    *,
    key: str = "1",
    xid: int | None = None,
    **data: Any,
) -> HealthReport:
    return HealthReport(
        kind=kind,
        key=f"{kind}:{gpu.uuid if gpu else '-'}:{xid}:{key}",
        occurred_at=timezone.now().timestamp(),
        gpu_index=gpu.index if gpu else None,
        gpu_uuid=gpu.uuid if gpu else None,
        xid=xid,
        message="agent text" if xid else "",
        data=data,
    )


@pytest.fixture
def receive(django_capture_on_commit_callbacks):
    """``receive(hostname, *reports)``: the central side's ``health.report`` for them, its
    commit's callbacks (scheduling's receivers, tasks sent) run."""

    def deliver(hostname: str, *reports: HealthReport) -> list[int]:
        with django_capture_on_commit_callbacks(execute=True):
            return services.receive_reports(hostname, list(reports))

    return deliver


@pytest.fixture
def alice(django_user_model) -> User:
    return django_user_model.objects.create_user("alice")


def running_job(owner: User, pid: int = 4242, **fields: Any) -> Job:
    """A one-GPU job the loop placed and its agent started."""
    job = submission.submit_job(owner, command=["sleep", "600"], gpu_count=1, **fields)
    start(job, pid)
    return job


def start(job: Job, pid: int = 4242) -> None:
    """The loop places the waiting ``job`` and its agent starts it."""
    loop.run_pass()
    job.refresh_from_db()
    job_reports.job_started(job.pk, job.attempt, pid, timezone.now())
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def job_stopped(job: Job) -> str | None:
    """The agent of the job a policy stopped reports its processes gone (the job keeps its
    GPUs until then): the state the job reached."""
    return scheduling_fixtures.processes_gone(job)


def gpu_of(job: Job) -> Gpu:
    return job.allocations.select_related("node").get(released_at__isnull=True).gpu


def audited(event_type: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(event_type=event_type).order_by("pk"))


def test_xid_13_fails_only_its_job(broker, receive, alice):
    add_sim_node("dgx-01")
    job, other = running_job(alice, pid=100), running_job(alice, pid=200)
    gpu = gpu_of(job)
    [event_id] = receive("dgx-01", report(gpu, xid=13, pid=100))
    assert job_stopped(job) == JobState.FAILED
    other.refresh_from_db()
    gpu.refresh_from_db()
    assert job.message == (
        f"XID 13 (Graphics Engine Exception) on GPU {gpu.index} of dgx-01: an application error"
    )
    assert other.state == JobState.RUNNING
    assert gpu.state == GpuState.AVAILABLE  # an application's fault: the GPU stays in service
    assert broker.named("scheduling.cancel_job") == [((job.pk, 1, job.message), "node.dgx-01")]
    event = HealthEvent.objects.get(pk=event_id)
    assert event.policy is not None and event.policy.xid == 13
    assert event.outcome == [
        "policy 'XID 13: graphics engine exception'",
        f"fail the job of pid 100 on GPU {gpu.index}",
    ]
    assert event.message == "agent text"  # the title says "XID 13 (Graphics Engine Exception)"
    [stopping] = audited("job.stopping")  # health decided; its agent reported it gone
    assert (stopping.actor_name, stopping.target_id) == ("health", str(job.pk))
    assert stopping.after["state"] == JobState.FAILED
    [failed] = audited("job.failed")
    assert (failed.actor_name, failed.target_id) == ("agent", str(job.pk))


def test_an_application_xid_counts_a_failed_run_against_the_jobs_retries(broker, receive, alice):
    """XID 13 with ``retries 2``: runs 1 and 2 are re-queued, as a non-zero exit would be, the
    third fails; each says what happened, each transition audited with the failures."""
    add_sim_node("dgx-01")
    job = running_job(alice, pid=100, max_retries=2)
    said = []
    for run in (1, 2, 3):
        gpu = gpu_of(job)
        receive("dgx-01", report(gpu, key=str(run), xid=13, pid=100))
        job_stopped(job)
        what = f"XID 13 (Graphics Engine Exception) on GPU {gpu.index} of dgx-01"
        said.append(f"{what}: an application error")
        if run < 3:
            assert (job.state, job.failures) == (JobState.QUEUED, run)
            assert job.message == f"retry {run}/2 after attempt {run} failed: {said[-1]}"
            start(job, pid=100)
    assert (job.state, job.failures, job.message) == (JobState.FAILED, 3, said[-1])
    rows = [
        (row.event_type, row.after["state"], row.after["failures"], row.actor_name)
        for row in AuditEvent.objects.filter(target_id=str(job.pk))
        .filter(event_type__in=("job.stopping", "job.queued", "job.failed"))
        .order_by("pk")
    ]
    assert rows == [
        ("job.stopping", "queued", 1, "health"),
        ("job.queued", "queued", 1, "agent"),
        ("job.stopping", "queued", 2, "health"),
        ("job.queued", "queued", 2, "agent"),
        ("job.stopping", "failed", 3, "health"),
        ("job.failed", "failed", 3, "agent"),
    ]
    assert [args[2] for args, _ in broker.named("scheduling.cancel_job")] == [
        f"retry 1/2 after attempt 1 failed: {said[0]}",
        f"retry 2/2 after attempt 2 failed: {said[1]}",
        said[2],
    ]


def test_xid_79_offlines_the_gpu_and_requeues_its_job(broker, receive, alice):
    add_sim_node("dgx-01")
    job = running_job(alice)
    gpu = gpu_of(job)
    [event_id] = receive("dgx-01", report(gpu, xid=79))
    gpu.refresh_from_db()
    assert job_stopped(job) == JobState.QUEUED
    assert gpu.state == GpuState.OFFLINE
    reason = f"XID 79 (GPU has fallen off the bus) on GPU {gpu.index} of dgx-01"
    assert gpu.state_reason == f"{reason}: agent text"
    assert (job.state, job.message, job.attempt) == (JobState.QUEUED, reason, 1)
    assert not job.allocations.filter(released_at__isnull=True).exists()
    assert broker.named("scheduling.cancel_job") == [((job.pk, 1, reason), "node.dgx-01")]
    event = HealthEvent.objects.get(pk=event_id)
    assert event.handled_at is not None and event.severity == "critical"
    assert f"GPU {gpu.index}: available -> offline (quarantined)" in event.outcome
    assert Alert.objects.get(event=event).state == AlertState.FIRING
    [changed] = audited("gpu.state_changed")
    assert (changed.actor_name, changed.after["state"]) == ("health", "offline")
    assert [row.actor_name for row in audited("job.stopping")] == ["health"]
    assert len(audited("health.event_handled")) == 1
    # The loop places it again, elsewhere: its second attempt.
    loop.run_pass()
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.SCHEDULED, 2)
    assert gpu_of(job) != gpu
    # The agent's late report of the first attempt's end changes nothing.
    assert job_reports.job_finished(job.pk, 1, "canceled", None, "", timezone.now()) is None
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.SCHEDULED, 2)


def test_a_duplicate_report_acts_once(broker, receive, alice):
    add_sim_node("dgx-01")
    job = running_job(alice)
    gpu = gpu_of(job)
    first = receive("dgx-01", report(gpu, xid=79))
    assert len(first) == 1
    assert receive("dgx-01", report(gpu, xid=79)) == []  # the agent resent it
    assert policies.handle(first[0]) == HealthEvent.objects.get(pk=first[0]).outcome  # a 2nd worker
    assert HealthEvent.objects.count() == 1
    assert len(audited("job.stopping")) == 1  # requeued once
    assert len(audited("health.event_handled")) == 1
    assert len(broker.named("scheduling.cancel_job")) == 1


def test_three_resets_in_a_day_take_the_gpu_offline(broker, receive, alice):
    node = add_sim_node("dgx-01")
    Node.objects.filter(pk=node.pk).update(nvml_backend="sim")
    gpu = Gpu.objects.get(node=node, index=2)
    for n in (1, 2):
        [event_id] = receive("dgx-01", report(gpu, key=str(n), xid=48))
        gpu.refresh_from_db()
        assert gpu.state == GpuState.RESETTING
        assert resets.finish_reset("dgx-01", gpu.uuid, None, event_id)
        back_after_probation(gpu)
        assert HealthEvent.objects.get(pk=event_id).outcome[-1] == "reset of GPU 2 of dgx-01 done"
    assert broker.named("health.reset_gpu") == [
        ((2, gpu.uuid, event_id - 1), "node.dgx-01"),
        ((2, gpu.uuid, event_id), "node.dgx-01"),
    ]
    [third] = receive("dgx-01", report(gpu, key="3", xid=48))
    gpu.refresh_from_db()
    assert gpu.state == GpuState.OFFLINE
    assert len(broker.named("health.reset_gpu")) == 2
    outcome = HealthEvent.objects.get(pk=third).outcome
    assert outcome[1].startswith("escalated: firing 3 on this GPU within 86400 s")


def back_after_probation(gpu: Gpu) -> None:
    """The reset ``gpu`` stays fenced until its probation (300 s) passed, then returns."""
    gpu.refresh_from_db()
    assert gpu.state == GpuState.DEGRADED
    now = timezone.now()
    assert list(quarantine.review(now).changed) == [QuarantineState.PROBATION]
    assert list(quarantine.review(now + timedelta(seconds=301)).changed) == [
        QuarantineState.RETURNED
    ]
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE


@pytest.mark.parametrize(
    ("kind", "xid"),
    [(EventKind.XID, 48), (EventKind.XID, 95), (EventKind.ECC_UNCORRECTED, None)],
)
def test_uncorrectable_memory_errors_wait_for_a_reset_before_probation(broker, receive, kind, xid):
    """Row remapping and page retirement take effect at a reset: without one (real hardware,
    resets off) the GPU stays fenced past any probation; a reset that succeeds starts it."""
    node = add_sim_node("dgx-01")
    Node.objects.filter(pk=node.pk).update(nvml_backend="real")
    gpu = Gpu.objects.get(node=node, index=0)
    receive("dgx-01", report(gpu, kind, key="1", xid=xid, count=2))
    held = Quarantine.objects.get(gpu=gpu, closed_at=None)
    assert held.reset_required and held.reset_at is None
    assert quarantine.review(timezone.now() + timedelta(hours=1)).changed == {}
    gpu.refresh_from_db()
    assert gpu.state == GpuState.DEGRADED
    what = f"XID {xid} needs" if xid else "Uncorrectable ECC errors:"
    assert quarantine.waiting_for(Quarantine.objects.get(pk=held.pk)).startswith(
        f"waits for a GPU reset before probation: {what}"
    )
    # On a node whose agent may reset it (simulated), the policy resets it.
    Node.objects.filter(pk=node.pk).update(nvml_backend="sim")
    other = Gpu.objects.get(node=node, index=1)
    [event_id] = receive("dgx-01", report(other, kind, key="2", xid=xid, count=2))
    other.refresh_from_db()
    assert other.state == GpuState.RESETTING
    assert broker.named("health.reset_gpu") == [((1, other.uuid, event_id), "node.dgx-01")]
    assert quarantine.review(timezone.now() + timedelta(hours=1)).changed == {}
    assert resets.finish_reset("dgx-01", other.uuid, None, event_id)
    assert Quarantine.objects.get(gpu=other).reset_at is not None
    back_after_probation(other)


def test_no_reset_while_the_circuit_breaker_is_open(broker, receive):
    """A reset takes a GPU out of service like a fence: none while automatic fencing is off."""
    node = add_sim_node("dgx-01")
    Node.objects.filter(pk=node.pk).update(nvml_backend="sim")
    BreakerTrip.objects.create(falling=9, fleet=10)
    gpu = Gpu.objects.get(node=node, index=0)
    [event_id] = receive("dgx-01", report(gpu, xid=48))
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE
    assert broker.named("health.reset_gpu") == []
    assert HealthEvent.objects.get(pk=event_id).outcome[-1] == (
        "GPU 0 not reset: the circuit breaker is open"
    )


def test_a_failed_reset_leaves_the_gpu_degraded(broker, receive):
    node = add_sim_node("dgx-01")
    Node.objects.filter(pk=node.pk).update(nvml_backend="sim")
    gpu = Gpu.objects.get(node=node, index=0)
    [event_id] = receive("dgx-01", report(gpu, xid=95))
    assert resets.finish_reset("dgx-01", gpu.uuid, "processes still run on it (pids 7)", event_id)
    gpu.refresh_from_db()
    assert gpu.state == GpuState.DEGRADED
    assert gpu.state_reason.endswith("failed: processes still run on it (pids 7)")
    assert quarantine.review(timezone.now() + timedelta(hours=1)).changed == {}  # a person's


def test_no_reset_of_real_hardware_by_default(broker, receive, settings):
    node = add_sim_node("dgx-01")
    Node.objects.filter(pk=node.pk).update(nvml_backend="real")
    gpu = Gpu.objects.get(node=node, index=0)
    [event_id] = receive("dgx-01", report(gpu, xid=48))
    gpu.refresh_from_db()
    assert gpu.state == GpuState.DEGRADED
    assert broker.named("health.reset_gpu") == []
    assert "not allowed (GPUADMIN_GPU_RESET" in HealthEvent.objects.get(pk=event_id).outcome[-2]
    settings.GPUADMIN_GPU_RESET = "on"
    other = Gpu.objects.get(node=node, index=1)
    receive("dgx-01", report(other, xid=48))
    other.refresh_from_db()
    assert other.state == GpuState.RESETTING


def test_an_unknown_xid_is_stored_and_alerted(broker, receive):
    node = add_sim_node("dgx-01")
    gpu = Gpu.objects.get(node=node, index=5)
    [event_id] = receive("dgx-01", report(gpu, xid=999))
    event = HealthEvent.objects.get(pk=event_id)
    assert event.message == "agent text"
    assert event.title == "XID 999 (not in NVIDIA's XID catalog)"
    assert event.data["xid"] == 999 and event.data["data"] == {}
    assert event.policy is not None and event.policy.resolution == policies.UNKNOWN_XID
    alert = Alert.objects.get(event=event)
    assert alert.state == AlertState.FIRING and alert.gpu == gpu
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE


def test_an_xid_without_its_own_policy_takes_its_buckets(broker, receive):
    node = add_sim_node("dgx-01")
    Node.objects.filter(pk=node.pk).update(nvml_backend="sim")
    gpu = Gpu.objects.get(node=node, index=1)
    [event_id] = receive("dgx-01", report(gpu, xid=119))  # GSP RPC timeout: RESET_GPU
    assert HealthEvent.objects.get(pk=event_id).policy.resolution == "RESET_GPU"  # type: ignore[union-attr]
    gpu.refresh_from_db()
    assert gpu.state == GpuState.RESETTING


def policy_form(policy: RecoveryPolicy, **changes: Any) -> dict[str, Any]:
    """What the admin's change form posts for ``policy``, with ``changes``."""
    data: dict[str, Any] = {
        field: "" if getattr(policy, field) is None else getattr(policy, field)
        for field in (*policies.POLICY_FIELDS, "description")
    }
    data.update(changes)
    for flag in ("enabled", "node_wide"):  # an unchecked box is not posted
        if not data[flag]:
            del data[flag]
    return data


@pytest.fixture
def admin_client_of(django_user_model) -> Client:
    root = django_user_model.objects.create_superuser("root", password="x")
    client = Client()
    client.force_login(root)
    return client


def test_a_policy_edited_in_the_admin_changes_the_outcome(broker, receive, alice, admin_client_of):
    add_sim_node("dgx-01")
    policy = RecoveryPolicy.objects.get(kind=EventKind.XID, xid=13)
    url = f"/admin/health/recoverypolicy/{policy.pk}/change/"
    response = admin_client_of.post(url, policy_form(policy, actions=["alert"]))
    assert response.status_code == 302, response.content.decode()[:3000]
    [changed] = audited("health.policy_changed")
    assert (changed.before["actions"], changed.after["actions"]) == (["fail_job"], ["alert"])
    assert changed.actor_name == "root"
    job = running_job(alice)
    [event_id] = receive("dgx-01", report(gpu_of(job), xid=13))
    job.refresh_from_db()
    assert job.state == JobState.RUNNING  # alerted, no longer failed
    assert Alert.objects.filter(event_id=event_id, state=AlertState.FIRING).exists()


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"xid": 999}, "xid", "not in NVIDIA's XID catalog"),
        ({"xid": "", "resolution": "REBOOT_PLEASE"}, "resolution", "not a resolution bucket"),
        ({"actions": ["explode"]}, "actions", "not one of the available choices"),
        ({"threshold": 5}, "threshold", "Only these kinds take a threshold"),
        ({"escalate_to": "alert"}, "escalate_to", "Escalate to fencing the GPU"),
    ],
)
def test_the_admin_refuses_a_policy_the_catalog_does_not_support(
    admin_client_of, changes, field, words
):
    policy = RecoveryPolicy.objects.get(kind=EventKind.XID, xid=13)
    url = f"/admin/health/recoverypolicy/{policy.pk}/change/"
    response = admin_client_of.post(url, policy_form(policy, **changes))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert words in " ".join(errors[field]), errors
    assert audited("health.policy_changed") == []


def test_a_report_from_another_nodes_credential_is_ignored(signed):
    add_sim_node("dgx-01")
    add_sim_node("dgx-02")
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=0)
    args = ("dgx-01", [report(gpu, xid=79).to_dict()])
    node_reports.deliver(
        health_tasks.report,
        signed(node_reports.token_of("dgx-02"), "dgx-02", "health.report", args),
    )
    assert HealthEvent.objects.count() == 0
    assert node_reports.refusals() == ["node 'dgx-02' reported for node 'dgx-01'"]
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE
    node_reports.deliver(
        health_tasks.report,
        signed(node_reports.token_of("dgx-01"), "dgx-01", "health.report", args),
    )
    assert HealthEvent.objects.get().kind == EventKind.XID


def test_a_silent_node_makes_one_event_per_episode(broker, django_capture_on_commit_callbacks):
    node = add_sim_node("dgx-01")
    heard = timezone.now() - timedelta(minutes=2)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=heard)
    with django_capture_on_commit_callbacks(execute=True):
        [event_id] = services.watch_heartbeats()
        assert services.watch_heartbeats() == []  # the same silence
    event = HealthEvent.objects.get(pk=event_id)
    assert (event.kind, event.gpu, event.severity) == (EventKind.HEARTBEAT_LOST, None, "critical")
    assert event.summary().startswith("Heartbeat lost on node dgx-01: last heartbeat")
    assert Alert.objects.get(event=event).node == node
    assert Gpu.objects.filter(node=node).exclude(state=GpuState.AVAILABLE).count() == 0
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=heard + timedelta(seconds=30))
    assert len(services.watch_heartbeats()) == 1  # heard from, then silent again
    Node.objects.filter(pk=node.pk).update(
        state=NodeState.OFFLINE, last_heartbeat_at=heard + timedelta(seconds=45)
    )
    assert services.watch_heartbeats() == []  # an offline node is expected to be silent


def test_correctable_ecc_degrades_only_above_the_rate(broker, receive):
    node = add_sim_node("dgx-01")
    gpu = Gpu.objects.get(node=node, index=3)
    kind = EventKind.ECC_CORRECTED
    [first] = receive("dgx-01", report(gpu, kind, key="a", delta=60))
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE
    assert HealthEvent.objects.get(pk=first).outcome[-1] == (
        "60 correctable ECC errors in the last hour: not above 100"
    )
    receive("dgx-01", report(gpu, kind, key="b", delta=50))
    gpu.refresh_from_db()
    assert gpu.state == GpuState.DEGRADED


def test_a_hot_gpu_takes_no_new_work(broker, receive):
    node = add_sim_node("dgx-01")
    gpu = Gpu.objects.get(node=node, index=4)
    receive("dgx-01", report(gpu, EventKind.THERMAL, key="m1", temperature_c=85))
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE
    RecoveryPolicy.objects.filter(kind=EventKind.THERMAL).update(threshold=80)  # settable
    receive("dgx-01", report(gpu, EventKind.THERMAL, key="m2", temperature_c=85))
    gpu.refresh_from_db()
    assert gpu.state == GpuState.DEGRADED
    assert not Gpu.objects.schedulable().filter(pk=gpu.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_policy_and_a_rule_opening_one_events_alert_at_once_do_not_deadlock():
    """A rule pass opens an event's alert (its row names the event: a foreign key PostgreSQL
    checks at commit) while the event's policy, holding the event, opens the alert of the same
    fingerprint and waits for the pass. Had the policy locked the event FOR UPDATE, the pass's
    commit would wait for the policy: each waits for the other and PostgreSQL aborts one."""
    add_sim_node("dgx-01")
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=3)
    event = HealthEvent.objects.create(
        node=gpu.node,
        gpu=gpu,
        kind=EventKind.XID,
        xid=79,
        severity="critical",
        occurred_at=timezone.now(),
        dedupe_key="xid-79-once",
    )
    outcome: dict[str, object] = {}
    with transaction.atomic():
        alerts.open_alert(  # the rule pass's alert, not committed yet
            fingerprint=alerts.event_fingerprint(event),
            severity="critical",
            summary=event.summary(),
            gpu=gpu,
            event=event,
        )
        policy = lock_order.run(outcome, "policy", lambda: policies.handle(event.pk))
        lock_order.wait_for_waiters(1)  # the policy holds the event and waits for the pass's alert
    policy.join(timeout=30)
    assert not isinstance(outcome["policy"], Exception), outcome["policy"]
    assert Alert.objects.filter(state=AlertState.FIRING).count() == 1
