"""Real headless Chromium (Debian's `chromium` package) driven by Playwright."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.conftest import REPO_DIR

ARTIFACTS_DIR = REPO_DIR / "test-artifacts" / "screenshots"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(
            "Debian's chromium is not installed: run `apt-get install chromium` (.ci/run does)"
        )
    return path


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread, which Django's ORM
    # guard mistakes for async code; the ORM calls in these tests are ordinary sync calls.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, request) -> Iterator[object]:
    """A fresh page; its screenshot is saved under test-artifacts/ when the test ends."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    yield page
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS_DIR / f"{request.node.name}.png"), full_page=True)
    context.close()
