"""Jobs from submission to their end: validation, the state machine, the placement loop over
the database, allocations the database guards, and what agents report."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from psycopg.errors import UniqueViolation

from gpuadmin.audit.models import AuditEvent
from inventory.choices import GpuState, NodeState
from inventory.models import Gpu, Node
from scheduling.agent.wire import ExecutorEvent, FinalState, JobFinished, JobSpec, JobStarted
from scheduling.allocations import services as allocation_services
from scheduling.jobs import control, limits, reports, shape, submission, transitions
from scheduling.loop import passes as loop
from scheduling.models import Allocation, Job, JobState, Quota, SchedulerSettings
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def fleet(broker) -> list[Node]:
    return [add_sim_node("dgx-01"), add_sim_node("dgx-02"), add_sim_node("h100-01", "dgx-h100")]


def submit(owner, **fields) -> Job:
    return submission.submit_job(owner, command=fields.pop("command", ["sleep", "1"]), **fields)


def events(job: Job) -> list[str]:
    return list(
        AuditEvent.objects.filter(target_type="scheduling.job", target_id=str(job.pk))
        .order_by("pk")
        .values_list("event_type", flat=True)
    )


# --------------------------------------------------------------------------- submission


def test_submission_is_queued_and_audited(alice, fleet):
    job = submit(alice, command="python train.py --lr '0.1 0.2'", gpu_count=2, name="t")
    assert job.state == JobState.QUEUED
    assert job.command == ["python", "train.py", "--lr", "0.1 0.2"]  # split, never a shell
    shell = submit(alice, command="echo $HOME; ls", use_shell=True)
    assert shell.command == ["echo $HOME; ls"]
    held = submit(alice, hold=True)
    assert held.state == JobState.PENDING
    assert events(job) == ["job.submitted"]
    assert AuditEvent.objects.get(event_type="job.submitted", target_id=str(job.pk)).after == {
        "state": "queued",
        "gpu_count": 2,
        "node_count": 1,
        "priority": "normal",
    }


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"gpu_count": 9}, "gpu_count", "9 GPUs per node, but no node has more than 8 GPUs"),
        (
            {"gpu_model": "NVIDIA B300"},
            "gpu_model",
            "no GPU model 'NVIDIA B300'; the fleet has: NVIDIA A100-SXM4-80GB, NVIDIA H100",
        ),
        (
            {"gpu_model": "NVIDIA H100 80GB HBM3", "node_count": 2, "gpu_count": 8},
            "node_count",
            "2 nodes with 8 GPUs each, but only 1 node has that many",
        ),
        (
            {"min_gpu_memory_mib": 200_000},
            "min_gpu_memory_mib",
            "195.3 GiB per GPU, but the largest GPU has 80 GiB",
        ),
        (
            {"max_runtime_s": 10**9},
            "max_runtime_s",
            "Ensure this value is less than or equal to 7776000",
        ),
        ({"gpu_count": 65}, "gpu_count", "Ensure this value is less than or equal to 64."),
        ({"command": ["x"] * 4097}, "command", "at most 4096 arguments"),
        ({"command": ""}, "command", "empty command"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env", "CUDA_VISIBLE_DEVICES is reserved"),
        (
            {"gpu_count": 8, "topology": "numa"},
            "topology",
            "needs 8 GPUs in one NUMA node; the largest NUMA node has 4",
        ),
        (
            {"gpu_count": 3, "topology": "numa", "gpu_model": "NVIDIA A100-SXM4-80GB"},
            "topology",
            "needs 3 NVIDIA A100-SXM4-80GB GPUs in one NUMA node; the largest NUMA node has 2",
        ),
        ({"topology": "ring"}, "topology", "must be one of any, numa, nvlink, node"),
        (
            {"gpu_count": 4, "node_count": 2, "topology": "numa"},
            "topology",
            "needs 2 nodes with 4 GPUs in one NUMA node each; the fleet has 1 such nodes",
        ),
    ],
)
def test_impossible_requests_are_refused_naming_the_field(alice, fleet, fields, field, message):
    with pytest.raises(limits.JobRejected) as caught:
        submit(alice, **fields)
    assert caught.value.field == field
    assert caught.value.message.startswith(message), caught.value.message
    assert not Job.objects.exists()


def test_what_the_fleet_could_never_run_is_read_from_the_catalog_not_the_state(alice, fleet):
    """Drained, fenced and offline hardware still counts: only what no node has is refused."""
    add_sim_node("pcie-01", "pcie-l40s-4x")
    Node.objects.filter(hostname="h100-01").update(state=NodeState.DRAINING)
    Gpu.objects.filter(node__hostname="h100-01", index__lt=2).update(state=GpuState.DEGRADED)
    Gpu.objects.filter(node__hostname="dgx-01").update(state=GpuState.OFFLINE)
    shape.FleetShape.forget()

    assert submit(alice, gpu_count=4, topology="numa").topology == "numa"  # h100-01's halves
    assert submit(alice, gpu_count=8, topology="nvlink").state == JobState.QUEUED
    with pytest.raises(limits.JobRejected) as caught:
        submit(alice, gpu_count=2, topology="nvlink", gpu_model="NVIDIA L40S")
    assert (caught.value.field, caught.value.message) == (
        "topology",
        "needs 2 NVIDIA L40S GPUs in one NVLink domain; no matching GPU has NVLink",
    )
    # The same count anywhere on the node is fine.
    assert submit(alice, gpu_count=2, topology="node", gpu_model="NVIDIA L40S").gpu_count == 2


def test_a_queued_job_the_shrunk_fleet_can_never_run_says_so_not_quota(alice, fleet):
    """Queued when the fleet had two A100 nodes; one is gone (its GPUs missing) and alice is
    at her quota: the job's reason is that it can never run, not the quota."""
    gang = submit(alice, gpu_count=8, node_count=2, gpu_model="NVIDIA A100-SXM4-80GB")
    Quota.objects.create(user=alice, max_gpus=8)
    Gpu.objects.filter(node__hostname="dgx-02").update(missing_since=timezone.now())

    loop.run_pass()

    gang.refresh_from_db()
    assert (gang.state, gang.pending_code) == (JobState.QUEUED, "too_large")
    assert gang.pending_reason == (
        "needs 2 nodes with 8 NVIDIA A100-SXM4-80GB GPUs each; the fleet has 1"
    )


# --------------------------------------------------------------------------- state machine


def test_illegal_transitions_are_refused_and_nothing_is_written(alice, fleet):
    job = submit(alice)
    with pytest.raises(transitions.IllegalTransition, match="cannot go from queued to running"):
        transitions.transition(job, JobState.RUNNING, actor=alice)
    transitions.transition(job, JobState.CANCELED, actor=alice, message="no longer needed")
    job.refresh_from_db()
    assert (job.state, job.message) == (JobState.CANCELED, "no longer needed")
    assert job.finished_at is not None
    with pytest.raises(transitions.IllegalTransition):
        transitions.transition(job, JobState.QUEUED, actor=alice)
    assert events(job) == ["job.submitted", "job.canceled"]


# --------------------------------------------------------------------------- placement loop


def test_a_pass_places_with_the_best_topology_and_dispatches_to_the_agent(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    pair = submit(alice, gpu_count=2)
    four = submit(alice, gpu_count=4, topology="nvlink")
    with django_capture_on_commit_callbacks(execute=True):
        summary = loop.run_pass()
    assert (summary.placed, summary.waiting) == (2, 0)
    pair.refresh_from_db()
    four.refresh_from_db()
    assert pair.state == four.state == JobState.SCHEDULED
    gpus = Gpu.objects.filter(allocations__job=pair, allocations__released_at__isnull=True)
    assert gpus.count() == 2
    assert len({gpu.numa_node for gpu in gpus}) == 1  # a same-NUMA pair
    assert pair.placement["topology_class"] in ("nvlink", "numa")
    # best fit: both land on the same node, keeping the others whole
    nodes = {host for job in (pair, four) for host in job.placement["nodes"]}
    assert len(nodes) == 1
    (sent, queue), _ = broker.job_specs()  # in one message to their node
    assert queue == f"node.{next(iter(pair.placement['nodes']))}"
    spec = JobSpec.from_dict(sent)
    assert spec.job_id == f"{pair.pk}.1"  # attempt 1
    assert sorted(spec.gpu_uuids) == sorted(gpus.values_list("uuid", flat=True))
    assert events(pair) == ["job.submitted", "job.scheduled"]
    assert AuditEvent.objects.filter(event_type="allocation.created").count() == 6


def test_a_job_that_cannot_run_says_why(alice, fleet):
    Node.objects.filter(hostname="h100-01").update(state=NodeState.DRAINING)
    h100 = submit(alice, gpu_model="NVIDIA H100 80GB HBM3")
    whole = [submit(alice, gpu_count=8) for _ in range(2)]
    third = submit(alice, gpu_count=8)
    loop.run_pass()
    h100.refresh_from_db()
    third.refresh_from_db()
    assert h100.state == JobState.QUEUED
    assert h100.pending_code == "nodes_unavailable"
    assert "h100-01 is draining" in h100.pending_reason
    assert h100.queue_position == 1
    assert third.pending_code == "resources_busy"
    assert third.queue_position == 2
    assert all(Job.objects.get(pk=job.pk).state == JobState.SCHEDULED for job in whole)


def test_estimated_start_comes_from_running_jobs(alice, fleet, broker):
    a100 = "NVIDIA A100-SXM4-80GB"
    for _ in range(2):
        submit(alice, gpu_count=8, gpu_model=a100, estimated_duration_s=600)
    loop.run_pass()
    waiting = submit(alice, gpu_count=8, gpu_model=a100)
    loop.run_pass()
    waiting.refresh_from_db()
    assert waiting.state == JobState.QUEUED
    expected = timezone.now() + timedelta(seconds=600)
    assert abs((waiting.estimated_start_at - expected).total_seconds()) < 30


def test_the_stopped_scheduler_places_nothing(alice, fleet):
    SchedulerSettings.objects.update_or_create(pk=1, defaults={"enabled": False})
    job = submit(alice)
    assert loop.run_pass().skipped == "the scheduler is stopped"
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


# --------------------------------------------------------------------------- integrity


def test_one_gpus_allocations_never_overlap_in_time_whatever_the_hosts_clocks(
    alice, fleet, monkeypatch
):
    """Allocation starts and ends are the database's statement times: a worker whose clock is
    an hour behind, allocating a GPU just released, still starts after the release."""
    first, second = submit(alice), submit(alice)
    gpu = Gpu.objects.filter(node__hostname="dgx-01").order_by("index").first()
    allocation_services.allocate(first, [gpu.pk], actor=alice)
    transitions.transition(first, JobState.CANCELED, actor=alice)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() - timedelta(hours=1))
    allocation_services.allocate(second, [gpu.pk], actor=alice)
    ended, started = Allocation.objects.filter(gpu=gpu).order_by("pk")
    assert ended.released_at < started.allocated_at
    assert started.allocated_at > real_now() - timedelta(minutes=1)


def test_the_database_refuses_a_gpu_given_twice(alice, fleet):
    first, second = submit(alice), submit(alice)
    gpu = Gpu.objects.filter(node__hostname="dgx-01").order_by("index").first()
    allocation_services.allocate(first, [gpu.pk], actor=alice)
    with pytest.raises(allocation_services.AllocationRefused):
        allocation_services.allocate(second, [gpu.pk], actor=alice)
    second.refresh_from_db()
    assert second.state == JobState.QUEUED
    assert second.allocations.count() == 0
    # Even raw SQL that skips every Python check is refused, by the partial unique index (a
    # complete row: a missing column's NOT NULL would refuse it first and prove nothing).
    raw = (
        "INSERT INTO scheduling_allocation (job_id, gpu_id, node_id, attempt, manual, kind,"
        " device_uuid) VALUES (%s, %s, %s, 1, true, 'gpu', %s)"
    )
    with (
        pytest.raises(IntegrityError) as refused,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(raw, [second.pk, gpu.pk, gpu.node_id, gpu.uuid])
    assert isinstance(refused.value.__cause__, UniqueViolation), refused.value


def test_a_gang_is_all_or_nothing(alice, fleet):
    other = submit(alice, gpu_count=8, gpu_model="NVIDIA A100-SXM4-80GB")
    loop.run_pass()
    gang = submit(alice, gpu_count=8, node_count=2, gpu_model="NVIDIA A100-SXM4-80GB")
    loop.run_pass()
    gang.refresh_from_db()
    assert gang.state == JobState.QUEUED
    assert gang.allocations.count() == 0
    assert gang.pending_code == "resources_busy"
    transitions.transition(other, JobState.CANCELED, actor=alice)
    loop.run_pass()
    gang.refresh_from_db()
    assert gang.state == JobState.SCHEDULED
    assert set(gang.placement["nodes"]) == {"dgx-01", "dgx-02"}
    assert gang.allocations.active().count() == 16


# --------------------------------------------------------------------------- agent reports


def place(owner, **fields) -> Job:
    job = submit(owner, **fields)
    loop.run_pass()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    return job


def test_started_then_completed_releases_the_gpus(alice, fleet):
    job = place(alice, gpu_count=2)
    now = timezone.now()
    assert reports.job_started(job.pk, 1, 4242, now)
    assert reports.job_finished(job.pk, 1, "completed", 0, "", now) == JobState.COMPLETED
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.pid) == (JobState.COMPLETED, 0, None)
    assert not Allocation.objects.active().filter(job=job).exists()
    assert events(job) == ["job.submitted", "job.scheduled", "job.running", "job.completed"]
    completed = AuditEvent.objects.get(event_type="job.completed", target_id=str(job.pk))
    assert len(completed.after["released_gpus"]) == 2


MEMORY_KILL = "stopped: it used more than its 64 MiB of host memory"


def test_an_end_records_the_runs_cpu_time_and_peak_memory_from_its_cgroup(alice, fleet):
    job = place(alice, host_memory_mib=64)
    ended = JobFinished(
        f"{job.pk}.1", FinalState.FAILED, -9, timezone.now(), MEMORY_KILL, 83.25, 67_108_864
    )
    assert reports.job_events([ended]).reached == {job.pk: JobState.FAILED}
    job.refresh_from_db()
    assert (job.cpu_seconds, job.max_memory_bytes, job.message) == (83.25, 2**26, MEMORY_KILL)
    failed = AuditEvent.objects.get(event_type="job.failed", target_id=str(job.pk))
    assert (failed.after["cpu_seconds"], failed.after["max_memory_bytes"]) == (83.25, 2**26)


def test_a_jobs_usage_adds_up_its_runs_retried_and_preempted_ones_too(alice, fleet):
    """sacct counts what every run used: a retried run's CPU time is not lost to the next."""
    job = place(alice, max_retries=1, preemptible=True)
    first = JobFinished(f"{job.pk}.1", FinalState.FAILED, 1, timezone.now(), "", 30.0, 2**20)
    assert reports.job_events([first]).reached == {job.pk: JobState.QUEUED}
    loop.run_pass()
    job.refresh_from_db()
    second = JobFinished(f"{job.pk}.2", FinalState.COMPLETED, 0, timezone.now(), "", 12.5, 2**10)
    reports.job_events([second])
    job.refresh_from_db()
    assert (job.state, job.cpu_seconds, job.max_memory_bytes) == ("completed", 42.5, 2**20)


def test_a_gangs_usage_adds_up_its_nodes_parts_each_counted_once(alice, fleet):
    """Each node of a multi-node gang reports its part: CPU seconds summed, the largest peak
    memory kept; the first part ends the job's attempt, the last one's end the job (its GPUs
    held until then), a repeated report counts nothing."""
    gang = place(alice, gpu_count=8, node_count=2, gpu_model="NVIDIA A100-SXM4-80GB")
    gang.cpu_seconds, gang.max_memory_bytes = 999.0, 200  # a previous run's: added to
    gang.save(update_fields=["cpu_seconds", "max_memory_bytes"])
    now = timezone.now()

    def part(cpu: float, memory: int) -> JobFinished:
        return JobFinished(f"{gang.pk}.1", FinalState.COMPLETED, 0, now, "", cpu, memory)

    assert reports.job_events([part(10.5, 300)], sender="dgx-01").reached == {}
    assert reports.job_events([part(4.5, 200)], sender="dgx-02").reached == {
        gang.pk: JobState.COMPLETED
    }
    reports.job_events([part(4.5, 200)], sender="dgx-02")  # delivered twice
    reports.job_events([part(10.5, 300)], sender="dgx-01")
    gang.refresh_from_db()
    assert (gang.state, gang.cpu_seconds, gang.max_memory_bytes) == ("completed", 1014.0, 300)
    parts = AuditEvent.objects.filter(event_type="job.part_usage", target_id=str(gang.pk))
    assert sorted(parts.values_list("after__node", "after__cpu_seconds")) == [
        ("dgx-01", 10.5),
        ("dgx-02", 4.5),
    ]


def test_a_batch_of_agent_events_is_recorded_in_order_in_a_fixed_number_of_statements(
    alice, fleet, django_assert_max_num_queries
):
    """An agent's batch: each job's start and end, in the order they happened, each
    transition audited and each end's GPUs released, a failure re-queued while retries are
    left and a stale report ignored; the statements do not grow with the batch."""
    now = timezone.now()

    def lifecycles(jobs: list[Job], outcome: str = "completed") -> list[ExecutorEvent]:
        started = [JobStarted(f"{job.pk}.1", 100 + job.pk, now) for job in jobs]
        ended = [JobFinished(f"{job.pk}.1", FinalState(outcome), 0, now) for job in jobs]
        return [*started, *ended]

    one = place(alice)
    with django_assert_max_num_queries(99) as single:
        assert reports.job_events(lifecycles([one])).reached == {one.pk: JobState.COMPLETED}
    jobs = [place(alice, gpu_count=2) for _ in range(6)]
    retried = place(alice, max_retries=1)
    batch = [
        *lifecycles(jobs),
        *lifecycles([retried], "failed"),
        JobStarted(f"{one.pk}.1", 1, now),  # stale: it ended already
    ]
    with django_assert_max_num_queries(len(single.captured_queries)):
        reached = reports.job_events(batch).reached
    assert reached == {**dict.fromkeys((j.pk for j in jobs), "completed"), retried.pk: "queued"}
    for job in [one, *jobs]:
        assert events(job)[-2:] == ["job.running", "job.completed"]
        job.refresh_from_db()
        assert (job.state, job.pid, job.exit_code) == (JobState.COMPLETED, None, 0)
    assert not Allocation.objects.active().filter(job__in=[one, *jobs]).exists()
    completed = AuditEvent.objects.get(event_type="job.completed", target_id=str(jobs[0].pk))
    assert len(completed.after["released_gpus"]) == 2
    retried.refresh_from_db()
    assert (retried.state, retried.pid) == (JobState.QUEUED, None)
    assert retried.message.startswith("retry 1/1 after attempt 1 failed")
    assert events(retried)[-2:] == ["job.running", "job.queued"]


def test_failures_retry_until_max_retries_then_fail(alice, fleet):
    job = place(alice, max_retries=1)
    now = timezone.now()
    reports.job_started(job.pk, 1, 100, now)
    assert reports.job_finished(job.pk, 1, "failed", 3, "", now) == JobState.QUEUED
    job.refresh_from_db()
    assert job.message.startswith("retry 1/1 after attempt 1 failed: exit code 3")
    loop.run_pass()
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.SCHEDULED, 2)
    # A late report about attempt 1 changes nothing.
    assert reports.job_finished(job.pk, 1, "failed", 3, "", now) is None
    reports.job_started(job.pk, 2, 101, now)
    assert reports.job_finished(job.pk, 2, "timed_out", -15, "", now) == JobState.FAILED


def test_an_agent_that_restarted_without_a_job_fails_it(alice, fleet):
    job = place(alice)
    reports.job_started(job.pk, 1, 100, timezone.now())
    host = next(iter(job.placement["nodes"]))
    assert reports.reconcile_node_jobs(host, {(job.pk, 1)}) == []
    assert reports.reconcile_node_jobs(host, set()) == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "restarted and no longer runs it" in job.message


def test_cancel_of_a_running_job_waits_for_the_agent(
    alice, fleet, broker, django_capture_on_commit_callbacks
):
    job = place(alice)
    reports.job_started(job.pk, 1, 100, timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        control.cancel_job(job, actor=alice)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING  # keeps its GPUs until its processes are gone
    ((args, queue),) = broker.named("scheduling.cancel_job")
    assert args == (job.pk, 1, "canceled by alice")
    reports.job_finished(job.pk, 1, "canceled", -15, "canceled by alice", timezone.now())
    job.refresh_from_db()
    assert job.state == JobState.CANCELED
    assert events(job)[-2:] == ["job.cancel_requested", "job.canceled"]


def test_a_scheduled_job_on_a_silent_node_goes_back_to_the_queue(alice, fleet):
    job = place(alice)
    Job.objects.filter(pk=job.pk).update(scheduled_at=timezone.now() - timedelta(minutes=5))
    Node.objects.update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert reports.requeue_unconfirmed() == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert not job.allocations.active().exists()


def test_an_unsplittable_command_is_refused_naming_it(alice, fleet):
    with pytest.raises(limits.JobRejected) as caught:
        submit(alice, command="python 'unclosed")
    assert (caught.value.field, caught.value.message) == (
        "command",
        "cannot split into arguments: No closing quotation",
    )


def test_mig_changes_are_refused_while_a_job_holds_the_gpu(alice, fleet):
    from gpuadmin import registry

    def refusals(gpu: Gpu) -> list[str]:
        return [
            reason for veto in registry.mig_change_vetoes.answers if (reason := veto(gpu, None))
        ]

    job = place(alice)
    gpu = Gpu.objects.get(allocations__job=job)
    assert refusals(gpu) == [f"GPU {gpu.index} of {gpu.node.hostname} is allocated to job {job.pk}"]
    transitions.transition(job, JobState.CANCELED, actor=alice)
    assert refusals(gpu) == []


def test_a_job_stays_on_one_socket_when_it_can(alice, broker):
    # GPUs 0 and 1 are in MIG mode: 2-7 are free, on NUMA nodes 1,1 | 7,7,5,5 of sockets 0 | 1.
    add_sim_node("dgx-40", "dgx-a100-40gb")
    job = place(alice, gpu_count=4)
    gpus = Gpu.objects.filter(allocations__job=job).order_by("index")
    assert [gpu.index for gpu in gpus] == [4, 5, 6, 7]
    assert {gpu.socket for gpu in gpus} == {4}  # the socket of NUMA nodes 4-7
    assert job.placement["numa_nodes"] == [5, 7]
