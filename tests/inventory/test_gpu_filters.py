"""One FilterSet (``inventory.filters.GpuFilterSet``) serves the fleet dashboard and
``/api/v1/gpus/``: the same query string shows the same GPUs on both."""

from __future__ import annotations

import re

import pytest

from inventory.models import Gpu, Node, Pool
from tests.inventory.pages import add_node, unique_host

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet() -> dict[str, str]:
    a100, h100, l40s = unique_host("a100"), unique_host("h100"), unique_host("l40s")
    add_node(a100, "dgx-a100-40gb")
    add_node(h100, "dgx-h100", busy={2: 80})
    add_node(l40s, "pcie-l40s-4x")
    team = Pool.objects.create(name=f"team-{a100}")
    Node.objects.filter(hostname=a100).update(pool=team)
    Gpu.objects.filter(node__hostname=h100, index=3).update(pool=team, state="draining")
    return {"a100": a100, "h100": h100, "l40s": l40s, "team": team.name, "team_id": team.pk}


def on_page(client, query: str) -> set[str]:
    html = client.get(f"/fleet/?{query}").content.decode()
    return set(re.findall(r'<tr class="gpu-row[^"]*" data-uuid="([^"]+)">', html))


def in_api(client, query: str) -> set[str]:
    body = client.get(f"/api/v1/gpus/?limit=1000&{query}").json()
    return {gpu["uuid"] for gpu in body["results"]}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("model=A100", {"a100": 8}),  # a substring of the product name, on both
        ("model=h100", {"h100": 8}),
        ("pool={team}", {"a100": 8, "h100": 1}),  # a GPU without a pool is in its node's
        ("pool_id={team_id}", {"a100": 8, "h100": 1}),
        ("state=draining", {"h100": 1}),
        ("node={l40s}", {"l40s": 4}),
        ("mig_enabled=true", {"a100": 2}),
        ("busy=true", {"h100": 1}),
        ("model=A100&mig_enabled=false&node={a100}", {"a100": 6}),
    ],
)
def test_the_page_and_the_api_show_the_same_gpus(admin_client, fleet, query, expected):
    query = query.format(**fleet)
    page, api = on_page(admin_client, query), in_api(admin_client, query)
    assert page == api
    by_node = {
        key: Gpu.objects.filter(uuid__in=api, node__hostname=fleet[key]).count()
        for key in ("a100", "h100", "l40s")
    }
    assert {key: n for key, n in by_node.items() if n} == expected


def test_the_page_form_renders_from_the_filterset(client, fleet):
    html = client.get(f"/fleet/?model=A100&mig_enabled=true&pool={fleet['team']}").content.decode()
    form = re.search(r'<form method="get" class="filters".*?</form>', html, re.S)[0]
    assert 'name="model" value="A100"' in form
    assert '<option value="NVIDIA A100-SXM4-40GB">' in form  # the models of the fleet offered
    assert f'name="pool" value="{fleet["team"]}"' in form
    assert '<input type="hidden" name="mig_enabled" value="true"' in form  # kept, not shown
    assert re.search(r'<select name="state"[^>]*>\s*<option value="" selected>all</option>', form)


def test_a_bad_value_is_named_on_the_page_and_refused_by_the_api(admin_client, fleet):
    html = admin_client.get("/fleet/?state=broken").content.decode()
    assert "Select a valid choice. broken is not one of the available choices." in html
    response = admin_client.get("/api/v1/gpus/?state=broken")
    assert response.status_code == 400 and "state" in response.json()


@pytest.mark.parametrize("query", ["node_id=abc", "pool_id=1e400"])
def test_a_bad_hidden_filter_is_named_too(client, fleet, query):
    """Filters the page keeps without a control (links set them) say why they were not
    applied, as the visible ones."""
    name = query.split("=")[0]
    html = client.get(f"/fleet/?{query}").content.decode()
    assert re.search(
        rf'<span class="bad" data-filter="{name}">{name}: .+ \(not applied\)</span>', html
    )
