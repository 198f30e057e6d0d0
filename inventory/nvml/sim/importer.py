"""Captured ``nvidia-smi`` output -> simulator machine model (``gpuadmin sim import``).

``model_from_capture`` (``-q -x``) and ``model_from_smi_text`` (``-q``) turn one machine's
capture, optionally with its ``nvidia-smi topo -m``, into a schema-1 machine model dict (see
``sim/README.md``) whose scan gives back the captured values. Plain Python, no Django.
Defaults, and how the topology is modelled: docs/development/design-notes.md, "Importing
nvidia-smi captures".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from .. import mig_catalog, pci_ids
from ..parsers import (
    GpuInfo,
    ParseError,
    PowerReadings,
    SmiLog,
    TopoMatrix,
    parse_topo_matrix,
)
from ..parsers.common import parse_bool, parse_celsius, parse_hex_id, parse_int
from ..parsers.smi_model import Node, build_smi_log
from ..parsers.smi_text import _tree as _text_tree
from ..parsers.smi_xml import _to_node as _xml_node
from ..parsers.topo import NUMA_COLUMN
from .model import Temperatures, parse_model, sys_apart

__all__ = [
    "CaptureError",
    "main",
    "model_from_capture",
    "model_from_smi_text",
    "pcie_level",
    "synthesize_pcie_paths",
]


class CaptureError(ValueError):
    """The capture cannot be turned into a machine model (the message says why)."""


# XML ``product_architecture`` -> pynvml constant; anything else (and old drivers, which do not
# print the field) -> NVML_DEVICE_ARCH_UNKNOWN, which NVML itself returns for unknown chips.
_ARCHITECTURES = {
    "Kepler": "NVML_DEVICE_ARCH_KEPLER",
    "Maxwell": "NVML_DEVICE_ARCH_MAXWELL",
    "Pascal": "NVML_DEVICE_ARCH_PASCAL",
    "Volta": "NVML_DEVICE_ARCH_VOLTA",
    "Turing": "NVML_DEVICE_ARCH_TURING",
    "Ampere": "NVML_DEVICE_ARCH_AMPERE",
    "Ada Lovelace": "NVML_DEVICE_ARCH_ADA",
    "Hopper": "NVML_DEVICE_ARCH_HOPPER",
    "Blackwell": "NVML_DEVICE_ARCH_BLACKWELL",
}
_ARCH_FALLBACK = "NVML_DEVICE_ARCH_UNKNOWN"

# ``product_brand`` -> pynvml constant; unknown brands -> NVML_BRAND_UNKNOWN.
_BRANDS = {
    "NVIDIA": "NVML_BRAND_NVIDIA",
    "GeForce": "NVML_BRAND_GEFORCE",
    "GeForce RTX": "NVML_BRAND_GEFORCE_RTX",
    "Quadro": "NVML_BRAND_QUADRO",
    "Quadro RTX": "NVML_BRAND_QUADRO_RTX",
    "NVIDIA RTX": "NVML_BRAND_NVIDIA_RTX",
    "Tesla": "NVML_BRAND_TESLA",
    "Titan": "NVML_BRAND_TITAN",
    "TITAN": "NVML_BRAND_TITAN",
    "NVS": "NVML_BRAND_NVS",
    "GRID": "NVML_BRAND_GRID",
    "NVIDIA RTX Virtual Workstation": "NVML_BRAND_NVIDIA_VWS",
    "NVIDIA Virtual PC": "NVML_BRAND_NVIDIA_VPC",
    "NVIDIA Virtual Compute Server": "NVML_BRAND_NVIDIA_VCS",
}
# Driver branches older than 410 print no CUDA version: the CUDA driver API each one ships
# (NVML's cudaDriverVersion encoding), from the CUDA toolkit release notes' driver table.
_CUDA_BY_BRANCH = {"384": 9000, "387": 9010, "390": 9010, "396": 9020, "410": 10000, "415": 10000}
_COMPUTE_MODES = {"Default": 0, "Exclusive_Thread": 1, "Prohibited": 2, "Exclusive_Process": 3}

# What nvmlDeviceGetNvLinkVersion answers: an nvmlNvlinkVersion_t, not the NVLink generation
# (an A100 or RTX 3090 answers 5, NVLINK_VERSION_3_1: open-mpi/hwloc#658, Syllo/nvtop#469).
_NVLINK_VERSIONS = {
    "NVML_DEVICE_ARCH_PASCAL": "NVML_NVLINK_VERSION_1_0",
    "NVML_DEVICE_ARCH_VOLTA": "NVML_NVLINK_VERSION_2_0",
    "NVML_DEVICE_ARCH_AMPERE": "NVML_NVLINK_VERSION_3_1",
    "NVML_DEVICE_ARCH_HOPPER": "NVML_NVLINK_VERSION_4_0",
    "NVML_DEVICE_ARCH_BLACKWELL": "NVML_NVLINK_VERSION_5_0",
}
# What A100 and H800 report (nvlink/ fixtures): every capability but "Link is supported".
_NVLINK_CAPABILITIES = {
    "NVML_NVLINK_CAP_P2P_SUPPORTED": 1,
    "NVML_NVLINK_CAP_SYSMEM_ACCESS": 1,
    "NVML_NVLINK_CAP_P2P_ATOMICS": 1,
    "NVML_NVLINK_CAP_SYSMEM_ATOMICS": 1,
    "NVML_NVLINK_CAP_SLI_BRIDGE": 1,
    "NVML_NVLINK_CAP_VALID": 0,
}
# NVSwitch chips per baseboard and their PCI device id (DGX/HGX A100: 6, HGX H100: 4).
_NVSWITCHES = {
    "NVML_DEVICE_ARCH_AMPERE": (6, "0x1AF110DE"),
    "NVML_DEVICE_ARCH_HOPPER": (4, "0x22A310DE"),
}
_NVSWITCH_FALLBACK = (1, "0x00000000")
# NVLinks per GPU (P100 4, V100 6, A100 12, H100 18); unknown chips: NVML's maximum.
_MAX_NVLINKS = {
    "NVML_DEVICE_ARCH_PASCAL": 4,
    "NVML_DEVICE_ARCH_VOLTA": 6,
    "NVML_DEVICE_ARCH_AMPERE": 12,
    "NVML_DEVICE_ARCH_HOPPER": 18,
}
_MIN_FABRIC_GPUS = 4

_PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first, as NVML orders them
_RANK = {level: rank for rank, level in enumerate(_PCIE_LEVELS)}

# Conservative defaults for what a capture lacks (each use is listed in "sources").
_FALLBACK_POWER_LIMIT_W = 75.0  # PCIe slot power: the smallest board limit there is
_FULL_LOAD_POWER_SHARE = 0.9  # of the default power limit
# A capture at this GPU utilization or above was taken under load: its readings are a loaded
# sample, not the idle baseline. The assumed idle draw is a share of the default limit (the idle
# captures draw 10-20 %: H100 10 %, A100 13 %, L40S 19 %, B200 20 %).
_LOADED_UTIL_PCT = 10
_IDLE_POWER_SHARE = 0.15
_FULL_LOAD_TEMP_C = 70
_IDLE_TEMP_C = 30
_FALLBACK_BAR1_MIB = 256
_MEM_UTIL_AT_FULL_LOAD = 30
_PCIE_FULL_LOAD_KBS = 10000
_FAN_CURVE = {"min_pct": 30, "full_c": 90}  # a zero-RPM fan starts 10 C above the idle temp
_IDLE_READINGS = (
    ("memory", "idle_used_mib"),
    ("memory", "bar1_idle_used_mib"),
    ("power_w", "idle"),
    ("power_w", "full_load"),  # a loaded capture's sample
    ("pstate", "idle"),
    ("pstate", "load"),
    ("pcie_kbs", "idle"),
)
_TLIMIT_THRESHOLDS = {  # absolute threshold = T.Limit temperature - printed offset
    "shutdown": ("gpu_temp_max_tlimit_threshold", "gpu_shutdown_t_limit_temp"),
    "slowdown": ("gpu_temp_slow_tlimit_threshold", "gpu_slowdown_t_limit_temp"),
    "gpu_max": ("gpu_temp_max_gpu_tlimit_threshold", "gpu_max_operating_t_limit_temp"),
}


class _Sources:
    """The model's ``"sources"``: where each value comes from, or what was assumed."""

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}

    def pick(self, field: str, value: Any, fallback: Any, why: str) -> Any:
        """``value`` when captured, else ``fallback`` (recorded as an assumption)."""
        if value is not None:
            return value
        self.entries.setdefault(field, f"assumed: {why}")
        return fallback

    def note(self, field: str, text: str) -> None:
        self.entries.setdefault(field, text)

    def not_supported(self, field: str, value: Any) -> Any:
        """``value``; ``None`` is the capture's "N/A", which NVML answers as NOT_SUPPORTED."""
        if value is None:
            self.note(field, "capture says N/A: null (NVML_ERROR_NOT_SUPPORTED)")
        return value


# --------------------------------------------------------------------------- public API


def model_from_capture(
    smi_xml_text: str | bytes,
    topo_text: str | None = None,
    *,
    name: str,
    smi_source: str = "nvidia-smi -q -x",
    topo_source: str = "nvidia-smi topo -m",
) -> dict[str, Any]:
    """A schema-1 machine model from ``nvidia-smi -q -x`` (and ``topo -m``) output.

    ``smi_source`` / ``topo_source`` name the files in the model's ``"sources"``. Raises
    :class:`CaptureError` for unreadable, incomplete or inconsistent input.
    """
    try:
        root = _xml_node(ET.fromstring(smi_xml_text))
    except ET.ParseError as exc:
        raise CaptureError(f"{smi_source}: not well-formed nvidia-smi XML: {exc}") from exc
    if root.key != "nvidia_smi_log":
        raise CaptureError(f"{smi_source}: expected <nvidia_smi_log> root, got <{root.key}>")
    return _build(root, topo_text, name, smi_source, topo_source)


def model_from_smi_text(
    smi_text: str,
    topo_text: str | None = None,
    *,
    name: str,
    smi_source: str = "nvidia-smi -q",
    topo_source: str = "nvidia-smi topo -m",
) -> dict[str, Any]:
    """Like :func:`model_from_capture`, from ``nvidia-smi -q`` (or ``-a``) text."""
    return _build(_text_tree(smi_text), topo_text, name, smi_source, topo_source)


# --------------------------------------------------------------------------- the builder


def _build(
    root: Node, topo_text: str | None, name: str, smi_source: str, topo_source: str
) -> dict[str, Any]:
    log = build_smi_log(root)
    nodes = root.find_all("gpu")
    _check_complete(log, smi_source)
    src = _Sources()
    driver = log.driver_version
    cuda = _cuda_version(log.cuda_version)
    if cuda is None and (cuda := _CUDA_BY_BRANCH.get((driver or "").split(".")[0])):
        src.note(
            "system.cuda_driver_version",
            f"derived: CUDA {cuda // 1000}.{cuda % 1000 // 10} from driver branch {driver} "
            "(no CUDA Version in the capture: drivers before 410 and 410's -q print none)",
        )
    cuda = src.pick("system.cuda_driver_version", cuda, 0, "0 (no CUDA Version in the capture)")
    src.note("system.driver_version, cuda_driver_version", f"{smi_source} (driver {driver})")
    src.note("system.nvml_version", "derived: NVML reports <CUDA major>.<driver>")

    type_keys, gpu_types = _gpu_types(log.gpus, nodes, src, smi_source)
    topo = _topology(log, topo_text, topo_source, smi_source, src)
    nvswitches, gpu_defaults = _nvswitches(topo.fabric_links, gpu_types, src, topo_source)
    linked = {key for key, links in zip(type_keys, topo.gpu_links, strict=True) if links}
    if topo.fabric_links or linked:
        _nvlink_specs({k: v for k, v in gpu_types.items() if topo.fabric_links or k in linked}, src)
    if len(gpu_types) == 1:
        gpu_defaults["type"] = next(iter(gpu_types))

    gpus = []
    for index, gpu in enumerate(log.gpus):
        entry: dict[str, Any] = {
            "bus_id": gpu.pci_bus_id,
            "numa_node": topo.numa[index],
            "pcie_path": topo.paths[index],
        }
        if len(gpu_types) > 1:
            entry["type"] = type_keys[index]
        if topo.gpu_links[index]:
            entry["nvlink_gpu_links"] = topo.gpu_links[index]
        if topo.multi_numa[index]:
            entry["numa_nodes"] = topo.multi_numa[index]
        if topo.own_cpus[index]:
            entry["cpu_affinity"] = topo.own_cpus[index]
        if topo.roots is not None:
            entry["root_complex"] = topo.roots[index]
        if topo.gpu_numa_ids[index] is not None:
            entry["gpu_numa_id"] = topo.gpu_numa_ids[index]
        entry.update(_identity(gpu, log.gpus))
        if gpu.uuid is not None and "uuid" not in entry:
            src.note(
                "gpus[].uuid",
                f"not kept: {smi_source} repeats UUID {gpu.uuid} (a scrubbed capture): generated",
            )
        entry["minor_number"] = gpu.minor_number
        gpus.append(entry)
    src.note("gpus[].bus_id, order", smi_source)
    src.note("gpus[].uuid, serial", f"{smi_source} (uuid only where unique in the capture)")
    src.note("gpus[].minor_number", f"{smi_source} (null: N/A, NVML_ERROR_NOT_SUPPORTED)")
    if log.attached_gpus is not None and log.attached_gpus != len(log.gpus):
        src.note("gpus", f"{smi_source} lists {len(log.gpus)} of {log.attached_gpus} attached GPUs")

    initial_mig = _initial_mig(log.gpus, gpu_types, type_keys, src, smi_source)
    captured_state = _captured_state(log.gpus, gpu_types, type_keys, src, smi_source)
    gpu_names = sorted({t["name"] for t in gpu_types.values()})
    model: dict[str, Any] = {
        "schema": 1,
        "name": name,
        "description": f"Imported from {smi_source}: {len(gpus)}x {', '.join(gpu_names)}",
        "sources": {},
        "system": {
            "driver_version": driver,
            "cuda_driver_version": cuda,
            "nvml_version": f"{cuda // 1000}.{driver}",
        },
        "numa_nodes": dict(sorted(topo.numa_nodes.items(), key=lambda item: int(item[0]))),
        "pcie_p2p_max_level": "NVML_TOPOLOGY_HOSTBRIDGE",
        "nvswitches": nvswitches,
        "gpu_types": gpu_types,
        "gpu_defaults": gpu_defaults,
        "gpus": gpus,
    }
    src.note("pcie_p2p_max_level", "assumed: PCIe P2P works up to a shared host bridge (PHB)")
    if topo.nics:
        model["nics"] = topo.nics
    initial_state = {"mig": initial_mig, "gpus": captured_state}
    if initial_mig or captured_state:
        model["initial_state"] = {key: value for key, value in initial_state.items() if value}
    model["sources"] = src.entries
    return model


def _check_complete(log: SmiLog, smi_source: str) -> None:
    if not log.gpus:
        raise CaptureError(f"{smi_source}: no GPU in the capture")
    if log.driver_version is None:
        raise CaptureError(f"{smi_source}: no driver version (a trimmed fragment?)")
    for index, gpu in enumerate(log.gpus):
        missing = [
            label
            for label, value in (
                ("product name", gpu.product_name),
                ("PCI bus id", gpu.pci_bus_id),
                ("FB memory total", gpu.fb_memory.total_mib),
            )
            if value is None
        ]
        if missing:
            raise CaptureError(
                f"{smi_source}: GPU {index} lacks {', '.join(missing)} (a trimmed fragment?)"
            )
    bus_ids = [gpu.pci_bus_id for gpu in log.gpus]
    if len(set(bus_ids)) != len(bus_ids):
        raise CaptureError(f"{smi_source}: duplicate PCI bus ids {bus_ids}")


def _cuda_version(text: str | None) -> int | None:
    """``"12.2"`` -> 12020 (NVML's ``cudaDriverVersion`` encoding)."""
    match = re.fullmatch(r"(\d+)\.(\d+)", text or "")
    return None if match is None else int(match[1]) * 1000 + int(match[2]) * 10


def _identity(gpu: GpuInfo, all_gpus: Sequence[GpuInfo]) -> dict[str, str]:
    """Captured UUID (when unique: scrubbed captures repeat one) and serial of one GPU."""
    out = {}
    if gpu.uuid is not None and sum(g.uuid == gpu.uuid for g in all_gpus) == 1:
        out["uuid"] = gpu.uuid
    if gpu.serial is not None:
        out["serial"] = gpu.serial
    return out


# --------------------------------------------------------------------------- GPU types


def _type_key(product_name: str, taken: dict[str, Any]) -> str:
    base = re.sub(r"[^A-Za-z0-9]+", "-", product_name.removeprefix("NVIDIA ")).strip("-")
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}-{n}"
    return key


def _static_view(spec: dict[str, Any]) -> str:
    """The type's facts without its idle readings and serial prefix (GPUs of one board type
    differ in those; each GPU keeps its captured serial). Temperatures are all readings: the
    thresholds newer drivers print are offsets from the current T.Limit."""
    view = json.loads(json.dumps(spec))
    if view["fan"] is not None:
        view["fan"] = True  # the curve follows the idle temperature
    view["clocks_idle_mhz"] = view["serial_prefix"] = view["temperature_c"] = None
    for group, key in _IDLE_READINGS:
        view[group][key] = None
    return json.dumps(view, sort_keys=True)


def _gpu_types(
    gpus: Sequence[GpuInfo], nodes: Sequence[Node], src: _Sources, smi_source: str
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """One type per distinct set of board facts; idle readings and the serial prefix come from
    its first GPU."""
    types: dict[str, dict[str, Any]] = {}
    by_view: dict[str, str] = {}
    keys = []
    for index, (gpu, node) in enumerate(zip(gpus, nodes, strict=True)):
        notes = _Sources()
        spec = _gpu_type(gpu, node, notes)
        view = _static_view(spec)
        if view not in by_view:
            key = _type_key(spec["name"], types)
            by_view[view] = key
            types[key] = spec
            src.note(
                f"gpu_types.{key}",
                f"{smi_source} (GPU {index} {gpu.pci_bus_id}; idle readings from this GPU)",
            )
            for field, text in notes.entries.items():
                src.note(f"gpu_types.{key}.{field}", text)
        keys.append(by_view[view])
    return keys, types


def _gpu_type(gpu: GpuInfo, node: Node, src: _Sources) -> dict[str, Any]:
    arch_name = gpu.architecture
    device = pci_ids.lookup(gpu.pci_device_id)
    if node.get("product_architecture") is None and device is not None:
        src.note(
            "architecture",
            f"derived: {arch_name} from PCI device id {gpu.pci_device_id} ({device.name}; "
            "no product_architecture before driver 470)",
        )
    architecture = _ARCHITECTURES.get(arch_name or "")
    if architecture is None:
        src.note("architecture", f"assumed: {_ARCH_FALLBACK} (capture says {arch_name!r})")
        architecture = _ARCH_FALLBACK
    brand = _BRANDS.get(gpu.product_brand or "")
    if brand is None:
        src.note("brand", f"assumed: NVML_BRAND_UNKNOWN (capture says {gpu.product_brand!r})")
        brand = "NVML_BRAND_UNKNOWN"
    serial = gpu.serial
    persistence = src.not_supported("persistence_mode", gpu.persistence_mode)
    load = _captured_load(gpu, src)
    temperature = _temperatures(gpu, node, load, src)
    pstate = src.pick(
        "pstate.idle", parse_int((gpu.performance_state or "")[1:]), 0, "P0 (not captured)"
    )
    src.note("num_gpu_cores", "assumed: null (not in -q output)")
    src.note(
        "pstate.load, mem_util_at_full_load, pcie_kbs.full_load",
        f"assumed: P{pstate if load else 0}, {_MEM_UTIL_AT_FULL_LOAD} %, "
        f"{_PCIE_FULL_LOAD_KBS} KB/s",
    )
    return {
        "name": gpu.product_name,
        "brand": brand,
        "architecture": architecture,
        "cuda_compute_capability": list(_compute_capability(device, arch_name, src)),
        "num_gpu_cores": None,
        "pci_device_id": _hex(gpu.pci_device_id, "pci_device_id", src),
        "pci_subsystem_id": _hex(
            parse_hex_id(node.get("pci", ("pci_sub_system_id", "sub_system_id"))),
            "pci_subsystem_id",
            src,
        ),
        "board_part_number": gpu.board_part_number,
        "vbios_version": src.pick(
            "vbios_version", gpu.vbios_version, "00.00.00.00.00", "00.00.00.00.00 (not captured)"
        ),
        "inforom_image_version": node.get("inforom_version", ("img_version", "image_version")),
        "serial_prefix": serial[:4] if serial and serial.isdigit() else None,
        "multi_gpu_board": int(
            src.pick("multi_gpu_board", parse_bool(node.get("multigpu_board")), False, "No")
        ),
        "persistence_mode": None if persistence is None else int(persistence),
        "compute_mode": src.pick(
            "compute_mode",
            _COMPUTE_MODES.get(gpu.compute_mode or ""),
            0,
            "0 / Default (not captured)",
        ),
        "memory": {
            "total_mib": gpu.fb_memory.total_mib,
            "reserved_mib": src.pick(
                "memory.reserved_mib", gpu.fb_memory.reserved_mib, 0, "0 (not captured)"
            ),
            "idle_used_mib": _idle_memory(gpu, load, src),
            **_bar1(gpu, node, src),
        },
        "clocks_max_mhz": _clocks(gpu.max_clocks, gpu.clocks, "clocks_max_mhz", src),
        "clocks_idle_mhz": _clocks(gpu.clocks, gpu.max_clocks, "clocks_idle_mhz", src),
        "power_w": _power(gpu.power, load, src),
        "temperature_c": temperature,
        "pstate": {"idle": pstate, "load": pstate if load else 0},
        "fan": _fan(gpu.fan_speed_pct, temperature),
        "ecc": _ecc(gpu),
        "page_retirement": gpu.retired_pages.single_bit is not None,
        "row_remapper_banks": _row_remapper_banks(gpu, node, src),
        **_mig(gpu, src),
        "mem_util_at_full_load": _MEM_UTIL_AT_FULL_LOAD,
        "pcie_kbs": {
            "idle": src.pick(
                "pcie_kbs.idle",
                _kbs(node.get("pci", ("tx_util", "tx_throughput"))),
                0,
                "0 KB/s (not captured)",
            ),
            "full_load": _PCIE_FULL_LOAD_KBS,
        },
        "nvlink": None,
    }


def _bar1(gpu: GpuInfo, node: Node, src: _Sources) -> dict[str, int | None]:
    """BAR1 total and idle use. "N/A" (coherent C2C GPUs such as GH200 have no BAR1) stays
    unknown: NVML answers NOT_SUPPORTED; a capture without the section gets the legacy size."""
    if node.at("bar1_memory_usage", "total") is not None and gpu.bar1_memory.total_mib is None:
        src.not_supported("memory.bar1_total_mib, bar1_idle_used_mib", None)
        return {"bar1_total_mib": None, "bar1_idle_used_mib": None}
    return {
        "bar1_total_mib": src.pick(
            "memory.bar1_total_mib",
            gpu.bar1_memory.total_mib,
            _FALLBACK_BAR1_MIB,
            f"{_FALLBACK_BAR1_MIB} MiB (legacy BAR1 size)",
        ),
        "bar1_idle_used_mib": src.pick(
            "memory.bar1_idle_used_mib", gpu.bar1_memory.used_mib, 0, "0"
        ),
    }


def _captured_load(gpu: GpuInfo, src: _Sources) -> float | None:
    """The utilization share of a GPU captured under load (``None``: an idle capture)."""
    util = gpu.gpu_util_pct
    if util is None or util < _LOADED_UTIL_PCT:
        return None
    src.note(
        "captured_load",
        f"the capture was taken under load ({util} % utilization, {gpu.power.draw_w} W, "
        f"{gpu.fb_memory.used_mib} MiB used, {len(gpu.processes)} process(es)): kept as the "
        "full-load sample, not as the idle baseline",
    )
    return util / 100


def _idle_memory(gpu: GpuInfo, load: float | None, src: _Sources) -> int:
    """Captured use less what the captured processes hold (they do not run in the simulator)."""
    used = gpu.fb_memory.used_mib
    if used is None:
        return int(src.pick("memory.idle_used_mib", None, 0, "0"))
    held = sum(proc.used_memory_mib or 0 for proc in gpu.processes)
    if held:
        src.note(
            "memory.idle_used_mib",
            f"derived: {used} MiB used less {held} MiB of the captured processes (not simulated)",
        )
        return max(0, used - held)
    if load is not None:
        src.note("memory.idle_used_mib", f"assumed: 0 ({used} MiB used under load, no process)")
        return 0
    return used


def _power(power: PowerReadings, load: float | None, src: _Sources) -> dict[str, float | None]:
    """Captured limits and idle draw; "N/A" limits (no power management) and an "N/A" draw (no
    power readings) stay null. The enforced limit is the captured current one (``-pl``). A draw
    captured under load gives the full-load draw (scaled to 100 %, capped at the enforced
    limit) and the idle draw is assumed."""
    default_limit = src.not_supported("power_w.*_limit", power.default_limit_w or power.limit_w)
    out: dict[str, float | None] = dict.fromkeys(("default_limit", "min_limit", "max_limit"))
    if default_limit is not None:
        out.update(
            default_limit=default_limit,
            min_limit=src.pick(
                "power_w.min_limit", power.min_limit_w, default_limit, "the default limit"
            ),
            max_limit=src.pick(
                "power_w.max_limit", power.max_limit_w, default_limit, "the default limit"
            ),
            enforced_limit=power.limit_w or default_limit,
        )
    draw = src.not_supported("power_w.idle, full_load", power.draw_w)
    if draw is None:
        return {**out, "idle": None, "full_load": None}
    limit = src.pick(
        "power_w.full_load",
        default_limit,
        _FALLBACK_POWER_LIMIT_W,
        f"{_FULL_LOAD_POWER_SHARE:.0%} of {_FALLBACK_POWER_LIMIT_W} W (no power limit captured)",
    )
    if load is None:
        src.note("power_w.full_load", f"assumed: {_FULL_LOAD_POWER_SHARE:.0%} of the limit")
        return {**out, "idle": draw, "full_load": round(limit * _FULL_LOAD_POWER_SHARE, 2)}
    idle = round(min(draw, limit * _IDLE_POWER_SHARE), 2)
    src.note("power_w.idle", f"assumed: {_IDLE_POWER_SHARE:.0%} of the limit (loaded capture)")
    src.note("power_w.full_load", f"derived: the {draw} W captured at {load:.0%} utilization")
    cap = power.limit_w or limit
    return {**out, "idle": idle, "full_load": round(min(cap, max(idle, draw / load)), 2)}


def _ecc(gpu: GpuInfo) -> bool | dict[str, bool]:
    """``false``: no ECC (the capture says N/A); ``true``: on; else the current/pending modes
    (ECC supported but disabled)."""
    if gpu.ecc_current is None:
        return False
    pending = gpu.ecc_current if gpu.ecc_pending is None else gpu.ecc_pending
    if gpu.ecc_current and pending:
        return True
    return {"current": gpu.ecc_current, "pending": pending}


def _compute_capability(
    device: pci_ids.NvidiaDevice | None, arch_name: str | None, src: _Sources
) -> tuple[int, int]:
    """Not in -q output: by PCI device id, else the architecture's usual one."""
    if device is not None:
        src.note("cuda_compute_capability", f"derived: by PCI device id ({device.name})")
        return device.compute_capability
    src.note("cuda_compute_capability", "assumed: by architecture (device id not in pci_ids)")
    return pci_ids.ARCHITECTURE_COMPUTE_CAPABILITY.get(arch_name or "", (0, 0))


def _hex(value: str | None, field: str, src: _Sources) -> str:
    return "0x" + src.pick(field, value, "00000000", "0x00000000 (not captured)")


def _kbs(value: str | None) -> int | None:
    """``"502 KB/s"`` -> 502."""
    match = re.fullmatch(r"(\d+)\s*KB/s", value or "")
    return None if match is None else int(match[1])


def _clocks(clocks: Any, fallback: Any, field: str, src: _Sources) -> dict[str, int]:
    out = {}
    for key, attr in (
        ("graphics", "graphics_mhz"),
        ("sm", "sm_mhz"),
        ("mem", "memory_mhz"),
        ("video", "video_mhz"),
    ):
        other = getattr(fallback, attr)
        out[key] = src.pick(
            f"{field}.{key}",
            getattr(clocks, attr),
            0 if other is None else other,
            "the other clock set, else 0",
        )
    return out


def _temperatures(gpu: GpuInfo, node: Node, load: float | None, src: _Sources) -> Temperatures:
    """Absolute thresholds, else derived from the T.Limit offsets newer drivers print."""
    temps = gpu.temperature
    captured_idle = None if load else temps.gpu_c
    idle = src.pick("temperature_c.idle", captured_idle, _IDLE_TEMP_C, f"{_IDLE_TEMP_C} C")
    thresholds: dict[str, int | None] = {
        "shutdown": temps.shutdown_c,
        "slowdown": temps.slowdown_c,
        "gpu_max": temps.max_operating_c,
    }
    if temps.tlimit_c is not None and temps.gpu_c is not None:
        tlimit = temps.gpu_c + temps.tlimit_c
        for key, tags in _TLIMIT_THRESHOLDS.items():
            offset = parse_celsius(node.get("temperature", tags))
            if thresholds[key] is None and offset is not None:
                thresholds[key] = tlimit - offset
                src.note(f"temperature_c.{key}", "derived: GPU temp + T.Limit margin - offset")
    gpu_max = thresholds["gpu_max"]
    full_load = _FULL_LOAD_TEMP_C if gpu_max is None else min(_FULL_LOAD_TEMP_C, gpu_max - 5)
    if load and temps.gpu_c is not None:
        full_load = max(idle, temps.gpu_c)
    else:
        src.note("temperature_c.full_load", f"assumed: {full_load} C (no loaded capture)")
    mem_max = parse_celsius(
        node.get("temperature", ("gpu_temp_max_mem_threshold", "memory_max_operating_temp"))
    )
    found: Temperatures = {
        "idle": idle,
        "full_load": full_load,
        "shutdown": thresholds["shutdown"],
        "slowdown": thresholds["slowdown"],
        "gpu_max": gpu_max,
        "mem_max": mem_max,
    }
    if temps.memory_c is not None and temps.gpu_c is not None:  # an HBM sensor
        found["memory_idle"] = idle + temps.memory_c - temps.gpu_c
    return found


def _fan(pct: int | None, temperature: Temperatures) -> dict[str, int] | None:
    """A fan curve that gives the captured speed at the captured temperature (None: no fan)."""
    if pct is None:
        return None
    idle = temperature["idle"]
    if pct == 0:
        return {"start_c": idle + 10, **_FAN_CURVE}
    return {"start_c": idle, "min_pct": pct, "full_c": max(idle + 1, _FAN_CURVE["full_c"])}


def _row_remapper_banks(gpu: GpuInfo, node: Node, src: _Sources) -> int | None:
    """Total banks of the row remapper histogram; None when the GPU has no row remapper."""
    if gpu.remapped_rows.correctable is None:
        return None
    histogram = node.at(
        "remapped_rows",
        ("row_remapper_histogram", "bank_remap_availability_histogram"),
    )
    banks = [
        int(match[1])
        for child in (histogram.children if histogram else [])
        if (match := re.fullmatch(r"(\d+) bank\(s\)", child.value or ""))
    ]
    return src.pick(
        "row_remapper_banks", sum(banks) if banks else None, 0, "0 (no histogram captured)"
    )


def _mig(gpu: GpuInfo, src: _Sources) -> dict[str, Any]:
    """``mig_table`` (the catalog's table, else null) and, for a MIG-capable GPU the catalog has
    no table for, ``mig_capable``: its captured MIG mode is a fact the scan must give back."""
    if gpu.mig_current is None:  # not MIG-capable: nvidia-smi prints MIG Mode N/A
        return {"mig_table": None}
    assert gpu.product_name is not None, "_check_complete refuses a GPU without a name"
    table = mig_catalog.table_for_gpu(gpu.product_name)
    if table is not None:
        return {"mig_table": table.name}
    src.note(
        "mig_table",
        f"not kept: no table for {gpu.product_name!r} in inventory/nvml/mig_profiles; the GPU "
        "is MIG-capable (mig_capable) with MIG disabled, enabling it is refused (NOT_SUPPORTED)",
    )
    if gpu.mig_current or gpu.mig_pending:
        src.note("mig_mode", "not kept: MIG enabled (current or pending) without a table")
    return {"mig_table": None, "mig_capable": True}


# --------------------------------------------------------------------------- captured state


def _reason_constant(name: str) -> str:
    """``hw_power_brake_slowdown`` -> ``nvmlClocksEventReasonHwPowerBrakeSlowdown``."""
    return "nvmlClocksEventReason" + name.title().replace("_", "")


def _captured_state(
    gpus: Sequence[GpuInfo],
    types: dict[str, dict[str, Any]],
    keys: Sequence[str],
    src: _Sources,
    smi_source: str,
) -> dict[str, dict[str, Any]]:
    """Captured row-remapper counters and active clock-event reasons -> ``initial_state.gpus``.
    Idle is left out: the simulator derives it from the load."""
    out: dict[str, dict[str, Any]] = {}
    for index, (gpu, key) in enumerate(zip(gpus, keys, strict=True)):
        entry: dict[str, Any] = {}
        rows = {
            field: value
            for field in ("correctable", "uncorrectable", "pending", "failure")
            if (value := getattr(gpu.remapped_rows, field)) is not None
        }
        if types[key]["row_remapper_banks"] is not None and any(rows.values()):
            entry["remapped_rows"] = rows
        if ecc := _captured_ecc(gpu):
            entry["ecc"] = ecc
        reasons = sorted(_reason_constant(name) for name in gpu.clock_event_reasons - {"gpu_idle"})
        unknown = [name for name in reasons if not hasattr(pynvml, name)]
        if unknown:
            src.note(f"initial_state.gpus.{index}.clock_event_reasons", f"not kept: {unknown}")
        if kept := [name for name in reasons if name not in unknown]:
            entry["clock_event_reasons"] = kept
        if entry:
            out[str(index)] = entry
    if out:
        src.note(
            "initial_state.gpus",
            f"{smi_source} (remapped rows, ECC counts, active clock-event reasons but idle)",
        )
    return out


def _captured_ecc(gpu: GpuInfo) -> dict[str, dict[str, dict[str, int]]]:
    """The captured non-zero ECC counts in the simulator state's shape, ``{"volatile" |
    "aggregate": {"corrected" | "uncorrected": {"dram": n, "sram": n}}}``. Pre-Ampere captures
    give a total and its device-memory (DRAM) part: the rest is on-chip SRAM."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for counter, counts in (("volatile", gpu.ecc_volatile), ("aggregate", gpu.ecc_aggregate)):
        for error in ("corrected", "uncorrected"):
            total = getattr(counts, error)
            if not total:
                continue
            dram = getattr(counts, f"dram_{error}") or 0
            sram = getattr(counts, f"sram_{error}")
            out.setdefault(counter, {})[error] = {
                "dram": dram,
                "sram": total - dram if sram is None else sram,
            }
    return out


# --------------------------------------------------------------------------- MIG layouts


def _initial_mig(
    gpus: Sequence[GpuInfo],
    types: dict[str, dict[str, Any]],
    keys: Sequence[str],
    src: _Sources,
    smi_source: str,
) -> dict[str, list[Any]]:
    """Captured MIG devices -> ``initial_state.mig`` layouts for the MIG-enabled GPUs."""
    layouts = {}
    for index, (gpu, key) in enumerate(zip(gpus, keys, strict=True)):
        table_name = types[key]["mig_table"]
        if gpu.mig_current and table_name:
            layouts[str(index)] = _layout(gpu, mig_catalog.load_table(table_name))
    if layouts:
        src.note(
            "initial_state.mig",
            f"{smi_source} (MIG devices: GI size and start from GI id by the table's memory "
            "slices, profile from SM counts; CIs largest first by NVML's default rule)",
        )
    return layouts


def _layout(gpu: GpuInfo, table: mig_catalog.MigTable) -> list[Any]:
    by_gi: dict[int, list[int]] = {}
    for dev in gpu.mig_devices:
        if dev.gpu_instance_id is not None:
            by_gi.setdefault(dev.gpu_instance_id, []).append(dev.multiprocessor_count or 0)
    layout = []
    # Each GI where its id says it is (the ids are a buddy tree over the table's memory slices).
    for gi_id in sorted(by_gi):
        sms = by_gi[gi_id]
        size = table.gpu_instance_size(gi_id)
        candidates = [p for p in table.profiles if p.memory_slices == size]
        if not candidates:
            raise CaptureError(f"{table.name}: no MIG profile for GPU instance {gi_id}")
        profile = next((p for p in candidates if p.sm == sum(sms)), candidates[0])
        ci_names = {ci.sm: ci.name for ci in table.ci_profiles(profile).values()}
        layout.append(
            {
                "gpu_instance": profile.name,
                "start": table.gpu_instance_start(gi_id),
                # Largest CIs first: a 2c.3g CI fits only at slice 0, beside a 1c at 2.
                "compute_instances": [
                    ci_names.get(sm, profile.name) for sm in sorted(sms, reverse=True)
                ],
            }
        )
    return layout


# --------------------------------------------------------------------------- topology


class _Topology:
    """Per-GPU NUMA node, PCIe path, root complex and direct NVLinks; NUMA node CPUs; the
    NVSwitch fabric; the network adapters."""

    def __init__(self, count: int) -> None:
        self.numa: list[int | None] = [None] * count  # the lowest NUMA node of each GPU
        self.multi_numa: list[list[int]] = [[] for _ in range(count)]  # when several
        # The GPU's own CPU affinity: with NUMA N/A, or with several NUMA nodes.
        self.own_cpus: list[str | None] = [None] * count
        # The GPU's own NUMA node ("GPU NUMA ID": Grace Hopper's GPU memory), None: N/A.
        self.gpu_numa_ids: list[int | None] = [None] * count
        self.numa_nodes: dict[str, dict[str, Any]] = {}
        self.paths: list[list[str]] = [[f"hb{i}"] for i in range(count)]
        self.roots: list[int] | None = None  # None: one root complex per NUMA node
        self.gpu_links: list[list[int]] = [[] for _ in range(count)]
        self.fabric_links = 0  # NV# of an NVSwitch fabric, 0 if none
        self.nics: list[dict[str, Any]] = []


def _topology(
    log: SmiLog, topo_text: str | None, topo_source: str, smi_source: str, src: _Sources
) -> _Topology:
    count = len(log.gpus)
    topo = _Topology(count)
    if topo_text is None:
        src.note(
            "gpus[].numa_node, pcie_path",
            "assumed: no topo -m: NUMA unknown (null), no GPU NUMA ID (gpu_numa_id: "
            "NOT_SUPPORTED), each GPU on its own host bridge (every pair NODE), no NVLink",
        )
        return topo
    try:
        matrix = parse_topo_matrix(topo_text)
    except ParseError as exc:
        raise CaptureError(f"{topo_source}: {exc}") from exc
    names = [device.name for device in matrix.gpus]
    if len(names) != count:
        raise CaptureError(f"{topo_source} shows {len(names)} GPUs but {smi_source} has {count}")
    _numa(matrix, names, topo, topo_source, src)
    nic_names = [device.name for device in matrix.devices if not device.is_gpu]
    devices = names + nic_names
    levels: dict[tuple[int, int], str] = {}
    nvlinks: dict[tuple[int, int], int] = {}
    for a in range(len(devices)):
        for b in range(a + 1, len(devices)):
            link = matrix.links.get((devices[a], devices[b])) or matrix.links.get(
                (devices[b], devices[a])
            )
            if link is None:
                continue
            link = "SYS" if link == "SOC" else link  # the pre-SYS spelling of old drivers
            if link.startswith("NV") and b < count:
                nvlinks[(a, b)] = matrix.nvlink_count(devices[a], devices[b])
            elif link in _RANK:
                levels[(a, b)] = link
            else:
                raise CaptureError(
                    f"{topo_source}: {devices[a]}-{devices[b]} link {link!r} unknown"
                )
    numa = topo.numa + [_nic_numa(count + j, topo.numa, levels) for j in range(len(nic_names))]
    paths, roots = synthesize_pcie_paths(levels, numa, devices)
    topo.paths = paths[:count]
    topo.roots = None if roots is None else roots[:count]
    topo.nics = [
        {
            "name": matrix.nic_names.get(nic, nic),
            "numa_node": numa[count + j],
            "pcie_path": paths[count + j],
            **({} if roots is None else {"root_complex": roots[count + j]}),
        }
        for j, nic in enumerate(nic_names)
    ]
    if _is_fabric(count, nvlinks, log):
        topo.fabric_links = next(iter(nvlinks.values()))
    else:
        for (a, b), n in sorted(nvlinks.items()):
            topo.gpu_links[a] += [b] * n
            topo.gpu_links[b] += [a] * n
    src.note(
        "gpus[].numa_node, gpu_numa_id, numa_nodes[].cpus, pcie_path, nvlinks, nics",
        f"{topo_source} (PCIe paths synthesized to reproduce its matrix)",
    )
    if roots is not None:
        src.note(
            "gpus[].root_complex",
            f"{topo_source} shows SYS within a NUMA node or a nearer level across NUMA nodes: "
            "root complexes synthesized",
        )
    if topo.nics:
        src.note(
            "nics[].numa_node", "derived: the NUMA node of the nearest GPU (PIX < PXB < PHB < NODE)"
        )
    if _share_sockets(topo.numa_nodes, numa, roots):
        src.note(
            "numa_nodes[].socket",
            f"derived: NUMA nodes that {topo_source} joins nearer than SYS share a socket "
            "(sub-NUMA clustering / NPS), else one socket per NUMA node",
        )
    src.note("numa_nodes[].socket", "assumed: one socket per NUMA node")
    return topo


def _share_sockets(
    numa_nodes: dict[str, dict[str, Any]],
    numa: Sequence[int | None],
    roots: Sequence[int] | None,
) -> bool:
    """Put NUMA nodes whose devices share a root complex on one socket (the lowest node's);
    ``True`` if any did."""
    if roots is None:
        return False
    socket = {int(node): spec["socket"] for node, spec in numa_nodes.items()}
    pairs = [(n, r) for n, r in zip(numa, roots, strict=True) if n is not None and n in socket]
    changed = True
    while changed:  # until every root complex's NUMA nodes agree on the lowest socket
        lowest: dict[int, int] = {}
        for node, root in pairs:
            lowest[root] = min(lowest.get(root, socket[node]), socket[node])
        changed = any(socket[node] != lowest[root] for node, root in pairs)
        for node, root in pairs:
            socket[node] = min(socket[node], lowest[root])
    for node, value in socket.items():
        numa_nodes[str(node)]["socket"] = value
    return any(value != node for node, value in socket.items())


def _nic_numa(
    nic: int, numa: Sequence[int | None], levels: dict[tuple[int, int], str]
) -> int | None:
    """A NIC's NUMA node: that of the nearest GPU it reaches without crossing sockets (PIX
    before PXB before PHB before NODE; the first GPU among equals). NODE can span a socket's
    NUMA nodes (NPS, sub-NUMA clustering), so the first non-SYS GPU may be on another node."""
    reachable = [
        (_RANK[level], gpu)
        for gpu in range(len(numa))
        if (level := levels.get((gpu, nic), "SYS")) != "SYS"
    ]
    return numa[min(reachable)[1]] if reachable else None


def _is_fabric(count: int, nvlinks: dict[tuple[int, int], int], log: SmiLog) -> bool:
    """Every pair at one NV# on 4+ GPUs, with more links than a GPU has for direct links
    (DGX A100's NV12 to 7 peers is 84 links: NVSwitch; HGX A100 4-GPU's NV4 to 3 peers is 12:
    direct links)."""
    pairs = count * (count - 1) // 2
    if count < _MIN_FABRIC_GPUS or len(nvlinks) != pairs or len(set(nvlinks.values())) != 1:
        return False
    max_links = min(
        (
            _MAX_NVLINKS.get(arch, pynvml.NVML_NVLINK_MAX_LINKS)
            for gpu in log.gpus
            if (arch := _ARCHITECTURES.get(gpu.architecture or ""))
        ),
        default=pynvml.NVML_NVLINK_MAX_LINKS,
    )
    return next(iter(nvlinks.values())) * (count - 1) > max_links


def _numa(
    matrix: TopoMatrix, names: Sequence[str], topo: _Topology, topo_source: str, src: _Sources
) -> None:
    by_cpus = _numa_from_affinity(matrix, names) if NUMA_COLUMN not in matrix.columns else {}
    if by_cpus:
        src.note(
            "gpus[].numa_node",
            f"derived: {topo_source} has no NUMA Affinity column; one NUMA node per distinct "
            "CPU affinity list, numbered by their lowest CPU",
        )
    spanning: list[tuple[int, tuple[int, ...], str | None]] = []
    for index, gpu_name in enumerate(names):
        device = matrix.device(gpu_name)
        node = by_cpus.get(device.cpu_affinity or "", device.numa_node)
        topo.numa[index] = node
        topo.gpu_numa_ids[index] = device.gpu_numa_id
        if node is None:
            topo.own_cpus[index] = device.cpu_affinity if device.cpus else None
            continue
        if device.numa_nodes and len(device.numa_nodes) > 1:
            spanning.append((index, device.numa_nodes, device.cpu_affinity))
            continue
        if device.cpus is None and device.cpu_affinity is not None:
            raise CaptureError(
                f"{topo_source}: {gpu_name} has NUMA node {node} but no readable "
                f"CPU affinity ({device.cpu_affinity!r})"
            )
        # An empty (or N/A) CPU Affinity beside a NUMA node: nvidia-smi ran in a cpuset (a
        # Slurm job) without CPUs of that node. The node is kept with no CPUs.
        cpus = device.cpu_affinity or ""
        if not cpus:
            src.note(
                f"numa_nodes.{node}.cpus",
                f"{topo_source} shows no CPU Affinity for NUMA node {node} (nvidia-smi ran "
                "in a cpuset without its CPUs): no CPUs",
            )
        known = topo.numa_nodes.setdefault(str(node), {"socket": node, "cpus": cpus})
        if known["cpus"] != cpus:
            raise CaptureError(
                f"{topo_source}: NUMA node {node} has CPUs {known['cpus']} and "
                f"{device.cpu_affinity}"
            )
    _spanning_numa(spanning, topo, topo_source, src)


def _spanning_numa(
    spanning: Sequence[tuple[int, tuple[int, ...], str | None]],
    topo: _Topology,
    topo_source: str,
    src: _Sources,
) -> None:
    """GPUs whose NUMA Affinity lists several nodes (``0-3``: AMD NPS, Intel SNC): they keep
    the whole set and their CPU Affinity as printed; ``topo -m`` shows no node's own CPUs."""
    for index, nodes, cpus in spanning:
        topo.multi_numa[index] = list(nodes)
        topo.own_cpus[index] = cpus or None
        for node in nodes:
            if str(node) not in topo.numa_nodes:
                topo.numa_nodes[str(node)] = {"socket": node, "cpus": ""}
                src.note(
                    f"numa_nodes.{node}.cpus",
                    f"assumed: none ({topo_source} shows node {node} only within a GPU's "
                    "multi-node NUMA Affinity; that GPU keeps its CPU Affinity as cpu_affinity)",
                )
    if spanning:
        src.note(
            "gpus[].numa_nodes, cpu_affinity",
            f"{topo_source} (a NUMA Affinity of several nodes: numa_node is the lowest, as "
            "NVML's memory affinity gives it; the CPU Affinity as printed)",
        )


def _numa_from_affinity(matrix: TopoMatrix, names: Sequence[str]) -> dict[str, int]:
    """Old ``topo -m`` prints no NUMA Affinity: each distinct CPU list is one NUMA node,
    numbered by its lowest CPU. Empty when the lists overlap (no NUMA layout to derive)."""
    lists = {}
    for name in names:
        device = matrix.device(name)
        if device.cpu_affinity and device.cpus:
            lists[device.cpu_affinity] = frozenset(device.cpus)
    ordered = sorted(lists, key=lambda text: min(lists[text]))
    cpus = [lists[text] for text in ordered]
    if any(a & b for i, a in enumerate(cpus) for b in cpus[i + 1 :]):
        return {}
    return {text: node for node, text in enumerate(ordered)}


def pcie_level(
    path_a: Sequence[str],
    numa_a: int | None,
    path_b: Sequence[str],
    numa_b: int | None,
    root_a: int | None = None,
    root_b: int | None = None,
) -> str:
    """The ``topo -m`` level the simulator derives for two distinct devices (its rules):
    SYS across root complexes (both given) or NUMA nodes, NODE across host bridges."""
    if sys_apart(numa_a, numa_b, root_a, root_b):
        return "SYS"
    if path_a[0] != path_b[0]:
        return "NODE"
    common = 0
    while common < min(len(path_a), len(path_b)) and path_a[common] == path_b[common]:
        common += 1
    if common == 1:
        return "PHB"
    return "PIX" if common == len(path_a) == len(path_b) else "PXB"


def _classes(count: int, levels: dict[tuple[int, int], str], within: str) -> list[int]:
    """Connected components of the pairs at level ``within`` or nearer, numbered in GPU order."""
    parent = list(range(count))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for (a, b), level in levels.items():
        if _RANK[level] <= _RANK[within]:
            parent[find(a)] = find(b)
    numbers: dict[int, int] = {}
    return [numbers.setdefault(find(i), len(numbers)) for i in range(count)]


def synthesize_pcie_paths(
    levels: dict[tuple[int, int], str],
    numa: Sequence[int | None],
    names: Sequence[str] | None = None,
) -> tuple[list[list[str]], list[int] | None]:
    """PCIe paths (host bridge, switch, leaf switch) and root complexes that reproduce
    ``levels`` exactly.

    ``levels`` maps device index pairs (GPUs, then NICs; ``names`` names them in messages,
    default ``GPU<i>``) to PIX/PXB/PHB/NODE/SYS (pairs joined by NVLink are left out: any path
    does). Devices joined by NODE or nearer share a root complex, by PHB or nearer a host
    bridge, by PXB or nearer a switch, by PIX a leaf switch. The root complexes are ``None``
    when SYS is exactly "across NUMA nodes" (the common case); they are given when SYS
    separates devices of one NUMA node (several root complexes) or a nearer level joins two
    NUMA nodes (sub-NUMA clustering / NPS, where one socket's root complex spans them). Raises
    :class:`CaptureError` when the matrix cannot be reproduced (levels that are not transitive).
    """
    label = list(names) if names is not None else [f"GPU{i}" for i in range(len(numa))]
    rc, hb, sw, leaf = (
        _classes(len(numa), levels, level) for level in ("NODE", "PHB", "PXB", "PIX")
    )
    numa_not_sys = any((level == "SYS") != (numa[a] != numa[b]) for (a, b), level in levels.items())
    roots = rc if numa_not_sys else None
    paths = [[f"hb{hb[i]}", f"sw{sw[i]}", f"sw{sw[i]}.{leaf[i]}"] for i in range(len(numa))]
    root: Sequence[int | None] = roots or [None] * len(numa)
    for (a, b), level in sorted(levels.items()):
        got = pcie_level(paths[a], numa[a], paths[b], numa[b], root[a], root[b])
        if got != level:
            raise CaptureError(
                f"inconsistent topo matrix: {label[a]}-{label[b]} is {level}, but the other "
                f"pairs put them at {got}"
            )
    return paths, roots


def _nvswitches(
    links: int, types: dict[str, dict[str, Any]], src: _Sources, topo_source: str
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """NVSwitch chips and per-GPU switch links for an ``NV<links>`` fabric (none if 0)."""
    if not links:
        return [], {}
    architectures = {spec["architecture"] for spec in types.values()}
    count, device_id = _NVSWITCHES.get(architectures.pop(), _NVSWITCH_FALLBACK)
    count = min(count, links)
    switches = [
        {
            "bus_id": f"00000000:{0xFF - i:02X}:00.0",
            "pci_device_id": device_id,
            "pci_subsystem_id": "0x00000000",
        }
        for i in range(count)
    ]
    src.note(
        "nvswitches",
        f"modelled: NV{links} on every GPU pair in {topo_source} = NVSwitch "
        f"fabric; {count} switches, PCI addresses and ids assumed",
    )
    return switches, {"nvlink_switch_links": [i * count // links for i in range(links)]}


def _nvlink_specs(types: dict[str, dict[str, Any]], src: _Sources) -> None:
    """NVLink version and capabilities for the types of GPUs that have NVLinks."""
    for spec in types.values():
        spec["nvlink"] = {
            "version": _NVLINK_VERSIONS.get(spec["architecture"], "NVML_NVLINK_VERSION_INVALID"),
            "capabilities": dict(_NVLINK_CAPABILITIES),
        }
    src.note(
        "gpu_types.*.nvlink",
        "assumed: NVLink version by architecture, capabilities as the captured A100/H800 reports",
    )


# --------------------------------------------------------------------------- CLI


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CaptureError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _default_name(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).stem).strip("-.") or "imported"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuadmin sim import",
        description="Turn nvidia-smi -q -x (or -q) output, and optionally nvidia-smi topo -m "
        "output, into a simulator machine model (JSON).",
    )
    parser.add_argument("smi", metavar="XML", help="nvidia-smi -q -x output (or -q text)")
    parser.add_argument("topo", metavar="TOPO", nargs="?", help="nvidia-smi topo -m output")
    parser.add_argument("--name", help="model name (default: the XML file's name)")
    parser.add_argument("--output", "-o", help="write the model here (default: stdout)")
    return parser


def main(argv: Sequence[str]) -> int:
    """``gpuadmin sim import XML [TOPO] [--name NAME] [--output FILE]``; exit status 0 or 2."""
    args = _parser().parse_args(list(argv))
    try:
        smi = _read(args.smi)
        topo = None if args.topo is None else _read(args.topo)
        build = model_from_capture if smi.lstrip().startswith("<") else model_from_smi_text
        model = build(
            smi,
            topo,
            name=args.name or _default_name(args.smi),
            smi_source=Path(args.smi).name,
            topo_source=Path(args.topo).name if args.topo else "nvidia-smi topo -m",
        )
        try:
            parse_model(model)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CaptureError(f"the generated model does not load: {exc!r}") from exc
        text = json.dumps(model, indent=2) + "\n"
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
    except (CaptureError, OSError) as exc:
        sys.stderr.write(f"gpuadmin sim import: {exc}\n")
        return 2
    return 0
