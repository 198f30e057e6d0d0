"""NVLink domains the placement loop gives the engine: sets of GPUs in which every pair is
NVLinked, so the "one NVLink domain" tier means what it says on meshes without NVSwitch."""

from __future__ import annotations

import pytest
from django.db.models import Q

from inventory.models import Gpu, GpuLink
from scheduling.loop import snapshot as loop_snapshot
from tests.scheduling.conftest import add_sim_node


def domains_by_index(hostname: str) -> dict[int, str | None]:
    snapshot, _ = loop_snapshot.take_snapshot()
    return {slot.index: slot.nvlink_domain for slot in snapshot.gpus if slot.node == hostname}


def linked(gpu_a: Gpu, gpu_b: Gpu) -> bool:
    pair = Q(gpu_a=gpu_a, gpu_b=gpu_b) | Q(gpu_a=gpu_b, gpu_b=gpu_a)
    return GpuLink.objects.filter(pair, link_type__startswith="NV").exists()


@pytest.mark.django_db
def test_a_dgx1_cube_mesh_splits_into_two_fully_linked_quads() -> None:
    add_sim_node("dgx1-01", "dgx-1-v100")
    domains = domains_by_index("dgx1-01")
    assert domains == dict.fromkeys(range(4), "dgx1-01/nvlink-gpu0") | dict.fromkeys(
        range(4, 8), "dgx1-01/nvlink-gpu4"
    )
    gpus = {gpu.index: gpu for gpu in Gpu.objects.filter(node__hostname="dgx1-01")}
    assert not linked(gpus[0], gpus[5])  # connected through the mesh, but SYS apart
    for quad in ((0, 1, 2, 3), (4, 5, 6, 7)):
        assert all(linked(gpus[a], gpus[b]) for a in quad for b in quad if a < b)


@pytest.mark.django_db
def test_nvswitch_and_pcie_nodes_keep_one_domain_or_none() -> None:
    add_sim_node("dgx-01", "dgx-a100-80gb")
    add_sim_node("pcie-01", "pcie-l40s-4x")
    assert set(domains_by_index("dgx-01").values()) == {"dgx-01/nvlink-gpu0"}
    assert set(domains_by_index("pcie-01").values()) == {None}
