"""A Grace Hopper node from its real capture through discovery: MIG capable and disabled (no MIG
table), BAR1 unknown, and the GPU's own NUMA node stored, shown and served (issue 30)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from inventory.models import Gpu
from inventory.nvml.sim.importer import model_from_smi_text
from inventory.services import apply_discovery
from tests.nvml.captures import OWN

pytestmark = pytest.mark.django_db

GH200 = OWN / "smi-q__thamada-gls__GH200-480GB__550.127.05_mig-disabled_bar1-na.txt"


def _gh200(gpu_numa_id: int | None) -> dict[str, Any]:
    """The captured GH200; its capture has no topo -m, so the Grace CPU's node 0 and the GPU's
    own node (``topo -m`` "GPU NUMA ID") are set here."""
    model = model_from_smi_text(GH200.read_text(), name="gh200", smi_source=GH200.name)
    model["numa_nodes"] = {"0": {"socket": 0, "cpus": "0-71"}}
    model["gpus"][0]["numa_node"] = 0
    if gpu_numa_id is not None:
        model["gpus"][0]["gpu_numa_id"] = gpu_numa_id
    return model


def test_a_gh200_is_stored_mig_capable_and_disabled_with_its_gpu_numa_node(
    sim_scan, client, admin_user
) -> None:
    apply_discovery("gh-01", sim_scan(_gh200(1), "gh-01"))
    gpu = Gpu.objects.get(node__hostname="gh-01")

    assert (gpu.mig_capable, gpu.mig_enabled) == (True, False)
    assert (gpu.numa_node, gpu.gpu_numa_node) == (0, 1)
    client.force_login(admin_user)
    page = client.get(reverse("inventory:gpu-detail", args=[gpu.uuid])).content.decode()
    assert '<dt>GPU memory NUMA node</dt><dd class="gpu-numa">1</dd>' in page
    topology = client.get("/api/v1/nodes/gh-01/topology/").json()
    assert (topology["numa_nodes"], topology["gpu_numa_nodes"]) == ([0], [1])
    assert client.get(f"/api/v1/gpus/{gpu.uuid}/").json()["gpu_numa_node"] == 1
    matrix_page = client.get(reverse("inventory:node-topology", args=["gh-01"])).content.decode()
    assert '<td class="affinity gpu-numa">1</td>' in matrix_page
    assert client.get(reverse("inventory:node-mig", args=["gh-01"])).status_code == 200

    # A later scan without it (N/A: NOT_SUPPORTED) clears it.
    apply_discovery("gh-01", sim_scan(_gh200(None), "gh-01"))
    gpu.refresh_from_db()
    assert gpu.gpu_numa_node is None
    page = client.get(reverse("inventory:gpu-detail", args=[gpu.uuid])).content.decode()
    assert "GPU memory NUMA node" not in page
