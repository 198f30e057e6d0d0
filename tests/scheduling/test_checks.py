"""``gpuadmin check``: each invariant is checked against the database and can fail."""

from __future__ import annotations

import io

import pytest
from django.utils import timezone

from inventory.choices import GpuState
from inventory.models import Gpu
from scheduling.checks import report, run_checks
from scheduling.jobs import reports, submission
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
