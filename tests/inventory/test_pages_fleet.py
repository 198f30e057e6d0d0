"""The fleet dashboard: cards, summary, filters, the HTMX partial and its query count."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from inventory import live
from inventory.models import Gpu, Node, Pool
from tests.inventory.pages import add_node, unique_host

pytestmark = pytest.mark.django_db


def count(html: str, status: str) -> int:
    return int(re.search(rf'data-count="{status}">(\d+)<', html)[1])


def gpu_row(html: str, uuid: str) -> str:
    """The GPU's row in its card's static table (GPU link with its missing badge, model)."""
    return re.search(rf'<tr class="gpu-row[^"]*" data-uuid="{uuid}">.*?</tr>', html, re.S)[0]


def card(html: str, host: str) -> str:
    return re.search(rf'<article [^>]*id="node-{host}">.*?</article>', html, re.S)[0]


LIVE_COLUMNS = ("status", "state", "util", "mem", "temp", "power", "procs")


def live_row(html: str, uuid: str) -> tuple[str, dict[str, str]]:
    """The GPU's row in its card's live table (same position as its static row): the row's
    markup and its cells by column."""
    node = next(c for c in html.split("<article ")[1:] if f'data-uuid="{uuid}"' in c)
    position = re.findall(r'data-uuid="([^"]+)"', node).index(uuid)
    tbody = re.search(r'<tbody id="live-\d+"[^>]*>(.*?)</tbody>', node, re.S)[1]
    row = re.findall(r'<tr class="s-[^"]+">.*?</tr>', tbody, re.S)[position]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    return row, dict(zip(LIVE_COLUMNS, cells, strict=True))


def test_dashboard_shows_every_node_with_live_values(client):
    host = unique_host()
    scanned = add_node(host, busy={3: 97})
    busy = scanned.gpus[3].facts.uuid
    used_mib = live.latest([host])[host][busy]["memory_used_mib"]

    response = client.get("/fleet/")

    html = response.content.decode()
    assert response.status_code == 200
    assert "<title>gpuadmin: fleet</title>" in html
    assert f'id="node-{host}"' in html
    assert html.count('class="gpu-row') == 8
    row, cells = live_row(html, busy)
    assert cells["util"] == "97%"
    assert f"{used_mib / 1024:.1f}/40" in cells["mem"]
    assert cells["procs"] == "1"
    # A process that no allocation accounts for (started outside the scheduler): foreign.
    assert row.startswith('<tr class="s-foreign">')
    _, mig = live_row(html, scanned.gpus[0].facts.uuid)
    assert mig["state"].endswith('title="3 MIG instances">MIG 3</span>')
    # GPUs 0 and 1 are in MIG mode: their slices may be given, the whole GPUs are not free.
    assert (count(html, "total"), count(html, "foreign"), count(html, "free")) == (8, 1, 5)
    assert count(html, "mig") == 2
    assert 'hx-trigger="every 2s"' in html
    assert "Refresh live GPUs" in html
    assert "HX-Request" in response["Vary"]


# The summary's "updated" clock: the one piece that may differ between two requests (a second
# may pass between them).
CLOCK = re.compile(r"<time>\d\d:\d\d:\d\d</time>")


def test_htmx_request_gets_only_the_live_region(client):
    add_node(unique_host())
    full = CLOCK.sub("<time/>", client.get("/fleet/?state=available").content.decode())
    response = client.get("/fleet/?state=available", HTTP_HX_REQUEST="true")

    partial = CLOCK.sub("<time/>", response.content.decode())
    assert "<time/>" in partial
    assert partial.lstrip().startswith('<section id="fleet-live" hx-get="/fleet/?state=available"')
    assert "<html" not in partial and "<form" not in partial
    # The live region: the summary bar (the poller's target) and each node's live rows,
    # swapped out of band; every piece as the full page has it, less the swap's mark.
    piece = re.compile(
        r'<section id="fleet-live".*?</section>'
        r'|<template>(<tbody id="live-\d+".*?</tbody>)</template>',
        re.S,
    )
    pieces = [
        found[0] if found[0].startswith("<section") else found[1]
        for found in piece.finditer(partial)
    ]
    assert not piece.sub("", partial).strip()
    assert len(pieces) == 1 + full.count("<article ")
    assert all(' hx-swap-oob="true">' in tbody for tbody in pieces[1:])
    assert "<html" in full and "hx-swap-oob" not in full
    assert all(piece.replace(' hx-swap-oob="true"', "") in full for piece in pieces)
    boosted = client.get("/fleet/", HTTP_HX_REQUEST="true", HTTP_HX_BOOSTED="true")
    assert "<html" in boosted.content.decode()


def test_unreachable_node_greys_its_gpus_offline(client):
    host = unique_host()
    add_node(host)
    Node.objects.filter(hostname=host).update(
        last_heartbeat_at=timezone.now() - timezone.timedelta(hours=1)
    )

    html = client.get("/fleet/").content.decode()

    assert re.search(r'<tbody id="live-\d+" class="live unreachable"', card(html, host))
    assert ">unreachable</span>" in card(html, host)
    assert (count(html, "offline"), count(html, "free")) == (8, 0)


def test_a_real_node_that_confines_no_job_shows_its_gpus_out_of_service(client):
    """The one rule refuses such a node's GPUs (``Reason.UNCONFINED``) until an admin allows
    unconfined jobs there: the page counts them offline and says why, never fails."""
    host = unique_host()
    add_node(host)
    free = count(client.get("/fleet/").content.decode(), "free")
    Node.objects.filter(hostname=host).update(nvml_backend="real", isolation="none")

    html = client.get("/fleet/").content.decode()

    assert (count(html, "offline"), count(html, "free")) == (8, 0)
    Node.objects.filter(hostname=host).update(allow_unconfined=True)
    assert count(client.get("/fleet/").content.decode(), "free") == free


def test_missing_gpus_count_as_missing_and_failing_ones_as_degraded(client):
    host = unique_host()
    scanned = add_node(host)
    Gpu.objects.filter(index=5).update(missing_since=timezone.now())
    Gpu.objects.filter(index=6).update(error_message="GPU has fallen off the bus")

    html = client.get("/fleet/").content.decode()

    assert (count(html, "missing"), count(html, "degraded")) == (1, 1)
    assert ">missing</span>" in gpu_row(html, scanned.gpus[5].facts.uuid)
    _, failing = live_row(html, scanned.gpus[6].facts.uuid)
    assert 'title="GPU has fallen off the bus">error<' in failing["status"]


def test_filters_by_node_model_state_and_pool(client):
    a100, h100 = unique_host("a100"), unique_host("h100")
    add_node(a100, "dgx-a100-40gb")
    add_node(h100, "dgx-h100")
    pool = Pool.objects.create(name="vision")
    Gpu.objects.filter(node__hostname=h100, index__in=[1, 2]).update(pool=pool, state="draining")

    def shown(query: str) -> tuple[set[str], int]:
        html = client.get("/fleet/" + query).content.decode()
        return set(re.findall(r'id="node-([^"]+)"', html)), count(html, "total")

    assert shown("") == ({a100, h100}, 16)
    assert shown(f"?node={a100}") == ({a100}, 8)
    assert shown("?model=NVIDIA+H100+80GB+HBM3") == ({h100}, 8)
    assert shown("?pool=vision") == ({h100}, 2)
    assert shown("?state=draining") == ({h100}, 2)
    assert shown(f"?state=draining&node={a100}") == (set(), 0)


@pytest.mark.parametrize("htmx", [False, True])
def test_query_count_does_not_grow_with_the_fleet(client, django_assert_max_num_queries, htmx):
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    add_node(unique_host())
    with django_assert_max_num_queries(8) as one:
        client.get("/fleet/", **headers)
    for _ in range(4):
        add_node(unique_host(), "dgx-h100")
    with django_assert_max_num_queries(len(one.captured_queries)):
        response = client.get("/fleet/", **headers)
    assert count(response.content.decode(), "total") == 40


def test_each_node_card_says_what_its_agent_runs_on(client):
    sim, unknown = unique_host(), unique_host()
    add_node(sim)
    add_node(unknown)
    Node.objects.filter(hostname=sim).update(model="dgx-a100-40gb", nvml_backend="sim")
    html = client.get("/fleet/").content.decode()
    assert 'dgx-a100-40gb · <span class="runs-on">NVML simulator</span>' in card(html, sim)
    assert "runs-on" not in card(html, unknown)


def test_only_nodes_with_mig_capable_gpus_link_to_a_mig_page(client):
    dgx, pcie = unique_host("dgx"), unique_host("box")
    add_node(dgx)
    add_node(pcie, "pcie-l40s-4x")
    html = client.get("/fleet/").content.decode()
    assert f'href="/nodes/{dgx}/mig/"' in card(html, dgx)
    assert "/mig/" not in card(html, pcie)
    assert f'href="/nodes/{pcie}/topology/"' in card(html, pcie)


def test_the_job_on_a_gpu_is_asked_of_the_apps_above_through_the_registry(client, monkeypatch):
    from gpuadmin import registry
    from gpuadmin.registry import Occupant

    host = unique_host()
    scanned = add_node(host, busy={3: 50})
    held = Gpu.objects.get(uuid=scanned.gpus[3].facts.uuid)
    asked: list[set[int]] = []

    def occupants(gpu_ids) -> list[Occupant]:
        asked.append(set(gpu_ids))
        return [Occupant(7, "/jobs/7/", "alice", held.pk)]

    # Asked of this test alone: scheduling's own answer is not called here.
    monkeypatch.setattr(registry.gpu_occupants, "answers", (occupants,))
    html = client.get("/fleet/").content.decode()
    _, cells = live_row(html, held.uuid)
    assert cells["procs"] == '<a href="/jobs/7/">#7</a> alice'
    assert asked == [set(Gpu.objects.filter(node__hostname=host).values_list("pk", flat=True))]
