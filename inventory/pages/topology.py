"""The topology page's data: a node's ``nvidia-smi topo -m`` matrix, for pages (cells with
titles, highlighted GPUs) and for the API (plain lists)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

from inventory.models import Gpu, GpuLink, GpuNicLink, Node

# NVLink bandwidth per link and direction, by GPU architecture (NVLink 1 on P100: 20 GB/s;
# NVLink 2 on V100, 3 on A100, 4 on H100: 25 GB/s). Other GPUs: the link count only.
NVLINK_GBPS_PER_LINK = {"Pascal": 20, "Volta": 25, "Ampere": 25, "Hopper": 25}

LINK_CLASSES = [
    ("nv", "NV#", "Bonded set of # NVLinks (through NVSwitch on DGX)"),
    ("pix", "PIX", "At most a single PCIe bridge"),
    ("pxb", "PXB", "Multiple PCIe bridges, no PCIe host bridge"),
    ("phb", "PHB", "PCIe and a PCIe host bridge (the CPU)"),
    ("node", "NODE", "PCIe and the interconnect between host bridges of one NUMA node"),
    ("sys", "SYS", "PCIe and the SMP interconnect between NUMA nodes (QPI/UPI, Infinity Fabric)"),
]
_DESCRIPTIONS = {label: text for _, label, text in LINK_CLASSES}


@dataclasses.dataclass
class TopologyCell:
    label: str
    css: str
    title: str
    highlighted: bool = False  # both GPUs of the pair are highlighted


@dataclasses.dataclass
class TopologyRow:
    gpu: Gpu
    cells: list[TopologyCell]
    highlighted: bool = False
    nic_cells: list[tuple[str, TopologyCell]] = dataclasses.field(default_factory=list)


def link_cell(gpu_a: Gpu, gpu_b: Gpu, link: GpuLink | None) -> TopologyCell:
    if gpu_a.pk == gpu_b.pk:
        return TopologyCell("X", "self", f"GPU{gpu_a.index}")
    pair = f"GPU{gpu_a.index} \u2194 GPU{gpu_b.index}"
    if link is None:
        return TopologyCell("?", "none", f"{pair}: not reported")
    if link.link_type.startswith("NV"):
        per_link = NVLINK_GBPS_PER_LINK.get(gpu_a.architecture)
        title = f"{pair}: {link.link_type}, {link.nvlink_count} NVLinks"
        if per_link:
            one_way = link.nvlink_count * per_link
            title += (
                f" \u00d7 {per_link} GB/s = {one_way} GB/s per direction "
                f"({2 * one_way} GB/s both ways)"
            )
        return TopologyCell(link.link_type, "nv", title)
    description = _DESCRIPTIONS.get(link.link_type, "")
    return TopologyCell(
        link.link_type, link.link_type.lower(), f"{pair}: {link.link_type}. {description}"
    )


def nic_cell(gpu: Gpu, nic: str, link_type: str | None) -> TopologyCell:
    pair = f"GPU{gpu.index} \u2194 {nic}"
    if link_type is None:
        return TopologyCell("?", "none", f"{pair}: not reported")
    description = _DESCRIPTIONS.get(link_type, "")
    return TopologyCell(link_type, link_type.lower(), f"{pair}: {link_type}. {description}")


def topology_rows(
    gpus: list[Gpu],
    links: Iterable[GpuLink],
    highlight: Collection[int] = (),
    nic_links: Iterable[GpuNicLink] = (),
) -> list[TopologyRow]:
    """The ``topo -m`` matrix for ``gpus`` (in index order), from the node's link rows, with a
    column per network adapter of ``nic_links``; the GPUs whose pk is in ``highlight`` (e.g. a
    job's) and the links between them are marked."""
    by_pair = {frozenset((link.gpu_a_id, link.gpu_b_id)): link for link in links}
    by_nic = {(link.gpu_id, link.nic): link.link_type for link in nic_links}
    nics = sorted({nic for _, nic in by_nic})
    rows = []
    for gpu in gpus:
        cells = [
            link_cell(gpu, other, by_pair.get(frozenset((gpu.pk, other.pk)))) for other in gpus
        ]
        if gpu.pk in highlight:
            for cell, other in zip(cells, gpus, strict=True):
                cell.highlighted = other.pk in highlight
        row = TopologyRow(gpu=gpu, cells=cells, highlighted=gpu.pk in highlight)
        row.nic_cells = [(nic, nic_cell(gpu, nic, by_nic.get((gpu.pk, nic)))) for nic in nics]
        rows.append(row)
    return rows


def has_nvlink(rows: Iterable[TopologyRow]) -> bool:
    """Whether any GPU pair of the matrix is joined by NVLink (the bandwidth note's subject)."""
    return any(cell.css == "nv" for row in rows for cell in row.cells)


@dataclasses.dataclass
class TopologyMatrix:
    """A node's ``topo -m`` matrix as data (the API's shape), GPUs in index order."""

    node: str
    gpus: list[int]
    matrix: list[list[str | None]]
    nvlink_counts: list[list[int]]
    numa_nodes: list[int | None]
    gpu_numa_nodes: list[int | None]  # topo -m "GPU NUMA ID" (Grace Hopper), None: N/A
    cpu_affinity: list[str]
    nics: list[str]
    nic_links: list[list[str | None]]  # [GPU][NIC]: PIX ... SYS


def topology_matrix(node: Node) -> TopologyMatrix:
    gpus = list(node.gpus.present().order_by("index"))
    by_pair = {frozenset((link.gpu_a_id, link.gpu_b_id)): link for link in node.links.all()}
    by_nic = {(link.gpu_id, link.nic): link.link_type for link in node.nic_links.all()}
    nics = sorted({nic for _, nic in by_nic})

    def link(a: Gpu, b: Gpu) -> GpuLink | None:
        return by_pair.get(frozenset((a.pk, b.pk)))

    return TopologyMatrix(
        node=node.hostname,
        gpus=[gpu.index for gpu in gpus],
        matrix=[
            ["X" if a.pk == b.pk else getattr(link(a, b), "link_type", None) for b in gpus]
            for a in gpus
        ],
        nvlink_counts=[[getattr(link(a, b), "nvlink_count", 0) for b in gpus] for a in gpus],
        numa_nodes=[gpu.numa_node for gpu in gpus],
        gpu_numa_nodes=[gpu.gpu_numa_node for gpu in gpus],
        cpu_affinity=[gpu.cpu_affinity for gpu in gpus],
        nics=nics,
        nic_links=[[by_nic.get((gpu.pk, nic)) for nic in nics] for gpu in gpus],
    )
