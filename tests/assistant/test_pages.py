"""The assistant's API endpoint and page: an answer as JSON, streamed to the page as
server-sent events, answered whole without script, and a page that says how to configure a
model when none is."""

from __future__ import annotations

import json

import pytest
from django.http import StreamingHttpResponse
from django.test import Client
from rest_framework.test import APIClient

from assistant.views import linked
from tests.assistant.chat_server import call, say

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(make_user):
    return make_user("alice")


def test_the_api_answers_with_citations_and_steps(model, alice, fleet):
    model(call(("node_health", {"hostname": "dgx-02"})), say("[dgx-02](/nodes/dgx-02/) is fine."))
    client = APIClient()
    client.force_login(alice)

    response = client.post("/api/v1/assistant/ask/", {"question": "Is dgx-02 healthy?"}, "json")

    assert response.status_code == 200, response.content
    assert response.json() == {
        "text": "[dgx-02](/nodes/dgx-02/) is fine.",
        "citations": [{"ref": "dgx-02", "url": "/nodes/dgx-02/"}],
        "steps": [
            {"name": "node_health", "arguments": '{"hostname": "dgx-02"}', "ok": True, "error": ""}
        ],
        "stopped": "",
    }
    bad = client.post("/api/v1/assistant/ask/", {"question": ""}, "json")
    assert bad.status_code == 400
    assert bad.json() == {"question": ["This field may not be blank."]}


def test_without_a_model_the_api_says_503_and_the_page_how_to_configure(alice, settings):
    settings.GPUADMIN_ASSISTANT_URL = ""
    api = APIClient()
    api.force_login(alice)
    page = Client()
    page.force_login(alice)

    response = api.post("/api/v1/assistant/ask/", {"question": "Anything?"}, "json")
    assert response.status_code == 503
    assert "GPUADMIN_ASSISTANT_URL" in response.json()["detail"]
    body = page.get("/assistant/").content.decode()
    assert "No model is configured" in body
    assert "GPUADMIN_ASSISTANT_URL=http://127.0.0.1:8001/v1" in body
    assert "assistant-form" not in body
    assert Client().get("/assistant/").status_code == 302  # signed-in people only


def test_the_page_streams_the_answer_and_answers_whole_without_script(model, alice, fleet):
    turns = [call(("list_gpus", {"node": "dgx-01", "limit": 1})), say("[GPU 0 of dgx-01] is free.")]
    model(*turns, *turns)  # streamed, then posted
    client = Client()
    client.force_login(alice)

    response = client.post("/assistant/stream/", {"question": "Which GPU is free?"})

    assert response["Content-Type"] == "text/event-stream"
    assert isinstance(response, StreamingHttpResponse)
    blocks = b"".join(response.streaming_content).decode().strip().split("\n\n")
    events = [
        (lines[0].removeprefix("event: "), json.loads(lines[1].removeprefix("data: ")))
        for lines in (block.split("\n") for block in blocks)
    ]
    assert events[0] == (
        "step",
        {
            "name": "list_gpus",
            "arguments": '{"node": "dgx-01", "limit": 1}',
            "ok": True,
            "error": "",
        },
    )
    texts = [data["text"] for name, data in events if name == "text"]
    assert len(texts) > 1
    assert "".join(texts) == "[GPU 0 of dgx-01] is free."
    name, answer = events[-1]
    assert name == "answer"
    assert answer["citations"] == [{"ref": "GPU 0 of dgx-01", "url": answer["citations"][0]["url"]}]
    assert answer["citations"][0]["url"].startswith("/gpus/")

    page = client.post("/assistant/", {"question": "Which GPU is free?"})
    body = page.content.decode()
    assert page.status_code == 200
    assert "[GPU 0 of dgx-01] is free." in body  # not a link to a page: left as it is
    assert f'<a href="{answer["citations"][0]["url"]}">GPU 0 of dgx-01</a>' in body
    assert "<code>list_gpus(" in body

    refused = client.post("/assistant/stream/", {"question": "  "})
    assert refused.status_code == 400
    assert refused.content == b'event: refused\ndata: {"detail": "ask a question"}\n\n'


def test_the_answers_links_to_gpuadmins_pages_are_made_links_and_nothing_else():
    text = "See [job 4](/jobs/4/), [x](//evil.example/), [y](javascript:alert(1)) & <b>."

    assert linked(text) == (
        'See <a href="/jobs/4/">job 4</a>, [x](//evil.example/), '
        "[y](javascript:alert(1)) &amp; &lt;b&gt;."
    )
