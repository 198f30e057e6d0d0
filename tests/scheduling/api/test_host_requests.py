"""Host CPUs and memory through the API and the CLI: taken, stored, audited and shown; any
other value is a 400 naming the field that writes nothing."""

from __future__ import annotations

import json

import pytest

from gpuadmin import cli, jobs_cli
from gpuadmin.audit.models import AuditEvent
from inventory.models import Node
from scheduling.jobs import limits, shape, submission
from scheduling.models import Job

pytestmark = pytest.mark.django_db

SUBMIT_URLS = ["/queue/submit", "/api/v1/jobs/"]
CPUS_MAX, MEMORY_MAX = (limits.SUBMISSION_LIMITS[name][1] for name in ("cpus", "host_memory_mib"))


@pytest.fixture
def alice(api_as, fleet):
    return api_as("alice")


@pytest.mark.parametrize("url", SUBMIT_URLS)
def test_a_job_asks_for_cpus_and_host_memory(alice, url):
    response = alice.post(
        url, {"command": "true", "cpus": 16, "host_memory_mib": 65536}, format="json"
    )

    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    assert (job.cpus, job.host_memory_mib) == (16, 65536)
    assert (response.json()["cpus"], response.json()["host_memory_mib"]) == (16, 65536)
    submitted = AuditEvent.objects.get(event_type="job.submitted")
    assert submitted.after is not None
    assert (submitted.after["cpus"], submitted.after["host_memory_mib"]) == (16, 65536)
    body = alice.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (body["cpus"], body["host_memory_mib"]) == (16, 65536)


def test_none_asked_is_zero_and_not_audited(alice):
    response = alice.post("/api/v1/jobs/", {"command": "true"}, format="json")

    assert (response.json()["cpus"], response.json()["host_memory_mib"]) == (0, 0)
    submitted = AuditEvent.objects.get(event_type="job.submitted")
    assert submitted.after is not None
    assert not {"cpus", "host_memory_mib"} & set(submitted.after)


HOSTILE = [
    -1,
    -(2**63),
    CPUS_MAX + 1,
    MEMORY_MAX + 1,
    2**31,
    2**64,
    10**30,
    1.5,
    "many",
    "64G",
    "",
    None,
    True,
    [],
    {},
    [4],
]


@pytest.mark.parametrize("field", ["cpus", "host_memory_mib"])
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_any_other_value_is_a_400_naming_the_field(alice, field, value):
    if field == "host_memory_mib" and value == CPUS_MAX + 1:
        value = MEMORY_MAX + 1  # in range for memory
    response = alice.post("/api/v1/jobs/", {"command": "true", field: value}, format="json")

    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert not Job.objects.exists()
    assert not AuditEvent.objects.filter(event_type="job.submitted").exists()


@pytest.mark.parametrize("text", ["1e999", "NaN", "-Infinity", "1" * 5000])
def test_numbers_json_cannot_hold_are_a_400_too(alice, text):
    body = f'{{"command": "true", "cpus": {text}}}'

    response = alice.post("/api/v1/jobs/", body, content_type="application/json")

    assert response.status_code == 400, response.content
    assert "cpus" in response.json() or "detail" in response.json()
    assert not Job.objects.exists()


def test_the_largest_values_are_taken_where_no_host_size_is_known(alice):
    Node.objects.update(cpu_count=None, memory_total_mib=None)  # no agent reported its host
    shape.FleetShape.forget()

    response = alice.post(
        "/api/v1/jobs/",
        {"command": "true", "cpus": CPUS_MAX, "host_memory_mib": MEMORY_MAX},
        format="json",
    )

    assert response.status_code == 201, response.json()
    assert (Job.objects.get().cpus, Job.objects.get().host_memory_mib) == (CPUS_MAX, MEMORY_MAX)


# --------------------------------------------------------------------------- the CLI


@pytest.fixture
def sent(monkeypatch) -> dict:
    """What ``gpuadmin jobs submit`` sends (no server)."""
    body: dict = {}

    def call(api, method, path, body_sent=None, **params):
        body.update(body_sent)
        defaults = {"node_count": 1, "gpu_model": "", "min_gpu_memory_mib": 0, "topology": "any"}
        return {**defaults, **body_sent, "id": 1, "state": "queued"}

    monkeypatch.setattr(jobs_cli.Api, "call", call)
    return body


@pytest.mark.parametrize(
    ("mem", "mib"), [("64G", 65536), ("512M", 512), ("2048", 2048), ("1T", 1048576)]
)
def test_cli_mem_takes_slurm_sizes(sent, capsys, mem, mib):
    argv = ["jobs", "submit", "--gpus", "1", "--cpus", "16", "--mem", mem, "--", "true"]

    assert cli.main(argv) == 0

    assert (sent["cpus"], sent["host_memory_mib"]) == (16, mib)
    out = capsys.readouterr().out
    assert out.startswith("job 1 submitted: queued (1 GPU x 1 node, 16 CPUs, ")


@pytest.mark.parametrize("argv", [["--mem", "64GB"], ["--mem", "1.5G"], ["--cpus", "many"]])
def test_cli_refuses_a_bad_size_before_sending(sent, capsys, argv):
    with pytest.raises(SystemExit) as exited:
        cli.main(["jobs", "submit", *argv, "--", "true"])

    assert exited.value.code == 2
    assert argv[0] in capsys.readouterr().err
    assert not sent


def test_cli_show_says_what_the_job_asks_of_each_host(alice, capsys, monkeypatch):
    job = submission.submit_job(alice.user, command=["true"], cpus=8, host_memory_mib=32768)
    body = json.loads(json.dumps(alice.get(f"/api/v1/jobs/{job.pk}/").json()))
    monkeypatch.setattr(jobs_cli.Api, "call", lambda *args, **kwargs: body)

    assert cli.main(["jobs", "show", str(job.pk)]) == 0

    assert "  host:        8 CPUs, 32 GiB RAM per node\n" in capsys.readouterr().out
