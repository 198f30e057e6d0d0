import pytest
from django.contrib.auth import get_user_model

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_home_page_runs_vendored_htmx_in_chromium(page, live_server):
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(live_server.url + "/")
    assert page.title() == "gpuadmin: fleet home"
    assert page.evaluate("typeof window.htmx") == "object"
    assert page.evaluate("htmx.version").startswith("2.")
    assert all(url.startswith(live_server.url) for url in requests), requests
    assert page.locator("dd.ok").count() == 2  # database and redis


def test_admin_login_in_chromium(page, live_server):
    get_user_model().objects.create_superuser("root", "root@example.org", "s3cret-pass-123")
    page.goto(live_server.url + "/admin/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "s3cret-pass-123")
    page.click("input[type=submit]")
    page.wait_for_url(live_server.url + "/admin/")
    assert page.locator("#site-name").inner_text() == "gpuadmin"
    assert page.get_by_role("link", name="Audit events").count() == 1
