"""Hostile input on the write endpoints: every bad value is a 4xx naming what was wrong, in the
one error format, and writes nothing (no job, no token, no audit row)."""

from __future__ import annotations

import json

import pytest
from django.db.models import Q
from django.test import override_settings

from gpuadmin.access.models import ApiToken
from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu
from scheduling.jobs import limits, submission
from scheduling.models import Job

pytestmark = pytest.mark.django_db

SUBMIT_URLS = ["/queue/submit", "/api/v1/jobs/"]
NUL = "Null characters are not allowed."
SURROGATE = "Surrogate characters are not allowed: U+D800."


@pytest.fixture
def alice(api_as, fleet):
    return api_as("alice")


def post(client, url: str, body: str):
    """POST a raw JSON text (lone surrogates cannot be sent any other way)."""
    return client.post(url, body, content_type="application/json")


def assert_nothing_written() -> None:
    assert not Job.objects.exists()
    assert not ApiToken.objects.exists()
    written = AuditEvent.objects.filter(
        Q(event_type__startswith="job.") | Q(event_type__startswith="token.")
    )
    assert not written.exists()


# (JSON body, field named). \u0000 and \ud800 are JSON escapes: a NUL and a lone surrogate.
BAD_TEXT = [
    ('{"command": "echo a\\u0000b"}', "command", NUL),
    ('{"command": ["echo", "a\\u0000b"]}', "command", NUL),
    ('{"command": "echo a\\u0000b", "use_shell": true}', "command", NUL),
    ('{"command": ["echo", "a\\u0000b"], "use_shell": true}', "command", NUL),
    ('{"command": "echo \\ud800"}', "command", SURROGATE),
    ('{"command": ["echo", "\\ud800"]}', "command", SURROGATE),
    ('{"command": "echo \\ud800", "use_shell": true}', "command", SURROGATE),
    ('{"command": "true", "name": "a\\u0000"}', "name", NUL),
    ('{"command": "true", "name": "\\ud800"}', "name", SURROGATE),
    ('{"command": "true", "project": "\\ud800"}', "project", SURROGATE),
    ('{"command": "true", "working_dir": "/a\\u0000"}', "working_dir", NUL),
    ('{"command": "true", "working_dir": "/\\ud800"}', "working_dir", SURROGATE),
    ('{"command": "true", "container_image": "\\ud800"}', "container_image", SURROGATE),
    ('{"command": "true", "gpu_model": "\\ud800"}', "gpu_model", SURROGATE),
    ('{"command": "true", "priority": "\\ud800"}', "priority", SURROGATE),
    ('{"command": "true", "env": {"A": "a\\u0000"}}', "env", NUL),
    ('{"command": "true", "env": {"A\\u0000": "x"}}', "env", NUL),
    ('{"command": "true", "env": {"A": "\\ud800"}}', "env", SURROGATE),
    ('{"command": "true", "env": {"\\ud800": "x"}}', "env", SURROGATE),
]


@pytest.mark.parametrize("url", SUBMIT_URLS)
@pytest.mark.parametrize(("body", "field", "message"), BAD_TEXT)
def test_text_the_database_cannot_store_is_a_400_naming_the_field(alice, url, body, field, message):
    response = post(alice, url, body)
    assert response.status_code == 400
    assert response.json() == {field: [message]}
    assert_nothing_written()


@pytest.mark.parametrize("use_shell", [False, True])
@pytest.mark.parametrize("command", ["echo a\x00b", ["echo", "a\x00b"]])
def test_a_nul_in_a_form_encoded_command_is_a_400(alice, command, use_shell):
    """Form bodies bypass the JSON parser: the job service refuses the text itself."""
    body = {"command": command, "use_shell": use_shell}
    response = alice.post("/queue/submit", body)
    assert response.status_code == 400
    assert response.json() == {"command": [NUL]}
    assert_nothing_written()


@pytest.mark.parametrize("command", ["echo a\x00b", ["echo", "\ud800"]])
def test_the_job_service_refuses_such_text_whoever_calls_it(api_as, fleet, command):
    with pytest.raises(limits.JobRejected) as caught:
        submission.submit_job(api_as("bob").user, command=command)
    assert caught.value.field == "command"
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "body",
    ['{"name": "a\\u0000"}', '{"name": "\\ud800"}'],
)
def test_token_names_the_database_cannot_store_are_a_400(alice, body):
    response = post(alice, "/api/v1/tokens/", body)
    assert response.status_code == 400
    assert list(response.json()) == ["name"]
    assert_nothing_written()


@pytest.mark.parametrize(
    "image",
    [
        "--privileged",
        "-v=/:/host",
        "--volume=/:/host",
        "-it",
        "alpine --privileged",
        "alpine\n--privileged",
        "alp ine",
        "alpine:1\x7f",
        "Alpine",  # a repository name is lowercase
        "alpine:",
        "alpine@sha256:abc",  # a digest has at least 32 hex digits
        "alpine:-tag",
        "alpine:" + "x" * 129,
        "/abs/path",
        "docker://alpine",
        "registry:5000/-name",
        "a" * 256,
        "registry.example.com/" + "a" * 250,
    ],
)
@pytest.mark.parametrize("url", SUBMIT_URLS)
def test_container_image_must_be_an_image_reference(alice, url, image):
    body = json.dumps({"command": "true", "container_image": image})
    response = post(alice, url, body)
    assert response.status_code == 400
    assert list(response.json()) == ["container_image"]
    assert_nothing_written()


@pytest.mark.parametrize(
    "image",
    [
        "alpine",
        "alpine:3.20",
        "library/alpine:latest",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "localhost:5000/team/train_job__v2:1.0",
        "registry.example.com:443/a/b/c",
        "[::1]:5000/img",
        "ghcr.io/org/img@sha256:" + "a" * 64,
        "ghcr.io/org/img:v1@sha256:" + "0123456789abcdef" * 4,
    ],
)
def test_image_references_are_accepted(alice, image):
    response = post(
        alice, "/api/v1/jobs/", json.dumps({"command": "true", "container_image": image})
    )
    assert response.status_code == 201, response.json()
    assert Job.objects.get().container_image == image


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_REQUIRE_CUDA",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "GPUADMIN_JOB_ID",
        "APPTAINERENV_CUDA_VISIBLE_DEVICES",
        "SINGULARITYENV_NVIDIA_VISIBLE_DEVICES",
        "APPTAINER_BIND",
        "DOCKER_HOST",
    ],
)
@pytest.mark.parametrize("url", SUBMIT_URLS)
def test_reserved_environment_names_are_a_400_naming_the_key(alice, url, name):
    response = post(alice, url, json.dumps({"command": "true", "env": {name: "all"}}))
    assert response.status_code == 400
    assert list(response.json()) == ["env"]
    assert name in response.json()["env"][0]
    assert_nothing_written()


@pytest.mark.parametrize("name", ["1A", "A-B", "A B", "A=B", "Ä", ""])
def test_environment_names_must_be_posix_names(alice, name):
    response = post(alice, "/api/v1/jobs/", json.dumps({"command": "true", "env": {name: "x"}}))
    assert response.status_code == 400
    assert list(response.json()) == ["env"]
    assert_nothing_written()


@pytest.mark.parametrize("url", SUBMIT_URLS)
@pytest.mark.parametrize("shape", ["[{}]", '{{"command": {}}}'])
def test_deeply_nested_json_is_a_400(alice, url, shape):
    nested = "[" * 100_000 + "]" * 100_000
    response = post(alice, url, shape.format(nested))
    assert response.status_code == 400
    assert response.json() == {"detail": "JSON nested deeper than 32 levels."}
    assert_nothing_written()


def test_nesting_past_the_limit_but_within_the_parser_is_a_400_too(alice):
    response = post(alice, "/api/v1/jobs/", '{"command": ' + "[" * 40 + "]" * 40 + "}")
    assert response.status_code == 400
    assert response.json() == {"detail": "JSON nested deeper than 32 levels."}


@pytest.mark.parametrize("url", [*SUBMIT_URLS, "/api/v1/tokens/"])
@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_a_body_over_the_limit_is_a_json_413_naming_it(alice, url, content_type):
    body = json.dumps({"command": "true", "name": "x" * (10 * 1024 * 1024)})
    response = alice.post(url, body, content_type=content_type)
    assert response.status_code == 413
    assert response.json() == {
        "detail": "The request body is larger than the limit of 2621440 bytes."
    }
    assert_nothing_written()


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_the_413_follows_the_setting(alice):
    response = post(alice, "/api/v1/jobs/", json.dumps({"command": "x" * 1000}))
    assert response.status_code == 413
    assert "1000 bytes" in response.json()["detail"]


@override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=5)
@pytest.mark.parametrize("format", ["multipart", None])
def test_a_form_django_refuses_is_a_json_400(alice, format):
    fields = {f"f{i}": "x" for i in range(10)}
    if format:
        response = alice.post("/api/v1/jobs/", {"command": "true", **fields}, format=format)
    else:
        body = "&".join(f"{name}=x" for name in fields)
        response = alice.post(
            "/api/v1/jobs/", body, content_type="application/x-www-form-urlencoded"
        )
    assert response.status_code == 400
    assert "DATA_UPLOAD_MAX_NUMBER_FIELDS" in response.json()["detail"]
    assert_nothing_written()


@override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=5)
@pytest.mark.parametrize("url", ["/api/v1/jobs/", "/api/v1/reservations/", "/queue"])
def test_too_many_query_parameters_are_a_json_400(alice, url):
    """The text middleware reads the query before DRF: Django's refusal is still the API's."""
    response = alice.get(url + "?" + "&".join(f"a{i}=1" for i in range(10)))
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert "DATA_UPLOAD_MAX_NUMBER_FIELDS" in response.json()["detail"]


@override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=5)
def test_too_many_query_parameters_on_a_page_are_django_s_400(client):
    response = client.get("/accounts/login/?" + "&".join(f"a{i}=1" for i in range(10)))
    assert response.status_code == 400


def test_non_field_errors_are_under_detail(api_as, fleet):
    """One error format: what concerns no one field is ``detail``, a string."""
    operator = api_as("olga", "operator")
    gpu = Gpu.objects.first()
    response = operator.post(
        "/cluster/gpu-allocate", {"job_id": 1, "gpu_uuids": [gpu.uuid]}, format="json"
    )
    assert response.status_code == 404
    assert isinstance(response.json()["detail"], str)
    response = post(operator, "/cluster/gpu-allocate", "[1, 2]")
    assert response.status_code == 400
    assert isinstance(response.json()["detail"], str)


def test_the_schema_documents_the_one_error_format(alice):
    schema = alice.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    components = schema["components"]["schemas"]
    assert components["ValidationError"]["properties"] == {"detail": {"type": "string"}}
    assert components["Error"]["required"] == ["detail"]
    priority = schema["paths"]["/queue/{job_id}/priority"]["patch"]["responses"]
    assert priority["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ValidationError"
    }
    submit = schema["paths"]["/api/v1/jobs/"]["post"]["responses"]
    assert {"400", "401", "403", "413"} <= set(submit)
    assert "404" in schema["paths"]["/api/v1/jobs/{id}/"]["get"]["responses"]
