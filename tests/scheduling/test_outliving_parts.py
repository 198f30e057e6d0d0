"""No job's process outlives what gpuadmin decided about it: when one part of a multi-node
gang ends the job's attempt, the agents of its other nodes are told to stop theirs (as Slurm
kills a job's other steps when its batch step ends), and an agent that comes back running an
attempt gpuadmin ended, re-queued or placed elsewhere meanwhile is told to stop it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node
from scheduling.agent.wire import FinalState, JobFinished
from scheduling.jobs import control, reports, submission, transitions
from scheduling.loop import passes as loop
from scheduling.models import Allocation, Job, JobState
from tests.scheduling.conftest import RecordingBroker, add_sim_node

pytestmark = pytest.mark.django_db

A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def fleet(broker) -> list[Node]:
    return [add_sim_node("dgx-01"), add_sim_node("dgx-02")]


def running(owner, **fields) -> Job:
    """Placed, and started on each of its nodes."""
    job = submission.submit_job(owner, command=["sleep", "900"], gpu_model=A100, **fields)
    loop.run_pass()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert reports.job_started(job.pk, job.attempt, 4242, timezone.now())
    job.refresh_from_db()
    return job


def hosts(job: Job) -> list[str]:
    """The nodes of the job's current attempt."""
    placed = job.allocations.filter(attempt=job.attempt).values_list("node__hostname", flat=True)
    return sorted(set(placed))


def gang(owner, **fields) -> Job:
    job = running(owner, gpu_count=8, node_count=2, **fields)
    assert hosts(job) == ["dgx-01", "dgx-02"]
    return job


def part_ended(
    job: Job, node: str, state: FinalState, code: int | None, message: str, cpu: float, *,
    attempt: int = 1,
) -> str | None:  # fmt: skip
    """``node``'s agent reports its part of the job's attempt ended (with its usage)."""
    ended = JobFinished(f"{job.pk}.{attempt}", state, code, timezone.now(), message, cpu, 2**20)
    return reports.job_events([ended], sender=node).reached.get(job.pk)


def cancels(broker: RecordingBroker) -> list[tuple[tuple, str | None]]:
    return broker.named("scheduling.cancel_job")


def test_a_gangs_part_that_ends_its_attempt_stops_the_other_parts(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    job = gang(alice)
    with django_capture_on_commit_callbacks(execute=True):
        reached = part_ended(job, "dgx-02", FinalState.FAILED, 1, "exited with code 1", 3.0)
    assert reached == JobState.FAILED
    said = "stopped: its part on dgx-02 ended (exited with code 1)"
    assert cancels(broker) == [((job.pk, 1, said), "node.dgx-01")]
    assert not Allocation.objects.active().filter(job=job).exists()

    # The stopped part's end is stale for the job's state, but its usage counts; nobody else
    # is told anything.
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-01", FinalState.CANCELED, -15, "canceled", 4.5) is None
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.message) == (JobState.FAILED, 1, "exited with code 1")
    assert job.cpu_seconds == 7.5
    assert len(cancels(broker)) == 1


def test_a_completed_part_ends_the_attempt_too_and_the_message_says_so(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    job = gang(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-01", FinalState.COMPLETED, 0, "", 1.0) == JobState.COMPLETED
    said = "stopped: its part on dgx-01 ended (completed)"
    assert cancels(broker) == [((job.pk, 1, said), "node.dgx-02")]


def test_a_requeued_gangs_other_part_is_stopped_and_its_late_report_still_counts(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """Re-queued (a retry), the gang may be placed again before its stopped part's end
    arrives: that report, of an earlier attempt, adds its usage and changes nothing else."""
    job = gang(alice, max_retries=1)
    with django_capture_on_commit_callbacks(execute=True):
        reached = part_ended(job, "dgx-01", FinalState.FAILED, 2, "exited with code 2", 1.0)
    assert reached == JobState.QUEUED
    said = "stopped: its part on dgx-01 ended (exited with code 2)"
    assert cancels(broker) == [((job.pk, 1, said), "node.dgx-02")]
    loop.run_pass()
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.SCHEDULED, 2)

    assert part_ended(job, "dgx-02", FinalState.CANCELED, -15, "canceled", 2.5) is None
    assert part_ended(job, "dgx-02", FinalState.CANCELED, -15, "canceled", 2.5) is None  # again
    job.refresh_from_db()
    assert (job.state, job.attempt, job.cpu_seconds) == (JobState.SCHEDULED, 2, 3.5)
    assert Allocation.objects.active().filter(job=job, attempt=2).count() == 16
    parts = AuditEvent.objects.filter(event_type="job.part_usage", target_id=str(job.pk))
    assert sorted(parts.values_list("after__node", "after__attempt")) == [
        ("dgx-01", 1),
        ("dgx-02", 1),
    ]


def test_a_gang_whose_stop_was_already_sent_to_every_node_gets_no_second_one(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """A cancel asked for, or a preemption, told every node of the attempt already."""
    canceled = gang(alice)
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(canceled, actor=alice)
    assert sorted(str(queue) for _, queue in cancels(broker)) == ["node.dgx-01", "node.dgx-02"]
    with django_capture_on_commit_callbacks(execute=True):
        ended = part_ended(canceled, "dgx-01", FinalState.CANCELED, -15, "canceled by alice", 1)
    assert ended == JobState.CANCELED
    assert len(cancels(broker)) == 2

    canceled.refresh_from_db()
    assert canceled.state == JobState.CANCELED  # its GPUs are free for the next one
    preempted = gang(alice, preemptible=True)
    Job.objects.filter(pk=preempted.pk).update(
        preempted_by=canceled, preempt_requested_at=timezone.now()
    )
    with django_capture_on_commit_callbacks(execute=True):
        ended = part_ended(preempted, "dgx-02", FinalState.CANCELED, -15, "canceled", 1.0)
    assert ended == JobState.QUEUED
    assert len(cancels(broker)) == 2


def test_a_gangs_part_lost_with_its_agent_stops_the_other_parts(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    job = gang(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.reconcile_node_jobs("dgx-02", set()) == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    said = "stopped: its part on dgx-02 ended (the agent of dgx-02 restarted and no longer runs it)"
    assert cancels(broker) == [((job.pk, 1, said), "node.dgx-01")]


def test_a_single_node_jobs_end_tells_nobody(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    job = running(alice, gpu_count=2)
    with django_capture_on_commit_callbacks(execute=True):
        part_ended(job, hosts(job)[0], FinalState.FAILED, 1, "", 1.0)
    assert cancels(broker) == []


# --------------------------------------------------------------------------- agent restarts


def test_an_agent_back_with_an_attempt_gpuadmin_requeued_is_told_to_stop_it(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """dgx-01 went silent: its job was re-queued, no cancel could reach it. Its agent comes
    back with the job's process re-adopted: that attempt is stopped there, audited."""
    job = running(alice, gpu_count=2)
    [host] = hosts(job)
    node = Node.objects.get(hostname=host)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    gpus = list(Gpu.objects.filter(node=node).values_list("pk", flat=True))
    with django_capture_on_commit_callbacks(execute=True):
        control.stop_jobs_on_gpus(gpus, requeue=True, reason=f"requeued: node {host} lost")
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert cancels(broker) == []  # nothing reaches a silent node

    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.reconcile_node_jobs(host, {(job.pk, 1)}) == []
    said = (
        f"gpuadmin ended this attempt while the agent of {host} was away: "
        f"the job is queued: requeued: node {host} lost"
    )
    assert cancels(broker) == [((job.pk, 1, said), f"node.{host}")]
    audited = AuditEvent.objects.get(event_type="job.stray_canceled", target_id=str(job.pk))
    assert (audited.actor_name, audited.after, audited.message) == (
        transitions.AGENT_ACTOR,
        {"attempt": 1, "node": host},
        said,
    )
    job.refresh_from_db()
    assert job.state == JobState.QUEUED  # the stray's end will be stale


def test_an_agent_is_left_alone_with_what_gpuadmin_still_places_there(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """Its own running and scheduled attempts stay; an attempt of a job since re-queued and
    placed again (there or elsewhere), and an unknown job, are stopped."""
    runs = running(alice, gpu_count=2)
    [host] = hosts(runs)
    moved = running(alice, gpu_count=2, max_retries=1)
    assert part_ended(moved, hosts(moved)[0], FinalState.LOST, None, "", 0)
    loop.run_pass()
    moved.refresh_from_db()
    assert (moved.state, moved.attempt) == (JobState.SCHEDULED, 2)
    with django_capture_on_commit_callbacks(execute=True):
        reports.reconcile_node_jobs(host, {(runs.pk, 1), (moved.pk, 1), (999_999, 3)})
    stopped = sorted((args[:2], queue) for args, queue in cancels(broker))
    assert stopped == [((moved.pk, 1), f"node.{host}"), ((999_999, 3), f"node.{host}")]
    said = {args[0]: args[2] for args, _ in cancels(broker)}
    assert said[moved.pk].endswith(f"the job is scheduled (attempt 2): {moved.message}")
    assert said[999_999].endswith("was away: the job no longer exists")

    broker.sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.reconcile_node_jobs(host, {(runs.pk, 1)}) == []
    assert cancels(broker) == []
    assert AuditEvent.objects.filter(event_type="job.stray_canceled").count() == 2


def test_a_gang_canceled_with_a_silent_node_stops_its_parts_on_the_others(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """Its part on the silent node cannot be signalled: the job ends at once, and its parts
    that can be told are (the silent node's agent stops its own when it comes back)."""
    job = gang(alice)
    Node.objects.filter(hostname="dgx-02").update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(job, actor=alice, kill=True)
    job.refresh_from_db()
    assert job.state == JobState.CANCELED
    assert not Allocation.objects.active().filter(job=job).exists()
    assert cancels(broker) == [((job.pk, 1, "killed by alice", "SIGKILL", 0), "node.dgx-01")]
