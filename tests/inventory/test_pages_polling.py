"""Live polling edges of the inventory pages: 286 stops, one Redis round trip, pool fallback."""

from __future__ import annotations

import pytest
from django.utils import timezone

from inventory import live
from inventory.models import Gpu, Node, Pool
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
