"""Live polling edges of the inventory pages: 286 stops, one Redis round trip, pool fallback."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from inventory import live
from inventory.models import Gpu, Node, Pool
from inventory.services import set_gpu_state, set_node_state
from tests.inventory.pages import add_node, unique_host

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


def test_dashboard_poll_stops_with_286_when_nothing_is_in_view(client):
    response = client.get("/fleet/?node=no-such-node", headers=HTMX)
    assert response.status_code == 286
    assert client.get("/fleet/?node=no-such-node").status_code == 200  # the page itself


def test_gpu_detail_poll_stops_with_286_once_the_gpu_is_missing(client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=2)
    assert client.get(f"/gpus/{gpu.uuid}/", headers=HTMX).status_code == 200
    Gpu.objects.filter(pk=gpu.pk).update(missing_since=timezone.now())
    assert client.get(f"/gpus/{gpu.uuid}/", headers=HTMX).status_code == 286


def test_live_values_are_read_in_one_redis_round_trip_per_request(client, monkeypatch):
    hosts = {unique_host() for _ in range(3)}
    for host in hosts:
        add_node(host)
    calls: list[list[str]] = []
    real = live.latest

    def counting(hostnames):
        calls.append(list(hostnames))
        return real(calls[-1])

    monkeypatch.setattr(live, "latest", counting)
    client.get("/fleet/")
    client.get("/fleet/", headers=HTMX)
    assert len(calls) == 2
    assert all(hosts <= set(names) for names in calls)


def test_a_gpu_without_a_pool_is_in_its_node_pool(client):
    host = unique_host()
    add_node(host)
    team = Pool.objects.create(name=f"team-{host}")
    other = Pool.objects.create(name=f"other-{host}")
    Node.objects.filter(hostname=host).update(pool=team)
    Gpu.objects.filter(node__hostname=host, index=0).update(pool=other)

    response = client.get(f"/fleet/?pool={team.name}")

    [node] = response.context["nodes"]
    assert [row.gpu.index for row in node.gpus] == list(range(1, 8))
    assert f'name="pool" value="{team.name}"' in response.content.decode()


@pytest.mark.parametrize("page", ["node", "gpu"])
def test_node_and_gpu_page_polls_keep_their_rows_and_bring_the_state(client, page):
    """Issue 26: the node page's poll carried the fleet poll's out-of-band mark on its live rows
    (htmx took them out of the table); neither page's poll brought the state badges. The page
    holds no out-of-band mark; its poll swaps its region in place and the state out of band."""
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=2)
    if page == "node":
        path, region, state = f"/nodes/{host}/", "node-live", "node-state"
        set_node_state(Node.objects.get(hostname=host), "draining", actor_name="ops", reason="x")
    else:
        path, region, state = f"/gpus/{gpu.uuid}/", "gpu-live", "gpu-state"
        set_gpu_state(gpu, "draining", actor_name="ops", reason="x")
    full = client.get(path).content.decode()
    poll = client.get(path, headers=HTMX).content.decode()

    assert "hx-swap-oob" not in full
    assert poll.lstrip().startswith(f'<div id="{region}"')
    region_html = poll[: poll.index(f'<span class="badge badge-amber" id="{state}"')]
    assert "hx-swap-oob" not in region_html  # the rows stay in the region swapped in place
    assert f'id="{state}" title="x" hx-swap-oob="true">Draining</span>' in poll
    service = re.search(r'<dd class="service-state" id="[^"]+" hx-swap-oob="true">.*?</dd>', poll)
    assert service and ">Draining</span>" in service[0] and service[0].endswith(": x</dd>")
