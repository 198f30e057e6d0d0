"""The telemetry charts in real Chromium: uPlot draws the history API's data on the GPU, node
and fleet pages, the range buttons change the request, a drag zooms all four charts, health
events are marked, content swapped in by HTMX draws too, and nothing violates the CSP."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from health.choices import EventKind, Severity
from health.models import FleetRollup, GpuRollup, GpuSample, HealthEvent
from inventory.models import Gpu
from tests.browser.test_csp import RECORD_VIOLATIONS
from tests.inventory.pages import add_node, unique_host

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Pixels of a series' stroke in a chart's canvas; GREEN (#76b900) is the first colour of
# charts.js's palette.
GREEN = (118, 185, 0)
STROKE_PIXELS = """
([selector, [r, g, b]]) => {
  const canvas = document.querySelector(selector + " canvas");
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let found = 0;
  for (let i = 0; i < data.length; i += 4) {
    const near = (value, to) => Math.abs(value - to) < 12;
    if (near(data[i], r) && near(data[i + 1], g) && near(data[i + 2], b)) {
      found++;
    }
  }
  return found;
}
"""
UTILIZATION = '[data-chart-metric="utilization"]'
PAGES_TIME_S = 25  # at most, from storing a test's history to its last page's request
METRICS = ("utilization", "memory", "temperature", "power")
GROUP = 'document.querySelector("[data-history-url]").gpuadminCharts'  # charts.js's chart group


def minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def history_of(gpu: Gpu, now: datetime, phase: int = 0) -> None:
    """An hour of raw samples every 2 s, a week of rollups, an XID 20 minutes ago."""
    GpuSample.objects.bulk_create(
        GpuSample(
            gpu_id=gpu.pk,
            at=now - timedelta(seconds=2 * i),
            utilization_gpu_pct=(i // 5 * 7 + phase) % 100,
            memory_used_mib=20_000 + i * 2,
            temperature_c=40 + i // 5 % 30,
            power_w=100.0 + i / 5,
        )
        for i in range(1800)
    )
    GpuRollup.objects.bulk_create(
        GpuRollup(
            gpu_id=gpu.pk,
            minute=minute(now) - timedelta(minutes=i),
            samples=30,
            utilization_min=(i * 3) % 50,
            utilization_avg=(i * 3) % 50 + 20,
            utilization_max=(i * 3) % 50 + 40,
            memory_used_avg=30_000,
            temperature_avg=60,
            power_avg=250,
        )
        for i in range(1, 7 * 1440)
    )
    HealthEvent.objects.create(
        node=gpu.node,
        gpu=gpu,
        kind=EventKind.XID,
        xid=48,
        severity=Severity.CRITICAL,
        message="Double bit ECC error",
        occurred_at=now - timedelta(minutes=20),
        dedupe_key=f"{gpu.uuid}:xid48",
    )


@pytest.fixture
def gpu() -> Gpu:
    host = unique_host("chart")
    add_node(host)
    gpu = Gpu.objects.on_node(host).filter(mig_enabled=False).order_by("index").first()
    history_of(gpu, timezone.now())
    return gpu


@pytest.fixture
def watched(page):  # noqa: ANN001, ANN201 - playwright Page
    """The page with CSP violations recorded and the history requests it makes listed."""
    page.add_init_script(RECORD_VIOLATIONS)
    page.history_requests = []
    page.on(
        "request",
        lambda request: (
            page.history_requests.append(request.url) if "/history/" in request.url else None
        ),
    )
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    return page


def drawn(page, selector: str = UTILIZATION) -> None:  # noqa: ANN001 - playwright Page
    expect(page.locator(selector)).to_have_attribute("data-points", re.compile(r"^[1-9]\d*$"))


def test_the_gpu_page_draws_four_charts_with_their_ranges_zoom_and_events(
    watched, live_server, gpu
):
    page = watched
    page.clock.install()  # the last hour's refresh, moved on to below
    page.goto(f"{live_server.url}/gpus/{gpu.uuid}/")  # anonymous: the page is public
    drawn(page)
    for metric in METRICS:
        figure = page.locator(f'[data-chart-metric="{metric}"]')
        expect(figure.locator("canvas")).to_have_count(1)
        assert int(figure.get_attribute("data-points")) >= 715  # 5 s buckets of an hour
    assert page.evaluate(STROKE_PIXELS, [UTILIZATION, GREEN]) > 200  # the line is drawn
    assert page.history_requests == [f"{live_server.url}/api/v1/gpus/{gpu.uuid}/history/?range=1h"]
    status = page.locator("[data-chart-status]")
    expect(status).to_contain_text("5 s buckets from raw samples")

    # The XID: a marker on each chart's time axis, its title saying what happened.
    markers = page.locator(".chart-event")
    expect(markers).to_have_count(4)
    title = markers.first.get_attribute("title")
    assert "XID 48" in title and "Double bit ECC error" in title and "critical" in title

    # The range buttons ask for another range, drawn from the rollups.
    for name, text in (("24h", "2 min buckets"), ("7d", "10 min buckets")):
        with page.expect_request(lambda request, name=name: f"range={name}" in request.url):
            page.click(f'button[data-chart-range="{name}"]')
        expect(status).to_contain_text(f"{text} from 1-minute rollups")
        expect(page.locator(f'button[data-chart-range="{name}"]')).to_have_attribute(
            "aria-pressed", "true"
        )
    assert int(page.locator(UTILIZATION).get_attribute("data-points")) > 1000  # a week
    assert page.evaluate(STROKE_PIXELS, [UTILIZATION, GREEN]) > 200

    # A drag across one chart zooms all four to the span; the reset brings the range back.
    over = page.locator(f"{UTILIZATION} .u-over").bounding_box()
    reset = page.locator("[data-chart-reset]")
    expect(reset).to_be_hidden()
    y = over["y"] + over["height"] / 2
    page.mouse.move(over["x"] + over["width"] * 0.6, y)
    page.mouse.down()
    page.mouse.move(over["x"] + over["width"] * 0.8, y, steps=5)
    page.mouse.up()
    expect(reset).to_be_visible()
    spans = page.evaluate(
        f"Object.values({GROUP}.plots).map((p) => p.plot.scales.x.max - p.plot.scales.x.min)"
    )
    assert len(spans) == 4 and len(set(spans)) == 1
    assert 0.15 * 7 * 86400 < spans[0] < 0.25 * 7 * 86400
    with page.expect_request(lambda request: "range=7d" in request.url):
        reset.click()
    expect(reset).to_be_hidden()

    # Back to the last hour: it refreshes by itself, REFRESH_MS (10 s) after it was drawn.
    timer = page.evaluate(f"{GROUP}.timer")
    page.click('button[data-chart-range="1h"]')
    drawn(page)
    page.wait_for_function(f"(timer) => {GROUP}.timer !== timer", arg=timer)  # scheduled
    asked = len(page.history_requests)
    with page.expect_request(lambda request: "range=1h" in request.url):
        page.clock.fast_forward(10_000)
    assert len(page.history_requests) > asked

    assert page.evaluate("window.__csp") == []
    assert page.errors == []


def test_charts_swapped_in_by_htmx_draw_too(watched, live_server, gpu):
    page = watched
    page.goto(f"{live_server.url}/gpus/{gpu.uuid}/")
    drawn(page)
    asked = len(page.history_requests)
    # The section as HTMX would swap it in (its script tags included): a new chart group.
    page.evaluate(
        """() => {
          const old = document.querySelector("section.charts");
          const html = old.outerHTML;
          old.remove();
          const target = document.createElement("div");
          target.id = "swapped";
          document.querySelector("main").append(target);
          htmx.swap(target, html, {swapStyle: "innerHTML"});
        }"""
    )
    drawn(page, f"#swapped {UTILIZATION}")
    expect(page.locator("#swapped canvas")).to_have_count(4)
    assert len(page.history_requests) == asked + 1  # one group, one request
    assert page.evaluate("window.__csp") == []
    assert page.errors == []


def test_the_node_and_fleet_pages_draw_their_charts(watched, live_server, gpu):
    page = watched
    # The fleet's last hour is the 60 minutes before the request's: one that begins between
    # the rollups below and the request would leave 59 of them in it.
    left_in_minute = 60 - timezone.now().second
    if left_in_minute < PAGES_TIME_S:
        time.sleep(left_in_minute)
    now = timezone.now()
    FleetRollup.objects.bulk_create(
        FleetRollup(minute=minute(now) - timedelta(minutes=i), gpus=8, utilization_avg=i % 60)
        for i in range(1, 120)
    )
    history_of(gpu.node.gpus.get(index=0), now, phase=50)  # not hidden under the other
    page.goto(f"{live_server.url}/nodes/{gpu.node.hostname}/")
    drawn(page)
    legend = page.locator(f"{UTILIZATION} .u-legend")
    expect(legend).to_contain_text("GPU 0")
    expect(legend).to_contain_text("GPU 7")  # one line per GPU of the node
    assert page.evaluate(STROKE_PIXELS, [UTILIZATION, GREEN]) > 100  # GPU 0's line

    page.goto(f"{live_server.url}/fleet/")
    drawn(page)
    assert int(page.locator(UTILIZATION).get_attribute("data-points")) == 60  # a minute each
    assert page.evaluate(STROKE_PIXELS, [UTILIZATION, GREEN]) > 100
    assert page.history_requests[-1] == f"{live_server.url}/api/v1/fleet/history/?range=1h"
    assert page.evaluate("window.__csp") == []
    assert page.errors == []
