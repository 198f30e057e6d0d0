"""Turn NVML answers into plain dataclasses: one code path for the real and simulated backends.

`scan(backend)` inits NVML, reads every GPU (facts, metrics, MIG layout, health counters) and the
GPU-to-GPU topology, and always shuts NVML down again. A failing GPU never fails the scan: its
NVML error becomes that GPU's `error_message`. Optional features that a GPU does not have
(NVML_ERROR_NOT_SUPPORTED) become None.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from ctypes import byref, c_uint
from typing import Any, TypeVar

import pynvml
from pynvml import NVMLError

from inventory.nvml import mig_catalog
from inventory.nvml.host import HostResources
from inventory.nvml.mig_catalog import MigProfile
from inventory.nvml.parsers.common import ParseError, normalize_bus_id
from inventory.nvml.parsers.topo import parse_topo_matrix
from inventory.nvml.record import Record

log = logging.getLogger("gpuadmin.nvml")

# "host": the CPUs and memory of the machine around the GPUs (``SystemInfo``), read with the
# catalog's scans, not with every live sample.
SECTIONS = ("facts", "metrics", "mig", "topology", "health", "host")

_MIB = 1024 * 1024
# Words of 64 CPUs passed to nvmlDeviceGetCpuAffinity: 1024 CPUs, more than GPU servers have.
_CPU_SET_WORDS = 16
_NODE_SET_WORDS = 4
# Room for the placements of one MIG profile: no GPU has more than 8 memory slices (an A30 has 4).
MAX_MIG_PLACEMENTS = 16
# NVML reports "not applicable" instance ids (no MIG) as 0xFFFFFFFF.
_NO_ID = 0xFFFFFFFF

UNSUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
# Errors that mean "no such NVLink / MIG profile on this GPU" while probing by index.
ABSENT = UNSUPPORTED | {pynvml.NVML_ERROR_INVALID_ARGUMENT}

_ERROR_NAMES = {
    getattr(pynvml, name): name for name in dir(pynvml) if name.startswith("NVML_ERROR_")
}
_INIT_FAILURES = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver installed"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "NVIDIA kernel driver not loaded (NVML_ERROR_DRIVER_NOT_LOADED): "
        "load the nvidia module or reinstall the driver"
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "no permission to use the NVIDIA driver (NVML_ERROR_NO_PERMISSION): "
        "check access to /dev/nvidia*"
    ),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "NVML library and kernel driver versions differ (NVML_ERROR_LIB_RM_VERSION_MISMATCH): "
        "reboot or reload the nvidia module after a driver upgrade"
    ),
}
_ARCHITECTURES = {
    getattr(pynvml, f"NVML_DEVICE_ARCH_{const}"): name
    for const, name in (
        ("KEPLER", "Kepler"),
        ("MAXWELL", "Maxwell"),
        ("PASCAL", "Pascal"),
        ("VOLTA", "Volta"),
        ("TURING", "Turing"),
        ("AMPERE", "Ampere"),
        ("ADA", "Ada Lovelace"),
        ("HOPPER", "Hopper"),
        ("BLACKWELL", "Blackwell"),
    )
    if hasattr(pynvml, f"NVML_DEVICE_ARCH_{const}")
}
_COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "Default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "Exclusive_Thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "Prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "Exclusive_Process",
}
# Clock event ("throttle") reason bits, named as stable snake_case identifiers.
_THROTTLE_REASONS = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
_KNOWN_REASON_BITS = sum(bit for bit, _ in _THROTTLE_REASONS)
_THROTTLE_BITS = {name: bit for bit, name in _THROTTLE_REASONS}
# The reasons that say heat slowed the GPU down (the fleet page's "hot" mark, the health
# watcher's thermal events), and the hardware power brake (a power fault, not the cap).
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER_BRAKE_REASONS = frozenset({"hw_power_brake_slowdown"})
# nvmlDeviceGetTopologyCommonAncestor level -> `nvidia-smi topo -m` label.
_PCIE_LINKS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "X",
    pynvml.NVML_TOPOLOGY_SINGLE: "PIX",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
    pynvml.NVML_TOPOLOGY_NODE: "NODE",
    pynvml.NVML_TOPOLOGY_SYSTEM: "SYS",
}
_ECC_COUNTERS = (
    ("ecc_volatile_corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    (
        "ecc_volatile_uncorrected",
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    ),
    ("ecc_aggregate_corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    (
        "ecc_aggregate_uncorrected",
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_AGGREGATE_ECC,
    ),
)
# One nvmlDeviceGetFieldValues call per GPU reads these (DCGM's DCGM_FI_DEV_MEMORY_TEMP and
# DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL come from the same fields): the memory (HBM)
# temperature, and NVLink's error counters summed over every link, where per-link
# nvmlDeviceGetNvLinkErrorCounter calls would cost 4 calls per link (48 per A100).
_MEMORY_TEMP_FIELD = pynvml.NVML_FI_DEV_MEMORY_TEMP
_NVLINK_ERROR_FIELDS = (
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
)
_SAMPLE_FIELDS = (_MEMORY_TEMP_FIELD, *_NVLINK_ERROR_FIELDS)
# c_nvmlFieldValue_t.valueType -> the c_nvmlValue_t member holding the value.
_FIELD_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


# --------------------------------------------------------------------------- errors


def error_name(err: NVMLError) -> str:
    """The NVML_ERROR_* constant name of an NVMLError (e.g. NVML_ERROR_GPU_IS_LOST)."""
    return _ERROR_NAMES.get(err.value, f"NVML_ERROR_{err.value}")


def describe_error(err: NVMLError) -> str:
    """One line naming the failed NVML call (when the traceback shows it) and the error."""
    call = _failed_call(err)
    return f"{call} failed: {_error_text(err)}" if call else _error_text(err)


def init_failure_reason(err: NVMLError) -> str:
    """A clear, actionable reason for an nvmlInit failure (no driver, no permission, ...)."""
    return _INIT_FAILURES.get(err.value) or f"nvmlInit failed: {_error_text(err)}"


def _error_text(err: NVMLError) -> str:
    return f"{error_name(err)} ({err})"


def _failed_call(err: BaseException) -> str | None:
    # The outermost nvml* frame is the call the scanner made (pynvml and the simulator alike);
    # reading it from the traceback costs nothing on the success path.
    tb = err.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_name
        if name.startswith("nvml"):
            return name
        tb = tb.tb_next
    return None


# --------------------------------------------------------------------------- dataclasses


@dataclasses.dataclass(frozen=True)
class SystemInfo(Record):
    """Driver-wide facts, and `error` when NVML could not be used at all."""

    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None
    gpu_count: int = 0
    scan_duration_ms: float = 0.0
    error: str | None = None
    # The host's logical CPUs and RAM (the "host" section): None when not asked or unreadable.
    cpu_count: int | None = None
    memory_total_mib: int | None = None


@dataclasses.dataclass(frozen=True)
class GpuFacts(Record):
    """What a GPU is. Everything but `index` may be None: unsupported, or not read before a
    failure (then `error_message` says why)."""

    index: int
    uuid: str | None = None
    name: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    pci_device_id: str | None = None
    minor_number: int | None = None
    board_part_number: str | None = None
    vbios_version: str | None = None
    architecture: str | None = None
    compute_capability: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    bar1_total_mib: int | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    power_limit_default_w: float | None = None
    power_limit_enforced_w: float | None = None
    power_limit_min_w: float | None = None
    power_limit_max_w: float | None = None
    persistence_mode: str | None = None
    compute_mode: str | None = None
    ecc_enabled: bool | None = None
    ecc_pending_enabled: bool | None = None
    mig_enabled: bool | None = None
    mig_pending_enabled: bool | None = None
    numa_node: int | None = None
    # Every NUMA node the GPU's memory is affine to, as `topo -m` prints "NUMA Affinity" ("0-3"
    # on AMD NPS4 / Intel SNC boxes); `numa_node` is the lowest of them.
    numa_affinity: str | None = None
    # The GPU's own NUMA node (nvmlDeviceGetNumaNodeId, topo -m "GPU NUMA ID"): its memory as a
    # NUMA node of the host, on coherent Grace Hopper GPUs only; None elsewhere.
    gpu_numa_node: int | None = None
    # The CPU socket, named by the lowest NUMA node on it (NVML speaks of sockets only as
    # sets of NUMA nodes): GPUs with the same value hang off the same socket.
    socket: int | None = None
    cpu_affinity: str | None = None
    nvlink_count: int | None = None
    error_message: str | None = None


@dataclasses.dataclass(frozen=True)
class ProcessInfo(Record):
    """A process using the GPU; `kind` is "C" (compute) or "G" (graphics)."""

    pid: int
    kind: str
    used_memory_mib: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclasses.dataclass(frozen=True)
class MigDeviceMetrics(Record):
    """A MIG device (one compute instance) right now: NVML reports its memory, never its
    utilization."""

    gi_id: int
    ci_id: int
    uuid: str | None = None
    profile: str | None = None  # "3g.20gb", "1c.3g.20gb"
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None


@dataclasses.dataclass(frozen=True)
class GpuMetrics(Record):
    """How busy a GPU is right now. None where the GPU cannot say (fan on SXM, util with MIG,
    memory temperature on GDDR boards)."""

    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    temperature_c: int | None = None
    memory_temperature_c: int | None = None
    power_w: float | None = None
    energy_mj: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    fan_pct: int | None = None
    pstate: str | None = None
    pcie_tx_kbps: int | None = None
    pcie_rx_kbps: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    processes: tuple[ProcessInfo, ...] = ()
    mig_devices: tuple[MigDeviceMetrics, ...] = ()  # while MIG is enabled


@dataclasses.dataclass(frozen=True)
class ComputeInstance(Record):
    """A compute instance inside a GPU instance, with its MIG device UUID when NVML shows one."""

    ci_id: int
    profile_id: int
    name: str
    sm_count: int
    placement_start: int
    placement_size: int
    uuid: str | None = None


@dataclasses.dataclass(frozen=True)
class GpuInstance(Record):
    """A GPU instance: its profile, where it sits in the slices, and its compute instances."""

    gi_id: int
    profile_id: int
    profile_name: str
    placement_start: int
    placement_size: int
    memory_mib: int
    compute_instances: tuple[ComputeInstance, ...] = ()


@dataclasses.dataclass(frozen=True)
class MigLayout(Record):
    """MIG on a MIG-capable GPU: its profile table and, while MIG is enabled, its instances.

    NVML answers profile queries only while MIG is enabled. For a GPU with MIG off the table
    comes from the catalog (``mig_catalog``) and ``profiles_source`` says so; ``remaining`` is
    then unknown.
    """

    enabled: bool
    pending_enabled: bool
    profiles: tuple[MigProfile, ...] = ()
    gpu_instances: tuple[GpuInstance, ...] = ()
    profiles_source: str | None = None  # "nvml", "catalog", or None when neither knows it


@dataclasses.dataclass(frozen=True)
class HealthCounters(Record):
    """Error counters for the health policies. None where the GPU does not keep the counter
    (retired pages on A100+, ECC on consumer cards)."""

    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # CRC (flit and data), replay and recovery errors summed over every NVLink; None: no NVLink.
    nvlink_errors: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    gpu_lost: bool = False


@dataclasses.dataclass(frozen=True)
class GpuScan(Record):
    """Everything one scan learnt about one GPU; sections not asked for are None."""

    facts: GpuFacts
    metrics: GpuMetrics | None = None
    mig: MigLayout | None = None
    health: HealthCounters | None = None

    @property
    def index(self) -> int:
        return self.facts.index

    @property
    def uuid(self) -> str | None:
        return self.facts.uuid

    @property
    def error_message(self) -> str | None:
        return self.facts.error_message


@dataclasses.dataclass(frozen=True)
class Topology(Record):
    """The `nvidia-smi topo -m` GPU matrix: row/column i is GPU `gpus[i]`; None where a GPU
    failed. NUMA node and CPU affinity per GPU, in the same order. `nics` are the network
    adapters (`mlx5_0`) and `nic_links[i][j]` how GPU `gpus[i]` reaches `nics[j]` (PIX ... SYS),
    from `topo -m` itself: NVML has no NIC API (the backend's `topo_matrix_text`)."""

    gpus: tuple[int, ...]
    matrix: tuple[tuple[str | None, ...], ...]
    numa_nodes: tuple[int | None, ...]
    cpu_affinity: tuple[str | None, ...]
    nics: tuple[str, ...] = ()
    nic_links: tuple[tuple[str | None, ...], ...] = ()

    def link(self, gpu_a: int, gpu_b: int) -> str | None:
        """The link class between two GPUs given by NVML index ("X", "NV12", "PXB", "SYS"...)."""
        return self.matrix[self.gpus.index(gpu_a)][self.gpus.index(gpu_b)]


@dataclasses.dataclass(frozen=True)
class NodeScan(Record):
    """One scan of one node: driver facts, every GPU, and the topology between them."""

    system: SystemInfo
    gpus: tuple[GpuScan, ...] = ()
    topology: Topology | None = None


# --------------------------------------------------------------------------- helpers


@functools.cache
def _catalog_profiles(gpu_name: str | None) -> tuple[MigProfile, ...]:
    """The catalog's profile table for a GPU model, in the order NVML enumerates it (by index)."""
    table = mig_catalog.table_for_gpu(gpu_name) if gpu_name else None
    return tuple(sorted(table.profiles, key=lambda p: p.index)) if table else ()


def read_mig_profiles(nvml: Any, handle: Any) -> tuple[MigProfile, ...]:
    """The GPU's instance profile table as NVML reports it (only while MIG is enabled)."""
    profiles = []
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except NVMLError as err:
            if err.value in ABSENT:
                continue
            raise
        placements = _gi_placements(nvml, handle, info.id)
        profiles.append(
            MigProfile(
                index=index,
                id=info.id,
                name=mig_profile_name(info.name),
                compute_slices=info.sliceCount,
                memory_slices=placements[0].size if placements else 0,
                instances=info.instanceCount,
                memory_mib=info.memorySizeMB,
                sm=info.multiprocessorCount,
                ce=info.copyEngineCount,
                dec=info.decoderCount,
                enc=info.encoderCount,
                jpeg=info.jpegCount,
                ofa=info.ofaCount,
                placements=tuple(p.start for p in placements),
            )
        )
    return tuple(profiles)


def _gi_placements(nvml: Any, handle: Any, profile_id: int) -> list[Any]:
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * MAX_MIG_PLACEMENTS)()
    count = c_uint(MAX_MIG_PLACEMENTS)
    found = _optional(
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements,
        handle,
        profile_id,
        placements,
        byref(count),
    )
    return [] if found is None else placements[: count.value]


def read_ci_profiles(nvml: Any, gi: Any) -> list[Any]:
    """The compute instance profiles a GPU instance offers (shared engines, as nvidia-smi)."""
    found = []
    for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            found.append(
                nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            )
        except NVMLError as err:
            if err.value not in ABSENT:
                raise
    return found


def cpulist(words: Iterable[int], word_bits: int = 64) -> str:
    """Linux cpulist ("48-63,176-191") from NVML's CPU affinity bitmask words."""
    cpus: list[int] = []
    for position, word in enumerate(words):
        base = position * word_bits
        while word:
            low = word & -word
            cpus.append(base + low.bit_length() - 1)
            word ^= low
    ranges: list[str] = []
    start = 0
    for i, cpu in enumerate(cpus):
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            first = cpus[start]
            ranges.append(str(cpu) if first == cpu else f"{first}-{cpu}")
            start = i + 1
    return ",".join(ranges)


def throttle_reason_names(mask: int) -> tuple[str, ...]:
    """Names of the set clock event reason bits; unknown bits as hex."""
    names = [name for bit, name in _THROTTLE_REASONS if mask & bit]
    unknown = mask & ~_KNOWN_REASON_BITS
    while unknown:
        low = unknown & -unknown
        names.append(f"0x{low:x}")
        unknown ^= low
    return tuple(names)


def throttle_reason_mask(names: Iterable[str]) -> int:
    """The NVML bitmask of these reason names (the inverse of ``throttle_reason_names``): once
    per GPU series in a ``/metrics`` scrape."""
    mask = 0
    for name in names:
        mask |= _THROTTLE_BITS.get(name) or int(name, 16)
    return mask


def _lowest_bit(words: Iterable[int], word_bits: int = 64) -> int | None:
    for position, word in enumerate(words):
        if word:
            return position * word_bits + (word & -word).bit_length() - 1
    return None


@functools.lru_cache(maxsize=4096)
def _bus_id(raw: str | bytes) -> str | None:
    # Cached: every NVLink of every scan reports one of a node's few dozen bus ids.
    return normalize_bus_id(_text(raw))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _mib(value: int | None) -> int | None:
    return None if value is None else value // _MIB


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def instance_id(value: int) -> int | None:
    """A MIG instance id NVML reports, or None for its "not applicable" value (no MIG)."""
    return None if value >= _NO_ID else value


def mig_profile_name(raw: str | bytes) -> str:
    # NVML names profiles "MIG 1g.5gb"; nvidia-smi tables and mig-parted use "1g.5gb".
    return _text(raw).removeprefix("MIG ")


_T = TypeVar("_T")


def _optional(call: Callable[..., _T], *args: Any) -> _T | None:
    """Call an NVML function whose feature a GPU may lack: NOT_SUPPORTED -> None."""
    try:
        return call(*args)
    except NVMLError as err:
        if err.value in UNSUPPORTED:
            return None
        raise


@dataclasses.dataclass
class _Links:
    """Active NVLinks of one GPU, counted by remote PCI bus id."""

    active: int = 0
    to_gpus: Counter[str | None] = dataclasses.field(default_factory=Counter)
    to_switches: Counter[str | None] = dataclasses.field(default_factory=Counter)
    to_unknown: Counter[str | None] = dataclasses.field(default_factory=Counter)


# --------------------------------------------------------------------------- scanning


def scan(backend: Any, *, include: Iterable[str] = SECTIONS) -> NodeScan:
    """Scan every GPU the backend shows. Never raises for NVML errors: an init failure gives no
    GPUs and `system.error`; a GPU failure gives that GPU's `facts.error_message`. The "host"
    section (the host's CPUs and memory) is read whether NVML works or not."""
    sections = frozenset(include)
    if unknown := sections - set(SECTIONS):
        raise ValueError(f"unknown scan sections: {sorted(unknown)}")
    result = _scan_gpus(backend, sections)
    if "host" not in sections:
        return result
    host: HostResources = backend.host_resources()
    system = dataclasses.replace(
        result.system, cpu_count=host.cpu_count, memory_total_mib=host.memory_total_mib
    )
    return dataclasses.replace(result, system=system)


def _scan_gpus(backend: Any, sections: frozenset[str]) -> NodeScan:
    started = time.perf_counter()
    try:
        backend.nvmlInit()
    except NVMLError as err:
        reason = init_failure_reason(err)
        log.warning("NVML unavailable: %s", reason)
        return NodeScan(system=SystemInfo(error=reason, scan_duration_ms=_since(started)))
    try:
        return _NodeScanner(backend, sections).run(started)
    finally:
        try:
            backend.nvmlShutdown()
        except NVMLError as err:
            log.warning("nvmlShutdown failed: %s", describe_error(err))


def _since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


class _NodeScanner:
    """One scan's state: handles and NVLink maps are read once and reused by the topology."""

    def __init__(self, nvml: Any, sections: frozenset[str]) -> None:
        self.nvml = nvml
        self.sections = sections
        self.handles: dict[int, Any] = {}
        self.links: dict[int, _Links] = {}
        # MIG profile tables are fixed per GPU model (name, PCI device id): read them once.
        self.mig_tables: dict[tuple[str, str], tuple[MigProfile, ...]] = {}
        self.ci_profiles: dict[tuple[str, str, int], list[Any]] = {}

    def run(self, started: float) -> NodeScan:
        nvml = self.nvml
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            count = nvml.nvmlDeviceGetCount()
        except NVMLError as err:
            reason = describe_error(err)
            log.warning("NVML initialised but unusable: %s", reason)
            return NodeScan(system=SystemInfo(error=reason, scan_duration_ms=_since(started)))
        log.debug("NVML initialised: %d GPUs, driver %s", count, driver)  # every sample
        cuda = _optional(nvml.nvmlSystemGetCudaDriverVersion)
        nvml_version = _optional(nvml.nvmlSystemGetNVMLVersion)
        gpus = tuple(self._gpu(index) for index in range(count))
        topology = self._topology(gpus) if "topology" in self.sections else None
        system = SystemInfo(
            driver_version=driver,
            cuda_driver_version=None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
            nvml_version=nvml_version,
            gpu_count=count,
            scan_duration_ms=_since(started),
        )
        return NodeScan(system=system, gpus=gpus, topology=topology)

    # ----------------------------------------------------------------- one GPU

    def _gpu(self, index: int) -> GpuScan:
        facts: dict[str, Any] = {"index": index}
        sections = self.sections
        try:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            self._identity(handle, facts)
            if "facts" in sections:
                self._facts(handle, facts)
            if sections & {"facts", "topology"}:
                self._locality(handle, facts)
            mig = None
            if sections & {"facts", "mig"}:
                self._mig_mode(handle, facts)
                if "mig" in sections:
                    mig = self._mig(handle, facts)
            metrics = health = None
            if sections & {"metrics", "health"}:
                reasons = self._throttle_reasons(handle)
                fields = self._field_values(handle, _SAMPLE_FIELDS)
                if "metrics" in sections:
                    metrics = self._metrics(handle, reasons, fields, facts.get("mig_enabled"))
                if "health" in sections:
                    health = self._health(handle, reasons, fields)
        except NVMLError as err:
            message = describe_error(err)
            log.debug("GPU %d: %s", index, message)  # in the result; callers log changes
            self.handles.pop(index, None)
            self.links.pop(index, None)
            lost = HealthCounters(gpu_lost=err.value == pynvml.NVML_ERROR_GPU_IS_LOST)
            return GpuScan(
                facts=GpuFacts(**facts, error_message=message),
                health=lost if "health" in sections else None,
            )
        return GpuScan(facts=GpuFacts(**facts), metrics=metrics, mig=mig, health=health)

    def _identity(self, handle: Any, facts: dict[str, Any]) -> None:
        nvml = self.nvml
        facts["uuid"] = nvml.nvmlDeviceGetUUID(handle)
        facts["name"] = nvml.nvmlDeviceGetName(handle)
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        facts["pci_bus_id"] = _bus_id(pci.busId)
        facts["pci_device_id"] = f"0x{pci.pciDeviceId:08X}"
        self.handles[facts["index"]] = handle

    def _facts(self, handle: Any, facts: dict[str, Any]) -> None:
        nvml = self.nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        bar1 = _optional(nvml.nvmlDeviceGetBAR1MemoryInfo, handle)
        capability = _optional(nvml.nvmlDeviceGetCudaComputeCapability, handle)
        architecture = _optional(nvml.nvmlDeviceGetArchitecture, handle)
        constraints = _optional(nvml.nvmlDeviceGetPowerManagementLimitConstraints, handle)
        persistence = _optional(nvml.nvmlDeviceGetPersistenceMode, handle)
        compute_mode = _optional(nvml.nvmlDeviceGetComputeMode, handle)
        ecc = _optional(nvml.nvmlDeviceGetEccMode, handle)
        facts.update(
            serial=_optional(nvml.nvmlDeviceGetSerial, handle),
            minor_number=_optional(nvml.nvmlDeviceGetMinorNumber, handle),
            board_part_number=_optional(nvml.nvmlDeviceGetBoardPartNumber, handle),
            vbios_version=_optional(nvml.nvmlDeviceGetVbiosVersion, handle),
            architecture=None if architecture is None else _ARCHITECTURES.get(architecture),
            compute_capability=None if capability is None else "{}.{}".format(*capability),
            memory_total_mib=memory.total // _MIB,
            memory_used_mib=memory.used // _MIB,
            memory_free_mib=memory.free // _MIB,
            bar1_total_mib=None if bar1 is None else bar1.bar1Total // _MIB,
            max_sm_clock_mhz=_optional(
                nvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM
            ),
            max_mem_clock_mhz=_optional(
                nvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM
            ),
            power_limit_default_w=_watts(
                _optional(nvml.nvmlDeviceGetPowerManagementDefaultLimit, handle)
            ),
            power_limit_enforced_w=_watts(_optional(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
            power_limit_min_w=None if constraints is None else _watts(constraints[0]),
            power_limit_max_w=None if constraints is None else _watts(constraints[1]),
            persistence_mode=None if persistence is None else _enabled_name(persistence),
            compute_mode=None if compute_mode is None else _COMPUTE_MODES.get(compute_mode),
            ecc_enabled=None if ecc is None else bool(ecc[0]),
            ecc_pending_enabled=None if ecc is None else bool(ecc[1]),
        )

    def _mig_mode(self, handle: Any, facts: dict[str, Any]) -> None:
        mode = _optional(self.nvml.nvmlDeviceGetMigMode, handle)
        if mode is not None:  # None: not MIG-capable
            facts["mig_enabled"] = mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            facts["mig_pending_enabled"] = mode[1] == pynvml.NVML_DEVICE_MIG_ENABLE

    def _locality(self, handle: Any, facts: dict[str, Any]) -> None:
        """NUMA node, CPU affinity and NVLinks: facts and the topology both need them."""
        nvml = self.nvml
        # The CPU-side NUMA node (`topo -m` "NUMA Affinity"); nvmlDeviceGetNumaNodeId is the
        # GPU's own node, which exists only where GPU memory is a NUMA node (Grace Hopper).
        nodes = _optional(
            nvml.nvmlDeviceGetMemoryAffinity,
            handle,
            _NODE_SET_WORDS,
            pynvml.NVML_AFFINITY_SCOPE_NODE,
        )
        socket_nodes = _optional(
            nvml.nvmlDeviceGetMemoryAffinity,
            handle,
            _NODE_SET_WORDS,
            pynvml.NVML_AFFINITY_SCOPE_SOCKET,
        )
        affinity = _optional(nvml.nvmlDeviceGetCpuAffinity, handle, _CPU_SET_WORDS)
        links = self._nvlinks(handle)
        self.links[facts["index"]] = links
        facts.update(
            numa_node=None if nodes is None else _lowest_bit(nodes),
            numa_affinity=None if nodes is None else cpulist(nodes) or None,
            gpu_numa_node=_optional(nvml.nvmlDeviceGetNumaNodeId, handle),
            socket=None if socket_nodes is None else _lowest_bit(socket_nodes),
            cpu_affinity=None if affinity is None else cpulist(affinity) or None,
            nvlink_count=links.active,
        )

    def _nvlinks(self, handle: Any) -> _Links:
        nvml = self.nvml
        links = _Links()
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except NVMLError as err:
                if err.value in ABSENT:  # past this GPU's last link, or no NVLink at all
                    break
                raise
            if state != pynvml.NVML_FEATURE_ENABLED:
                continue
            links.active += 1
            remote_pci = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            remote = None if remote_pci is None else _bus_id(remote_pci.busId)
            kind = _optional(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                links.to_switches[remote] += 1
            elif kind == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU:
                links.to_gpus[remote] += 1
            elif kind is None:  # driver without remote device types: decided by bus id later
                links.to_unknown[remote] += 1
        return links

    def _throttle_reasons(self, handle: Any) -> tuple[str, ...]:
        nvml = self.nvml
        try:
            mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        except NVMLError as err:
            if err.value not in UNSUPPORTED:
                raise
            # Drivers older than 535 only know the deprecated name.
            mask = _optional(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        return () if mask is None else throttle_reason_names(mask)

    def _field_values(self, handle: Any, field_ids: tuple[int, ...]) -> dict[int, Any]:
        """Field id -> value, None for a field the GPU does not report (each field carries its
        own NVML return code; the call as a whole fails only for the device)."""
        values = _optional(self.nvml.nvmlDeviceGetFieldValues, handle, list(field_ids))
        found: dict[int, Any] = dict.fromkeys(field_ids)
        for value in values or ():
            member = _FIELD_VALUE_MEMBERS.get(value.valueType)
            if value.nvmlReturn == pynvml.NVML_SUCCESS and member is not None:
                found[value.fieldId] = getattr(value.value, member)
        return found

    def _metrics(
        self,
        handle: Any,
        throttle_reasons: tuple[str, ...],
        fields: dict[int, Any],
        mig_enabled: bool | None,
    ) -> GpuMetrics:
        nvml = self.nvml
        utilization = _optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        pstate = _optional(nvml.nvmlDeviceGetPerformanceState, handle)
        return GpuMetrics(
            utilization_gpu_pct=None if utilization is None else utilization.gpu,
            utilization_memory_pct=None if utilization is None else utilization.memory,
            temperature_c=_optional(
                nvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
            ),
            memory_temperature_c=fields[_MEMORY_TEMP_FIELD],
            power_w=_watts(_optional(nvml.nvmlDeviceGetPowerUsage, handle)),
            energy_mj=_optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle),
            sm_clock_mhz=_optional(nvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
            mem_clock_mhz=_optional(nvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
            fan_pct=_optional(nvml.nvmlDeviceGetFanSpeed, handle),
            pstate=None if pstate is None or pstate > 15 else f"P{pstate}",
            # Each call samples the PCIe byte counters for 20 ms on real GPUs.
            pcie_tx_kbps=_optional(
                nvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES
            ),
            pcie_rx_kbps=_optional(
                nvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES
            ),
            throttle_reasons=throttle_reasons,
            processes=self._processes(handle),
            mig_devices=self._mig_device_metrics(handle) if mig_enabled else (),
        )

    def _mig_device_metrics(self, handle: Any) -> tuple[MigDeviceMetrics, ...]:
        nvml = self.nvml
        devices = []
        for (gi_id, ci_id), device in self._mig_devices(handle):
            memory = nvml.nvmlDeviceGetMemoryInfo(device)
            name = nvml.nvmlDeviceGetName(device)
            devices.append(
                MigDeviceMetrics(
                    gi_id=gi_id,
                    ci_id=ci_id,
                    uuid=nvml.nvmlDeviceGetUUID(device),
                    profile=name.rpartition(" MIG ")[2] if " MIG " in name else None,
                    memory_used_mib=memory.used // _MIB,
                    memory_total_mib=memory.total // _MIB,
                )
            )
        devices.sort(key=lambda d: (d.gi_id, d.ci_id))
        return tuple(devices)

    def _processes(self, handle: Any) -> tuple[ProcessInfo, ...]:
        nvml = self.nvml
        processes = []
        for kind, call in (
            ("C", nvml.nvmlDeviceGetComputeRunningProcesses),
            ("G", nvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for process in _optional(call, handle) or ():
                processes.append(
                    ProcessInfo(
                        pid=process.pid,
                        kind=kind,
                        used_memory_mib=_mib(process.usedGpuMemory),
                        gpu_instance_id=instance_id(process.gpuInstanceId),
                        compute_instance_id=instance_id(process.computeInstanceId),
                    )
                )
        return tuple(processes)

    def _health(
        self, handle: Any, throttle_reasons: tuple[str, ...], fields: dict[int, Any]
    ) -> HealthCounters:
        nvml = self.nvml
        counters: dict[str, Any] = {
            name: _optional(nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter)
            for name, error_type, counter in _ECC_COUNTERS
        }
        for name, cause in (
            ("retired_pages_sbe", pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
            ("retired_pages_dbe", pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        ):
            pages = _optional(nvml.nvmlDeviceGetRetiredPages, handle, cause)
            counters[name] = None if pages is None else len(pages)
        pending = _optional(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        remapped = _optional(nvml.nvmlDeviceGetRemappedRows, handle)
        if remapped is not None:
            correctable, uncorrectable, remap_pending, failure = remapped
            counters.update(
                remapped_rows_correctable=correctable,
                remapped_rows_uncorrectable=uncorrectable,
                remapped_rows_pending=bool(remap_pending),
                remapped_rows_failure=bool(failure),
            )
        nvlink = [fields[field] for field in _NVLINK_ERROR_FIELDS if fields[field] is not None]
        return HealthCounters(
            **counters,
            retired_pages_pending=None if pending is None else bool(pending),
            nvlink_errors=sum(nvlink) if nvlink else None,
            throttle_reasons=throttle_reasons,
        )

    # ----------------------------------------------------------------- MIG

    def _mig(self, handle: Any, facts: dict[str, Any]) -> MigLayout | None:
        nvml = self.nvml
        if "mig_enabled" not in facts:
            return None
        pending = facts["mig_pending_enabled"]
        if not facts["mig_enabled"]:
            # NVML answers profile queries only while MIG is enabled (NOT_SUPPORTED otherwise).
            catalog = _catalog_profiles(facts["name"])
            return MigLayout(
                enabled=False,
                pending_enabled=pending,
                profiles=catalog,
                profiles_source="catalog" if catalog else None,
            )
        model = (facts["name"], facts["pci_device_id"])
        if model not in self.mig_tables:
            self.mig_tables[model] = read_mig_profiles(nvml, handle)
        profiles = tuple(
            dataclasses.replace(
                profile,
                remaining=_optional(
                    nvml.nvmlDeviceGetGpuInstanceRemainingCapacity, handle, profile.id
                ),
            )
            for profile in self.mig_tables[model]
        )
        return MigLayout(
            enabled=True,
            pending_enabled=pending,
            profiles=profiles,
            gpu_instances=self._gpu_instances(handle, model, profiles),
            profiles_source="nvml",
        )

    def _gpu_instances(
        self, handle: Any, model: tuple[str, str], profiles: tuple[MigProfile, ...]
    ) -> tuple[GpuInstance, ...]:
        nvml = self.nvml
        mig_uuids = self._mig_device_uuids(handle)
        instances = []
        for profile in profiles:
            gis = (pynvml.c_nvmlGpuInstance_t * profile.instances)()
            count = c_uint(0)
            nvml.nvmlDeviceGetGpuInstances(handle, profile.id, gis, byref(count))
            for gi in gis[: count.value]:
                info = nvml.nvmlGpuInstanceGetInfo(gi)
                key = (*model, profile.id)
                if key not in self.ci_profiles:
                    self.ci_profiles[key] = read_ci_profiles(nvml, gi)
                instances.append(
                    GpuInstance(
                        gi_id=info.id,
                        profile_id=profile.id,
                        profile_name=profile.name,
                        placement_start=info.placement.start,
                        placement_size=info.placement.size,
                        memory_mib=profile.memory_mib,
                        compute_instances=self._compute_instances(
                            gi, info.id, self.ci_profiles[key], mig_uuids
                        ),
                    )
                )
        instances.sort(key=lambda gi: gi.gi_id)
        return tuple(instances)

    def _compute_instances(
        self, gi: Any, gi_id: int, profiles: list[Any], mig_uuids: dict[tuple[int, int], str]
    ) -> tuple[ComputeInstance, ...]:
        nvml = self.nvml
        instances = []
        for profile in profiles:
            cis = (pynvml.c_nvmlComputeInstance_t * profile.instanceCount)()
            count = c_uint(0)
            nvml.nvmlGpuInstanceGetComputeInstances(gi, profile.id, cis, byref(count))
            for ci in cis[: count.value]:
                info = nvml.nvmlComputeInstanceGetInfo(ci)
                instances.append(
                    ComputeInstance(
                        ci_id=info.id,
                        profile_id=info.profileId,
                        name=mig_profile_name(profile.name),
                        sm_count=profile.multiprocessorCount,
                        placement_start=info.placement.start,
                        placement_size=info.placement.size,
                        uuid=mig_uuids.get((gi_id, info.id)),
                    )
                )
        instances.sort(key=lambda ci: ci.ci_id)
        return tuple(instances)

    def _mig_device_uuids(self, handle: Any) -> dict[tuple[int, int], str]:
        """(GI id, CI id) -> `MIG-...` UUID of the MIG devices NVML enumerates."""
        return {
            key: self.nvml.nvmlDeviceGetUUID(device) for key, device in self._mig_devices(handle)
        }

    def _mig_devices(self, handle: Any) -> Iterator[tuple[tuple[int, int], Any]]:
        """((GI id, CI id), MIG device handle) of each MIG device NVML enumerates."""
        nvml = self.nvml
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except NVMLError as err:
                if err.value == pynvml.NVML_ERROR_NOT_FOUND:  # empty slot
                    continue
                raise
            key = (
                nvml.nvmlDeviceGetGpuInstanceId(device),
                nvml.nvmlDeviceGetComputeInstanceId(device),
            )
            yield key, device

    # ----------------------------------------------------------------- topology

    def _topology(self, gpus: tuple[GpuScan, ...]) -> Topology:
        indices = tuple(gpu.index for gpu in gpus)
        bus_ids = {gpu.facts.pci_bus_id for gpu in gpus if gpu.facts.pci_bus_id}
        switches = {index: _switch_links(links, bus_ids) for index, links in self.links.items()}
        size = len(indices)
        matrix: list[list[str | None]] = [[None] * size for _ in range(size)]
        for row, gpu_a in enumerate(gpus):
            matrix[row][row] = "X"
            if gpu_a.index not in self.handles:
                continue
            for col in range(row + 1, size):
                gpu_b = gpus[col]
                if gpu_b.index in self.handles:
                    label = self._link(gpu_a, gpu_b, switches)
                    matrix[row][col] = matrix[col][row] = label
        nics, nic_links = _nic_links(self.nvml, indices)
        return Topology(
            gpus=indices,
            matrix=tuple(tuple(row) for row in matrix),
            numa_nodes=tuple(gpu.facts.numa_node for gpu in gpus),
            cpu_affinity=tuple(gpu.facts.cpu_affinity for gpu in gpus),
            nics=nics,
            nic_links=nic_links,
        )

    def _link(
        self, gpu_a: GpuScan, gpu_b: GpuScan, switches: dict[int, Counter[str | None]]
    ) -> str | None:
        """`nvidia-smi topo -m` label for one GPU pair, computed once per unordered pair."""
        a, b = gpu_a.index, gpu_b.index
        links_a = self.links[a]
        direct = (
            links_a.to_gpus[gpu_b.facts.pci_bus_id] + links_a.to_unknown[gpu_b.facts.pci_bus_id]
        )
        if direct:
            return f"NV{direct}"
        if switched := _shared_switch_links(switches[a], switches[b]):
            return f"NV{switched}"
        try:
            level = self.nvml.nvmlDeviceGetTopologyCommonAncestor(self.handles[a], self.handles[b])
        except NVMLError as err:
            log.error("topology GPU %d-GPU %d: %s", a, b, describe_error(err))
            return None
        return _PCIE_LINKS.get(level)


def _nic_links(
    backend: Any, indices: tuple[int, ...]
) -> tuple[tuple[str, ...], tuple[tuple[str | None, ...], ...]]:
    """NIC names and, per GPU index, its link to each NIC, parsed from `topo -m`."""
    text = backend.topo_matrix_text()
    if not text:
        return (), ()
    try:
        matrix = parse_topo_matrix(text)
    except ParseError as err:
        log.warning("nvidia-smi topo -m: %s", err)
        return (), ()
    links = matrix.nic_links()
    nics = matrix.nics
    rows = tuple(tuple(links.get(f"GPU{index}", {}).get(nic) for nic in nics) for index in indices)
    return nics, rows


def _enabled_name(state: int) -> str:
    return "Enabled" if state == pynvml.NVML_FEATURE_ENABLED else "Disabled"


def _switch_links(links: _Links, gpu_bus_ids: set[str]) -> Counter[str | None]:
    if not links.to_unknown:
        return links.to_switches
    # Without remote device types, a remote that is not one of this node's GPUs is a switch.
    unknown = Counter({bus: n for bus, n in links.to_unknown.items() if bus not in gpu_bus_ids})
    return links.to_switches + unknown


def _shared_switch_links(a: Counter[str | None], b: Counter[str | None]) -> int:
    """Links both GPUs have into the switches they share: nvidia-smi's NV12 (DGX A100) and
    NV18 (DGX H100) through NVSwitch."""
    shared = a.keys() & b.keys()
    return min(sum(a[s] for s in shared), sum(b[s] for s in shared))
