"""List endpoints cost the same number of queries for one job as for many."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpuadmin.access.models import Role
from scheduling.allocations import manual
from scheduling.jobs.pages import job_page
from scheduling.models import Job, JobState
from tests.scheduling.api.conftest import submit

pytestmark = pytest.mark.django_db

# Session, user and role: 3 queries; then each list's own (jobs: with their allocations and
# their dependencies, ``queries.with_details``).
LISTS = {
    "/api/v1/jobs/": 7,
    "/api/v1/jobs/?state=scheduled&state=queued&node=dgx-01": 7,
    "/queue": 11,
    "/api/v1/allocations/": 5,
    "/cluster/gpu-status": 4,
}


def queries(client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200
    return len(captured)


def add_jobs(owner, gpus: list, count: int) -> None:
    """``count`` queued jobs and ``count`` jobs holding one of ``gpus`` each."""
    for n in range(count):
        submit(owner, env={"N": str(n)})
        manual.allocate_by_hand(submit(owner), [gpus.pop().uuid], actor=owner)


@pytest.mark.parametrize("path", LISTS)
def test_lists_do_not_grow_with_the_jobs(api_as, fleet, path):
    viewer = api_as("vera", Role.VIEWER)  # sees everyone's jobs, env hidden: the most work
    operator = api_as("olga", Role.OPERATOR)
    gpus = list(fleet[0].gpus.all())
    add_jobs(operator.user, gpus, 1)
    one = queries(viewer, path)
    add_jobs(operator.user, gpus, 5)
    assert queries(viewer, path) == one == LISTS[path]


def add_running_ray_jobs(owner, gpus: list, count: int) -> None:
    """``count`` running Ray applications holding one of ``gpus`` each (rows set running, as
    their agents would report them: no Ray is needed for a list)."""
    for _ in range(count):
        job = submit(owner, ray=True)
        manual.allocate_by_hand(job, [gpus.pop().uuid], actor=owner)
        Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, ray_port=6380)


def test_a_list_of_running_ray_jobs_does_not_query_each_jobs_dashboard(api_as, fleet):
    viewer = api_as("vera", Role.VIEWER)
    operator = api_as("olga", Role.OPERATOR)
    gpus = list(fleet[0].gpus.all())
    add_running_ray_jobs(operator.user, gpus, 1)
    one = queries(viewer, "/api/v1/jobs/")
    add_running_ray_jobs(operator.user, gpus, 4)
    assert queries(viewer, "/api/v1/jobs/") == one == LISTS["/api/v1/jobs/"]
    url = f"http://{fleet[0].reached_at}:6381/"
    listed = viewer.get("/api/v1/jobs/").json()["results"]
    assert {job["ray_dashboard"] for job in listed} == {url}
    # The job's own answer and page link to the same dashboard.
    job = Job.objects.get(pk=listed[0]["id"])
    assert viewer.get(f"/api/v1/jobs/{job.pk}/").json()["ray_dashboard"] == url
    assert job_page(job, viewer.user).ray_dashboard == url
