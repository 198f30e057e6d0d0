"""Every page of the site in real Chromium, at a laptop's 1440 px and a phone's 390 px: no
console error, no uncaught exception, no Content-Security-Policy violation, and no page wider
than the window (tables scroll inside their cards, the navigation folds behind a button).

The admin's pages are visited as an admin, the login page anonymously and the 403 page as an
ordinary user; the list of pages is checked against the URL patterns, so that a page added
later is swept too (or named in ``NOT_PAGES`` with the reason)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from gpuadmin.access.models import Role
from gpuadmin.celery import app
from gpuadmin.text import is_api_view
from health.alerts import open_alert
from integrations.ray.models import RayCluster, RayJob
from inventory.models import Node
from scheduling.models import Quota
from scheduling.reservations import services as reservations
from tests.browser.polling import on_clock, run_polls
from tests.browser.test_csp import RECORD_VIOLATIONS
from tests.browser.test_scheduling_pages import log_in
from tests.inventory.pages import add_node, unique_host
from tests.scheduling.pages.helpers import AgentBroker, person, place, submit

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = {"laptop": (1440, 900), "phone": (390, 844)}
# Routes that are no page of their own: form targets (POST only), HTMX partials, downloads,
# the API's JSON routes (the browsable API's root stands for them), and Django's password
# views, which the login page does not link to.
NOT_PAGES = (
    "/cancel/",
    "/release/",
    "/approve/",
    "/reject/",
    "/delete/",
    "/state/",
    "/mig/create/",
    "/destroy/",
    "/mig-relayout/",
    "alerts/panel/",
    "/ack/",
    "usage.csv",
    "favicon.ico",
    "-/health",
    "metrics",
    "api/schema/",
    "accounts/logout/",
    "accounts/password_",
    "accounts/reset/",
    "assistant/stream/",
)
# Live regions poll (hx-trigger="every 2s"): two polls each and their swaps, since the second
# swaps into what the first left (a target the first swap lost is an error only then).
POLL_ROUNDS = 2


# The elements that reach past the window's right edge, innermost first (the culprits).
WIDEST = """
const past = (e) => e.getBoundingClientRect().right > window.innerWidth + 1;
[...document.querySelectorAll("body *")]
  .filter((e) => past(e) && ![...e.children].some(past))
  .slice(0, 3)
  .map((e) => e.tagName.toLowerCase() + (e.className ? "." + e.className : "") + " "
    + Math.round(e.getBoundingClientRect().right))
"""


@pytest.fixture(autouse=True)
def agents(monkeypatch) -> AgentBroker:
    broker = AgentBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    return broker


def page_routes() -> set[str]:
    """The routes of the site's pages (``node/<str:hostname>/``), from the URL patterns."""
    routes: set[str] = set()

    def walk(patterns: list[URLPattern | URLResolver], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                if route != "admin/":  # the admin's pages: its index and one changelist
                    walk(pattern.url_patterns, route)
            elif not is_api_view(pattern.callback) and not any(part in route for part in NOT_PAGES):
                routes.add(route)

    walk(get_resolver().url_patterns, "")
    return routes


def the_site() -> dict[str, str]:
    """Something on every page (two nodes with live samples, a placed job, a reservation, a
    quota, an alert); returns each page's route and the path visited for it."""
    host = unique_host()
    gpu = add_node(host).gpus[0].facts.uuid
    add_node(unique_host("pcie"), "pcie-l40s-4x")  # a second node, on the fleet and in its polls
    alice = person("alice")
    job = submit(alice, gpu_count=2, name="sweep", project="vision")
    place(job)
    start = timezone.now() + timedelta(hours=2)
    reservations.request(alice, 1, start, start + timedelta(hours=3))
    quota = Quota.objects.create(project="vision", max_gpus=8)
    open_alert(
        fingerprint=f"sweep-{host}",
        severity="warning",
        summary="GPU 0 runs hot",
        node=Node.objects.get(hostname=host),
    )
    # A Ray cluster not read yet (nothing listens there), with a job not yet sent to it.
    ray = RayCluster.objects.create(name="lab", address="http://127.0.0.1:9")
    ray_job = RayJob.objects.create(
        owner=alice, cluster=ray, entrypoint="python train.py", gpus=1, submission_id="sweep-1"
    )
    return {
        "": "/",
        "accounts/login/": "/accounts/login/",
        "audit/": "/audit/",
        "assistant/": "/assistant/",
        "fleet/": "/fleet/",
        "nodes/<str:hostname>/": f"/nodes/{host}/",
        "nodes/<str:hostname>/mig/": f"/nodes/{host}/mig/",
        "nodes/<str:hostname>/topology/": f"/nodes/{host}/topology/",
        "nodes/<str:hostname>/calendar/": f"/nodes/{host}/calendar/",
        "gpus/<str:uuid>/": f"/gpus/{gpu}/",
        "gpus/<str:uuid>/calendar/": f"/gpus/{gpu}/calendar/",
        "jobs/": "/jobs/",
        "jobs/new/": "/jobs/new/",
        "jobs/<int:pk>/": f"/jobs/{job.pk}/",
        "jobs/<int:pk>/log/": f"/jobs/{job.pk}/log/",
        "usage/": "/usage/",
        "ray/": "/ray/",
        "ray/jobs/new/": "/ray/jobs/new/",
        "ray/jobs/<int:pk>/": f"/ray/jobs/{ray_job.pk}/",
        "ray/jobs/<int:pk>/log/": f"/ray/jobs/{ray_job.pk}/log/",
        "reservations/": "/reservations/",
        "policies/": "/policies/",
        "policies/<str:pool>/": "/policies/~/",
        "quotas/": "/quotas/",
        "quotas/new/": "/quotas/new/",
        "quotas/<int:pk>/": f"/quotas/{quota.pk}/",
        "fairshare/": "/fairshare/",
        "alerts/": "/alerts/",
        "alerts/idle/": "/alerts/idle/",
        "api/docs/": "/api/docs/",
        "api/v1/": "/api/v1/",
        "api/v1/jobs/": "/api/v1/jobs/",
        "admin/": "/admin/",
        "admin/inventory/gpu/": "/admin/inventory/gpu/",
        "404": "/no-such-page/",
        # Not built for the tests (the site's own tests build it): the 404 saying how.
        "docs/": "/docs/",
        "docs/<path:page>": "/docs/reference/",
    }


def problems(page, url: str, status: int = 200) -> list[str]:  # noqa: ANN001 - a Page
    """What is wrong with the page at ``url``: its status, console errors, uncaught errors,
    CSP violations, and a document wider than the window."""
    found: list[str] = []

    def on_console(message) -> None:  # noqa: ANN001 - a ConsoleMessage
        # Chromium reports a document answered 403/404 as a failed load; that one is meant.
        own = message.location.get("url") == url and f"status of {status}" in message.text
        if message.type == "error" and not own:
            found.append(f"console: {message.text}")

    def on_error(error) -> None:  # noqa: ANN001 - an Error
        found.append(f"pageerror: {error}")

    page.on("console", on_console)
    page.on("pageerror", on_error)
    try:
        response = page.goto(url)
        if response.status != status:
            found.append(f"status {response.status}")
        run_polls(page, POLL_ROUNDS)
        page.wait_for_timeout(300)  # errors and violations are queued as tasks
        found.extend(f"CSP: {violation}" for violation in page.evaluate("window.__csp || []"))
        width, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        if width > inner:
            found.append(f"{width} px wide in a {inner} px window: {page.evaluate(WIDEST)}")
    finally:
        page.remove_listener("console", on_console)
        page.remove_listener("pageerror", on_error)
    return found


def sweep(  # noqa: ANN201
    browser,  # noqa: ANN001 - a Browser
    live_server,  # noqa: ANN001
    user,  # noqa: ANN001 - a User or None (anonymous)
    paths: list[str],
    viewport: tuple[int, int],
    status: int = 200,
):
    """The problems of each path that has some, visited in one context of ``user``."""
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    try:
        if user is not None:
            log_in(context, live_server, user)
        context.add_init_script(RECORD_VIOLATIONS)
        on_clock(context)
        page = context.new_page()
        found = {path: problems(page, live_server.url + path, status) for path in paths}
        return {path: found for path, found in found.items() if found}
    finally:
        context.close()


def test_the_sweep_names_every_page():
    """Besides the pages: the API's docs and browsable root, the admin, the 404 page and the
    documentation's."""
    assert page_routes() - set(the_site()) == set()


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_at_laptop_and_phone_width(browser, live_server, width):
    paths = the_site()
    root = get_user_model().objects.create_superuser("root", "root@example.org", "pw-root-123")
    viewport = WIDTHS[width]
    login = paths.pop("accounts/login/")
    missing = [paths.pop(route) for route in ("404", "docs/", "docs/<path:page>")]
    found = sweep(browser, live_server, root, list(paths.values()), viewport)
    found |= sweep(browser, live_server, root, missing, viewport, status=404)
    found |= sweep(browser, live_server, None, [login], viewport)
    # An ordinary user may not edit a pool's policy: the 403 page.
    viewer = person("vic", Role.USER)
    found |= sweep(browser, live_server, viewer, ["/policies/~/"], viewport, status=403)
    assert found == {}, "\n".join(f"{path}: {found[path]}" for path in found)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_navigation_folds_behind_a_menu_button_on_a_phone(browser, live_server, width):
    root = get_user_model().objects.create_superuser("root", "root@example.org", "pw-root-123")
    viewport = WIDTHS[width]
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    log_in(context, live_server, root)
    page = context.new_page()
    try:
        page.goto(live_server.url + "/")
        menu = page.get_by_role("button", name="Menu")
        jobs = page.locator("#site-nav").get_by_role("link", name="Jobs", exact=True)
        logout = page.locator("#site-nav").get_by_role("button", name="Log out root")
        if width == "laptop":  # a row of links, no button
            assert not menu.is_visible()
            assert jobs.is_visible() and logout.is_visible()
            return
        assert not jobs.is_visible()
        menu.click()
        for item in (jobs, logout):  # the list opens inside the window
            box = item.bounding_box()
            assert item.is_visible() and box["x"] >= 0 and box["x"] + box["width"] <= viewport[0]
        page.keyboard.press("Escape")
        assert not jobs.is_visible()
        menu.click()
        jobs.click()
        page.wait_for_url(live_server.url + "/jobs/")
    finally:
        context.close()
