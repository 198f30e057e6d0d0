"""The ``nvidia-smi -q`` data model, shared by the XML (``-q -x``) and text (``-q``) parsers.

Both front-ends turn their input into a small :class:`Node` tree whose keys are snake_case
(XML tag names as-is, text labels snake-cased: ``FB Memory Usage`` -> ``fb_memory_usage``), and
:func:`build_smi_log` maps that tree to the dataclasses below. Where the XML tag and the text
label differ, or a field was renamed between drivers (``power_readings`` ->
``gpu_power_readings``, ``clocks_throttle_reasons`` -> ``clocks_event_reasons``,
``single_bit``/``double_bit`` -> ``sram_*``/``dram_*`` ECC counters), a lookup names every
spelling.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from .. import pci_ids
from .common import (
    none_if_na,
    normalize_bus_id,
    parse_bool,
    parse_celsius,
    parse_hex_id,
    parse_int,
    parse_mhz,
    parse_mib,
    parse_percent,
    parse_watts,
)

__all__ = [
    "Clocks",
    "EccCounts",
    "GpuInfo",
    "MemoryUsage",
    "MigDeviceInfo",
    "Node",
    "PowerReadings",
    "ProcessInfo",
    "RemappedRows",
    "RetiredPages",
    "SmiLog",
    "Temperatures",
    "build_smi_log",
    "snake_key",
]

Key = str | tuple[str, ...]


def snake_key(label: str) -> str:
    """``"SRAM Uncorrectable SEC-DED"`` -> ``"sram_uncorrectable_sec_ded"``."""
    return re.sub(r"[^0-9a-z]+", "_", label.casefold()).strip("_")


@dataclass
class Node:
    """One element of a parsed ``-q`` document: a key, an optional value, children in order."""

    key: str
    value: str | None = None
    children: list[Node] = field(default_factory=list)

    def find(self, key: Key) -> Node | None:
        """First child whose key is ``key`` (or any of the alternatives in a tuple)."""
        keys = (key,) if isinstance(key, str) else key
        for wanted in keys:
            for child in self.children:
                if child.key == wanted:
                    return child
        return None

    def find_all(self, key: str) -> list[Node]:
        return [child for child in self.children if child.key == key]

    def at(self, *path: Key) -> Node | None:
        node: Node | None = self
        for key in path:
            node = node.find(key) if node is not None else None
        return node

    def get(self, *path: Key) -> str | None:
        """The value at ``path``, ``None`` when absent or an N/A-style sentinel."""
        node = self.at(*path)
        return None if node is None else none_if_na(node.value)

    def walk(self) -> Iterator[Node]:
        """Every descendant in document order; iterative, as a hostile paste can nest deeply."""
        stack = self.children[::-1]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children[::-1])


@dataclass(frozen=True)
class MemoryUsage:
    total_mib: int | None = None
    used_mib: int | None = None
    free_mib: int | None = None
    reserved_mib: int | None = None


@dataclass(frozen=True)
class Clocks:
    graphics_mhz: int | None = None
    sm_mhz: int | None = None
    memory_mhz: int | None = None
    video_mhz: int | None = None


@dataclass(frozen=True)
class PowerReadings:
    draw_w: float | None = None
    average_draw_w: float | None = None
    limit_w: float | None = None
    default_limit_w: float | None = None
    min_limit_w: float | None = None
    max_limit_w: float | None = None


@dataclass(frozen=True)
class Temperatures:
    """Absolute readings/thresholds in °C; ``tlimit_c`` is the headroom to the T.Limit."""

    gpu_c: int | None = None
    memory_c: int | None = None
    slowdown_c: int | None = None
    shutdown_c: int | None = None
    max_operating_c: int | None = None
    tlimit_c: int | None = None


@dataclass(frozen=True)
class EccCounts:
    """One ECC counter set (volatile or aggregate); totals add SRAM and DRAM parts."""

    corrected: int | None = None
    uncorrected: int | None = None
    sram_corrected: int | None = None
    sram_uncorrected: int | None = None
    dram_corrected: int | None = None
    dram_uncorrected: int | None = None


@dataclass(frozen=True)
class RetiredPages:
    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class RemappedRows:
    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


@dataclass(frozen=True)
class ProcessInfo:
    pid: int | None
    name: str | None
    type: str | None
    used_memory_mib: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class MigDeviceInfo:
    index: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    multiprocessor_count: int | None
    memory: MemoryUsage
    bar1: MemoryUsage


@dataclass(frozen=True)
class GpuInfo:
    pci_bus_id: str | None
    product_name: str | None
    product_brand: str | None
    architecture: str | None
    uuid: str | None
    serial: str | None
    pci_device_id: str | None
    minor_number: int | None
    vbios_version: str | None
    board_part_number: str | None
    virtualization_mode: str | None
    persistence_mode: bool | None
    mig_current: bool | None
    mig_pending: bool | None
    mig_devices: tuple[MigDeviceInfo, ...]
    fb_memory: MemoryUsage
    bar1_memory: MemoryUsage
    compute_mode: str | None
    gpu_util_pct: int | None
    memory_util_pct: int | None
    fan_speed_pct: int | None
    performance_state: str | None
    temperature: Temperatures
    power: PowerReadings
    clocks: Clocks
    max_clocks: Clocks
    clock_event_reasons: frozenset[str]
    ecc_current: bool | None
    ecc_pending: bool | None
    ecc_volatile: EccCounts
    ecc_aggregate: EccCounts
    retired_pages: RetiredPages
    remapped_rows: RemappedRows
    processes: tuple[ProcessInfo, ...]


@dataclass(frozen=True)
class SmiLog:
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    timestamp: str | None
    gpus: tuple[GpuInfo, ...]


# Reasons are named as NVML names the bits (``nvmlClocksEventReasonDisplayClockSetting`` ->
# ``display_clock_setting``), where the XML suffix or text label differs.
_REASON_ALIASES = {"idle": "gpu_idle", "display_clocks_setting": "display_clock_setting"}
_REASON_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")


def _memory(node: Node | None) -> MemoryUsage:
    if node is None:
        return MemoryUsage()
    return MemoryUsage(
        total_mib=parse_mib(node.get("total")),
        used_mib=parse_mib(node.get("used")),
        free_mib=parse_mib(node.get("free")),
        reserved_mib=parse_mib(node.get("reserved")),
    )


def _clocks(node: Node | None) -> Clocks:
    if node is None:
        return Clocks()
    return Clocks(
        graphics_mhz=parse_mhz(node.get(("graphics_clock", "graphics"))),
        sm_mhz=parse_mhz(node.get(("sm_clock", "sm"))),
        memory_mhz=parse_mhz(node.get(("mem_clock", "memory"))),
        video_mhz=parse_mhz(node.get(("video_clock", "video"))),
    )


def _first_watts(node: Node, *keys: str) -> float | None:
    for key in keys:
        watts = parse_watts(node.get(key))
        if watts is not None:
            return watts
    return None


def _power(gpu: Node) -> PowerReadings:
    node = gpu.find(("gpu_power_readings", "power_readings"))
    if node is None:
        return PowerReadings()
    # 610-series drivers nest the limits under "GPU Ceiling Power Limit".
    limits = node.find("gpu_ceiling_power_limit") or node
    return PowerReadings(
        draw_w=_first_watts(
            node,
            "instant_power_draw",
            "instantaneous_power_draw",
            "power_draw",
            "average_power_draw",
        ),
        average_draw_w=parse_watts(node.get("average_power_draw")),
        limit_w=_first_watts(limits, "current_power_limit", "power_limit", "enforced_power_limit"),
        default_limit_w=parse_watts(limits.get("default_power_limit")),
        min_limit_w=parse_watts(node.get("min_power_limit")),
        max_limit_w=parse_watts(node.get("max_power_limit")),
    )


def _temperatures(gpu: Node) -> Temperatures:
    node = gpu.find("temperature")
    if node is None:
        return Temperatures()
    return Temperatures(
        gpu_c=parse_celsius(node.get(("gpu_temp", "gpu_current_temp"))),
        memory_c=parse_celsius(node.get(("memory_temp", "memory_current_temp"))),
        slowdown_c=parse_celsius(node.get(("gpu_temp_slow_threshold", "gpu_slowdown_temp"))),
        shutdown_c=parse_celsius(node.get(("gpu_temp_max_threshold", "gpu_shutdown_temp"))),
        max_operating_c=parse_celsius(
            node.get(("gpu_temp_max_gpu_threshold", "gpu_max_operating_temp"))
        ),
        tlimit_c=parse_celsius(node.get(("gpu_temp_tlimit", "gpu_t_limit_temp"))),
    )


def _sum(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _ecc(node: Node | None) -> EccCounts:
    if node is None:
        return EccCounts()
    if node.find("single_bit") is not None or node.find("double_bit") is not None:
        # Pre-Ampere schema: per-location single/double bit counters with a total.
        return EccCounts(
            corrected=parse_int(node.get("single_bit", "total")),
            uncorrected=parse_int(node.get("double_bit", "total")),
            dram_corrected=parse_int(node.get("single_bit", "device_memory")),
            dram_uncorrected=parse_int(node.get("double_bit", "device_memory")),
        )
    sram_uncorrected = parse_int(node.get("sram_uncorrectable"))
    if sram_uncorrected is None:
        sram_uncorrected = _sum(
            parse_int(node.get("sram_uncorrectable_parity")),
            parse_int(node.get(("sram_uncorrectable_secded", "sram_uncorrectable_sec_ded"))),
        )
    sram_corrected = parse_int(node.get("sram_correctable"))
    dram_corrected = parse_int(node.get("dram_correctable"))
    dram_uncorrected = parse_int(node.get("dram_uncorrectable"))
    return EccCounts(
        corrected=_sum(sram_corrected, dram_corrected),
        uncorrected=_sum(sram_uncorrected, dram_uncorrected),
        sram_corrected=sram_corrected,
        sram_uncorrected=sram_uncorrected,
        dram_corrected=dram_corrected,
        dram_uncorrected=dram_uncorrected,
    )


def _retired_pages(gpu: Node) -> RetiredPages:
    node = gpu.find("retired_pages")
    if node is None:
        return RetiredPages()
    return RetiredPages(
        single_bit=parse_int(
            node.get("multiple_single_bit_retirement", "retired_count")
            or node.get("single_bit_ecc")
        ),
        double_bit=parse_int(
            node.get("double_bit_retirement", "retired_count") or node.get("double_bit_ecc")
        ),
        pending=parse_bool(
            node.get(
                ("pending_retirement", "pending_blacklist", "pending_page_blacklist", "pending")
            )
        ),
    )


def _remapped_rows(gpu: Node) -> RemappedRows:
    node = gpu.find("remapped_rows")
    if node is None:
        return RemappedRows()
    return RemappedRows(
        correctable=parse_int(node.get(("remapped_row_corr", "correctable_error"))),
        uncorrectable=parse_int(node.get(("remapped_row_unc", "uncorrectable_error"))),
        pending=parse_bool(node.get(("remapped_row_pending", "pending"))),
        failure=parse_bool(node.get(("remapped_row_failure", "remapping_failure_occurred"))),
    )


def _event_reasons(gpu: Node) -> frozenset[str]:
    node = gpu.find(("clocks_event_reasons", "clocks_throttle_reasons"))
    if node is None:
        return frozenset()
    active = set()
    for reason in node.walk():
        if parse_bool(reason.value) is not True:
            continue
        name = reason.key
        for prefix in _REASON_PREFIXES:
            name = name.removeprefix(prefix)
        active.add(_REASON_ALIASES.get(name, name))
    return frozenset(active)


def _mig_devices(gpu: Node) -> tuple[MigDeviceInfo, ...]:
    container = gpu.find("mig_devices") or gpu
    return tuple(
        MigDeviceInfo(
            index=parse_int(dev.get("index")),
            gpu_instance_id=parse_int(dev.get("gpu_instance_id")),
            compute_instance_id=parse_int(dev.get("compute_instance_id")),
            multiprocessor_count=parse_int(
                dev.get("device_attributes", "shared", "multiprocessor_count")
            ),
            memory=_memory(dev.find(("fb_memory_usage", "shared_fb_memory_usage"))),
            bar1=_memory(dev.find(("bar1_memory_usage", "shared_bar1_memory"))),
        )
        for dev in container.find_all("mig_device")
    )


def _process(entry: Node, pid: str | None, gi: str | None, ci: str | None) -> ProcessInfo:
    return ProcessInfo(
        pid=parse_int(pid),
        name=entry.get(("process_name", "name")),
        type=entry.get("type"),
        used_memory_mib=parse_mib(entry.get(("used_memory", "used_gpu_memory"))),
        gpu_instance_id=parse_int(gi),
        compute_instance_id=parse_int(ci),
    )


def _processes(gpu: Node) -> tuple[ProcessInfo, ...]:
    node = gpu.find("processes")
    if node is None:
        return ()
    found = [
        _process(
            info, info.get("pid"), info.get("gpu_instance_id"), info.get("compute_instance_id")
        )
        for info in node.find_all("process_info")
    ]
    # Text form: "GPU instance ID" / "Compute instance ID" lines precede each "Process ID"
    # line, whose children hold Type, Name and Used GPU Memory.
    context: dict[str, str | None] = {}
    for child in node.children:
        if child.key in ("gpu_instance_id", "compute_instance_id"):
            context[child.key] = none_if_na(child.value)
        elif child.key == "process_id":
            found.append(
                _process(
                    child,
                    child.value,
                    context.get("gpu_instance_id"),
                    context.get("compute_instance_id"),
                )
            )
    return tuple(found)


def _architecture(gpu: Node, pci_device_id: str | None) -> str | None:
    """As printed; drivers before 470 print none, so it comes from the PCI device id."""
    printed = gpu.get("product_architecture")
    if printed is not None:
        return printed
    device = pci_ids.lookup(pci_device_id)
    return None if device is None else device.architecture


def _board_part_number(gpu: Node) -> str | None:
    """Drivers before 520 print the board part number (``692-2G506-0200-003``) as
    ``<gpu_part_number>``; later ones print it as ``<board_part_number>`` and use
    ``<gpu_part_number>`` for the chip (``20B0-884-A1``)."""
    if gpu.find("board_part_number") is not None:
        return gpu.get("board_part_number")
    return gpu.get("gpu_part_number")


def _build_gpu(gpu: Node, header_bus_id: str | None) -> GpuInfo:
    pci_device_id = parse_hex_id(gpu.get("pci", ("pci_device_id", "device_id")))
    return GpuInfo(
        pci_bus_id=normalize_bus_id(gpu.get("pci", ("pci_bus_id", "bus_id")) or header_bus_id),
        product_name=gpu.get("product_name"),
        product_brand=gpu.get("product_brand"),
        architecture=_architecture(gpu, pci_device_id),
        uuid=gpu.get(("uuid", "gpu_uuid")),
        serial=gpu.get(("serial", "serial_number")),
        pci_device_id=pci_device_id,
        minor_number=parse_int(gpu.get("minor_number")),
        vbios_version=gpu.get("vbios_version"),
        board_part_number=_board_part_number(gpu),
        virtualization_mode=gpu.get("gpu_virtualization_mode", "virtualization_mode"),
        persistence_mode=parse_bool(gpu.get("persistence_mode")),
        mig_current=parse_bool(gpu.get("mig_mode", ("current_mig", "current"))),
        mig_pending=parse_bool(gpu.get("mig_mode", ("pending_mig", "pending"))),
        mig_devices=_mig_devices(gpu),
        fb_memory=_memory(gpu.find("fb_memory_usage")),
        bar1_memory=_memory(gpu.find("bar1_memory_usage")),
        compute_mode=gpu.get("compute_mode"),
        gpu_util_pct=parse_percent(gpu.get("utilization", ("gpu_util", "gpu"))),
        memory_util_pct=parse_percent(gpu.get("utilization", ("memory_util", "memory"))),
        fan_speed_pct=parse_percent(gpu.get("fan_speed")),
        performance_state=gpu.get("performance_state"),
        temperature=_temperatures(gpu),
        power=_power(gpu),
        clocks=_clocks(gpu.find("clocks")),
        max_clocks=_clocks(gpu.find("max_clocks")),
        clock_event_reasons=_event_reasons(gpu),
        ecc_current=parse_bool(gpu.get("ecc_mode", ("current_ecc", "current"))),
        ecc_pending=parse_bool(gpu.get("ecc_mode", ("pending_ecc", "pending"))),
        ecc_volatile=_ecc(gpu.at("ecc_errors", "volatile")),
        ecc_aggregate=_ecc(gpu.at("ecc_errors", "aggregate")),
        retired_pages=_retired_pages(gpu),
        remapped_rows=_remapped_rows(gpu),
        processes=_processes(gpu),
    )


def _version(root: Node, *keys: str) -> str | None:
    """First present version; drops the ``[Deprecated; ... Use KMD Version instead]`` note that
    610-series drivers append to ``Driver Version`` and ``CUDA Version``."""
    for key in keys:
        value = root.get(key)
        if value is not None:
            return re.sub(r"\s*\[[^\]]*\]$", "", value) or None
    return None


def build_smi_log(root: Node) -> SmiLog:
    """Build an :class:`SmiLog` from a document root whose ``gpu`` children carry the bus id."""
    return SmiLog(
        driver_version=_version(root, "kmd_version", "driver_version"),
        cuda_version=_version(root, "cuda_umd_version", "cuda_version"),
        attached_gpus=parse_int(root.get("attached_gpus")),
        timestamp=root.get("timestamp"),
        gpus=tuple(_build_gpu(node, node.value) for node in root.find_all("gpu")),
    )
