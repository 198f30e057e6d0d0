"""Parser for ``nvidia-smi topo -m`` / ``topo --matrix`` / ``topo -mp``.

Seen in the captures: drivers up to 610 (older pastes do not name theirs), DGX-1 (``-mp``),
DGX A100, HGX H100/H800/A800,
PCIe boxes and desktops, single-GPU VMs. Handles tab- and space-separated pastes, CRLF line
ends, the `` X `` self cell, the ANSI underline around the header row, NIC rows with fewer cells,
old ``mlx5_N`` column names and the newer ``NIC<N>`` columns with a ``NIC Legend``, the optional
``GPU NUMA ID`` column (with its empty extra tab cell), ``N/A`` NUMA affinity, the legend block,
and pastes cut after the GPU rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .common import ParseError, none_if_na, parse_cpu_list, parse_int, strip_ansi

__all__ = ["TopoDevice", "TopoMatrix", "parse_topo_matrix"]

NUMA_COLUMN = "NUMA Affinity"

# Columns after the device columns, in the order nvidia-smi prints them.
_AFFINITY_COLUMNS = ("CPU Affinity", NUMA_COLUMN, "GPU NUMA ID")
_LINK_RE = re.compile(r"^(X|NV\d{1,18}|PIX|PXB|PHB|NODE|SYS|SOC)$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


@dataclass(frozen=True)
class TopoDevice:
    """One row/column of the matrix. ``cpus`` is ``None`` when the affinity is N/A or cut."""

    name: str
    is_gpu: bool
    cpu_affinity: str | None = None
    cpus: tuple[int, ...] | None = None
    numa_node: int | None = None  # the lowest of numa_nodes, as NVML's memory affinity gives it
    gpu_numa_id: int | None = None
    numa_nodes: tuple[int, ...] | None = None  # the NUMA Affinity as printed: "0-1" -> (0, 1)


@dataclass(frozen=True)
class TopoMatrix:
    """``devices`` in header order; ``links`` maps ``(row, column)`` to a link type (``"NV12"``,
    ``"PXB"``, ...) for every off-diagonal cell present, in both directions as printed;
    ``nic_names`` maps ``NIC0`` to ``mlx5_0`` from the NIC legend; ``columns`` names the
    affinity columns the header has (old drivers print no ``NUMA Affinity``)."""

    devices: tuple[TopoDevice, ...]
    links: dict[tuple[str, str], str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)
    columns: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(device.name for device in self.devices)

    @property
    def gpus(self) -> tuple[TopoDevice, ...]:
        return tuple(device for device in self.devices if device.is_gpu)

    @property
    def nics(self) -> tuple[str, ...]:
        """Network adapters in header order, by their legend name (``NIC0`` -> ``mlx5_0``)."""
        return tuple(
            self.nic_names.get(device.name, device.name)
            for device in self.devices
            if not device.is_gpu
        )

    def nic_links(self) -> dict[str, dict[str, str]]:
        """GPU -> {adapter name: PIX/PXB/PHB/NODE/SYS} for every GPU-NIC cell present."""
        out: dict[str, dict[str, str]] = {}
        for gpu in self.gpus:
            row = out.setdefault(gpu.name, {})
            for device in self.devices:
                if device.is_gpu:
                    continue
                link = self.links.get((gpu.name, device.name)) or self.links.get(
                    (device.name, gpu.name)
                )
                if link is not None:
                    row[self.nic_names.get(device.name, device.name)] = link
        return out

    def device(self, name: str) -> TopoDevice:
        for device in self.devices:
            if device.name == name:
                return device
        raise KeyError(name)

    def nvlink_count(self, a: str, b: str) -> int:
        """Number of bonded NVLinks between ``a`` and ``b`` (``NV12`` -> 12), 0 for PCIe paths."""
        link = self.links.get((a, b)) or self.links.get((b, a)) or ""
        return int(link[2:]) if link.startswith("NV") else 0


def _header(lines: list[str]) -> tuple[int, list[str], list[str]]:
    """Index of the header line, its device names, and its trailing affinity column names."""
    for index, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == "GPU0" and "X" not in tokens:
            rest = line.strip()
            extras = [column for column in _AFFINITY_COLUMNS if column in rest]
            for column in extras:
                rest = rest.replace(column, " ")
            return index, rest.split(), extras
    raise ParseError("no 'GPU0 ...' header row found in topo -m output")


def _device(name: str, values: list[str], extras: list[str]) -> TopoDevice:
    by_column = dict(zip(extras, values, strict=False))
    # nvidia-smi emits an extra empty tab cell before "GPU NUMA ID": take that one from the end.
    if extras and extras[-1] == "GPU NUMA ID" and len(values) > len(extras):
        by_column["GPU NUMA ID"] = values[-1]
    affinity = none_if_na(by_column.get("CPU Affinity"))
    numa_nodes = parse_cpu_list(none_if_na(by_column.get(NUMA_COLUMN)))
    return TopoDevice(
        name=name,
        is_gpu=name.startswith("GPU"),
        cpu_affinity=affinity,
        cpus=parse_cpu_list(affinity),
        numa_node=numa_nodes[0] if numa_nodes else None,
        gpu_numa_id=parse_int(by_column.get("GPU NUMA ID")),
        numa_nodes=numa_nodes,
    )


def _cells(line: str) -> list[str]:
    """Tab-separated output keeps its empty cells; space-aligned pastes split on whitespace."""
    if "\t" in line:
        return [cell.strip() for cell in line.strip(" ").split("\t")]
    return line.split()


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m`` output into a :class:`TopoMatrix`.

    Raises :class:`ParseError` when there is no header row. Rows missing from a truncated paste
    are simply absent (their devices get no affinity); link cells present are kept.
    """
    lines = [strip_ansi(line).rstrip("\r") for line in text.splitlines()]
    start, names, extras = _header(lines)
    known = set(names)
    rows: dict[str, TopoDevice] = {}
    links: dict[tuple[str, str], str] = {}
    nic_names: dict[str, str] = {}
    for line in lines[start + 1 :]:
        tokens = _cells(line)
        if legend := _NIC_LEGEND_RE.match(line):
            nic_names[legend[1]] = legend[2]
            continue
        if not tokens or tokens[0] not in known or tokens[0] in rows:
            continue
        name, cells = tokens[0], tokens[1:]
        count = 0
        while count < min(len(cells), len(names)) and _LINK_RE.match(cells[count]):
            count += 1
        for column, link in zip(names, cells[:count], strict=False):
            if column != name:
                links[(name, column)] = link
        rows[name] = _device(name, cells[count:], extras)
    devices = tuple(
        rows.get(name) or TopoDevice(name=name, is_gpu=name.startswith("GPU")) for name in names
    )
    return TopoMatrix(devices=devices, links=links, nic_names=nic_names, columns=tuple(extras))
