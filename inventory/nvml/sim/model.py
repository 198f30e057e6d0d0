"""Machine models (JSON under ``machines/``), fleet specs and per-node GPU identities."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NotRequired, TypedDict, overload

import pynvml

from .. import mig_catalog

MACHINE_DIR = Path(__file__).with_name("machines")
_MIG_UUID_NAMESPACE = uuid.UUID("8b7e0a52-5c1a-4a3e-9d4e-6a1f0c2b7d11")


def sys_apart(
    numa_a: int | None, numa_b: int | None, root_a: int | None, root_b: int | None
) -> bool:
    """SYS apart. Explicit root complexes decide alone: one root complex may span the NUMA
    nodes of one socket (sub-NUMA clustering, NPS: ``topo -m`` prints NODE across them)."""
    if root_a is not None and root_b is not None:
        return root_a != root_b
    return numa_a != numa_b or root_a != root_b


def parse_cpulist(text: str) -> list[int]:
    """``"48-63,176-191"`` -> ``[48, ..., 63, 176, ..., 191]``; ``""`` (a NUMA node whose CPUs
    the capture did not show) -> ``[]``."""
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.strip().partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


@overload
def _const(name: str) -> int: ...
@overload
def _const(name: None) -> None: ...
def _const(name: str | None) -> int | None:
    return None if name is None else getattr(pynvml, name)


def _hex(text: str) -> int:
    return int(text, 16)


class Temperatures(TypedDict):
    """``temperature_c`` in °C; a threshold the board lacks is None (NOT_SUPPORTED)."""

    idle: int
    full_load: int
    shutdown: int | None
    slowdown: int | None
    gpu_max: int | None
    mem_max: int | None
    # The memory (HBM) sensor at idle; absent: no memory sensor (GDDR boards: NOT_SUPPORTED).
    memory_idle: NotRequired[int]


@dataclass(frozen=True)
class GpuType:
    """Static facts shared by every GPU of one board type, as NVML reports them."""

    key: str
    name: str
    brand: int
    architecture: int
    cuda_cc: tuple[int, int]
    num_gpu_cores: int | None
    pci_device_id: int
    pci_subsystem_id: int
    board_part_number: str | None
    vbios_version: str
    inforom_image_version: str | None
    serial_prefix: str | None
    multi_gpu_board: int
    persistence_mode: int | None  # None: NOT_SUPPORTED (Windows drivers)
    compute_mode: int
    memory: dict[str, int]  # bar1_total_mib, bar1_idle_used_mib: None = NOT_SUPPORTED
    clocks_max: dict[str, int]
    clocks_idle: dict[str, int]
    # default_limit, min_limit, max_limit, enforced_limit (None: no power management),
    # idle, full_load (None: no power readings)
    power: dict[str, float | None]
    temperature: Temperatures
    pstate: dict[str, int]
    fan: dict[str, int] | None
    ecc_mode: tuple[int, int] | None  # (current, pending) NVML_FEATURE_*; None: no ECC
    page_retirement: bool
    row_remapper_banks: int | None
    mig_table: mig_catalog.MigTable | None
    # MIG-capable: a table, or a captured MIG mode on a board the catalog has no table for.
    mig_capable: bool
    mem_util_at_full_load: int
    pcie_kbs: dict[str, int]
    nvlink_version: int | None
    nvlink_caps: dict[int, int]

    @property
    def ecc_enabled(self) -> bool:
        """ECC is on now: the error counters and ECC events exist only then."""
        return self.ecc_mode is not None and self.ecc_mode[0] == pynvml.NVML_FEATURE_ENABLED


@dataclass(frozen=True)
class GpuSlot:
    """One GPU position in a machine: its PCI address, NUMA node, PCIe path and NVLinks."""

    index: int
    type: GpuType
    bus_id: str  # "00000000:07:00.0"
    domain: int
    bus: int
    device: int
    numa_node: int | None
    pcie_path: tuple[str, ...]  # host bridge first, then PCIe switches towards the GPU
    nvlink_switch_links: tuple[int, ...]  # remote NVSwitch index per link
    nvlink_gpu_links: tuple[int, ...]  # remote GPU index per link (bridged boards)
    # Identities of a machine imported from a capture (`gpuadmin sim import`); None = generated.
    uuid: str | None = None
    serial: str | None = None
    # The CPU list where it is not the NUMA node's: no NUMA node (desktops), or several NUMA
    # nodes whose own CPU lists the capture did not show. None: the node(s)' CPUs.
    cpu_affinity: tuple[int, ...] | None = None
    minor_number: int | None = None  # /dev/nvidia<N>; None: NOT_SUPPORTED (Windows)
    # GPUs/NICs of one NUMA node on different root complexes are SYS apart (None: the node's).
    root_complex: int | None = None
    # Memory affine to several NUMA nodes (AMD NPS, Intel SNC: topo -m "0-3"), numa_node the
    # lowest; () for one node.
    numa_nodes: tuple[int, ...] = ()
    # The GPU's own NUMA node: its memory as a NUMA node of the host (Grace Hopper's coherent
    # C2C memory; topo -m "GPU NUMA ID"). None: NOT_SUPPORTED, as on every PCIe/SXM x86 GPU.
    gpu_numa_id: int | None = None

    @property
    def memory_nodes(self) -> tuple[int, ...]:
        """The NUMA nodes of nvmlDeviceGetMemoryAffinity's NODE scope (topo -m NUMA Affinity)."""
        if self.numa_nodes:
            return self.numa_nodes
        return () if self.numa_node is None else (self.numa_node,)


@dataclass(frozen=True)
class NicSlot:
    """A network adapter (``mlx5_0``): NVML does not see it, ``nvidia-smi topo -m`` does."""

    name: str
    numa_node: int | None
    pcie_path: tuple[str, ...]
    root_complex: int | None = None


@dataclass(frozen=True)
class NvSwitch:
    bus_id: str
    domain: int
    bus: int
    device: int
    pci_device_id: int
    pci_subsystem_id: int


@dataclass(frozen=True)
class MachineModel:
    name: str
    description: str
    driver_version: str
    cuda_driver_version: int
    nvml_version: str
    numa_cpus: dict[int, tuple[int, ...]]
    numa_socket: dict[int, int]
    pcie_p2p_max_level: int | None
    nvswitches: tuple[NvSwitch, ...]
    gpus: tuple[GpuSlot, ...]
    nics: tuple[NicSlot, ...]
    initial_state: dict[str, Any]
    raw: dict[str, Any]
    host_memory_mib: int | None = None  # the host's RAM; None: the model does not say

    @property
    def cpus(self) -> frozenset[int]:
        """The host's logical CPUs: every NUMA node's."""
        return frozenset(cpu for cpus in self.numa_cpus.values() for cpu in cpus)


def parse_bus_id(text: str) -> tuple[int, int, int]:
    """Accept ``00000000:07:00.0``, ``0000:07:00.0`` or ``07:00.0`` (any case)."""
    parts = text.strip().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3 or "." not in parts[2]:
        raise ValueError(f"bad PCI bus id {text!r}")
    dev, _, _fn = parts[2].partition(".")
    return int(parts[0], 16), int(parts[1], 16), int(dev, 16)


def format_bus_id(domain: int, bus: int, device: int) -> str:
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def _ecc_mode(spec: bool | dict[str, bool]) -> tuple[int, int] | None:
    """``true`` (on, current and pending), ``false`` (no ECC) or ``{"current", "pending"}``."""
    if isinstance(spec, dict):
        return int(spec["current"]), int(spec["pending"])
    return (pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_ENABLED) if spec else None


def _power(spec: dict[str, float | None]) -> dict[str, float | None]:
    """``power_w`` with ``enforced_limit`` filled in (absent or null: the default limit)."""
    enforced = spec.get("enforced_limit")
    return {**spec, "enforced_limit": spec["default_limit"] if enforced is None else enforced}


def _gpu_type(key: str, spec: dict[str, Any]) -> GpuType:
    nvlink = spec.get("nvlink")
    return GpuType(
        key=key,
        name=spec["name"],
        brand=_const(spec["brand"]),
        architecture=_const(spec["architecture"]),
        cuda_cc=tuple(spec["cuda_compute_capability"]),
        num_gpu_cores=spec.get("num_gpu_cores"),
        pci_device_id=_hex(spec["pci_device_id"]),
        pci_subsystem_id=_hex(spec["pci_subsystem_id"]),
        board_part_number=spec["board_part_number"],
        vbios_version=spec["vbios_version"],
        inforom_image_version=spec["inforom_image_version"],
        serial_prefix=spec["serial_prefix"],
        multi_gpu_board=spec["multi_gpu_board"],
        persistence_mode=spec["persistence_mode"],
        compute_mode=spec["compute_mode"],
        memory=spec["memory"],
        clocks_max=spec["clocks_max_mhz"],
        clocks_idle=spec["clocks_idle_mhz"],
        power=_power(spec["power_w"]),
        temperature=spec["temperature_c"],
        pstate=spec["pstate"],
        fan=spec["fan"],
        ecc_mode=_ecc_mode(spec["ecc"]),
        page_retirement=spec["page_retirement"],
        row_remapper_banks=spec["row_remapper_banks"],
        mig_table=mig_catalog.load_table(spec["mig_table"]) if spec["mig_table"] else None,
        mig_capable=bool(spec["mig_table"]) or spec.get("mig_capable", False),
        mem_util_at_full_load=spec["mem_util_at_full_load"],
        pcie_kbs=spec["pcie_kbs"],
        nvlink_version=_const(nvlink["version"]) if nvlink else None,
        nvlink_caps={_const(k): v for k, v in nvlink["capabilities"].items()} if nvlink else {},
    )


def parse_model(data: dict[str, Any]) -> MachineModel:
    """Build a MachineModel from the JSON schema documented in ``sim/README.md``."""
    if data.get("schema") != 1:
        raise ValueError(f"{data.get('name')}: unsupported machine model schema")
    types = {key: _gpu_type(key, spec) for key, spec in data["gpu_types"].items()}
    defaults = data.get("gpu_defaults", {})
    gpus = []
    for index, entry in enumerate(data["gpus"]):
        merged = {**defaults, **entry}
        domain, bus, device = parse_bus_id(merged["bus_id"])
        gpus.append(
            GpuSlot(
                index=index,
                type=types[merged["type"]],
                bus_id=format_bus_id(domain, bus, device),
                domain=domain,
                bus=bus,
                device=device,
                numa_node=merged.get("numa_node"),
                numa_nodes=tuple(sorted(merged.get("numa_nodes", ()))),
                pcie_path=tuple(merged["pcie_path"]),
                nvlink_switch_links=tuple(merged.get("nvlink_switch_links", ())),
                nvlink_gpu_links=tuple(merged.get("nvlink_gpu_links", ())),
                uuid=merged.get("uuid"),
                serial=merged.get("serial"),
                cpu_affinity=tuple(parse_cpulist(merged["cpu_affinity"]))
                if merged.get("cpu_affinity")
                else None,
                root_complex=merged.get("root_complex"),
                minor_number=merged.get("minor_number", index),
                gpu_numa_id=merged.get("gpu_numa_id"),
            )
        )
        slot = gpus[-1]
        if slot.numa_nodes and slot.numa_node != slot.numa_nodes[0]:
            raise ValueError(f"{data.get('name')}: GPU {index} numa_node is not its lowest node")
        if (slot.nvlink_switch_links or slot.nvlink_gpu_links) and slot.type.nvlink_version is None:
            raise ValueError(f"{data.get('name')}: GPU {index} has NVLinks but its type no nvlink")
    switches = []
    for sw in data.get("nvswitches", []):
        domain, bus, device = parse_bus_id(sw["bus_id"])
        switches.append(
            NvSwitch(
                format_bus_id(domain, bus, device),
                domain,
                bus,
                device,
                _hex(sw["pci_device_id"]),
                _hex(sw["pci_subsystem_id"]),
            )
        )
    numa = data["numa_nodes"]
    system = data["system"]
    return MachineModel(
        name=data["name"],
        description=data.get("description", ""),
        driver_version=system["driver_version"],
        cuda_driver_version=system["cuda_driver_version"],
        nvml_version=system["nvml_version"],
        numa_cpus={int(k): tuple(parse_cpulist(v["cpus"])) for k, v in numa.items()},
        numa_socket={int(k): v["socket"] for k, v in numa.items()},
        pcie_p2p_max_level=_const(data.get("pcie_p2p_max_level")),
        nvswitches=tuple(switches),
        gpus=tuple(gpus),
        nics=tuple(
            NicSlot(
                name=nic["name"],
                numa_node=nic.get("numa_node"),
                pcie_path=tuple(nic["pcie_path"]),
                root_complex=nic.get("root_complex"),
            )
            for nic in data.get("nics", [])
        ),
        initial_state=data.get("initial_state", {}),
        raw=data,
        host_memory_mib=data.get("host_memory_mib"),
    )


def list_models() -> list[str]:
    """Names of the machine models shipped under ``machines/``."""
    return sorted(p.stem for p in MACHINE_DIR.glob("*.json"))


@cache
def _load_named(name: str) -> MachineModel:
    path = MACHINE_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown machine model {name!r}; known: {', '.join(list_models())}")
    return parse_model(json.loads(path.read_text()))


def load_model(model: str | dict[str, Any] | MachineModel) -> MachineModel:
    """A shipped model by name, a model JSON file (``*.json``, e.g. from ``gpuadmin sim
    import``), or an inline model dict (same schema)."""
    if isinstance(model, MachineModel):
        return model
    if isinstance(model, dict):
        return parse_model(model)
    if model.endswith(".json"):
        return parse_model(json.loads(Path(model).read_text()))
    return _load_named(model)


# --- identities -------------------------------------------------------------------------------


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()


def gpu_uuid(model: str, node: str, index: int, salt: int = 0) -> str:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``, stable per (model, node, index)."""
    h = _digest("gpuadmin-sim-uuid", model, node, index, salt)[:16].hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_serial(prefix: str, model: str, node: str, index: int, salt: int = 0) -> str:
    """13-digit board serial: the model's captured prefix plus digits hashed from the node."""
    width = 13 - len(prefix)
    number = int.from_bytes(_digest("gpuadmin-sim-serial", model, node, index, salt)[:8], "big")
    return f"{prefix}{number % 10**width:0{width}d}"


def mig_uuid(parent_uuid: str, gi_id: int, ci_id: int) -> str:
    """Modern ``MIG-<uuid>`` id; real MIG UUIDs are version-5 UUIDs as well."""
    return f"MIG-{uuid.uuid5(_MIG_UUID_NAMESPACE, f'{parent_uuid}/{gi_id}/{ci_id}')}"


# --- fleet spec -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetNode:
    name: str
    model: str | dict[str, Any]
    mig: dict[int, list[Any] | None]  # GPU index -> layout (None: MIG disabled)
    salt: int  # bumped when a hashed serial would collide with an earlier node of the fleet


def load_fleet(spec: str | os.PathLike[str] | dict[str, Any] | list[Any]) -> list[FleetNode]:
    """Parse a fleet spec: ``{"nodes": [{"name", "model", "mig"?}, ...]}`` (or the bare list)."""
    data = spec if isinstance(spec, dict | list) else json.loads(Path(spec).read_text())
    entries = data["nodes"] if isinstance(data, dict) else data
    nodes: list[FleetNode] = []
    seen_serials: set[str] = set()
    names: set[str] = set()
    for entry in entries:
        name = entry["name"]
        if name in names:
            raise ValueError(f"fleet spec: node {name!r} listed twice")
        names.add(name)
        model = load_model(entry["model"])
        salt = 0
        while True:
            serials = {
                gpu_serial(g.type.serial_prefix, model.name, name, g.index, salt)
                for g in model.gpus
                if g.type.serial_prefix and not g.serial  # a captured serial never changes
            }
            if seen_serials.isdisjoint(serials):
                break
            salt += 1
        seen_serials |= serials
        mig_layout = {int(k): v for k, v in entry.get("mig", {}).items()}
        nodes.append(FleetNode(name, entry["model"], mig_layout, salt))
    return nodes
