"""The job's wire format (the executor's ``JobSpec`` and events, as JSON) and dispatch: what
the central side sends each node's agent, and what it makes of the agent's reports."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpuadmin.access.services import set_unix_account
from scheduling import tasks
from scheduling.agent.wire import FinalState, JobFinished, JobSpec, JobStarted, event_from_dict
from scheduling.jobs import submission
from scheduling.loop import passes as loop
from scheduling.loop.dispatch import job_spec
from scheduling.models import Job, JobState
from tests.scheduling.conftest import add_sim_node


def over_the_wire(data: dict) -> dict:
    return json.loads(json.dumps(data))  # what Celery's JSON serializer carries


def test_a_job_spec_round_trips_through_json() -> None:
    spec = JobSpec(
        job_id="12.3",
        shell_command="nvidia-smi; python train.py",
        env={"GPUADMIN_NODE_RANK": "1", "LR": "0.1"},
        gpu_uuids=["GPU-a", "GPU-b"],
        max_runtime_s=3600,
        container_image="nvcr.io/nvidia/pytorch:24.05-py3",
        container_workdir="/workspace",
        unix_user="alice",
        allow_root=False,
    )
    assert JobSpec.from_dict(over_the_wire(spec.to_dict())) == spec
    host = JobSpec(job_id="4.1", cwd="/data/run", argv=["python", "train.py"], unix_user="bob")
    assert JobSpec.from_dict(over_the_wire(host.to_dict())) == host
    # A newer central side's extra field does not stop an older agent.
    assert JobSpec.from_dict({**host.to_dict(), "priority": "high"}) == host


def test_an_invalid_spec_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not an absolute path"):
        JobSpec.from_dict({"job_id": "6.1", "argv": ["true"], "cwd": "runs/today"})
    with pytest.raises(ValueError, match="invalid job spec"):
        JobSpec.from_dict({"argv": ["true"]})  # no job id


def test_executor_events_round_trip_through_json() -> None:
    at = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    started = JobStarted("12.3", 4242, at, adopted=True)
    finished = JobFinished("12.3", FinalState.TIMED_OUT, -15, at, "ran past its maximum runtime")
    assert started.to_dict()["started_at"] == finished.to_dict()["finished_at"] == at.isoformat()
    for event in (started, finished):
        assert event_from_dict(over_the_wire(event.to_dict())) == event


@pytest.mark.django_db
def test_a_gang_is_sent_to_each_node_as_its_spec_with_its_rank(
    django_user_model, broker, django_capture_on_commit_callbacks
) -> None:
    add_sim_node("dgx-01")
    add_sim_node("dgx-02")
    owner = django_user_model.objects.create_user("alice")
    job = submission.submit_job(
        owner,
        command="python train.py",
        use_shell=True,
        gpu_count=8,
        node_count=2,
        env={"LR": "0.1"},
        working_dir="/workspace",
        container_image="nvcr.io/nvidia/pytorch:24.05-py3",
        max_runtime_s=600,
    )
    with django_capture_on_commit_callbacks(execute=True):
        loop.run_pass()
    sent = broker.job_specs()
    assert [queue for _, queue in sent] == ["node.dgx-01", "node.dgx-02"]
    specs = [JobSpec.from_dict(spec) for spec, _ in sent]
    for rank, spec in enumerate(specs):
        assert spec.job_id == f"{job.pk}.1"
        assert spec.shell_command == "python train.py" and spec.argv == ()
        assert dict(spec.env) == {
            "LR": "0.1",
            "GPUADMIN_NODE_RANK": str(rank),
            "GPUADMIN_NNODES": "2",
            "GPUADMIN_NODES": "dgx-01,dgx-02",
        }
        assert len(spec.gpu_uuids) == 8
        # The working directory is inside the image; the agent picks where the client starts.
        assert (spec.container_image, spec.container_workdir, spec.cwd) == (
            "nvcr.io/nvidia/pytorch:24.05-py3",
            "/workspace",
            None,
        )
        assert spec.max_runtime_s == 600
        assert (spec.unix_user, spec.allow_root) == ("alice", False)  # by default, their name
    assert not set(specs[0].gpu_uuids) & set(specs[1].gpu_uuids)


@pytest.mark.parametrize("allow_root", [False, True])
def test_a_job_runs_as_the_unix_account_an_admin_gave_its_owner(
    django_user_model, admin_user, allow_root: bool
) -> None:
    add_sim_node("dgx-01")
    owner = django_user_model.objects.create_user("alice.smith@lab.example")
    set_unix_account(owner, username="asmith", allow_root=allow_root, actor=admin_user)
    job = submission.submit_job(owner, command=["true"], gpu_count=1)
    job = Job.objects.select_related("owner__unix_account").get(pk=job.pk)

    spec = job_spec(job, [], 0, ["dgx-01"])

    assert (spec.unix_user, spec.allow_root) == ("asmith", allow_root)


@pytest.mark.django_db
def test_a_job_the_executor_would_refuse_is_reported_failed_not_sent(
    django_user_model, broker, django_capture_on_commit_callbacks
) -> None:
    """A row stored before submissions were checked (a relative working directory) ends
    failed with the reason, through the same event an agent sends, instead of staying
    SCHEDULED or breaking the pass."""
    add_sim_node("dgx-01")
    owner = django_user_model.objects.create_user("alice")
    job = submission.submit_job(owner, command=["true"], max_retries=0)
    Job.objects.filter(pk=job.pk).update(working_dir="runs/today")
    with django_capture_on_commit_callbacks(execute=True):
        summary = loop.run_pass()
    assert summary.placed == 1
    assert broker.job_specs() == []
    [(args, queue)] = broker.named("scheduling.job_event")
    assert queue is None  # the central queue
    with django_capture_on_commit_callbacks(execute=True):
        tasks.job_event(*args)
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.message == "cannot start: working directory 'runs/today' is not an absolute path"
    assert not job.allocations.active().exists()


@pytest.mark.django_db
def test_the_agents_events_drive_the_job(django_user_model, broker) -> None:
    add_sim_node("dgx-01")
    owner = django_user_model.objects.create_user("alice")
    job = submission.submit_job(owner, command=["true"], gpu_count=2)
    loop.run_pass()
    started_at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    finished_at = datetime(2025, 1, 2, 3, 4, 9, 250000, tzinfo=UTC)
    tasks.job_event(over_the_wire(JobStarted(f"{job.pk}.1", 4242, started_at).to_dict()))
    job.refresh_from_db()
    assert (job.state, job.pid, job.started_at) == (JobState.RUNNING, 4242, started_at)
    finished = JobFinished(f"{job.pk}.1", FinalState.COMPLETED, 0, finished_at)
    tasks.job_event(over_the_wire(finished.to_dict()))
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.finished_at) == (JobState.COMPLETED, 0, finished_at)
