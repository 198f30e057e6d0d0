"""The chart sections the health app adds to the GPU, node and fleet pages."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import Client
from django.urls import reverse

from health.sections_charts import chart_sections
from inventory.models import Gpu
from inventory.pages.sections import requested_sections
from tests.inventory.pages import add_node, unique_host

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu() -> Gpu:
    host = unique_host("charts")
    add_node(host)
    return Gpu.objects.on_node(host).filter(mig_enabled=False).order_by("index").first()


def test_each_page_gets_its_chart_section(rf, gpu):
    request = rf.get("/")
    request.user = AnonymousUser()
    [gpu_section] = [
        s
        for s in requested_sections("gpu", gpu, request)
        if s.template.startswith("health/partials/chart")
    ]
    assert gpu_section.template == "health/partials/charts.html"
    assert gpu_section.context["history_url"] == f"/api/v1/gpus/{gpu.uuid}/history/"
    assert gpu_section.context["mig_enabled"] is False
    node_section = chart_sections(page="node", obj=gpu.node, request=request)
    assert node_section.context["history_url"] == f"/api/v1/nodes/{gpu.node.hostname}/history/"
    assert node_section.context["per_gpu"] is True
    fleet_section = chart_sections(page="fleet", obj=None, request=request)
    assert fleet_section.template == "health/partials/fleet_chart.html"
    assert fleet_section.context["history_url"] == reverse("health-history:fleet")
    assert chart_sections(page="elsewhere", obj=None, request=request) is None


@pytest.mark.parametrize(
    ("_case", "page", "title"),
    [
        ("GPU", "gpu", "History"),
        ("node", "node", "History"),
        ("fleet", "fleet", "Fleet utilization"),
    ],
)
def test_the_pages_render_the_charts_with_their_static_files(gpu, _case, page, title):
    url = {
        "gpu": f"/gpus/{gpu.uuid}/",
        "node": f"/nodes/{gpu.node.hostname}/",
        "fleet": "/fleet/",
    }[page]
    html = Client().get(url).content.decode()
    history_url = {
        "gpu": f"/api/v1/gpus/{gpu.uuid}/history/",
        "node": f"/api/v1/nodes/{gpu.node.hostname}/history/",
        "fleet": "/api/v1/fleet/history/",
    }[page]
    assert f'data-history-url="{history_url}"' in html
    assert f">{title}</h2>" in html
    assert "/static/vendor/uplot/uPlot.iife.min.js" in html
    assert "/static/health/charts.js" in html
    assert "<script>" not in html  # no inline script: the CSP refuses it
    for name in ("1h", "24h", "7d"):
        assert f'data-chart-range="{name}"' in html
    metrics = (
        ["utilization"] if page == "fleet" else ["utilization", "memory", "temperature", "power"]
    )
    assert [m for m in metrics if f'data-chart-metric="{m}"' in html] == metrics


def test_a_mig_gpu_says_its_utilization_is_not_measured(gpu):
    Gpu.objects.filter(pk=gpu.pk).update(mig_enabled=True)
    html = Client().get(f"/gpus/{gpu.uuid}/").content.decode()
    assert "NVML does not measure utilization here" in html
