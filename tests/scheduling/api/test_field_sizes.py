"""Unbounded job fields have sizes (the job service's, for the API and the page alike): more is
a 400 naming the field, and no job is stored."""

from __future__ import annotations

import pytest

from scheduling.jobs.limits import MAX_COMMAND_CHARS, MAX_ENV_CHARS, MAX_ENV_VARS
from scheduling.models import Job

pytestmark = pytest.mark.django_db

BIG = "x" * 30_000


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": "echo " + "y" * MAX_COMMAND_CHARS}, "command"),
        ({"command": ["echo", *[BIG] * 5]}, "command"),
        ({"command": "true", "env": {f"V{i}": BIG for i in range(5)}}, "env"),
        ({"command": "true", "env": {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}}, "env"),
        ({"command": "true", "env": {"V": "v" * 32_769}}, "env"),
        ({"command": "true", "name": "n" * 201}, "name"),
        ({"command": "true", "project": "p" * 101}, "project"),
        ({"command": "true", "working_dir": "/" + "w" * 1024}, "working_dir"),
    ],
)
@pytest.mark.parametrize("path", ["/queue/submit", "/api/v1/jobs/"])
def test_oversized_submissions_are_a_400_naming_the_field(api_as, fleet, path, body, field):
    response = api_as("alice").post(path, body, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert not Job.objects.exists()


def test_the_submit_page_refuses_a_large_environment_on_its_field(api_as, fleet):
    env = "\n".join(f"V{i}={BIG}" for i in range(5))
    form = {"command": "true", "gpu_count": 1, "node_count": 1, "max_retries": 0, "env": env}
    form |= {"topology": "any", "priority": "normal"}
    response = api_as("alice").post("/jobs/new/", form)
    assert response.status_code == 200
    assert f"at most {MAX_ENV_CHARS} characters" in response.content.decode()
    assert not Job.objects.exists()


def test_just_under_the_sizes_is_accepted(api_as, fleet):
    body = {
        "command": ["echo", "y" * (MAX_COMMAND_CHARS - 4)],
        "env": {"V": "v" * 32_768, **{f"W{i}": BIG for i in range(3)}},
    }
    assert api_as("alice").post("/api/v1/jobs/", body, format="json").status_code == 201


def test_a_list_page_holds_at_most_1000_items(api_as, fleet, django_user_model):
    alice = api_as("alice")
    owner = django_user_model.objects.get(username="alice")
    Job.objects.bulk_create(Job(owner=owner, command=["true"]) for _ in range(1001))
    body = alice.get("/api/v1/jobs/?limit=5000").json()
    assert (body["count"], len(body["results"])) == (1001, 1000)
