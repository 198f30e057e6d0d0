"""POST /queue/submit and POST /api/v1/jobs/: validated up front, stored QUEUED, audited."""

from __future__ import annotations

import pytest

from gpuadmin.access.models import Role
from gpuadmin.audit.models import AuditEvent
from scheduling.models import Job, JobState
from tests.scheduling.api.conftest import events

pytestmark = pytest.mark.django_db

A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def alice(api_as):
    return api_as("alice")


def test_submit_queues_the_job_and_audits_it(alice, fleet):
    body = {
        "command": "python train.py --lr '0.1 0.2'",
        "name": "train",
        "project": "vision",
        "env": {"WANDB_MODE": "offline"},
        "gpu_count": 4,
        "gpu_model": A100,
        "topology": "nvlink",
        "priority": "high",
        "max_runtime_s": 3600,
        "max_retries": 2,
    }
    response = alice.post("/queue/submit", body, format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    data = response.json()
    assert data["id"] == job.pk
    assert (data["state"], data["owner"], data["project"], data["priority"]) == (
        "queued",
        "alice",
        "vision",
        "high",
    )
    assert data["command"] == ["python", "train.py", "--lr", "0.1 0.2"]
    assert (data["env"], data["gpu_count"], data["node_count"], data["topology"]) == (
        {"WANDB_MODE": "offline"},
        4,
        1,
        "nvlink",
    )
    assert (data["placement"], data["allocations"], data["queue_position"]) == (None, [], None)
    assert job.state == JobState.QUEUED
    assert (job.owner.username, job.max_runtime_s, job.max_retries) == ("alice", 3600, 2)
    assert events(target_id=job.pk) == ["job.submitted"]
    assert AuditEvent.objects.get(event_type="job.submitted").actor_name == "alice"


def test_shell_command_is_kept_whole_and_a_list_is_argv(alice, fleet):
    shell = alice.post(
        "/queue/submit", {"command": "echo $HOME; ls", "use_shell": True}, format="json"
    )
    assert (shell.json()["command"], shell.json()["use_shell"]) == (["echo $HOME; ls"], True)
    argv = alice.post("/queue/submit", {"command": ["echo", "a b"]}, format="json")
    assert argv.json()["command"] == ["echo", "a b"]


def test_held_job_is_pending(alice, fleet):
    response = alice.post("/queue/submit", {"command": "true", "hold": True}, format="json")
    assert response.json()["state"] == "pending"


def test_versioned_jobs_endpoint_takes_the_same_body(alice, fleet):
    response = alice.post("/api/v1/jobs/", {"command": "true", "gpu_count": 2}, format="json")
    assert response.status_code == 201
    assert response.json()["gpu_count"] == 2
    assert Job.objects.get().state == JobState.QUEUED


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"gpu_count": 9}, "gpu_count", "9 GPUs per node, but no node has more than 8 GPUs"),
        ({"gpu_count": 0}, "gpu_count", "Ensure this value is greater than or equal to 1."),
        ({"gpu_count": 65}, "gpu_count", "Ensure this value is less than or equal to 64."),
        ({"gpu_count": "two"}, "gpu_count", "A valid integer is required."),
        (
            {"gpu_model": "Tesla K80"},
            "gpu_model",
            f"no GPU model 'Tesla K80'; the fleet has: {A100}",
        ),
        (
            {"node_count": 3, "gpu_count": 8},
            "node_count",
            "3 nodes with 8 GPUs each, but only 2 nodes have that many",
        ),
        ({"node_count": -1}, "node_count", "Ensure this value is greater than or equal to 1."),
        (
            {"min_gpu_memory_mib": -5},
            "min_gpu_memory_mib",
            "Ensure this value is greater than or equal to 0.",
        ),
        (
            {"min_gpu_memory_mib": 200_000},
            "min_gpu_memory_mib",
            "195.3 GiB per GPU, but the largest GPU has 80 GiB",
        ),
        ({"max_retries": -1}, "max_retries", "Ensure this value is greater than or equal to 0."),
        ({"max_retries": 21}, "max_retries", "Ensure this value is less than or equal to 20."),
        (
            {"max_runtime_s": 10**9},
            "max_runtime_s",
            "Ensure this value is less than or equal to 7776000.",
        ),
        (
            {"estimated_duration_s": -60},
            "estimated_duration_s",
            "Ensure this value is greater than or equal to 1.",
        ),
        ({"topology": "ring"}, "topology", '"ring" is not a valid choice.'),
        ({"priority": "urgent"}, "priority", '"urgent" is not a valid choice.'),
        ({"env": ["A=1"]}, "env", 'Expected a dictionary of items but got type "list".'),
        ({"env": {"A": 1}}, "env", "Not a valid string."),
        ({"env": {"1A": "x"}}, "env", "not a variable name: '1A'"),
        (
            {"env": {"CUDA_VISIBLE_DEVICES": "0"}},
            "env",
            "CUDA_VISIBLE_DEVICES is reserved: it would change the job's GPUs or its runtime",
        ),
        ({"command": ""}, "command", "empty command"),
        ({"command": "   "}, "command", "empty command"),
        ({"command": []}, "command", "empty command"),
        ({"command": 5}, "command", "Expected a string or a list of strings."),
        ({"command": ["ls", 5]}, "command", "Expected a string or a list of strings."),
        ({"command": "echo 'unbalanced"}, "command", "No closing quotation"),
        ({"use_shell": "maybe"}, "use_shell", "Must be a valid boolean."),
        ({"working_dir": "runs/today"}, "working_dir", "'runs/today' is not an absolute path"),
    ],
)
def test_impossible_or_bad_requests_name_the_field_and_write_nothing(
    alice, fleet, fields, field, message
):
    response = alice.post("/queue/submit", {"command": "true", **fields}, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert list(errors) == [field]
    assert message in str(errors[field])
    assert not Job.objects.exists()
    assert not AuditEvent.objects.filter(event_type="job.submitted").exists()


def test_missing_command_and_non_object_body_are_400(alice, fleet):
    assert alice.post("/queue/submit", {}, format="json").json() == {
        "command": ["This field is required."]
    }
    response = alice.post("/queue/submit", [1, 2], format="json")
    assert response.status_code == 400
    response = alice.post("/queue/submit", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert not Job.objects.exists()


def test_empty_fleet_refuses_everything(alice, db):
    response = alice.post("/queue/submit", {"command": "true"}, format="json")
    assert response.json() == {"gpu_count": ["the fleet has no GPUs yet"]}


def test_viewers_cannot_submit_and_strangers_must_sign_in(api_as, fleet, client):
    viewer = api_as("vera", Role.VIEWER)
    assert viewer.post("/queue/submit", {"command": "true"}, format="json").status_code == 403
    assert viewer.post("/api/v1/jobs/", {"command": "true"}, format="json").status_code == 403
    anonymous = client.post("/queue/submit", {"command": "true"}, content_type="application/json")
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"] == "Bearer"
    assert not Job.objects.exists()
