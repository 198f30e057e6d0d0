"""The submit form: a job as typed becomes ``submit_job``'s arguments; the service's refusals
and the form's own checks show on their fields, never as a server error."""

from __future__ import annotations

import re

import pytest

from scheduling.models import Job, JobState
from tests.scheduling.pages.helpers import add_fleet

pytestmark = pytest.mark.django_db

VALID = {
    "command": "python train.py --lr '0.1 0.2'",
    "name": "finetune",
    "project": "llm",
    "gpu_count": "2",
    "node_count": "1",
    "gpu_model": "",
    "min_gpu_memory_gib": "",
    "topology": "nvlink",
    "priority": "high",
    "max_runtime": "",
    "estimated_duration": "",
    "max_retries": "0",
    "env": "",
    "working_dir": "",
}


def field_errors(html: str) -> dict[str, str]:
    return dict(
        re.findall(r'<div class="field-error bad" id="id_(\w+)-error">(.*?)</div>', html, re.S)
    )


def test_the_form_offers_the_fleets_gpu_models(client, alice):
    add_fleet(1)
    add_fleet(1, "dgx-h100")
    client.force_login(alice)
    html = client.get("/jobs/new/").content.decode()
    select = re.search(r'<select name="gpu_model".*?</select>', html, re.S)[0]
    assert re.findall(r'<option value="([^"]*)"', select) == [
        "",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA H100 80GB HBM3",
    ]
    assert '<option value="NVIDIA A100-SXM4-80GB">A100-SXM4-80GB</option>' in select


def test_a_valid_submission_lands_on_the_job_page(client, alice, agents):
    add_fleet()
    client.force_login(alice)
    form = VALID | {
        "gpu_model": "NVIDIA A100-SXM4-80GB",
        "min_gpu_memory_gib": "40.5",
        "max_runtime": "2:00:00",
        "estimated_duration": "1 00:00:00",
        "max_retries": "2",
        "env": "SEED=1\n# a comment\n\nNOTE=a=b \n",
        "working_dir": "/data/run",
    }

    response = client.post("/jobs/new/", form, follow=True)

    job = Job.objects.get()
    assert response.redirect_chain == [(f"/jobs/{job.pk}/", 302)]
    html = response.content.decode()
    assert f"Job {job.pk} submitted." in html
    assert "<dt>Max runtime</dt><dd>2 h</dd>" in html
    assert "<dt>Estimated duration</dt><dd>1 day</dd>" in html
    assert job.owner == alice
    assert job.command == ["python", "train.py", "--lr", "0.1 0.2"]
    assert not job.use_shell
    assert (job.gpu_count, job.node_count, job.topology, job.priority) == (2, 1, "nvlink", "high")
    assert job.min_gpu_memory_mib == 41472
    assert (job.max_runtime_s, job.estimated_duration_s, job.max_retries) == (7200, 86400, 2)
    assert job.env == {"SEED": "1", "NOTE": "a=b "}
    assert (job.name, job.project, job.working_dir) == ("finetune", "llm", "/data/run")
    assert job.state == JobState.QUEUED


def test_a_shell_command_is_kept_whole(client, alice, agents):
    add_fleet()
    client.force_login(alice)
    client.post("/jobs/new/", VALID | {"command": "echo $HOME; ls 'x", "use_shell": "on"})
    job = Job.objects.get()
    assert (job.command, job.use_shell) == (["echo $HOME; ls 'x"], True)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        # refused by the service, which knows the fleet
        ({"gpu_count": "9"}, "gpu_count", "9 GPUs per node, but no node has more than 8 GPUs"),
        ({"node_count": "2", "gpu_count": "8"}, "node_count", "2 nodes with 8 GPUs each, but"),
        ({"min_gpu_memory_gib": "200"}, "min_gpu_memory_gib", "200 GiB per GPU, but the"),
        (
            {"max_runtime": "100 00:00:00"},
            "max_runtime",
            "Ensure this value is less than or equal to 7776000.",
        ),
        (
            {"estimated_duration": "0"},
            "estimated_duration",
            "Ensure this value is greater than or equal to 1.",
        ),
        ({"env": "CUDA_VISIBLE_DEVICES=0"}, "env", "CUDA_VISIBLE_DEVICES is reserved"),
        ({"command": "''"}, "command", "empty command"),
        # refused by the form
        ({"command": "python 'unclosed"}, "command", "cannot split into arguments: No closing"),
        ({"env": "SEED=1\nnot a pair"}, "env", "line 2: expected KEY=VALUE, got &#x27;not a pair"),
        ({"env": "A=1\nA=2"}, "env", "line 2: A is set twice"),
        ({"gpu_count": "0"}, "gpu_count", "Ensure this value is greater than or equal to 1."),
        ({"gpu_model": "NVIDIA B300"}, "gpu_model", "Select a valid choice."),
        ({"max_runtime": "soon"}, "max_runtime", "Enter a valid duration."),
        ({"max_runtime": "1.9"}, "max_runtime", "Enter a whole number of seconds."),
        ({"max_retries": "21"}, "max_retries", "Ensure this value is less than or equal to 20."),
    ],
)
def test_refusals_show_on_their_field(client, alice, agents, changes, field, message):
    add_fleet()
    client.force_login(alice)

    response = client.post("/jobs/new/", VALID | changes)

    assert response.status_code == 200
    errors = field_errors(response.content.decode())
    assert list(errors) == [field], errors
    assert errors[field].startswith(message), errors[field]
    assert not Job.objects.exists()


# (form field, form value, API field, API value): out of the service's SUBMISSION_LIMITS.
OUT_OF_RANGE = [
    ("gpu_count", "0", "gpu_count", 0),
    ("gpu_count", "65", "gpu_count", 65),
    ("node_count", "0", "node_count", 0),
    ("node_count", "1025", "node_count", 1025),
    ("max_retries", "21", "max_retries", 21),
    ("max_runtime", "7776001", "max_runtime_s", 7_776_001),
    ("estimated_duration", "0", "estimated_duration_s", 0),
    ("cpus", "-1", "cpus", -1),
    ("cpus", "65537", "cpus", 65_537),
]


@pytest.mark.parametrize(("field", "typed", "api_field", "sent"), OUT_OF_RANGE)
def test_the_form_and_the_api_refuse_the_same_values_in_the_same_words(
    client, alice, agents, field, typed, api_field, sent
):
    add_fleet()
    client.force_login(alice)
    page = client.post("/jobs/new/", VALID | {field: typed})
    api = client.post("/api/v1/jobs/", {"command": "true", api_field: sent}, "application/json")
    assert api.status_code == 400, api.content
    [message] = api.json()[api_field]
    assert field_errors(page.content.decode()) == {field: message}
    assert not Job.objects.exists()


def test_an_empty_post_shows_the_required_fields(client, alice):
    add_fleet()
    client.force_login(alice)
    errors = field_errors(client.post("/jobs/new/", {}).content.decode())
    assert set(errors) == {
        "command",
        "gpu_count",
        "node_count",
        "topology",
        "priority",
        "max_retries",
    }


def test_viewers_cannot_submit(client, viewer):
    add_fleet()
    client.force_login(viewer)
    assert client.get("/jobs/new/").status_code == 403
    assert client.post("/jobs/new/", VALID).status_code == 403
    assert not Job.objects.exists()


def test_submitting_needs_a_login(client):
    response = client.post("/jobs/new/", VALID)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_the_form_submits_every_field_the_api_takes(alice):
    """A field added to the submit API needs its field on the page (what the form names
    differently stands for the same job field: GiB for MiB, a duration for seconds)."""
    from scheduling.jobs.api.serializers import JobSubmitSerializer
    from scheduling.jobs.forms import SubmitJobForm

    add_fleet(1)
    form = SubmitJobForm(VALID | {"preemptible": "on", "hold": "on"}, user=alice)
    assert form.is_valid(), form.errors
    submission = form.submission()
    assert set(submission) == set(JobSubmitSerializer().fields)
    assert (submission["preemptible"], submission["hold"]) == (True, True)


def test_a_held_preemptible_job_from_the_page_is_released_from_its_page(client, alice):
    add_fleet(1)
    client.force_login(alice)
    image = "registry.example/train:1.2"
    form = VALID | {"preemptible": "on", "hold": "on", "container_image": image}
    response = client.post("/jobs/new/", form)
    assert response.status_code == 302, field_errors(response.content.decode())
    job = Job.objects.get()
    assert (job.state, job.preemptible, job.container_image) == (JobState.PENDING, True, image)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<dt>Preemptible</dt><dd>yes:" in html
    assert f'action="/jobs/{job.pk}/release/"' in html
    assert client.post(f"/jobs/{job.pk}/release/").status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert (
        f'action="/jobs/{job.pk}/release/"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    )
    client.post(f"/jobs/{job.pk}/release/")  # not held any more: a message, no change
    assert "not held" in client.get(f"/jobs/{job.pk}/").content.decode()
