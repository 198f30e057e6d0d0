"""Security headers on pages and API answers, and `manage.py check --deploy` clean under
production settings (DEBUG off, a real key, the SECURE_* variables of
docs/reference/settings.md)."""

from __future__ import annotations

import secrets
import subprocess
import sys

import pytest

from tests.conftest import REPO_DIR

pytestmark = pytest.mark.django_db

HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def directives(header: str) -> dict[str, list[str]]:
    parts = (part.split() for part in header.split(";"))
    return {words[0]: words[1:] for words in parts if words}


@pytest.mark.parametrize(
    "path", ["/", "/fleet/", "/jobs/", "/api/docs/", "/api/v1/gpus/", "/api/schema/", "/-/health"]
)
def test_every_answer_carries_the_security_headers(admin_client, path):
    response = admin_client.get(path)
    assert response.status_code == 200
    for name, value in HEADERS.items():
        assert response[name] == value, name
    policy = directives(response["Content-Security-Policy"])
    assert policy["script-src"] == ["'self'"]  # no inline or evaluated script
    assert policy["style-src"] == ["'self'"]  # no inline <style>
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["object-src"] == ["'none'"]
    assert "Strict-Transport-Security" not in response  # plain HTTP, HSTS off by default


def test_anonymous_and_error_answers_carry_them_too(client):
    for response in (client.get("/accounts/login/"), client.get("/api/v1/jobs/")):
        assert "script-src 'self'" in response["Content-Security-Policy"]
        assert response["X-Frame-Options"] == "DENY"


def test_hsts_is_sent_over_https_when_configured(client, settings):
    settings.SECURE_HSTS_SECONDS = 31_536_000
    response = client.get("/accounts/login/", headers={"X-Forwarded-Proto": "https"})
    assert response["Strict-Transport-Security"] == "max-age=31536000"


def test_pages_have_no_inline_script_or_style_element(admin_client):
    for path in ("/", "/fleet/", "/jobs/", "/jobs/new/", "/api/docs/"):
        html = admin_client.get(path).content.decode()
        assert "<style" not in html, path
        assert html.count("<script") == html.count("<script src="), path


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
        "DATABASE_URL": "postgresql://u@h/db",
        "REDIS_URL": "redis://h",
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "gpuadmin.example.org",
    }
    return subprocess.run(
        [sys.executable, "-m", "django", "check", "--deploy", "--fail-level", "WARNING"],
        env={**base, **env},
        capture_output=True,
        text=True,
        cwd=REPO_DIR,
    )


@pytest.mark.django_db(False)
def test_check_deploy_is_clean_under_production_settings():
    production = {
        "SECURE_COOKIES": "true",
        "SECURE_SSL_REDIRECT": "true",
        "SECURE_HSTS_SECONDS": "31536000",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
        "SECURE_HSTS_PRELOAD": "true",
    }
    result = check_deploy(production)
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
    # The variables are what makes it clean: without them Django names each one.
    unset = check_deploy({})
    assert unset.returncode == 1
    for code in ("W004", "W008", "W012", "W016"):
        assert f"security.{code}" in unset.stderr
