"""The documentation site as `gpuadmin serve` serves it, in real Chromium: its navigation and
its search (Material's scripts, the search worker, the index) work under the
Content-Security-Policy, with no violation and no console error."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.test_csp import RECORD_VIOLATIONS

pytestmark = pytest.mark.browser


def test_the_documentation_navigates_and_searches_under_the_policy(page, docs_server):
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
    page.on(
        "console",
        lambda message: errors.append(message.text) if message.type == "error" else None,
    )
    page.add_init_script(RECORD_VIOLATIONS)

    page.goto(f"{docs_server}/docs")
    assert page.url == f"{docs_server}/docs/"
    expect(page).to_have_title("gpuadmin")

    page.locator("nav.md-nav--primary").get_by_role("link", name="Settings", exact=True).click()
    expect(page).to_have_url(f"{docs_server}/docs/reference/settings/")
    expect(page).to_have_title("Settings - gpuadmin")

    search = page.locator("input.md-search__input")
    search.click()
    # Typed key by key, as a person types: Material reads the query on a key's release (or
    # when its search worker becomes ready), not on the input event that fill() sends alone;
    # a query filled in after the worker was ready would never be read.
    search.press_sequentially("quarantine")
    results = page.locator(".md-search-result__item")
    # The search index loads in a web worker: seconds on a loaded 2-core machine.
    expect(results.first).to_be_visible(timeout=30_000)
    expect(page.locator(".md-search-result__meta")).to_contain_text("matching document")
    results.first.locator("a").first.click()
    expect(page.locator("article")).to_contain_text("quarantine")
    assert page.url.startswith(f"{docs_server}/docs/")

    assert page.evaluate("window.__csp") == []
    assert errors == []
