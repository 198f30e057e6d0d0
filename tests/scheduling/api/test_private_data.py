"""What a job keeps private (its log, environment values and command line): its owner's and
admins' by default, widened by ``GPUADMIN_PRIVATE_DATA`` (Slurm's PrivateData=jobs), alike
in the API, on the pages and in the CLI (through the API). A viewer read alice's
``ALICE-LOG-SECRET`` and operators every job's ``env`` values."""

from __future__ import annotations

import pytest
from django.test import Client

from gpuadmin.access.models import Role
from scheduling.allocations import manual
from scheduling.models import Job
from tests.scheduling.api.conftest import submit, write_log

pytestmark = pytest.mark.django_db

SECRET = "ALICE-LOG-SECRET"
# Who reads alice's job at all, and its private data, by role (a user does not see it: 404).
ROLES = ("owner", "user", "viewer", "operator", "admin")
SEES = {"owner": True, "viewer": True, "operator": True, "admin": True}
READS = {
    "owner": {"owner", "admin"},
    "operators": {"owner", "operator", "admin"},
    "everyone": {"owner", "viewer", "operator", "admin"},
}


@pytest.fixture
def clients(api_as):
    """An API client per role; alice is the owner."""
    made = {"owner": api_as("alice")}
    for role in ROLES[1:]:
        made[role] = api_as(f"{role}-1", {"user": Role.USER}.get(role, role))
    return made


@pytest.fixture
def ran(clients, fleet, agent_broker) -> Job:
    """alice's job, placed on dgx-01 GPU 0, with a secret in its env, command and log."""
    job = submit(
        clients["owner"].user,
        command=["train.py", "--password", "hunter2"],
        env={"TOKEN": "s3cret"},
    )
    manual.allocate_by_hand(job, [fleet[0].gpus.get(index=0).uuid], actor=job.owner)
    job = Job.objects.get(pk=job.pk)
    write_log(job, f"epoch 1\n{SECRET}\n")
    return job


def page_client(api_client) -> Client:
    client = Client()
    client.force_login(api_client.user)
    return client


@pytest.mark.parametrize("setting", sorted(READS))
@pytest.mark.parametrize("role", ROLES)
def test_the_api_shows_private_data_to_whom_the_setting_says(clients, ran, settings, setting, role):
    settings.GPUADMIN_PRIVATE_DATA = setting
    client = clients[role]
    detail = client.get(f"/api/v1/jobs/{ran.pk}/")
    log = client.get(f"/api/v1/jobs/{ran.pk}/log/")
    if not SEES.get(role):
        assert (detail.status_code, log.status_code) == (404, 404)
        return
    body = detail.json()
    listed = {job["id"]: job for job in client.get("/api/v1/jobs/").json()["results"]}[ran.pk]
    queued = client.get("/queue").json()["running"]
    assert [job["id"] for job in queued] == [ran.pk]
    if role in READS[setting]:
        assert (body["command"], body["env"]) == (
            ["train.py", "--password", "hunter2"],
            {"TOKEN": "s3cret"},
        )
        assert (listed["command"], listed["env"], queued[0]["env"]) == (
            body["command"],
            body["env"],
            body["env"],
        )
        assert log.status_code == 200 and SECRET in log.json()["text"]
    else:
        assert (body["command"], body["env"]) == (None, {"TOKEN": "(hidden)"})
        assert (listed["command"], listed["env"]) == (None, {"TOKEN": "(hidden)"})
        assert (queued[0]["command"], queued[0]["env"]) == (None, {"TOKEN": "(hidden)"})
        assert log.status_code == 403
        who = {"owner": "its owner and admins", "operators": "its owner, operators and admins"}
        assert log.json() == {"detail": f"The log of job {ran.pk} is private to {who[setting]}."}


@pytest.mark.parametrize("setting", sorted(READS))
@pytest.mark.parametrize("role", ROLES)
def test_the_job_page_shows_private_data_to_whom_the_setting_says(
    clients, ran, settings, setting, role
):
    settings.GPUADMIN_PRIVATE_DATA = setting
    client = page_client(clients[role])
    page = client.get(f"/jobs/{ran.pk}/")
    log = client.get(f"/jobs/{ran.pk}/log/")
    if not SEES.get(role):
        assert (page.status_code, log.status_code) == (404, 404)
        return
    html = page.content.decode()
    assert page.status_code == 200
    assert "s3cret" not in html  # the page names the variables, never their values
    assert "<code>TOKEN</code>" in html
    if role in READS[setting]:
        assert "hunter2" in html and "private to" not in html
        assert f'hx-get="/jobs/{ran.pk}/log/"' in html
        assert log.status_code == 200 and SECRET in log.content.decode()
    else:
        assert "hunter2" not in html and f'hx-get="/jobs/{ran.pk}/log/"' not in html
        assert "The log is private to its owner" in html
        assert log.status_code == 403 and SECRET not in log.content.decode()
