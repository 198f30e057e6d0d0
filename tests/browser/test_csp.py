"""Every page works under the Content-Security-Policy: real Chromium reports no violation on
any of them (the dashboard's and the job page's polling, the MIG drawing, Swagger UI, the
admin), and the live regions still refresh."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from gpuadmin.celery import app
from inventory.models import Gpu
from tests.browser.polling import on_clock, poll_interval_ms, run_polls
from tests.browser.test_scheduling_pages import log_in
from tests.inventory.pages import add_node, unique_host
from tests.scheduling.pages.helpers import AgentBroker, person, place, submit

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Records violations from the first byte of each page (Playwright's init scripts are exempt).
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + e.sample);
});
"""


@pytest.fixture(autouse=True)
def agents(monkeypatch) -> AgentBroker:
    broker = AgentBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    return broker


def test_no_page_violates_the_content_security_policy(page, live_server):
    host = unique_host()
    gpu = add_node(host).gpus[0].facts.uuid
    alice = person("alice")
    job = submit(alice, gpu_count=2, name="csp")
    place(job)
    root = get_user_model().objects.create_superuser("root", "root@example.org", "pw-root-123")
    log_in(page.context, live_server, root)
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    page.add_init_script(RECORD_VIOLATIONS)
    on_clock(page)
    polled: list[str] = []
    page.on(
        "requestfinished",
        lambda request: polled.append(request.url) if request.headers.get("hx-request") else None,
    )

    pages = {
        "/": None,
        "/fleet/": "#fleet-live",
        f"/gpus/{gpu}/": "#gpu-live",
        f"/nodes/{host}/mig/": ".mig-instance",
        f"/nodes/{host}/topology/": "table.topo",
        "/jobs/": "#queue-live",
        f"/jobs/{job.pk}/": "#job-log pre",
        "/jobs/new/": "form",
        "/reservations/": "form.job-form",
        f"/nodes/{host}/calendar/": "table.calendar",
        "/api/docs/": ".swagger-ui .info",
        "/admin/": "#site-name",
        "/admin/inventory/gpu/": "#result_list",
        f"/admin/inventory/gpu/{Gpu.objects.get(uuid=gpu).pk}/change/": "#gpu_form",
    }
    violations: dict[str, list[str]] = {}
    for path, selector in pages.items():
        polled.clear()
        response = page.goto(live_server.url + path)
        assert "script-src 'self'" in response.headers["content-security-policy"], path
        if selector:
            page.locator(selector).first.wait_for(timeout=10_000)
        if selector and selector.endswith("-live"):
            run_polls(page, 1)
            page.wait_for_timeout(300)  # its requestfinished event reaches this process
            assert polled, f"{path} did not poll"
        found = page.evaluate("window.__csp")
        if found:
            violations[path] = found
    assert violations == {}
    assert [text for text in console if "Content Security Policy" in text] == []

    # The watch works: an inline <style> added now is refused and recorded.
    page.goto(live_server.url + "/")
    assert page.evaluate("htmx.config.allowEval") is False
    page.evaluate("document.head.append(Object.assign(document.createElement('style')))")
    page.wait_for_timeout(300)  # the violation event is queued as a task
    assert [v.split()[:2] for v in page.evaluate("window.__csp")] == [["style-src-elem", "inline"]]


def test_polling_pauses_while_the_tab_is_hidden(page, live_server):
    """The visibility rule moved from hx-trigger filters (evaluated: refused) to poll.js."""
    add_node(unique_host())
    root = get_user_model().objects.create_superuser("root", "root@example.org", "pw-root-123")
    log_in(page.context, live_server, root)
    on_clock(page)
    polled: list[str] = []
    page.on("request", lambda r: polled.append(r.url) if r.headers.get("hx-request") else None)
    page.goto(live_server.url + "/fleet/")
    sent = run_polls(page, 1)
    page.wait_for_timeout(300)  # its request event reaches this process
    assert polled  # visible: it polls
    page.evaluate("Object.defineProperty(document, 'visibilityState', {value: 'hidden'})")
    page.wait_for_timeout(300)  # a request already on its way
    polled.clear()
    for _ in range(2):  # two polls due, each skipped
        page.clock.fast_forward(poll_interval_ms(page))
    page.wait_for_timeout(300)
    assert polled == []
    assert page.evaluate("window.__polls.sent") == sent
