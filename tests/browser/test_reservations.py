"""The reservation calendar in real Chromium: a reservation is a bar across its hours, and the
week changes in place through HTMX (the URL pushed, the page not reloaded)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from gpuadmin.celery import app
from scheduling.reservations import services as reservations
from scheduling.reservations.pages import week_start
from tests.browser.test_scheduling_pages import log_in
from tests.inventory.pages import add_node, unique_host
from tests.scheduling.pages.helpers import AgentBroker, person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def agents(monkeypatch) -> AgentBroker:
    broker = AgentBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    return broker


def test_the_week_changes_in_place(page, live_server):
    host = unique_host()
    add_node(host)
    alice = person("alice")
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    next_week = week_start(timezone.localdate(start) + timedelta(days=7))
    if start + timedelta(hours=8) > next_week:  # late on a Sunday: the week would cut it short
        start = next_week + timedelta(hours=1)
    reservation = reservations.request(alice, 2, start, start + timedelta(hours=8))
    log_in(page.context, live_server, alice)
    page.goto(f"{live_server.url}/nodes/{host}/calendar/?week={timezone.localdate(start)}")
    bar = page.locator("td.cal-mine").first
    assert bar.inner_text() == f"#{reservation.pk} alice"
    assert bar.get_attribute("colspan") == "8"
    width = bar.bounding_box()["width"]
    hour = page.locator("table.calendar col.cal-slot").first.bounding_box()["width"]
    assert width == pytest.approx(8 * hour, abs=2)
    page.evaluate("window.__same_page = true")
    heading = page.locator("#week-title").inner_text()
    page.get_by_role("link", name="next week").click()
    expect(page.locator("#week-title")).not_to_have_text(heading)
    assert page.evaluate("window.__same_page") is True  # swapped, not reloaded
    assert "?week=" in page.url
    assert page.locator("td.cal-mine").count() == 0  # next week holds nothing


def test_a_half_hour_reservation_is_readable(page, live_server):
    """A 30-minute reservation takes one hour column (a few pixels wide at 1440 px): its chip
    still shows a readable label, whole, at a readable height, with the full text as its
    tooltip."""
    host = unique_host()
    add_node(host)
    alice = person("alice")
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    reservation = reservations.request(alice, 1, start, start + timedelta(minutes=30))
    log_in(page.context, live_server, alice)
    # The week it is in (the next one, late on a Sunday): the calendar shows Monday to Sunday.
    page.goto(f"{live_server.url}/nodes/{host}/calendar/?week={timezone.localdate(start)}")
    bar = page.locator("td.cal-mine").first
    assert bar.get_attribute("colspan") == "1"
    chip = bar.locator(".cal-chip")
    expect(chip).to_be_visible()
    box = chip.bounding_box()
    assert box["height"] >= 20
    text = chip.inner_text()
    assert text and text in f"#{reservation.pk} alice"
    # The whole label is drawn: nothing cut off by the chip's box or an ellipsis.
    assert chip.evaluate("e => e.scrollWidth <= e.clientWidth && e.scrollHeight <= e.clientHeight")
    size = chip.evaluate("e => parseFloat(getComputedStyle(e).fontSize)")
    assert size >= 11
    assert box["width"] >= len(text) * size * 0.5  # room for its characters
    assert f"Reservation {reservation.pk} of alice" in chip.get_attribute("title")
