"""``gpuadmin ask``: the assistant from a terminal, through a live server to the scripted
chat-completions server: the answer and its sources, ``--json``, an answer cut short, and no
model configured (the API's 503) as one line and status 1."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model

from scheduling.models import Job, JobState
from tests.assistant.chat_server import Scripted, call, say
from tests.scheduling.api.conftest import submit
from tests.scheduling.api.test_cli import gpuadmin  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

WHY = "2 GPUs of model A100 asked for; the pool has none free"


@pytest.fixture
def waiting(gpuadmin, fleet) -> Job:  # noqa: F811
    alice = get_user_model().objects.get(username="alice")
    job = submit(alice, name="train-llm", gpu_count=2, command=["train.py"])
    Job.objects.filter(pk=job.pk).update(
        state=JobState.QUEUED, pending_code="resources", pending_reason=WHY, queue_position=1
    )
    return job


def test_the_answer_is_printed_with_its_sources(gpuadmin, waiting, model, live_server):  # noqa: F811
    url = f"/jobs/{waiting.pk}/"
    server = model(
        call(("get_job", {"job_id": waiting.pk})), say(f"[Job {waiting.pk}]({url}) waits: {WHY}.")
    )

    status, out, err = gpuadmin("ask", "why", "is", "my", "job", str(waiting.pk), "waiting?")

    assert (status, err) == (0, "")
    assert out == (
        f"[Job {waiting.pk}]({url}) waits: {WHY}.\n"
        "\n"
        "sources:\n"
        f"  job {waiting.pk}: {live_server.url}{url}\n"
    )
    first = server.requests[0]
    assert first["messages"][-1]["content"] == f"why is my job {waiting.pk} waiting?"


def test_json_is_the_apis_answer(gpuadmin, waiting, model):  # noqa: F811
    model(say("Nothing is wrong."))

    status, out, _ = gpuadmin("ask", "--json", "anything wrong?")

    assert status == 0
    assert json.loads(out) == {
        "text": "Nothing is wrong.",
        "citations": [],
        "steps": [],
        "stopped": "",
    }


def test_an_answer_cut_short_says_why(gpuadmin, model):  # noqa: F811
    model(Scripted(status=500))

    status, out, _ = gpuadmin("ask", "anything?")

    assert status == 0
    assert out.startswith("stopped: the model's endpoint failed: HTTP 500 from ")


def test_no_model_configured_is_one_line_and_status_1(gpuadmin, settings):  # noqa: F811
    settings.GPUADMIN_ASSISTANT_URL = ""

    status, out, err = gpuadmin("ask", "anything?")

    assert (status, out) == (1, "")
    assert err == (
        "gpuadmin ask: HTTP 503: The assistant has no model: set GPUADMIN_ASSISTANT_URL (and "
        "GPUADMIN_ASSISTANT_MODEL) to an OpenAI-compatible chat-completions endpoint.\n"
    )
