"""`gpuadmin serve` serves the built documentation site under /docs/ as it serves the static
files (WhiteNoise): folders' index pages, content types, the static files' caching headers,
each page under the Content-Security-Policy with its own inline scripts' hashes; a page the
site does not have is a 404, and no path reaches a file outside the site."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.gpuadmin.test_security_headers import directives

pytestmark = pytest.mark.integration


def get(base_url: str, path: str) -> tuple[int, http.client.HTTPMessage, str]:
    """``path`` sent as it is written (no client-side clean-up of ``..``): the status, the
    headers and the body."""
    address = urlsplit(base_url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.headers, response.read().decode(errors="replace")
    finally:
        connection.close()


def test_the_site_is_served_as_the_static_files_are(docs_server):
    _, static_headers, _ = get(docs_server, "/static/gpuadmin/gpuadmin.css")

    status, headers, body = get(docs_server, "/docs")
    assert (status, headers["Location"]) == (302, "docs/")

    status, headers, index = get(docs_server, "/docs/")
    assert status == 200
    assert headers["Content-Type"] == 'text/html; charset="utf-8"'
    assert headers["Cache-Control"] == static_headers["Cache-Control"]
    policy = directives(headers["Content-Security-Policy"])
    scripts = policy["script-src"]
    assert scripts[0] == "'self'" and len(scripts) > 1
    assert all(source.startswith("'sha256-") for source in scripts[1:])
    assert policy["style-src"] == ["'self'"]  # the rest is the app's policy
    assert "<title>gpuadmin</title>" in index

    status, headers, _ = get(docs_server, "/docs/reference/settings")
    assert (status, headers["Location"]) == (302, "settings/")
    status, _, settings_page = get(docs_server, "/docs/reference/settings/")
    assert status == 200
    assert "GPUADMIN_DOCS_DIR" in settings_page

    bundle = re.search(r'<script src="(assets/javascripts/bundle\.[0-9a-f]+\.min\.js)"', index)
    assert bundle is not None
    status, headers, _ = get(docs_server, f"/docs/{bundle[1]}")
    assert (status, headers["Content-Type"]) == (200, 'text/javascript; charset="utf-8"')

    status, headers, body = get(docs_server, "/docs/search/search_index.json")
    assert (status, headers["Content-Type"]) == (200, "application/json")
    locations = {entry["location"] for entry in json.loads(body)["docs"]}
    assert "reference/settings/" in locations


def test_what_the_site_does_not_hold_is_a_404(docs_server, built_docs: Path):
    status, headers, body = get(docs_server, "/docs/no-such-page/")
    assert status == 404
    assert headers["Content-Type"].startswith("text/html")
    assert "The documentation has no page at /docs/no-such-page/." in body

    secret = built_docs.parent / "secret.txt"
    secret.write_text("not part of the site")
    for path in (
        "/docs/../secret.txt",
        "/docs/%2e%2e/secret.txt",
        "/docs/..%2fsecret.txt",
        "/docs/assets/../../secret.txt",
        "/docs/%2e%2e%2fsecret.txt",
    ):
        status, _, body = get(docs_server, path)
        assert status in (400, 404), path
        assert "not part of the site" not in body, path
