"""Every page with a live table keeps its rows filled through its polls, in real Chromium at
1440 px, with no console error (issue 26): the node page's GPU table went blank two seconds
after load (its poll's rows were marked for the fleet page's out-of-band swap, so htmx took
them out of the table, then found no target: `htmx:oobErrorNoTarget #live-<pk>`), and the
fleet page's state badges never refreshed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from playwright.sync_api import expect

from gpuadmin.access.models import Role
from gpuadmin.access.services import create_token
from health.models import Alert
from inventory.models import Gpu, Node
from tests.browser.polling import on_clock, run_polls
from tests.browser.test_scheduling_pages import agents, busy_queue, log_in  # noqa: F401
from tests.inventory.pages import add_node, unique_host
from tests.scheduling.pages.helpers import person, place, submit

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The polls of the live region the test waits for, each answered and swapped in.
POLLS = 2


@dataclass
class LiveTable:
    """A page to open, the id of its polled region and its live tables' rows (a selector);
    ``filled``: every cell of those rows shows something (a dash at least)."""

    path: str
    region: str
    rows: str
    filled: bool = True


def fleet_page() -> LiveTable:
    add_node(unique_host(), busy={5: 60})
    return LiveTable("/fleet/", "fleet-live", ".node-card .gpu-table tbody tr")


def node_page(model: str) -> Callable[[], LiveTable]:
    def make() -> LiveTable:
        host = unique_host(model)
        add_node(host, model)
        return LiveTable(f"/nodes/{host}/", "node-live", "#node-live .gpu-table tbody tr")

    return make


def gpu_page() -> LiveTable:
    """A GPU with a process on it: its live region has a table of processes."""
    scanned = add_node(unique_host(), busy={5: 60})
    path = f"/gpus/{scanned.gpus[5].facts.uuid}/"
    return LiveTable(path, "gpu-live", "#gpu-live table.gpu-processes tbody tr")


def queue_page() -> LiveTable:
    busy_queue()  # waiting, running and finished jobs: a finished job's message may be empty
    return LiveTable("/jobs/", "queue-live", "#queue-live table.jobs tbody tr", filled=False)


def alerts_page() -> LiveTable:
    host = unique_host()
    add_node(host)
    node = Node.objects.get(hostname=host)
    for index, severity in enumerate(("critical", "warning")):
        gpu = node.gpus.get(index=index + 2)
        Alert.objects.create(
            fingerprint=f"test:{gpu.uuid}", severity=severity, summary="XID 79", node=node, gpu=gpu
        )
    # Unacknowledged alerts seen by a viewer: their "Acknowledged" cell is empty.
    return LiveTable("/alerts/", "alerts-live", "#alerts-live table.alerts tbody tr", filled=False)


PAGES = {
    "fleet": fleet_page,
    "node-dgx-h100": node_page("dgx-h100"),
    "node-pcie-l40s": node_page("pcie-l40s-4x"),
    "gpu": gpu_page,
    "queue": queue_page,
    "alerts": alerts_page,
}


def console_errors(page) -> list[str]:  # noqa: ANN001 - playwright Page
    """Console errors (htmx logs `htmx:oobErrorNoTarget` through console.error) and uncaught
    exceptions, as they come."""
    errors: list[str] = []

    def on_console(message) -> None:  # noqa: ANN001 - playwright ConsoleMessage
        # Chromium asks for /favicon.ico on its own; whether it exists is another page's check.
        if message.type == "error" and not message.location.get("url", "").endswith("favicon.ico"):
            errors.append(f"console.error: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
    return errors


def region_polls(page, region: str) -> list[int]:  # noqa: ANN001 - playwright Page
    """The statuses of the answered polls of the live region ``region`` (htmx names the
    triggering element in `HX-Trigger`)."""
    statuses: list[int] = []

    def on_response(response) -> None:  # noqa: ANN001 - playwright Response
        if response.request.headers.get("hx-trigger") == region:
            statuses.append(response.status)

    page.on("response", on_response)
    return statuses


def cells(page, rows: str) -> list[list[str]]:  # noqa: ANN001 - playwright Page
    """The text of each cell of the rows ``rows`` selects, row by row, in one evaluation."""
    return page.locator(rows).evaluate_all(
        "rows => rows.map(row => [...row.cells].map(cell => cell.innerText.trim()))"
    )


@pytest.mark.parametrize("name", PAGES)
def test_live_tables_keep_their_rows_through_polls(name, page, live_server):
    table = PAGES[name]()
    log_in(page.context, live_server, person("otto", Role.OPERATOR))
    errors = console_errors(page)
    polls = region_polls(page, table.region)
    page.set_viewport_size({"width": 1440, "height": 900})
    on_clock(page)
    page.goto(live_server.url + table.path)
    loaded = cells(page, table.rows)
    assert loaded and all(any(row) for row in loaded), loaded

    run_polls(page, POLLS)
    page.wait_for_timeout(500)  # the last poll's swap settles

    after = cells(page, table.rows)
    assert len(polls) >= POLLS and set(polls) == {200}, polls
    # The same rows, each cell still showing what it showed (its value may have changed).
    assert [[bool(text) for text in row] for row in after] == [
        [bool(text) for text in row] for row in loaded
    ]
    if table.filled:
        assert all(all(row) for row in after), after
    assert errors == []


def test_a_gpu_drained_through_the_api_changes_its_badge_without_reload(page, live_server):
    """The fleet page's state badge follows the catalog (it read "Available" until a reload),
    and a drained GPU still running its job counts as draining, not busy."""
    import json
    import urllib.request

    alice = person("alice")
    host = unique_host()
    add_node(host, "dgx-a100-80gb")
    job = submit(alice)
    place(job)
    gpu = Gpu.objects.get(allocations__job=job)
    _, token = create_token(person("otto", Role.OPERATOR), "drain")
    errors = console_errors(page)
    page.goto(live_server.url + "/fleet/")
    card = page.locator(f'[id="node-{host}"]')
    live_row = card.locator("tbody.live tr").nth(gpu.index)  # beside its static row
    badge = live_row.locator("td").nth(1).locator(".badge").first
    expect(card.locator("tr.gpu-row").nth(gpu.index)).to_have_attribute("data-uuid", gpu.uuid)
    expect(badge).to_have_text("Available")
    expect(live_row).to_have_class("s-busy")
    expect(page.locator("[data-count=draining]")).to_have_text("0")
    page.evaluate("window.__marker = 1")

    request = urllib.request.Request(
        f"{live_server.url}/api/v1/gpus/{gpu.uuid}/state/",
        data=json.dumps({"state": "draining", "reason": "new driver"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200

    expect(badge).to_have_text("Draining", timeout=10_000)
    expect(badge).to_have_attribute("title", "new driver")
    expect(live_row).to_have_class("s-draining")
    expect(live_row.locator("td").nth(6)).to_have_text(f"#{job.pk} alice")  # it still runs
    expect(page.locator("[data-count=draining]")).to_have_text("1")
    expect(page.locator("[data-count=busy]")).to_have_text("0")
    assert page.evaluate("window.__marker") == 1  # no reload
    assert errors == []


@pytest.mark.parametrize("page_of", ["node", "gpu"])
def test_the_node_and_gpu_pages_show_a_drain_without_reload(page_of, page, live_server):
    """Their head's state badge and their service state follow the catalog through the poll,
    out of band, while the polled region keeps its rows."""
    from inventory.services import set_gpu_state, set_node_state

    host = unique_host("pcie")
    add_node(host, "pcie-l40s-4x")
    gpu = Gpu.objects.get(node__hostname=host, index=1)
    path, rows = {
        "node": (f"/nodes/{host}/", "#node-live .gpu-live tbody tr"),
        "gpu": (f"/gpus/{gpu.uuid}/", "#gpu-live dl.live-sample dd"),
    }[page_of]
    errors = console_errors(page)
    page.goto(live_server.url + path)
    badge, service = page.locator(f"#{page_of}-state"), page.locator(f"#{page_of}-service-state")
    expect(badge).to_have_text("Available" if page_of == "gpu" else "Online")
    count = page.locator(rows).count()
    page.evaluate("window.__marker = 1")

    if page_of == "node":
        set_node_state(Node.objects.get(hostname=host), "draining", actor_name="ops", reason="BIOS")
    else:
        set_gpu_state(gpu, "draining", actor_name="ops", reason="BIOS")

    expect(badge).to_have_text("Draining", timeout=10_000)
    expect(badge).to_have_attribute("title", "BIOS")
    expect(service).to_contain_text("Draining")
    expect(service).to_contain_text(": BIOS")
    expect(page.locator(rows)).to_have_count(count)
    assert page.evaluate("window.__marker") == 1
    assert errors == []
