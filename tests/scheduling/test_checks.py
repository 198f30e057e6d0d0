"""``gpuadmin check``: each invariant is checked against the database and can fail."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.utils import timezone

from inventory.choices import GpuState
from inventory.models import Gpu
from scheduling.checks import report, run_checks
from scheduling.jobs import control, reports, submission
from scheduling.loop import passes as loop
from scheduling.models import Job, JobArray, JobState
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def running_job(broker, django_user_model) -> Job:
    add_sim_node("chk-01")
    owner = django_user_model.objects.create_user("bob")
    job = submission.submit_job(owner, command=["true"], gpu_count=2)
    loop.run_pass()
    reports.job_started(job.pk, 1, 99, timezone.now())
    job.refresh_from_db()
    return job


def violations() -> dict[str, list[str]]:
    return {name: found for name, found in run_checks().items() if found}


def printed() -> tuple[int, list[str]]:
    out = io.StringIO()
    return report(out), out.getvalue().splitlines()


def test_a_consistent_database_passes(running_job):
    assert violations() == {}
    failed, lines = printed()
    assert (failed, lines[-1]) == (0, "all invariants hold")


def test_each_broken_invariant_is_found(running_job):
    # States changed behind the services' back: no audit row, allocations left behind.
    Job.objects.filter(pk=running_job.pk).update(state=JobState.COMPLETED)
    queued = submission.submit_job(running_job.owner, command=["true"])
    Job.objects.filter(pk=queued.pk).update(state=JobState.RUNNING)
    gpu = Gpu.objects.get(
        allocations__job=running_job, index=running_job.placement["nodes"]["chk-01"][0]
    )
    Gpu.objects.filter(pk=gpu.pk).update(state=GpuState.OFFLINE)
    found = violations()
    assert found["a job that ended holds no GPU"][0].endswith(f"job {running_job.pk} is completed")
    assert found["a scheduled or running job holds exactly its GPUs"] == [
        f"job {queued.pk} is running with 0 GPUs allocated, needs 1"
    ]
    assert found["no allocation on offline or missing hardware"] == [
        f"job {running_job.pk} holds GPU {gpu.uuid} (offline) on node chk-01 (online)"
    ]
    assert sorted(found["every job and allocation change is audited"]) == sorted(
        [
            f"job {running_job.pk} is completed but its audit log says running",
            f"job {queued.pk} is running but its audit log says queued",
        ]
    )
    failed, lines = printed()
    assert (failed, lines[-1]) == (6, "6 violation(s)")
    assert "FAIL a job that ended holds no GPU" in lines


def test_an_array_whose_jobs_are_not_those_it_made_is_found(running_job):
    """Its tasks made jobs by the loop, then one more counted (or one deleted) behind its
    back."""
    array = submission.submit_array(running_job.owner, "0-9%2", command=["true"]).array
    loop.run_pass()
    assert violations() == {}
    JobArray.objects.filter(pk=array.pk).update(split=4)
    assert violations() == {
        "each job array's tasks are made jobs once": [
            f"array {array.pk} has 3 jobs of its tasks, says it made 4"
        ]
    }


def test_an_array_task_canceled_before_it_was_made_yet_a_job_is_found(running_job):
    """Its unmade tasks canceled one by one are never made; one made anyway behind its back
    (its index also recorded as canceled) is a violation."""
    array = submission.submit_array(running_job.owner, "0-9%2", command=["true"]).array
    control.cancel_tasks(array, "5-6", actor=running_job.owner)
    loop.run_pass()
    assert violations() == {}
    made = array.tasks.get(array_index=1)
    JobArray.objects.filter(pk=array.pk).update(canceled_tasks=[1, 5, 6], split=2)
    assert violations() == {
        "each job array's tasks are made jobs once": [
            f"array {array.pk} has 3 jobs of its tasks, says it made 2",
            f"array {array.pk}'s task 1 was canceled before it was made, yet is job {made.pk}",
        ]
    }


@pytest.mark.parametrize("how", ["stopped", "canceled"])
def test_a_job_its_agent_never_reports_gone_is_found_past_the_timeout_and_a_beat_period(
    running_job, settings, how
):
    """Its GPUs taken offline (its end decided, ``Job.ending``) or its cancel asked, and its
    agent, heard from, never reports its processes gone: overdue past the kill grace plus
    ``GPUADMIN_UNKILLABLE_TIMEOUT_S``, when beat drains its node and ends it; no violation
    until a beat period later (beat may not have run yet), one past it (nothing acted)."""
    gpu_ids = list(running_job.allocations.values_list("gpu_id", flat=True))
    if how == "stopped":
        control.stop_jobs_on_gpus(gpu_ids, requeue=True, reason="went offline")
    else:
        control.cancel_job(running_job, actor=running_job.owner)
    running_job.refresh_from_db()
    assert running_job.state == JobState.RUNNING  # holds its GPUs, waiting for its agent
    assert violations() == {}

    def began(seconds_ago: float) -> None:
        at = timezone.now() - timedelta(seconds=seconds_ago)
        if how == "stopped":
            ending = {**running_job.ending, "since": at.isoformat()}
            Job.objects.filter(pk=running_job.pk).update(ending=ending)
        else:
            Job.objects.filter(pk=running_job.pk).update(cancel_requested_at=at)

    kill, unkillable = settings.GPUADMIN_JOB_KILL_GRACE_S, settings.GPUADMIN_UNKILLABLE_TIMEOUT_S
    beat = settings.GPUADMIN_REQUEUE_INTERVAL_S
    began(kill + unkillable + beat / 2)  # overdue: beat's to act on, within its period
    assert violations() == {}
    began(kill + unkillable + beat + 30)
    [found] = violations()[
        "no stopped job holds its GPUs past the kill grace and the unkillable timeout"
    ]
    waiting = " (waiting for chk-01)" if how == "stopped" else ""
    assert found in [
        f"job {running_job.pk} has been stopping for {waited:.0f} s{waiting}, longer than "
        f"its grace ({kill} s) + GPUADMIN_UNKILLABLE_TIMEOUT_S ({unkillable} s) "
        f"+ a beat period ({beat:g} s), and holds its GPUs: its nodes should have been drained "
        "and the job ended"
        for waited in (kill + unkillable + beat + 30, kill + unkillable + beat + 31)
    ]

    assert reports.end_unkillable_stops() == [running_job.pk]  # beat acts
    assert violations() == {}
