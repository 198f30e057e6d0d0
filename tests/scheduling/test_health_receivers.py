"""Scheduling's answer to failed hardware: the jobs holding GPUs that a health policy stops
(``health.signals.jobs_on_gpus_must_stop``) or that went offline
(``inventory.signals.gpus_went_offline``) are canceled on their agents and requeued (their next
placement is their next attempt) or failed, their GPUs released, audited, once."""

from __future__ import annotations

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from health.models import HealthEvent
from health.signals import jobs_on_gpus_must_stop
from inventory.choices import GpuState
from inventory.models import Gpu
from inventory.services import set_gpu_state
from scheduling.jobs import reports, submission
from scheduling.loop import passes as loop
from scheduling.models import Job, JobState
from tests.scheduling.conftest import add_sim_node, processes_gone

pytestmark = pytest.mark.django_db
REASON = "XID 95 (Uncontained memory error) on GPU 0 of dgx-01"


@pytest.fixture
def two_jobs(django_user_model, broker) -> tuple[Job, Job]:
    """Two running one-GPU jobs on dgx-01 (pids 100 and 200)."""
    add_sim_node("dgx-01")
    owner = django_user_model.objects.create_user("alice")
    placed = []
    for pid in (100, 200):
        job = submission.submit_job(owner, command=["sleep", "600"], gpu_count=1)
        loop.run_pass()
        job.refresh_from_db()
        reports.job_started(job.pk, job.attempt, pid, timezone.now())
        job.refresh_from_db()
        placed.append(job)
    return placed[0], placed[1]


def gpu_of(job: Job) -> Gpu:
    return job.allocations.get(released_at__isnull=True).gpu


def stop(gpus: list[Gpu], action: str, capture, event_id: int | None = None) -> None:
    with capture(execute=True):
        jobs_on_gpus_must_stop.send_robust(
            sender=HealthEvent,
            gpu_ids=[gpu.pk for gpu in gpus],
            action=action,
            reason=REASON,
            event_id=event_id,
        )


def test_a_requeue_cancels_releases_and_counts_the_attempt(
    two_jobs, broker, django_capture_on_commit_callbacks
):
    job, other = two_jobs
    gpu = gpu_of(job)
    stop([gpu], "requeue", django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING  # until its agent reports its process gone
    assert job.allocations.filter(released_at__isnull=True).exists()
    assert broker.named("scheduling.cancel_job") == [((job.pk, 1, REASON), "node.dgx-01")]
    row = AuditEvent.objects.get(event_type="job.stopping", target_id=str(job.pk))
    assert (row.actor_name, row.before, row.after, row.message) == (
        "health",
        {"state": "running"},
        {"state": "queued", "nodes": ["dgx-01"]},  # no failure counted
        REASON,
    )
    # Once more (a duplicate, or the GPU's offline signal after the policy's requeue): nothing.
    stop([gpu], "requeue", django_capture_on_commit_callbacks)
    assert AuditEvent.objects.filter(event_type="job.stopping", target_id=str(job.pk)).count() == 1
    assert len(broker.named("scheduling.cancel_job")) == 1

    with django_capture_on_commit_callbacks(execute=True):
        assert processes_gone(job) == JobState.QUEUED
    other.refresh_from_db()
    assert (job.state, job.message, job.pid, job.ending) == (JobState.QUEUED, REASON, None, None)
    assert other.state == JobState.RUNNING
    assert not job.allocations.filter(released_at__isnull=True).exists()
    assert broker.named("scheduling.placement_pass")  # the loop is woken
    row = AuditEvent.objects.get(event_type="job.queued", target_id=str(job.pk))
    assert (row.actor_name, row.before, row.message) == ("agent", {"state": "running"}, REASON)
    # Placed again: attempt 2; the agent's late end of attempt 1 changes nothing.
    set_gpu_state(gpu, GpuState.OFFLINE, actor_name="health", reason=REASON)
    loop.run_pass()
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.SCHEDULED, 2)
    assert reports.job_finished(job.pk, 1, "canceled", None, "", timezone.now()) is None
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED


def test_a_fail_ends_the_job_with_the_reason(two_jobs, broker, django_capture_on_commit_callbacks):
    job, _ = two_jobs
    stop([gpu_of(job)], "fail", django_capture_on_commit_callbacks)
    assert processes_gone(job) == JobState.FAILED
    assert (job.state, job.message) == (JobState.FAILED, REASON)
    assert job.finished_at is not None
    assert broker.named("scheduling.cancel_job") == [((job.pk, 1, REASON), "node.dgx-01")]


def test_the_events_pid_picks_its_job_among_the_gpus(
    two_jobs, broker, django_capture_on_commit_callbacks
):
    job, other = two_jobs
    gpus = [gpu_of(job), gpu_of(other)]
    event = HealthEvent.objects.create(
        node=gpus[0].node,
        gpu=gpus[1],
        kind="xid",
        xid=13,
        severity="warning",
        occurred_at=timezone.now(),
        dedupe_key="dgx-01:xid:13:pid",
        data={"xid": 13, "data": {"pid": 200}},
    )
    stop(gpus, "fail", django_capture_on_commit_callbacks, event_id=event.pk)
    assert processes_gone(other) == JobState.FAILED
    job.refresh_from_db()
    assert (job.state, job.ending) == (JobState.RUNNING, None)


def test_gpus_taken_offline_requeue_their_jobs(
    two_jobs, broker, django_capture_on_commit_callbacks, django_user_model
):
    job, other = two_jobs
    gpu = gpu_of(job)
    admin = django_user_model.objects.create_user("ops")
    with django_capture_on_commit_callbacks(execute=True):
        set_gpu_state(gpu, GpuState.OFFLINE, actor=admin, reason="reseating the card")
    assert processes_gone(job) == JobState.QUEUED
    other.refresh_from_db()
    assert (job.state, job.message) == (
        JobState.QUEUED,
        f"GPU {gpu.index} of dgx-01 went offline: reseating the card",
    )
    assert other.state == JobState.RUNNING
    assert broker.named("scheduling.cancel_job") == [((job.pk, 1, job.message), "node.dgx-01")]
