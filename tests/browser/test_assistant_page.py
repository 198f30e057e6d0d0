"""The assistant's page in real Chromium: the answer streams in from a real chat-completions
server (scripted), with the tool call it made and a link to the alert it cites, under the
Content-Security-Policy (its script is a static file)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from health.alerts import open_alert
from tests.assistant.chat_server import ChatServer, call, say
from tests.browser.test_csp import RECORD_VIOLATIONS
from tests.browser.test_scheduling_pages import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def model(settings) -> Iterator[ChatServer]:
    server = ChatServer([call(("list_alerts", {"state": "firing"}))]).start()
    settings.GPUADMIN_ASSISTANT_URL = server.url
    settings.GPUADMIN_ASSISTANT_MODEL = "scripted-model"
    yield server
    server.stop()


def test_the_answer_streams_in_with_its_steps_and_citations(page, live_server, model):
    alert = open_alert(fingerprint="hot", severity="warning", summary="GPU 0 of dgx-01 runs hot")
    answer = (
        f"One alert fires: GPU 0 of dgx-01 runs hot ([alert {alert.pk}](/alerts/?id={alert.pk}))."
    )
    model.script.append(say(answer))
    log_in(page.context, live_server, User.objects.create_user("alice"))
    page.context.add_init_script(RECORD_VIOLATIONS)

    page.goto(live_server.url + "/assistant/")
    page.get_by_label("Question").fill("What is firing?")
    page.get_by_role("button", name="Ask").click()

    page.locator("#assistant-citations a").wait_for()
    text = page.locator("#assistant-text")
    assert text.inner_text() == f"One alert fires: GPU 0 of dgx-01 runs hot (alert {alert.pk})."
    assert text.locator("a").get_attribute("href") == f"/alerts/?id={alert.pk}"
    assert page.locator("#assistant-steps").inner_text() == 'list_alerts({"state": "firing"})'
    link = page.locator("#assistant-citations a")
    assert link.inner_text() == f"alert {alert.pk}"
    assert link.get_attribute("href") == f"/alerts/?id={alert.pk}"
    assert page.url == live_server.url + "/assistant/"  # streamed: the page stayed
    assert page.evaluate("window.__csp") == []
    assert [message["role"] for message in model.requests[1]["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
