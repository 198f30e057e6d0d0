"""The topology and MIG pages of a node, and the GPU detail page."""

from __future__ import annotations

import re

import pytest

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu
from tests.inventory.pages import add_node, unique_host

pytestmark = pytest.mark.django_db


def cells(html: str) -> list[tuple[str, str, str]]:
    return re.findall(r'<td class="link link-(\w+)" title="([^"]*)">([^<]*)</td>', html)


def test_topology_of_a_dgx_a100_is_all_nv12(client):
    host = unique_host()
    add_node(host)

    response = client.get(f"/nodes/{host}/topology/")

    html = response.content.decode()
    found = cells(html)
    assert len(found) == 64
    assert [label for css, _, label in found if css == "self"] == ["X"] * 8
    nv = [(title, label) for css, title, label in found if css == "nv"]
    assert len(nv) == 56 and {label for _, label in nv} == {"NV12"}
    assert (
        "GPU0 \u2194 GPU1: NV12, 12 NVLinks \u00d7 25 GB/s = 300 GB/s per direction "
        "(600 GB/s both ways)" in [title for title, _ in nv]
    )
    assert "CPU Affinity" in html and "NUMA Affinity" in html
    assert re.search(r'<td class="affinity">[^<]+</td><td class="affinity">3</td>', html)
    assert "25 GB/s per NVLink per direction" in html


def test_topology_of_a_dgx_h100_is_all_nv18(client):
    host = unique_host("ws")
    add_node(host, "dgx-h100")
    html = client.get(f"/nodes/{host}/topology/").content.decode()
    assert {(css, label) for css, _, label in cells(html)} == {("self", "X"), ("nv", "NV18")}
    assert '<span class="link link-sys">SYS</span>' in html  # legend


def test_topology_of_a_dgx1_shows_its_cube_mesh_and_nic_columns(client):
    host = unique_host()
    add_node(host, "dgx-1-v100")

    html = client.get(f"/nodes/{host}/topology/").content.decode()

    gpu_header = html.split("</thead>")[0]
    assert re.findall(r">(mlx5_\d)<", gpu_header) == [
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3",
    ]  # fmt: skip
    gpu0 = html.split('href="/gpus/')[1].split("</tr>")[0]
    assert [(css, label) for css, _, label in cells(gpu0)] == [
        ("self", "X"), ("nv", "NV1"), ("nv", "NV1"), ("nv", "NV2"), ("nv", "NV2"),
        ("sys", "SYS"), ("sys", "SYS"), ("sys", "SYS"),
        ("pix", "PIX"), ("phb", "PHB"), ("sys", "SYS"), ("sys", "SYS"),
    ]  # fmt: skip
    assert "GPU0 \u2194 mlx5_0: PIX" in gpu0
    assert "GPU0 \u2194 GPU3: NV2, 2 NVLinks \u00d7 25 GB/s = 50 GB/s per direction" in html
    assert "per NVLink per direction" in html


def test_pcie_only_node_has_no_nvlink_bandwidth_note(client):
    host = unique_host("box")
    add_node(host, "pcie-l40s-4x")

    html = client.get(f"/nodes/{host}/topology/").content.decode()

    assert {css for css, _, _ in cells(html)} == {"self", "pix", "node", "sys"}
    assert "per NVLink per direction" not in html
    assert f"/nodes/{host}/mig/" not in html  # no MIG-capable GPU: no empty MIG page to link


def test_topology_links_the_mig_page_of_a_node_with_mig_capable_gpus(client):
    host = unique_host()
    add_node(host, "dgx-a100-40gb")

    assert f'href="/nodes/{host}/mig/"' in client.get(f"/nodes/{host}/topology/").content.decode()


def profiles(part: str) -> list[tuple[str, str]]:
    return re.findall(r'data-profile="([^"]+)" style="grid-column: (\d+ / span \d+)', part)


def test_mig_page_draws_instances_and_what_still_fits(client):
    host = unique_host()
    add_node(host)

    html = client.get(f"/nodes/{host}/mig/").content.decode()

    gpu0 = html.split('id="mig-gpu0"')[1].split("</section>")[0]
    gpu1 = html.split('id="mig-gpu1"')[1].split("</section>")[0]
    gpu2 = html.split('id="mig-gpu2"')[1].split("</section>")[0]
    assert profiles(gpu0) == [
        ("2g.10gb", "1 / span 2"),
        ("2g.10gb", "3 / span 2"),
        ("3g.20gb", "5 / span 4"),
    ]
    assert profiles(gpu1) == [("1g.5gb", f"{n + 1} / span 1") for n in range(7)]
    assert "more" not in gpu0 and "more" not in gpu1
    # MIG is off on GPU 2: no instance can be made there, so no room is listed.
    assert "MIG off" in gpu2 and "MIG is off on this GPU" in gpu2
    assert "more" not in gpu2 and "mig-profiles" not in gpu2


def test_the_mig_page_of_a_node_without_mig_capable_gpus_says_so(client):
    host = unique_host("box")
    add_node(host, "pcie-l40s-4x")
    html = client.get(f"/nodes/{host}/mig/").content.decode()
    assert f"No MIG-capable GPU on this node: {host} has no GPU" in html
    assert "mig-gpu" not in html


def test_pages_404_for_unknown_nodes_and_gpus(client):
    assert client.get("/nodes/nope/topology/").status_code == 404
    assert client.get("/nodes/nope/mig/").status_code == 404
    assert client.get("/gpus/GPU-00000000-0000-0000-0000-000000000000/").status_code == 404


def test_gpu_detail_shows_facts_live_values_links_and_history(admin_client):
    host = unique_host()
    scanned = add_node(host, busy={4: 55})
    gpu = Gpu.objects.get(node__hostname=host, index=4)

    response = admin_client.get(f"/gpus/{gpu.uuid}/")

    html = response.content.decode()
    assert f"<title>gpuadmin: {host} GPU4</title>" in html
    assert f"<code>{gpu.uuid}</code>" in html
    assert "<dd>NVIDIA A100-SXM4-40GB</dd>" in html
    assert "<dt>Processes</dt><dd>1</dd>" in html
    assert "0 GPU instances" in html and "MIG is off on this GPU" in html
    assert " fit</td>" not in html  # no room listed while MIG is off
    assert len(re.findall(r'<span class="link link-nv">NV12</span>', html)) == 7
    assert "<td>gpu.appeared</td>" in html
    assert AuditEvent.objects.filter(target_id=gpu.uuid).count() == 1
    assert scanned.gpus[4].facts.uuid == gpu.uuid


def test_gpu_detail_partial_is_the_live_sample_only(client):
    add_node(unique_host())
    gpu = Gpu.objects.get(index=4)
    response = client.get(f"/gpus/{gpu.uuid}/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="gpu-live"')
    assert "<dt>Utilization</dt>" in html and "Facts" not in html
