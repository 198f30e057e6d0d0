"""A submission's answer with ``Prefer: return=minimal`` (RFC 7240), and what makes a
submission one statement: the job and its audit row inserted together, or neither."""

from __future__ import annotations

import shlex

import pytest
from django.db import DataError, connection
from django.test.utils import CaptureQueriesContext

from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.services import create_recorded
from scheduling.jobs import limits
from scheduling.models import Job, JobState
from tests.scheduling.api.conftest import events

pytestmark = pytest.mark.django_db

MINIMAL = {"HTTP_PREFER": "return=minimal"}


@pytest.fixture
def alice(api_as):
    return api_as("alice")


@pytest.mark.parametrize("path", ["/queue/submit", "/api/v1/jobs/"])
@pytest.mark.parametrize("prefer", ["return=minimal", "respond-async, return=minimal; x=1"])
def test_a_minimal_answer_is_the_id_state_and_time(alice, fleet, path, prefer):
    body = {"command": "python train.py", "name": "train", "hold": True}
    response = alice.post(path, body, format="json", HTTP_PREFER=prefer)
    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    assert response.json() == {
        "id": job.pk,
        "state": JobState.PENDING,
        "submitted_at": job.submitted_at.isoformat().replace("+00:00", "Z"),
    }
    assert response["Preference-Applied"] == "return=minimal"
    assert events(target_id=job.pk) == ["job.submitted"]


@pytest.mark.parametrize("prefer", [None, "return=representation", "handling=lenient"])
def test_without_the_preference_the_answer_is_the_whole_job(alice, fleet, prefer):
    headers = {"HTTP_PREFER": prefer} if prefer else {}
    response = alice.post("/queue/submit", {"command": "true"}, format="json", **headers)
    assert response.status_code == 201
    assert response.json()["owner"] == "alice" and response.json()["allocations"] == []
    assert "Preference-Applied" not in response


def test_an_array_is_answered_as_ever(alice, fleet):
    body = {"command": "true", "array": "0-2"}
    response = alice.post("/queue/submit", body, format="json", **MINIMAL)
    assert response.status_code == 201
    assert (response.json()["size"], response.json()["state"]) == (3, "queued")
    assert "Preference-Applied" not in response


def test_bad_input_is_still_a_400_naming_the_field(alice, fleet):
    body = {"command": "true", "gpu_count": 9}
    response = alice.post("/queue/submit", body, format="json", **MINIMAL)
    assert response.status_code == 400
    assert list(response.json()) == ["gpu_count"]
    assert not Job.objects.exists() and events() == []


def test_a_job_and_its_audit_row_are_one_statement(alice, fleet):
    alice.post("/queue/submit", {"command": "true"}, format="json")  # warm caches
    with CaptureQueriesContext(connection) as queries:
        response = alice.post("/queue/submit", {"command": "true", "name": "n"}, format="json")
    assert response.status_code == 201
    [statement] = [q["sql"] for q in queries if "INSERT" in q["sql"]]
    assert "scheduling_job" in statement and "audit_auditevent" in statement
    job = Job.objects.get(pk=response.json()["id"])
    event = AuditEvent.objects.get(target_id=str(job.pk))
    assert (event.object_repr, event.actor_name, event.after["state"]) == (
        f"job {job.pk} n",
        "alice",
        "queued",
    )
    assert event.request_id is not None


@pytest.mark.django_db(transaction=True)
def test_when_the_audit_row_cannot_be_written_neither_is_the_job(django_user_model):
    owner = django_user_model.objects.create_user("bob")
    job = Job(owner=owner, command=["true"])
    # Outside any transaction block (autocommit): the statement alone is atomic.
    assert not connection.in_atomic_block
    with pytest.raises(DataError):
        create_recorded(job, "job.submitted", actor=owner, actor_name="x" * 151, after={})
    assert not Job.objects.exists() and not AuditEvent.objects.exists()
    create_recorded(job, "job.submitted", actor=owner, after={"state": job.state})
    assert Job.objects.get().pk == job.pk and not job._state.adding
    assert AuditEvent.objects.get().target_id == str(job.pk)


@pytest.mark.parametrize(
    "command",
    [
        "python train.py --lr 0.1",
        "  a\tb\r\nc  ",
        "",
        "a#b $HOME;|&",
        "é\u00a0x",
        "a 'b c'",
        'a "b',
    ],
)
def test_commands_split_as_shlex_splits_them(command):
    try:
        expected = shlex.split(command)
    except ValueError:
        with pytest.raises(limits.JobRejected):
            limits.split_command(command, use_shell=False)
        return
    assert limits.split_command(command, use_shell=False) == expected
