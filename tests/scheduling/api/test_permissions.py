"""Users see and cancel their own jobs; operators act on anyone's; viewers read."""

from __future__ import annotations

import pytest

from gpuadmin.access.models import Role
from scheduling.models import Job, JobState
from tests.scheduling.api.conftest import events, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(api_as):
    return {role: api_as(role, role) for role in Role.values}


@pytest.fixture
def jobs(people, fleet) -> dict[str, Job]:
    """One queued job of the user, one of the operator (with a secret in its env)."""
    return {
        "user": submit(people["user"].user, env={"TOKEN": "s3cret"}),
        "operator": submit(people["operator"].user, env={"TOKEN": "0p"}),
    }


def listed(client, path: str = "/api/v1/jobs/") -> list[int]:
    return sorted(job["id"] for job in client.get(path).json()["results"])


def test_users_list_only_their_own_jobs(people, jobs):
    assert listed(people["user"]) == [jobs["user"].pk]
    queue = people["user"].get("/queue").json()
    assert [job["id"] for job in queue["waiting"]] == [jobs["user"].pk]
    everyone = sorted(job.pk for job in jobs.values())
    for role in (Role.VIEWER, Role.OPERATOR, Role.ADMIN):
        assert listed(people[role]) == everyone


def test_users_cannot_see_another_users_job(people, jobs):
    other = jobs["operator"].pk
    said = {"detail": f"No job {other} of yours (a user sees only their own jobs)."}
    user = people["user"]
    for response in (
        user.get(f"/api/v1/jobs/{other}/"),
        user.delete(f"/queue/{other}"),
        user.post(f"/api/v1/jobs/{other}/cancel/"),  # not "No Job matches the given query."
        user.patch(f"/queue/{other}/priority", {"priority": "low"}, format="json"),
    ):
        assert (response.status_code, response.json()) == (404, said)
    missing = user.post(f"/api/v1/jobs/{other + 1000}/cancel/")
    assert (
        missing.json()["detail"]
        == f"No job {other + 1000} of yours (a user sees only their own jobs)."
    )
    gone = people["admin"].post(f"/api/v1/jobs/{other + 1000}/cancel/")
    assert (gone.status_code, gone.json()) == (404, {"detail": f"No job {other + 1000}."})
    assert Job.objects.get(pk=other).state == JobState.QUEUED


def test_viewers_read_everything_but_act_on_nothing(people, jobs):
    viewer = people["viewer"]
    job = jobs["user"]
    detail = viewer.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["env"] == {"TOKEN": "(hidden)"}  # secrets stay with its owner and admins
    assert people["operator"].get(f"/api/v1/jobs/{job.pk}/").json()["env"] == {"TOKEN": "(hidden)"}
    assert people["admin"].get(f"/api/v1/jobs/{job.pk}/").json()["env"] == {"TOKEN": "s3cret"}
    response = viewer.delete(f"/queue/{job.pk}")
    assert response.status_code == 403
    assert viewer.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert events(target_id=job.pk) == ["job.submitted"]


def test_users_cancel_their_own_and_operators_anyones(people, jobs):
    own = people["user"].delete(f"/queue/{jobs['user'].pk}")
    assert own.status_code == 200
    assert (own.json()["canceling"], own.json()["job"]["state"]) == (False, "canceled")
    assert own.json()["job"]["message"] == "canceled by user"
    other = people["operator"].post(f"/api/v1/jobs/{jobs['operator'].pk}/cancel/")
    assert other.status_code == 200
    mine = submit(people["user"].user)
    assert people["operator"].delete(f"/queue/{mine.pk}").json()["job"]["state"] == "canceled"
    assert events(target_id=mine.pk) == ["job.submitted", "job.canceled"]


def test_operator_and_cluster_and_orchestrator_writes_need_their_role(people, jobs):
    body = {"job_id": jobs["user"].pk, "gpu_uuids": ["GPU-x"]}
    for role in (Role.VIEWER, Role.USER):
        assert people[role].post("/cluster/gpu-allocate", body, format="json").status_code == 403
        assert people[role].post("/cluster/gpu-release", body, format="json").status_code == 403
    for role in (Role.VIEWER, Role.USER, Role.OPERATOR):
        assert people[role].post("/orchestrator/stop").status_code == 403
        policy = {"policy": "fcfs", "aging_interval_s": 60}
        assert people[role].put("/orchestrator/policies", policy, format="json").status_code == 403
        assert people[role].get("/orchestrator/policies").status_code == 200
    assert events("scheduling.schedulersettings") == events("scheduling.poolpolicy") == []


def test_allocations_follow_job_visibility(people, jobs, fleet):
    from scheduling.models import Allocation

    gpu = fleet[0].gpus.get(index=0)
    for job in jobs.values():
        Allocation.objects.create(job=job, gpu=gpu, node=fleet[0], released_at=job.submitted_at)
    mine = people["user"].get("/api/v1/allocations/").json()["results"]
    assert [a["job"] for a in mine] == [jobs["user"].pk]
    assert people["viewer"].get("/api/v1/allocations/").json()["count"] == 2
