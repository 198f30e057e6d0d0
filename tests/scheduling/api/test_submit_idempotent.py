"""``Idempotency-Key`` on a submission (draft-ietf-httpapi-idempotency-key-header): a resend
with the key of a submission already stored answers with that job, through the rule the gRPC
``SubmitJob`` keeps (``submission.submit_once``)."""

from __future__ import annotations

import pytest

from scheduling.models import Job, JobState
from tests.scheduling.api.conftest import events

pytestmark = pytest.mark.django_db

BODY = {"command": "python train.py", "name": "train", "hold": True}


@pytest.fixture
def alice(api_as):
    return api_as("alice")


@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/queue/submit"])
def test_a_resend_with_the_key_answers_the_job_it_stored(alice, fleet, path):
    first = alice.post(path, BODY, format="json", HTTP_IDEMPOTENCY_KEY="train-1")
    assert first.status_code == 201, first.json()
    again = alice.post(path, BODY, format="json", HTTP_IDEMPOTENCY_KEY="train-1")
    assert again.status_code == 200, again.json()
    job = Job.objects.get()
    assert first.json()["id"] == again.json()["id"] == job.pk
    assert again.json()["owner"] == "alice" and again.json()["allocations"] == []
    assert (job.idempotency_key, job.state) == ("train-1", JobState.PENDING)
    assert events(target_id=job.pk) == ["job.submitted"]


def test_a_structured_field_string_is_the_same_key(alice, fleet):
    """The draft's form, a quoted sf-string, and a bare value name one key."""
    alice.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY='"8e03978e"')
    again = alice.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="8e03978e")
    assert again.status_code == 200
    assert Job.objects.get().idempotency_key == "8e03978e"


def test_a_reused_key_with_another_body_answers_the_first_job(alice, fleet):
    """A key names one submission: what a resend asks is not read (documented in api.md)."""
    first = alice.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k")
    other = {**BODY, "name": "other", "command": "true"}
    again = alice.post("/api/v1/jobs/", other, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["name"] == "train"
    assert Job.objects.count() == 1


def test_keys_are_per_user_and_a_new_key_is_a_new_job(alice, api_as, fleet):
    bob = api_as("bob")
    assert (
        alice.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code
        == 201
    )
    assert (
        bob.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 201
    )
    assert (
        alice.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k2").status_code
        == 201
    )
    assert alice.post("/api/v1/jobs/", BODY, format="json").status_code == 201
    assert alice.post("/api/v1/jobs/", BODY, format="json").status_code == 201
    assert Job.objects.filter(owner__username="alice").count() == 4


def test_a_minimal_resend_is_the_id_state_and_time(alice, fleet):
    alice.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k")
    again = alice.post(
        "/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k", HTTP_PREFER="return=minimal"
    )
    assert again.status_code == 200
    assert set(again.json()) == {"id", "state", "submitted_at"}
    assert again["Preference-Applied"] == "return=minimal"


@pytest.mark.parametrize(
    ("key", "body"),
    [
        ("x" * 101, BODY),
        ("k", {"command": "true", "array": "0-2"}),
    ],
)
def test_a_key_it_cannot_keep_is_a_400_naming_it(alice, fleet, key, body):
    response = alice.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 400
    assert list(response.json()) == ["idempotency_key"]
    assert not Job.objects.exists()
