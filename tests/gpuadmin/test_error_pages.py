"""The 403 (a refused form's too), 404 and 500 pages are the site's pages (its layout, why, a
way back); the API's paths answer JSON instead; the 500 page renders with the database out of
reach; the favicon; the browsable API within the Content-Security-Policy."""

from __future__ import annotations

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.core.exceptions import PermissionDenied
from django.db import InterfaceError, OperationalError
from django.test import Client, RequestFactory

from gpuadmin.access.models import Role
from gpuadmin.api import permission_denied, server_error
from tests.scheduling.pages.helpers import person

LAYOUT = '<header class="topbar">'


@pytest.mark.django_db
def test_a_page_not_found_is_the_sites_page_with_ways_back(client):
    response = client.get("/no-such-page/")
    html = response.content.decode()
    assert response.status_code == 404
    assert LAYOUT in html and '<h1 id="error-title">Not found (404)</h1>' in html
    assert "There is no page at <code>/no-such-page/</code>." in html
    assert '<a class="button" href="/">Home page</a>' in html
    assert '<a href="/accounts/login/?next=/no-such-page/">Log in</a>' in html


@pytest.mark.django_db
def test_a_404_says_what_is_missing_and_the_api_answers_json(client):
    client.force_login(person("ada", Role.ADMIN))
    html = client.get("/policies/nope/").content.decode()
    assert "No pool nope." in html and LAYOUT in html
    assert "Log in</a>" not in html  # signed in: the way back is the home page
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


@pytest.mark.django_db
def test_a_403_is_the_sites_page_saying_why(client):
    client.force_login(person("vic"))
    response = client.get("/policies/~/")
    html = response.content.decode()
    assert response.status_code == 403
    assert LAYOUT in html and "Not allowed (403)" in html
    assert "This needs the admin role; you are a user. You are signed in as vic." in html
    assert '<a class="button" href="/">Home page</a>' in html


@pytest.mark.django_db
def test_a_form_without_its_csrf_token_is_refused_on_the_sites_page():
    client = Client(enforce_csrf_checks=True)
    client.force_login(person("vic"))
    response = client.post("/accounts/logout/")
    html = response.content.decode()
    assert response.status_code == 403
    assert LAYOUT in html and "Form refused (403)" in html
    assert "The form came without a valid security (CSRF) token" in html
    assert '<a class="button" href="/">Home page</a>' in html


def test_a_403_under_the_apis_paths_is_json():
    request = RequestFactory().get("/api/v1/jobs/")
    response = permission_denied(request, PermissionDenied("Only admins."))
    assert (response.status_code, response["Content-Type"]) == (403, "application/json")
    assert response.content == b'{"detail": "Only admins."}'


def test_the_500_page_needs_no_database():
    """No database access is allowed here (no django_db mark): pytest-django refuses any."""
    response = server_error(RequestFactory().get("/fleet/"))
    html = response.content.decode()
    assert response.status_code == 500
    assert LAYOUT in html and "Server error (500)" in html
    assert '<a class="button" href="/">Home page</a>' in html
    api = server_error(RequestFactory().get("/api/v1/jobs/"))
    assert (api.status_code, api.content) == (500, b'{"detail": "A server error occurred."}')


@pytest.mark.django_db
def test_an_uncaught_error_answers_the_500_page(monkeypatch):
    from gpuadmin import views

    def broken(**_: object) -> dict[str, str]:
        raise RuntimeError("boom")

    monkeypatch.setattr(views, "_service_status", broken)
    response = Client(raise_request_exception=False).get("/")
    assert response.status_code == 500
    assert "Server error (500)" in response.content.decode()


@pytest.mark.django_db
def test_the_favicon(client):
    html = client.get("/").content.decode()
    assert '<link rel="icon" href="/static/gpuadmin/favicon.svg" type="image/svg+xml">' in html
    response = client.get("/favicon.ico")
    assert (response.status_code, response["Location"]) == (302, "/static/gpuadmin/favicon.svg")
    icon = client.get("/static/gpuadmin/favicon.svg")
    assert (icon.status_code, icon["Content-Type"]) == (200, "image/svg+xml")


@pytest.mark.django_db
def test_the_browsable_api_has_no_inline_style(client):
    """DRF's page inlines pygments' rules in a <style>, which the CSP refuses."""
    client.force_login(person("ada", Role.ADMIN))
    response = client.get("/api/v1/jobs/", headers={"accept": "text/html"})
    html = response.content.decode()
    assert response.status_code == 200 and "Django REST framework" in html
    assert "<style" not in html
    assert '<link rel="icon" href="/static/gpuadmin/favicon.svg"' in html


@pytest.mark.django_db
@pytest.mark.parametrize("error", [OperationalError, InterfaceError])
def test_a_page_while_the_database_is_away_is_a_503_not_a_500(monkeypatch, error):
    """The database restarting under a page (here: the session's lookup, in no view's code)
    is the site's 503 page with Retry-After, as the API answers; a server error stays a 500
    (tests/integration/test_faults.py restarts PostgreSQL for real)."""
    client = Client(raise_request_exception=False)
    client.force_login(person("vic"))

    def away(self: SessionStore, *args: object) -> None:
        raise error("connection to server at 127.0.0.1, port 5432 failed: Connection refused")

    monkeypatch.setattr(SessionStore, "load", away)
    response = client.get("/fleet/")
    html = response.content.decode()
    assert (response.status_code, response["Retry-After"]) == (503, "5")
    assert LAYOUT in html and "Database unavailable (503)" in html
    api = client.get("/api/v1/jobs/")
    assert (api.status_code, api["Retry-After"]) == (503, "5")
    assert api.json() == {"detail": "The database cannot be reached right now; retry shortly."}
