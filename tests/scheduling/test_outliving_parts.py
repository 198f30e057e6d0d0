"""No job's process outlives what gpuadmin decided about it: when one part of a multi-node
gang ends the job's attempt, the agents of its other nodes are told to stop theirs (as Slurm
kills a job's other steps when its batch step ends), and an agent that comes back running an
attempt gpuadmin ended, re-queued or placed elsewhere meanwhile is told to stop it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory.choices import NodeState
from inventory.models import Gpu, Node
from inventory.services import record_heartbeat
from scheduling import placement, tasks
from scheduling.agent.wire import FinalState, JobFinished
from scheduling.jobs import control, queries, reports, submission, transitions
from scheduling.loop import passes as loop
from scheduling.loop.preemption import preempt
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


def test_a_completed_part_ends_the_attempt_too_and_the_message_says_so(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    job = gang(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-01", FinalState.COMPLETED, 0, "", 1.0) is None
    said = "stopped: its part on dgx-01 ended (completed)"
    assert cancels(broker) == [((job.pk, 1, said), "node.dgx-02")]
    assert part_ended(job, "dgx-02", FinalState.CANCELED, -15, "canceled", 1.0) == (
        JobState.COMPLETED
    )
    job.refresh_from_db()
    assert (job.exit_code, job.ending) == (0, None)


def test_a_requeued_gangs_part_on_a_silent_node_is_not_waited_for_and_its_late_report_counts(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """dgx-02 is silent when the gang's part on dgx-01 fails (a retry): its part there can be
    neither signalled nor waited for (its GPUs are unschedulable while it is silent), so the
    gang is re-queued at once and may be placed again before that part's end arrives. That
    report, of an earlier attempt, adds its usage and changes nothing else."""
    add_sim_node("dgx-03")
    job = gang(alice, max_retries=1)
    assert hosts(job) == ["dgx-01", "dgx-02"]
    Node.objects.filter(hostname="dgx-02").update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    with django_capture_on_commit_callbacks(execute=True):
        reached = part_ended(job, "dgx-01", FinalState.FAILED, 2, "exited with code 2", 1.0)
    assert reached == JobState.QUEUED
    said = "stopped: its part on dgx-01 ended (exited with code 2)"
    assert cancels(broker) == [((job.pk, 1, said), "node.dgx-02")]  # when its agent is back
    loop.run_pass()
    job.refresh_from_db()
    assert (job.state, job.attempt, hosts(job)) == (JobState.SCHEDULED, 2, ["dgx-01", "dgx-03"])

    Node.objects.filter(hostname="dgx-02").update(last_heartbeat_at=timezone.now())
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
    assert ended is None  # its part on dgx-02 is still dying
    assert len(cancels(broker)) == 2
    with django_capture_on_commit_callbacks(execute=True):
        ended = part_ended(canceled, "dgx-02", FinalState.CANCELED, -15, "canceled by alice", 1)
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
    assert ended is None
    assert Allocation.objects.active().filter(job=preempted).count() == 16
    with django_capture_on_commit_callbacks(execute=True):
        ended = part_ended(preempted, "dgx-01", FinalState.CANCELED, -15, "canceled", 1.0)
    assert ended == JobState.QUEUED
    assert len(cancels(broker)) == 2
    preempted.refresh_from_db()
    assert (preempted.preemptions, preempted.exit_code) == (1, -15)


def test_a_gangs_part_lost_with_its_agent_stops_the_other_parts(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    job = gang(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.reconcile_node_jobs("dgx-02", set()) == []  # not over yet
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    said = "stopped: its part on dgx-02 ended (the agent of dgx-02 restarted and no longer runs it)"
    assert cancels(broker) == [((job.pk, 1, said), "node.dgx-01")]
    assert part_ended(job, "dgx-01", FinalState.CANCELED, -15, "canceled", 1.0) == JobState.FAILED
    job.refresh_from_db()
    assert job.message == "the agent of dgx-02 restarted and no longer runs it"


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
    """Its part on the silent node can be neither signalled nor waited for (the silent node's
    agent stops its own when it comes back); its parts that can be told are, and the job keeps
    its GPUs until they report their processes gone."""
    job = gang(alice)
    Node.objects.filter(hostname="dgx-02").update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(job, actor=alice, kill=True)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert Allocation.objects.active().filter(job=job).count() == 16
    assert cancels(broker) == [((job.pk, 1, "killed by alice", "SIGKILL", 0), "node.dgx-01")]
    with django_capture_on_commit_callbacks(execute=True):
        ended = part_ended(job, "dgx-01", FinalState.CANCELED, -9, "killed by alice", 1.0)
    assert ended == JobState.CANCELED
    assert not Allocation.objects.active().filter(job=job).exists()


def test_a_gang_whose_nodes_are_all_silent_is_canceled_at_once(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    job = gang(alice)
    Node.objects.update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(job, actor=alice)
    job.refresh_from_db()
    assert job.state == JobState.CANCELED
    assert not Allocation.objects.active().filter(job=job).exists()
    assert cancels(broker) == []


# ------------------------------------------------------- GPUs held until every part is gone


def gpus_of(job: Job, node: str) -> set[int]:
    """The GPUs the job holds on ``node`` now."""
    held = Allocation.objects.active().filter(job=job, node__hostname=node)
    return set(held.values_list("gpu_id", flat=True))


def placed_on(owner) -> Job:
    """A job for a whole node, after a placement pass."""
    job = submission.submit_job(owner, command=["true"], gpu_model=A100, gpu_count=8)
    loop.run_pass()
    job.refresh_from_db()
    return job


@pytest.mark.parametrize(
    ("outcome", "code", "why"),
    [
        (FinalState.FAILED, 1, "exited with code 1"),
        (FinalState.TIMED_OUT, -15, "ran past its maximum runtime of 60 s"),  # its time limit
    ],
)
def test_the_gpus_of_a_gangs_other_parts_are_held_until_their_agents_report_them_gone(
    alice, fleet, broker, django_capture_on_commit_callbacks, outcome, code, why
):
    """Part dgx-02 failed (or ran past its time limit): the job is stopping, its part on
    dgx-01 dies for up to the kill grace, and its GPUs there go to nobody else until dgx-01's
    agent says the part is gone. The job then ends as its part said, and its GPUs are free."""
    job = gang(alice, max_runtime_s=60)
    held = gpus_of(job, "dgx-01")
    with django_capture_on_commit_callbacks(execute=True):
        reached = part_ended(job, "dgx-02", outcome, code, why, 3.0)
    other = placed_on(alice)
    assert other.state == JobState.QUEUED  # no GPU of dgx-01's is free
    assert reached is None  # not over yet
    said = f"stopped: its part on dgx-02 ended ({why})"
    assert cancels(broker) == [((job.pk, 1, said), "node.dgx-01")]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert gpus_of(job, "dgx-01") == held
    stopping = AuditEvent.objects.get(event_type="job.stopping", target_id=str(job.pk))
    assert (stopping.actor_name, stopping.before, stopping.message) == (
        transitions.AGENT_ACTOR,
        {"state": JobState.RUNNING},
        said,
    )
    assert {**stopping.after, "finished_at": None} == {
        "state": JobState.FAILED,
        "exit_code": code,
        "failures": 1,
        "finished_at": None,
        "nodes": ["dgx-01"],
    }

    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-01", FinalState.CANCELED, -15, "canceled", 4.5) == (
            JobState.FAILED
        )
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.message) == (JobState.FAILED, code, why)
    assert job.cpu_seconds == 7.5
    assert not Allocation.objects.active().filter(job=job).exists()
    ended = AuditEvent.objects.get(event_type="job.failed", target_id=str(job.pk))
    assert ended.before == {"state": JobState.RUNNING}
    assert len(ended.after["released_gpus"]) == 16
    [run] = queries.job_attempts(job, job.allocations.select_related("node", "gpu"))
    assert (run.ended, run.exit_code, run.reason, run.ended_at) == (
        JobState.FAILED,
        code,
        why,
        ended.time,
    )
    assert len(cancels(broker)) == 1
    loop.run_pass()
    other.refresh_from_db()
    assert other.state == JobState.SCHEDULED


def test_a_stop_waits_for_no_node_gone_silent_past_the_heartbeat_grace(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """dgx-01's agent, told to stop the gang's part, goes silent before it reports: once past
    the heartbeat grace its GPUs are unschedulable and its agent stops the part when it comes
    back, so the job takes its end (the beat's sweep), its GPUs not held forever."""
    job = gang(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-02", FinalState.FAILED, 1, "exited with code 1", 3.0) is None
    assert reports.end_stops_on_silent_nodes() == []  # dgx-01 is heard from: its report counts
    job.refresh_from_db()
    assert job.state == JobState.RUNNING

    Node.objects.filter(hostname="dgx-01").update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.end_stops_on_silent_nodes() == [job.pk]
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.message) == (JobState.FAILED, 1, "exited with code 1")
    assert not Allocation.objects.active().filter(job=job).exists()
    ended = AuditEvent.objects.get(event_type="job.failed", target_id=str(job.pk))
    assert ended.actor_name == transitions.LOOP_ACTOR
    assert reports.end_stops_on_silent_nodes() == []


def test_a_gangs_preemption_waits_only_for_its_reachable_parts(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """A preempted gang with a silent node: its reachable parts are signalled and waited for,
    its GPUs held until they are gone; then it is re-queued (a preemption, no failure)."""
    job = gang(alice, preemptible=True)
    high = submission.submit_job(alice, command=["true"], gpu_model=A100, gpu_count=8)
    Node.objects.filter(hostname="dgx-02").update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    decision = placement.Preemption(
        job_id=high.pk, victims=(job.pk,), gpu_ids=(), reason="higher priority"
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert preempt(decision, signal="SIGTERM", grace_s=30) == [job.pk]
    said = f"preempted by job {high.pk}: higher priority"
    assert cancels(broker) == [((job.pk, 1, said, "SIGTERM", 30), "node.dgx-01")]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert Allocation.objects.active().filter(job=job).count() == 16
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-01", FinalState.CANCELED, -15, "canceled", 1.0) == (
            JobState.QUEUED
        )
    job.refresh_from_db()
    assert (job.preemptions, job.failures) == (1, 0)
    assert not Allocation.objects.active().filter(job=job).exists()


def test_a_gang_stopped_for_its_hardware_keeps_its_gpus_until_its_parts_are_gone(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """A health policy (or an admin's offline) stops the gang for a GPU of dgx-02: both parts
    are told to stop, and the job is re-queued once both agents reported them gone."""
    job = gang(alice)
    gpu = Gpu.objects.filter(node__hostname="dgx-02").order_by("index").first()
    assert gpu is not None
    with django_capture_on_commit_callbacks(execute=True):
        stopped = control.stop_jobs_on_gpus([gpu.pk], requeue=True, reason="XID 79 on dgx-02")
    assert stopped == [job.pk]
    assert sorted(queue for _, queue in cancels(broker)) == ["node.dgx-01", "node.dgx-02"]
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-02", FinalState.CANCELED, -15, "canceled", 1.0) is None
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert Allocation.objects.active().filter(job=job, attempt=1).count() == 16
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-01", FinalState.CANCELED, -15, "canceled", 1.0) == (
            JobState.QUEUED
        )
    job.refresh_from_db()
    assert (job.message, job.failures) == ("XID 79 on dgx-02", 0)
    assert len(cancels(broker)) == 2


def test_a_gang_stopped_for_a_lost_node_waits_only_for_its_reachable_parts(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    """dgx-02 went silent and a policy (or an admin) stops its jobs: the gang's part there
    can be neither signalled nor waited for; its part on dgx-01 is, and holds the GPUs until
    it is gone."""
    job = gang(alice)
    Node.objects.filter(hostname="dgx-02").update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    gpus = list(Gpu.objects.filter(node__hostname="dgx-02").values_list("pk", flat=True))
    with django_capture_on_commit_callbacks(execute=True):
        assert control.stop_jobs_on_gpus(gpus, requeue=True, reason="node dgx-02 lost") == [job.pk]
    assert cancels(broker) == [((job.pk, 1, "node dgx-02 lost"), "node.dgx-01")]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert job.ending["nodes"] == ["dgx-01"]
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-01", FinalState.CANCELED, -15, "canceled", 1.0) == (
            JobState.QUEUED
        )
    assert not Allocation.objects.active().filter(job=job).exists()


# ------------------------------------- agents heard from that never report the processes gone


def stop_began_ago(job: Job, seconds: float) -> None:
    """Time passes: ``job``'s stop (its cancel or preemption, or its decided end's ``since``) began
    ``seconds`` ago, while its nodes' agents kept heartbeating."""
    at = timezone.now() - timedelta(seconds=seconds)
    job.refresh_from_db()
    if job.ending is not None:
        Job.objects.filter(pk=job.pk).update(ending={**job.ending, "since": at.isoformat()})
    if job.cancel_requested_at is not None:
        Job.objects.filter(pk=job.pk).update(cancel_requested_at=at)
    if job.preempt_requested_at is not None:
        Job.objects.filter(pk=job.pk).update(preempt_requested_at=at)
    for node in Node.objects.all():
        assert record_heartbeat(node.hostname)


def overdue_s(settings) -> int:
    return settings.GPUADMIN_JOB_KILL_GRACE_S + settings.GPUADMIN_UNKILLABLE_TIMEOUT_S


def assert_drained_for(job: Job, hostname: str) -> None:
    """``hostname`` was drained for ``job``'s processes that never went, audited."""
    node = Node.objects.get(hostname=hostname)
    assert node.state == NodeState.DRAINING
    reason = reports.unkillable_reason(job.pk)
    assert reason.startswith(f"Kill task failed: the processes of job {job.pk} ")
    assert node.state_reason == reason
    drained = AuditEvent.objects.get(event_type="node.state_changed", target_id=str(node.pk))
    assert (drained.actor_name, drained.before, drained.after, drained.message) == (
        transitions.LOOP_ACTOR,
        {"state": NodeState.ONLINE},
        {"state": NodeState.DRAINING},
        reason,
    )


def test_a_canceled_job_whose_agent_never_reports_it_gone_drains_its_node_and_ends(
    alice, fleet, broker, settings, django_capture_on_commit_callbacks
):
    """Slurm's UnkillableStepTimeout: the agent of dgx-01 heartbeats but never reports the
    canceled job's processes gone (stuck in the driver after SIGKILL). Until the kill grace
    and ``GPUADMIN_UNKILLABLE_TIMEOUT_S`` have passed nothing happens; then dgx-01 is drained
    ("Kill task failed", audited) and the job is canceled, its GPUs released, and nothing new
    is placed on dgx-01 until an admin resumes it."""
    job = running(alice, gpu_count=8)
    [host] = hosts(job)
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(job, actor=alice)
    stop_began_ago(job, overdue_s(settings) - 5)
    assert reports.end_unkillable_stops() == []  # not overdue yet
    job.refresh_from_db()
    assert (job.state, Node.objects.get(hostname=host).state) == (
        JobState.RUNNING,
        NodeState.ONLINE,
    )

    stop_began_ago(job, overdue_s(settings) + 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.end_unkillable_stops() == [job.pk]
    assert_drained_for(job, host)
    job.refresh_from_db()
    assert job.state == JobState.CANCELED
    assert job.message == (
        f"canceled: its processes on {host} were not reported gone "
        f"{settings.GPUADMIN_UNKILLABLE_TIMEOUT_S} s after SIGKILL; node drained"
    )
    assert not Allocation.objects.active().filter(job=job).exists()
    canceled = AuditEvent.objects.get(event_type="job.canceled", target_id=str(job.pk))
    assert canceled.actor_name == transitions.LOOP_ACTOR
    assert len(canceled.after["released_gpus"]) == 8
    assert reports.end_unkillable_stops() == []  # once

    elsewhere, waits = placed_on(alice), placed_on(alice)
    assert hosts(elsewhere) != [host]
    assert waits.state == JobState.QUEUED  # dgx-01's GPUs are free, but it drains


@pytest.mark.parametrize("sweep", ["end_unkillable_stops", "beat's task"])
def test_a_gang_part_past_its_time_limit_that_never_goes_drains_only_that_node(
    alice, fleet, broker, settings, django_capture_on_commit_callbacks, sweep
):
    """Its part on dgx-02 ran past its time limit; dgx-01's agent, told to stop the other
    part, heartbeats but never reports it gone: past the timeout dgx-01 is drained and the
    job takes its decided end (failed, with dgx-02's exit code), its GPUs released; dgx-02,
    whose agent reported, stays online (beat's task runs it, after the silent-node sweep)."""

    def beat() -> None:
        if sweep == "beat's task":
            tasks.requeue_unconfirmed()
        else:
            reports.end_unkillable_stops()

    job = gang(alice, max_runtime_s=60)
    why = "ran past its maximum runtime of 60 s"
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-02", FinalState.TIMED_OUT, -15, why, 3.0) is None
    job.refresh_from_db()
    assert job.ending["nodes"] == ["dgx-01"]
    stop_began_ago(job, overdue_s(settings) - 5)
    beat()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING

    stop_began_ago(job, overdue_s(settings) + 1)
    with django_capture_on_commit_callbacks(execute=True):
        beat()
    assert_drained_for(job, "dgx-01")
    assert Node.objects.get(hostname="dgx-02").state == NodeState.ONLINE
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.message, job.ending) == (
        JobState.FAILED,
        -15,
        why,
        None,
    )
    assert not Allocation.objects.active().filter(job=job).exists()
    ended = AuditEvent.objects.get(event_type="job.failed", target_id=str(job.pk))
    assert (ended.actor_name, len(ended.after["released_gpus"])) == (transitions.LOOP_ACTOR, 16)
    assert hosts(placed_on(alice)) == ["dgx-02"]
    assert placed_on(alice).state == JobState.QUEUED


def test_a_preempted_job_is_given_its_pools_grace_before_its_node_is_drained(
    alice, fleet, broker, settings, django_capture_on_commit_callbacks
):
    """A preemption's signal comes with its pool's grace (time to checkpoint), longer here
    than the kill grace and the timeout together: its node is not drained while that grace
    runs, only the timeout after it; the job is then re-queued, as a preemption ends (no
    failure counted), and its node drained."""
    job = running(alice, gpu_count=8, preemptible=True)
    [host] = hosts(job)
    high = submission.submit_job(alice, command=["true"], gpu_model=A100, gpu_count=8)
    grace_s = overdue_s(settings) + 600
    decision = placement.Preemption(
        job_id=high.pk, victims=(job.pk,), gpu_ids=(), reason="higher priority"
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert preempt(decision, signal="SIGUSR1", grace_s=grace_s) == [job.pk]
    stop_began_ago(job, overdue_s(settings) + 30)  # past the kill grace's rule, not its own
    assert reports.end_unkillable_stops() == []
    assert Node.objects.get(hostname=host).state == NodeState.ONLINE

    stop_began_ago(job, grace_s + settings.GPUADMIN_UNKILLABLE_TIMEOUT_S + 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.end_unkillable_stops() == [job.pk]
    assert_drained_for(job, host)
    job.refresh_from_db()
    assert (job.state, job.preemptions, job.failures) == (JobState.QUEUED, 1, 0)
    assert not Allocation.objects.active().filter(job=job).exists()


def test_a_job_past_its_time_limit_whose_agent_never_reports_it_gone_drains_its_node(
    alice, fleet, broker, settings, django_capture_on_commit_callbacks
):
    """A single-node job's agent stops it at its time limit, by itself (nothing is recorded
    centrally), and never reports it gone: the time limit is the stop's start, and past the
    kill grace and the timeout its node is drained and the job ends as the agent's report of
    a time-out would end it (failed: no retries left), its GPUs released."""
    job = running(alice, gpu_count=8, max_runtime_s=60)
    [host] = hosts(job)

    def started_ago(seconds: float) -> None:
        at = timezone.now() - timedelta(seconds=seconds)
        Job.objects.filter(pk=job.pk).update(started_at=at)
        for node in Node.objects.all():
            assert record_heartbeat(node.hostname)

    started_ago(50)  # within its limit
    assert reports.end_unkillable_stops() == []
    started_ago(60 + overdue_s(settings) - 5)  # past it, its processes given their time
    assert reports.end_unkillable_stops() == []
    assert Node.objects.get(hostname=host).state == NodeState.ONLINE

    started_ago(60 + overdue_s(settings) + 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.end_unkillable_stops() == [job.pk]
    assert_drained_for(job, host)
    job.refresh_from_db()
    assert (job.state, job.message) == (JobState.FAILED, "ran past its maximum runtime of 60 s")
    assert job.finished_at is not None
    assert not Allocation.objects.active().filter(job=job).exists()


@pytest.mark.parametrize("stop", ["cancel", "preemption"])
def test_a_stop_asked_for_whose_node_goes_silent_ends_without_its_report(
    alice, fleet, broker, django_capture_on_commit_callbacks, stop
):
    """A cancel or a preemption is sent to dgx-01's agent, which goes silent past the
    heartbeat grace before reporting: no report will come, so beat's silent sweep ends the
    job as asked (canceled, or re-queued without a failure), its GPUs released, as a cancel
    of a job on a node already silent does; the node is not drained (it is not heard from)."""
    job = running(alice, gpu_count=8, preemptible=True)
    [host] = hosts(job)
    with django_capture_on_commit_callbacks(execute=True):
        if stop == "cancel":
            control.cancel_job(job, actor=alice)
        else:
            high = submission.submit_job(alice, command=["true"], gpu_model=A100, gpu_count=8)
            decision = placement.Preemption(
                job_id=high.pk, victims=(job.pk,), gpu_ids=(), reason="higher priority"
            )
            assert preempt(decision, signal="SIGTERM", grace_s=30) == [job.pk]
    assert reports.end_stops_on_silent_nodes() == []  # its agent is heard from: it waits
    Node.objects.filter(hostname=host).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert reports.end_stops_on_silent_nodes() == [job.pk]
    job.refresh_from_db()
    if stop == "cancel":
        assert (job.state, job.message) == (
            JobState.CANCELED,
            "canceled: its nodes went silent before reporting it gone",
        )
    else:
        assert (job.state, job.preemptions, job.failures) == (JobState.QUEUED, 1, 0)
    assert not Allocation.objects.active().filter(job=job).exists()
    assert Node.objects.get(hostname=host).state == NodeState.ONLINE


def test_a_report_that_comes_first_ends_the_job_and_drains_nothing(
    alice, fleet, broker, settings, django_capture_on_commit_callbacks
):
    """The agent's report arrives (late, but before beat acts): the job ends as it says, and
    no node is drained."""
    job = running(alice, gpu_count=8)
    [host] = hosts(job)
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(job, actor=alice)
    stop_began_ago(job, overdue_s(settings) + 30)
    assert part_ended(job, host, FinalState.CANCELED, -9, "canceled by alice", 1.0) == (
        JobState.CANCELED
    )
    assert reports.end_unkillable_stops() == []
    assert Node.objects.get(hostname=host).state == NodeState.ONLINE
    assert not AuditEvent.objects.filter(event_type="node.state_changed").exists()


def test_a_stop_waiting_for_a_silent_node_is_the_silent_sweeps_and_drains_nothing(
    alice, fleet, broker, settings, django_capture_on_commit_callbacks
):
    """dgx-01 went silent past the heartbeat grace while the gang's part there stopped: its
    agent can report nothing, so its stop is not overdue there but no longer waited for
    (``end_stops_on_silent_nodes``); no node is drained."""
    job = gang(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert part_ended(job, "dgx-02", FinalState.FAILED, 1, "exited with code 1", 3.0) is None
    stop_began_ago(job, overdue_s(settings) + 30)
    Node.objects.filter(hostname="dgx-01").update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    assert reports.end_unkillable_stops() == []
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    with django_capture_on_commit_callbacks(execute=True):
        tasks.requeue_unconfirmed()
    job.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.FAILED, 1)
    assert not Allocation.objects.active().filter(job=job).exists()
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.ONLINE}
    assert not AuditEvent.objects.filter(event_type="node.state_changed").exists()
