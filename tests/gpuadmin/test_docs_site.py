"""/docs/ when the documentation site has not been built (the page saying how), the link to it
from every page, and each page's policy: the app's, with its own inline scripts' hashes.
Serving a built site through `gpuadmin serve`: tests/integration/test_docs_site.py."""

from __future__ import annotations

import base64
import hashlib

import pytest
from django.conf import settings

from gpuadmin import csp
from gpuadmin.docs_site import page_policy
from tests.gpuadmin.test_security_headers import directives


def sha256_source(script: str) -> str:
    return f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"


@pytest.mark.parametrize("path", ["/docs/", "/docs/reference/settings/"])
def test_an_unbuilt_site_answers_how_to_build_it(client, path):
    response = client.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "text/html; charset=utf-8"
    body = response.content.decode()
    assert "The documentation site has not been built. Run `make docs`" in body
    assert "Traceback" not in body


def test_docs_without_its_slash_is_sent_to_it(client):
    response = client.get("/docs")
    assert (response.status_code, response["Location"]) == (301, "/docs/")


def test_every_page_links_the_documentation(client):
    assert '<a href="/docs/">Docs</a>' in client.get("/accounts/login/").content.decode()


def test_a_page_may_run_its_own_inline_scripts_and_nothing_more():
    html = (
        "<html><head><script>var a = 1;</script><script src='bundle.js'></script>"
        '<script id="__config" type="application/json">{"base": "."}</script></head>'
        "<body><script>var a = 1;</script><script>var b = 2;</script></body></html>"
    )
    scripts = ["'self'", sha256_source("var a = 1;"), sha256_source("var b = 2;")]
    app = directives(csp.policy(settings.CONTENT_SECURITY_POLICY))
    assert directives(page_policy(html)) == {**app, "script-src": scripts}
