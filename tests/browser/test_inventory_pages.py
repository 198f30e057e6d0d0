"""The inventory pages in real Chromium: live refresh without reload, the failure toast,
the topology matrix and the MIG drawing."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from inventory import live
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from tests.browser.conftest import ARTIFACTS_DIR
from tests.inventory.pages import add_node, unique_host

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def tops(page, *elements) -> list[int]:
    """The elements' tops in one evaluation: a section above them (the fleet's charts) may
    grow as it loads and move them all between two separate measurements."""
    handles = [element.element_handle() for element in elements]
    return page.evaluate(
        "elements => elements.map(e => Math.round(e.getBoundingClientRect().top))", handles
    )


def test_dashboard_values_change_without_reload(page, live_server):
    host = unique_host()
    scanned = add_node(host)
    uuid = scanned.gpus[5].facts.uuid
    card = page.locator(f'[id="node-{host}"]')
    row = card.locator("tbody.live tr").nth(5)  # the live row beside GPU5's static row
    util, procs = row.locator("td").nth(2), row.locator("td").nth(6)
    page.goto(live_server.url + "/fleet/")
    static = card.locator("tr.gpu-row").nth(5)
    assert static.get_attribute("data-uuid") == uuid
    static_top, row_top = tops(page, static, row)
    assert static_top == row_top  # the two tables line up
    assert procs.inner_text() == "0"
    assert not card.locator(".badge-unreachable").is_visible()  # its agent is heartbeating
    page.evaluate("window.__marker = 1")

    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name=host)
    faults.start_process(nvml, None, 5, 4242, used_mib=30_000, util=88)
    live.publish(host, scan(nvml, include=("facts", "metrics")))

    # expect() polls from Python: wait_for_function's predicate is evaluated in the page, which
    # the Content-Security-Policy refuses (no 'unsafe-eval').
    # A process that no allocation accounts for: foreign.
    expect(page.locator("[data-count=foreign]")).to_have_text("1", timeout=10_000)
    expect(row).to_have_class("s-foreign")
    assert util.inner_text() == "88%"
    assert procs.inner_text() == "1"
    assert page.evaluate("window.__marker") == 1


def test_a_gpu_fenced_by_health_turns_red_on_the_dashboard_without_reload(page, live_server):
    from inventory.models import Gpu
    from inventory.services import set_gpu_state

    host = unique_host()
    add_node(host)
    card = page.locator(f'[id="node-{host}"]')
    row = card.locator("tbody.live tr").nth(4)
    page.goto(live_server.url + "/fleet/")
    expect(row).to_have_class("s-free")
    free_colour = row.locator("td").first.evaluate("cell => getComputedStyle(cell).color")

    gpu = Gpu.objects.get(node__hostname=host, index=4)
    set_gpu_state(gpu, "degraded", actor_name="health", reason="XID 48: double-bit ECC error")

    expect(page.locator("[data-count=degraded]")).to_have_text("1", timeout=10_000)
    expect(row).to_have_class("s-degraded")
    red = page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--red')")
    degraded_colour = row.locator("td").first.evaluate("cell => getComputedStyle(cell).color")
    assert degraded_colour != free_colour and red.strip()
    # The passport says why, and since when.
    page.goto(live_server.url + f"/gpus/{gpu.uuid}/")
    expect(page.locator("dd.service-state")).to_contain_text("XID 48: double-bit ECC error")


def test_failed_refresh_shows_a_toast_and_keeps_the_page(page, live_server):
    add_node(unique_host())
    page.goto(live_server.url + "/fleet/")
    page.evaluate("window.__marker = 1")

    def fail_htmx(route) -> None:  # noqa: ANN001 - playwright Route
        if route.request.headers.get("hx-request"):
            route.fulfill(status=500, body="boom")
        else:
            route.continue_()

    page.route(re.compile(r"/fleet/"), fail_htmx)
    page.click("#refresh-live")
    toast = page.locator("#toasts .toast")
    toast.wait_for(timeout=5_000)
    assert "HTTP 500" in toast.inner_text()
    assert page.locator("[data-count=total]").inner_text() == "8"
    assert page.evaluate("window.__marker") == 1


def test_topology_of_a_dgx_a100_shows_nv12_everywhere(page, live_server):
    host = unique_host()
    add_node(host)
    page.goto(f"{live_server.url}/nodes/{host}/topology/")
    cells = page.locator("table.topo td.link")
    assert cells.count() == 64
    assert page.locator("table.topo td.link-nv").all_inner_texts() == ["NV12"] * 56
    assert page.locator("table.topo td.link-self").count() == 8


def test_mig_page_draws_the_instances_to_scale(page, live_server):
    host = unique_host()
    add_node(host)
    page.goto(f"{live_server.url}/nodes/{host}/mig/")

    def widths(gpu: int) -> list[tuple[str, int]]:
        cards = page.locator(f"#mig-gpu{gpu} .mig-instance")
        return [
            (card.get_attribute("data-profile"), round(card.bounding_box()["width"]))
            for card in cards.all()
        ]

    slice_width = page.locator("#mig-gpu0 .mig-slice").first.bounding_box()["width"]
    gpu0 = widths(0)
    assert [name for name, _ in gpu0] == ["2g.10gb", "2g.10gb", "3g.20gb"]
    assert gpu0[2][1] == pytest.approx(4 * slice_width + 12, abs=2)  # 4 slices + 3 gaps
    assert gpu0[0][1] == pytest.approx(2 * slice_width + 4, abs=2)
    gpu1 = widths(1)
    assert [name for name, _ in gpu1] == ["1g.5gb"] * 7
    assert {width for _, width in gpu1} == {round(slice_width)}


def test_gpu_detail_page_shows_its_links_and_mig_layout(page, live_server):
    host = unique_host()
    scanned = add_node(host)
    page.goto(f"{live_server.url}/gpus/{scanned.gpus[0].facts.uuid}/")
    assert page.title() == f"gpuadmin: {host} GPU0"
    assert page.locator(".mig-instance").count() == 3
    assert page.locator("#gpu-live dt").first.inner_text() == "Status"
    assert page.get_by_role("link", name="GPU7").count() == 1


@pytest.mark.parametrize(
    ("width", "height", "scheme", "columns"),
    [(1366, 768, "light", 1), (2560, 1440, "dark", 3)],
    ids=["laptop-light", "wall-dark"],
)
def test_dashboard_fits_laptop_and_wall_screens_in_both_schemes(
    browser, live_server, width, height, scheme, columns
):
    from inventory.models import Node, Pool

    hosts = [unique_host() for _ in range(4)]
    for host in hosts:
        add_node(host, busy={2: 71})
    # Only these cards on the page (nodes other tests left would take grid cells first).
    pool = Pool.objects.create(name=f"layout-{hosts[0]}".lower())
    Node.objects.filter(hostname__in=hosts).update(pool=pool)
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
    page = context.new_page()
    try:
        page.goto(f"{live_server.url}/fleet/?pool={pool.name}")
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scroll
        cards = [page.locator(f'[id="node-{host}"]') for host in hosts]
        top = tops(page, *cards)
        assert top.count(min(top)) == columns, top  # node cards side by side
        for card in cards:  # no card needs its own sideways scroll
            assert card.evaluate("e => e.scrollWidth <= e.clientWidth")
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        red, green, blue = map(int, re.findall(r"\d+", background)[:3])
        assert (max(red, green, blue) < 60) == (scheme == "dark"), background
        ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS_DIR / f"fleet-{width}-{scheme}.png"), full_page=True)
    finally:
        context.close()


def test_a_refused_mig_change_shows_on_the_card_the_page_scrolls_to(page, live_server, admin_user):
    from django.test import Client
    from playwright.sync_api import expect

    from inventory.models import Node

    host = unique_host()
    add_node(host)
    Node.objects.filter(hostname=host).update(last_heartbeat_at=None)  # the change is refused
    client = Client()
    client.force_login(admin_user)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    page.set_viewport_size({"width": 1366, "height": 600})
    page.goto(f"{live_server.url}/nodes/{host}/mig/")
    page.locator("#mig-gpu1").get_by_role("button", name="Create instance").click()
    page.wait_for_url(re.compile(r"#mig-gpu1$"))
    error = page.locator(".message.error")
    expect(error).to_have_count(1)
    expect(error).to_be_in_viewport()
    assert (
        page.locator("#mig-gpu1 .message.error")
        .inner_text()
        .startswith(f"1g.5gb not created on GPU 1: node {host} is unreachable")
    )
