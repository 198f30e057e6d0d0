"""Who sees a Ray job is who sees a gpuadmin job (``gpuadmin.access.services.visible_to``):
users their own, viewers, operators and admins everyone's; its entrypoint, environment and log
only for those ``can_read_private`` lets read them (``GPUADMIN_PRIVATE_DATA``), in the API and
on the pages alike. The jobs are rows: no Ray is needed."""

from __future__ import annotations

import pytest

from gpuadmin.access.models import Role
from integrations.ray import services
from integrations.ray.models import RayCluster, RayJob
from scheduling.jobs import queries
from scheduling.models import Job
from tests.integrations.ray.test_external_cluster import client_of, person

pytestmark = pytest.mark.django_db


@pytest.fixture
def alices(free_port) -> RayJob:
    cluster = RayCluster.objects.create(name="lab", address=f"http://127.0.0.1:{free_port}")
    return RayJob.objects.create(
        owner=person("alice"),
        cluster=cluster,
        entrypoint="python train.py --secret",
        runtime_env={"env_vars": {"TOKEN": "s3cr3t"}},
        submission_id="gpuadmin-1",
    )


@pytest.mark.parametrize(
    ("role", "sees"),
    [(Role.USER, False), (Role.VIEWER, True), (Role.OPERATOR, True), (Role.ADMIN, True)],
)
def test_ray_jobs_are_seen_as_gpuadmin_jobs_are(alices, role, sees):
    someone = person("someone", role)
    assert services.visible_jobs(someone).filter(pk=alices.pk).exists() is sees
    # The same rule as for a gpuadmin job of the same owner.
    Job.objects.create(owner=alices.owner, command=["true"])
    assert queries.visible_jobs(someone).filter(owner=alices.owner).exists() is sees
    listed = client_of(someone).get("/api/v1/ray/jobs/").json()["results"]
    assert [job["id"] for job in listed] == ([alices.pk] if sees else [])


def test_the_entrypoint_environment_and_log_are_private_as_a_jobs(alices, settings):
    settings.GPUADMIN_PRIVATE_DATA = "owner"
    viewer, operator = person("vic", Role.VIEWER), person("otto", Role.OPERATOR)
    for reader in (viewer, operator):
        answer = client_of(reader).get(f"/api/v1/ray/jobs/{alices.pk}/").json()
        assert (answer["entrypoint"], answer["runtime_env"]) == (None, None)
        assert client_of(reader).get(f"/api/v1/ray/jobs/{alices.pk}/logs/").status_code == 403
    mine = client_of(alices.owner).get(f"/api/v1/ray/jobs/{alices.pk}/").json()
    assert mine["entrypoint"] == "python train.py --secret"
    assert mine["runtime_env"] == {"env_vars": {"TOKEN": "s3cr3t"}}
    assert client_of(alices.owner).get(f"/api/v1/ray/jobs/{alices.pk}/logs/").json() == {
        "logs": ""  # not sent yet: Ray has none
    }
    settings.GPUADMIN_PRIVATE_DATA = "operators"
    answer = client_of(operator).get(f"/api/v1/ray/jobs/{alices.pk}/").json()
    assert answer["entrypoint"] == "python train.py --secret"
    # The pages: the viewer sees the job, not what is private; the list the same.
    page = client_of(viewer).get(f"/ray/jobs/{alices.pk}/").content.decode()
    assert "--secret" not in page and "s3cr3t" not in page and "private to" in page
    listing = client_of(viewer).get("/ray/").content.decode()
    assert f'id="ray-job-{alices.pk}"' in listing and "--secret" not in listing
    assert "--secret" in client_of(operator).get("/ray/").content.decode()


def test_a_viewer_cancels_nothing_and_a_user_not_anothers(alices):
    viewer = client_of(person("vic", Role.VIEWER))
    assert viewer.post(f"/api/v1/ray/jobs/{alices.pk}/cancel/").status_code == 403
    assert client_of(person("bob")).post(f"/api/v1/ray/jobs/{alices.pk}/cancel/").status_code == 404
    alices.refresh_from_db()
    assert alices.state == "pending"


def test_the_schema_says_what_can_be_null_and_a_null_entrypoint_is_refused_by_name(alices):
    schema = client_of(alices.owner).get("/api/schema/?format=json").json()
    fields = schema["components"]["schemas"]["RayJob"]["properties"]
    assert fields["entrypoint"]["nullable"] is True
    assert fields["runtime_env"]["nullable"] is True
    refused = client_of(alices.owner).post(
        "/api/v1/ray/jobs/", {"cluster": "lab", "entrypoint": None}, format="json"
    )
    assert refused.status_code == 400
    assert set(refused.json()) == {"entrypoint"}
