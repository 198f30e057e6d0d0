"""The sections apps above inventory add to its pages (``gpuadmin.registry.page_sections``), and the
fleet's health at a glance: one status per GPU, its colour, the legend and the counts."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from gpuadmin import registry
from gpuadmin.registry import Section
from inventory.models import Gpu
from inventory.nvml.sim import faults
from inventory.services import set_gpu_state
from tests.inventory.pages import add_node, unique_host
from tests.inventory.test_pages_fleet import count, live_row

pytestmark = pytest.mark.django_db

# A template that renders its context: each section shows its own marker.
MARKER_TEMPLATE = "inventory/partials/node_backends.html"


def marker(name: str, order: int) -> Section:
    return Section(MARKER_TEMPLATE, {"backends": [(f"marker-{name}", order)]}, order)


@pytest.fixture
def only_these_receivers(monkeypatch):
    """Leave the hook to the answers a test registers (the apps' own are not called)."""
    monkeypatch.setattr(registry.page_sections, "answers", ())


@pytest.mark.parametrize("page", ["gpu", "node", "fleet"])
def test_each_page_renders_the_sections_receivers_return_in_order(
    client, only_these_receivers, page
):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=1)
    asked = []

    def late(page, obj, request):
        asked.append((page, obj))
        return marker("late", 90)

    def early_and_none(page, obj, request):
        return [marker("early", 10), None]

    def nothing(page, obj, request):
        return None

    for receiver in (late, early_and_none, nothing):
        registry.page_sections.register(receiver)
    path, obj = {
        "gpu": (f"/gpus/{gpu.uuid}/", gpu),
        "node": (f"/nodes/{host}/", gpu.node),
        "fleet": ("/fleet/", None),
    }[page]

    html = client.get(path).content.decode()

    assert asked == [(page, obj)]
    assert html.index("marker-early") < html.index("marker-late")
    assert html.count("marker-") == 2


def test_without_receivers_the_pages_render(client, only_these_receivers):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=1)
    for path in (f"/gpus/{gpu.uuid}/", f"/nodes/{host}/", "/fleet/"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert 'id="health-title"' not in response.content.decode()


def test_the_fleet_poll_asks_for_no_sections(client, only_these_receivers):
    add_node(unique_host())
    asked = []
    registry.page_sections.register(lambda page, obj, request: asked.append(1))
    client.get("/fleet/", HTTP_HX_REQUEST="true")
    assert asked == []
    client.get("/fleet/")
    assert asked == [1]


def test_each_gpu_state_shows_at_a_glance_with_its_count(client):
    host = unique_host()
    scanned = add_node(
        host,
        busy={4: 50},  # a process that no allocation accounts for
        prepare=lambda nvml: faults.set_temperature(nvml, None, 7, 97),
    )
    uuids = [gpu.facts.uuid for gpu in scanned.gpus]
    gpus = {gpu.index: gpu for gpu in Gpu.objects.filter(node__hostname=host)}
    set_gpu_state(gpus[2], "degraded", actor_name="health", reason="XID 48")
    set_gpu_state(gpus[3], "resetting", actor_name="health", reason="XID 79: resetting")
    set_gpu_state(gpus[5], "offline", actor_name="admin", reason="RMA")
    Gpu.objects.filter(pk=gpus[6].pk).update(missing_since=timezone.now())

    html = client.get(f"/fleet/?node={host}").content.decode()

    statuses = {index: live_row(html, uuids[index])[0] for index in range(8)}
    assert statuses[2].startswith('<tr class="s-degraded"><td>degraded')
    assert statuses[3].startswith('<tr class="s-resetting"><td>resetting')
    assert statuses[4].startswith('<tr class="s-foreign"><td>foreign')
    assert statuses[5].startswith('<tr class="s-offline"><td>offline')
    assert statuses[6].startswith('<tr class="s-missing"><td>missing')
    assert statuses[7].startswith('<tr class="s-free"><td>free <span class="badge badge-amber"')
    counted = {status: count(html, status) for status in re.findall(r'data-count="([\w-]+)"', html)}
    assert counted == {
        "total": 8, "free": 1, "busy": 0, "draining": 0, "mig": 2, "mps": 0, "foreign": 1,
        "resetting": 1, "degraded": 1, "missing": 1, "offline": 1, "hot": 1,
    }  # fmt: skip
    # The state column says why, the legend what each colour means.
    assert re.search(
        r'<span class="badge badge-amber" title="XID 79: resetting">Resetting</span>', html
    )
    legend = re.search(r'<details class="legend status-legend">.*?</details>', html, re.S)[0]
    assert len(re.findall(r'<dt><span class="s-(\w+)">', legend)) == 10
    assert "processes that no allocation accounts for" in legend


def test_the_fleet_poll_reads_at_most_four_queries_whatever_the_fleet(
    client, django_assert_max_num_queries
):
    for _ in range(3):
        add_node(unique_host(), "dgx-h100")
    # The nodes, their GPUs and who holds them: scheduling's jobs, Slurm's (the page's filters
    # add none).
    with django_assert_max_num_queries(4):
        response = client.get("/fleet/", HTTP_HX_REQUEST="true")
    assert count(response.content.decode(), "total") >= 24
