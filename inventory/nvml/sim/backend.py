"""``SimulatedNvml``: the pynvml functions the scanner uses, answered from a machine model.

Method names, arguments, return shapes and errors follow ``pynvml`` (nvidia-ml-py 13): strings
come back as ``str``, structs as the ``pynvml.c_nvml*`` ctypes classes, errors as
``pynvml.NVMLError(code)``. Handles are real ctypes pointers of pynvml's handle types, so they fit
into pynvml structs and arrays (``c_nvmlEventData_t.device``, ``c_nvmlGpuInstance_t * n``); the
simulator maps them back by address.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import pynvml

from ..host import HostResources
from ..mig_catalog import CiProfile, MigProfile, MigTable
from ..parsers.common import format_cpu_list
from . import metrics
from . import mig as migmod
from . import state as statemod
from .model import (
    FleetNode,
    GpuSlot,
    MachineModel,
    NicSlot,
    gpu_serial,
    gpu_uuid,
    load_fleet,
    load_model,
    mig_uuid,
    parse_bus_id,
    sys_apart,
)
from .state import NO_ID, FileStore, MemoryStore

_NVMLError = pynvml.NVMLError
_monotonic = time.monotonic
_MIB = 1024 * 1024

# NVML's memory locations that Ampere and later report ECC counts for.
_ECC_LOCATIONS = {
    pynvml.NVML_MEMORY_LOCATION_DRAM: ("dram",),  # == NVML_MEMORY_LOCATION_DEVICE_MEMORY
    pynvml.NVML_MEMORY_LOCATION_SRAM: ("sram",),
}
_ECC_ERRORS = {
    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected",
    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected",
}
_ECC_COUNTERS = {pynvml.NVML_VOLATILE_ECC: "volatile", pynvml.NVML_AGGREGATE_ECC: "aggregate"}
_EVENTS_ECC = pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError
_EVENTS_BASE = (
    pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeClock
)
_TEMPERATURE_THRESHOLDS: dict[int, Literal["shutdown", "slowdown", "mem_max", "gpu_max"]] = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown",
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
    pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "mem_max",
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max",
}
_SUPPORTED_REASONS = 0x1FF  # clocks_event_reasons.supported in the captures
# nvmlDeviceGetNvLinkErrorCounter's counters, as the state names them.
_NVLINK_COUNTERS = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}
# nvmlDeviceGetFieldValues' NVLink error fields: field id -> (counter, link; None = all links).
_NVLINK_FIELDS: dict[int, tuple[str, int | None]] = {}
for _name in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY"):
    _prefix = f"NVML_FI_DEV_NVLINK_{_name}_ERROR_COUNT_"
    _NVLINK_FIELDS[getattr(pynvml, _prefix + "TOTAL")] = (_name.lower(), None)
    for _link in range(12):  # pynvml names per-link fields for links 0-11 only
        _NVLINK_FIELDS[getattr(pynvml, f"{_prefix}L{_link}")] = (_name.lower(), _link)


_T = TypeVar("_T")


def _supported(value: _T | None) -> _T:
    """A fact the board may lack: ``None`` in the model is NVML's NOT_SUPPORTED."""
    if value is None:
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return value


def _milliwatts(watts: float | None) -> int:
    """A power limit in mW; ``None`` (the capture says "N/A": no power management) is
    NOT_SUPPORTED."""
    return round(_supported(watts) * 1000)


def _physical(obj: _Gpu | _MigDevice) -> _Gpu:
    """The physical GPU behind a GPU or MIG device."""
    return obj.parent if isinstance(obj, _MigDevice) else obj


def _err(code: int) -> pynvml.NVMLError:
    return _NVMLError(code)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _DeviceHandle(pynvml.c_nvmlDevice_t):
    _type_ = pynvml.struct_c_nvmlDevice_t


class _GpuInstanceHandle(pynvml.c_nvmlGpuInstance_t):
    _type_ = pynvml.struct_c_nvmlGpuInstance_t


class _ComputeInstanceHandle(pynvml.c_nvmlComputeInstance_t):
    _type_ = pynvml.struct_c_nvmlComputeInstance_t


class _EventSetHandle(pynvml.c_nvmlEventSet_t):
    _type_ = pynvml.struct_c_nvmlEventSet_t


_Handle = TypeVar(
    "_Handle", _DeviceHandle, _GpuInstanceHandle, _ComputeInstanceHandle, _EventSetHandle
)


class _Gpu:
    """A physical GPU: static facts from the model plus views of its slice of the state."""

    def __init__(self, owner: SimulatedNvml, slot: GpuSlot, uuid: str, serial: str | None) -> None:
        self.owner = owner
        self.slot = slot
        self.type = slot.type
        self.index = slot.index
        self.uuid = uuid
        self.serial = serial
        self.seed = metrics.seed_of(uuid)
        self.handle = owner._new_handle(_DeviceHandle, self)
        self.fault: int | None = None
        self.gs: dict[str, Any] = {}
        self.procs: list[dict[str, Any]] = []
        self.mig_devices: list[_MigDevice] = []
        self.gis: dict[int, dict[str, Any]] = {}
        self._mig_cache: dict[tuple[int, int, int, int], _MigDevice] = {}
        self._gi_cache: dict[tuple[int, int, int], _GpuInstance] = {}
        self._ci_cache: dict[tuple[int, int, int, int], _ComputeInstance] = {}
        self._snap: tuple[Any, metrics.Snapshot] | None = None

    @property
    def mig_enabled(self) -> bool:
        block = self.gs["mig"]
        return block is not None and bool(block["current"])

    @property
    def mig_table(self) -> MigTable:
        """The MIG geometry (NOT_SUPPORTED on a GPU without MIG)."""
        return _supported(self.type.mig_table)

    def profile_by_id(self, profile_id: int) -> MigProfile:
        found = self.mig_table.by_id(profile_id)
        if found is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def adopt(self, gs: dict[str, Any], procs: list[dict[str, Any]]) -> None:
        self.gs = gs
        self.procs = procs
        self.fault = pynvml.NVML_ERROR_GPU_IS_LOST if gs["lost"] else gs["fail_code"]
        self._snap = None
        self.gis = {}
        devices = []
        if self.mig_enabled:
            for gi in gs["mig"]["instances"]:
                self.gis[gi["id"]] = gi
                for ci in gi["compute_instances"]:
                    key = (gi["id"], gi["profile_id"], ci["id"], ci["profile_id"])
                    dev = self._mig_cache.get(key)
                    if dev is None:
                        dev = self._mig_cache[key] = _MigDevice(self, gi, ci)
                    dev.gi, dev.ci = gi, ci
                    devices.append(dev)
        self.mig_devices = devices
        live = {id(d) for d in devices}
        for dev in self._mig_cache.values():
            dev.alive = id(dev) in live

    def snapshot(self) -> metrics.Snapshot:
        t = self.owner._clock()
        key = (int(t), self.owner._version)
        if self._snap is None or self._snap[0] != key:
            snap = metrics.snapshot(self.type, self.gs, self.procs, t, self.seed)
            self._snap = (key, snap)
        return self._snap[1]

    def gpu_instance(self, gi: dict[str, Any]) -> _GpuInstance:
        key = (gi["id"], gi["profile_id"], gi["start"])
        obj = self._gi_cache.get(key)
        if obj is None:
            obj = self._gi_cache[key] = _GpuInstance(self, key)
        return obj

    def compute_instance(self, gi: dict[str, Any], ci: dict[str, Any]) -> _ComputeInstance:
        key = (gi["id"], gi["profile_id"], ci["id"], ci["profile_id"])
        obj = self._ci_cache.get(key)
        if obj is None:
            obj = self._ci_cache[key] = _ComputeInstance(self, key)
        return obj


class _MigDevice:
    """A MIG device (one compute instance) as seen through a MIG device handle."""

    def __init__(self, parent: _Gpu, gi: dict[str, Any], ci: dict[str, Any]) -> None:
        self.owner = parent.owner
        self.parent = parent
        self.gi = gi
        self.ci = ci
        self.alive = True
        self.uuid = mig_uuid(parent.uuid, gi["id"], ci["id"])
        self.gi_profile = parent.profile_by_id(gi["profile_id"])
        self.ci_profile = parent.mig_table.ci_profiles(self.gi_profile)[ci["profile_id"]]
        self.handle = parent.owner._new_handle(_DeviceHandle, self)


class _GpuInstance:
    def __init__(self, parent: _Gpu, key: tuple[int, int, int]) -> None:
        self.owner = parent.owner
        self.parent = parent
        self.key = key
        self.handle = parent.owner._new_handle(_GpuInstanceHandle, self)

    def current(self) -> dict[str, Any]:
        """The GI's state dict, or INVALID_ARGUMENT once it has been destroyed."""
        gi = self.parent.gis.get(self.key[0])
        if gi is None or (gi["id"], gi["profile_id"], gi["start"]) != self.key:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gi


class _ComputeInstance:
    def __init__(self, parent: _Gpu, key: tuple[int, int, int, int]) -> None:
        self.owner = parent.owner
        self.parent = parent
        self.key = key
        self.handle = parent.owner._new_handle(_ComputeInstanceHandle, self)

    def current(self) -> tuple[dict[str, Any], dict[str, Any]]:
        gi = self.parent.gis.get(self.key[0])
        if gi is not None and gi["profile_id"] == self.key[1]:
            for ci in gi["compute_instances"]:
                if (ci["id"], ci["profile_id"]) == self.key[2:]:
                    return gi, ci
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)


class _EventSet:
    def __init__(self, owner: SimulatedNvml) -> None:
        self.owner = owner
        self.registered: dict[int, list[int]] = {}  # GPU index -> [event mask, last seen seq]
        self.freed = False
        self.last_message = ""  # the text of the event last delivered (see event_message)
        self.handle = owner._new_handle(_EventSetHandle, self)


def _out_param(ref: Any) -> Any:
    """The ctypes object behind ``byref(x)`` or ``pointer(x)`` (how pynvml passes counts)."""
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    return getattr(ref, "_obj", ref)


class SimulatedNvml:
    """A pynvml look-alike for one simulated node. Build it with :meth:`from_model` or
    :meth:`from_fleet_spec`; the constructor takes an already loaded model."""

    def __init__(
        self,
        machine: MachineModel,
        node_name: str,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        model_ref: str | dict[str, Any] | None = None,
        mig_overrides: dict[int, list[Any] | None] | None = None,
        salt: int = 0,
        clock: Callable[[], float] = time.time,
        reload_interval: float = 0.5,
    ) -> None:
        self.machine = machine
        self.node_name = node_name
        self._clock = clock
        self._reload_interval = reload_interval
        self._refcount = 0
        self._next_poll = 0.0
        self._version = 0
        self._sig: Any = None
        self._addr: dict[int, Any] = {}
        ref = model_ref if model_ref is not None else machine.name
        fresh = statemod.new_state(machine, node_name, ref, salt, mig_overrides or {}, clock())
        if state_dir is None:
            self._store: MemoryStore | FileStore = MemoryStore(fresh)
        else:
            store = FileStore(state_dir, node_name)
            store.create_if_missing(fresh, replace_model=True)
            self._store = store
        self._gpus = [
            _Gpu(
                self,
                slot,
                slot.uuid or gpu_uuid(machine.name, node_name, slot.index, salt),
                slot.serial
                or (
                    gpu_serial(slot.type.serial_prefix, machine.name, node_name, slot.index, salt)
                    if slot.type.serial_prefix
                    else None
                ),
            )
            for slot in machine.gpus
        ]
        self._by_uuid: dict[str, Any] = {g.uuid: g for g in self._gpus}
        self._by_bus = {(g.slot.domain, g.slot.bus, g.slot.device): g for g in self._gpus}
        self._load()

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_model(
        cls,
        model: str | dict[str, Any],
        node_name: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> SimulatedNvml:
        """A node of a shipped machine model (by name) or of an inline model dict."""
        machine = load_model(model)
        return cls(machine, node_name or machine.name, state_dir, model_ref=model, **kwargs)

    @classmethod
    def from_fleet_spec(
        cls,
        spec: str | os.PathLike[str] | dict[str, Any] | list[Any],
        node_name: str,
        state_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> SimulatedNvml:
        """The node ``node_name`` of a fleet spec (see ``sim/README.md``)."""
        nodes: list[FleetNode] = load_fleet(spec)
        node = next((n for n in nodes if n.name == node_name), None)
        if node is None:
            raise ValueError(f"fleet spec has no node {node_name!r}")
        return cls(
            load_model(node.model),
            node.name,
            state_dir,
            model_ref=node.model,
            mig_overrides=node.mig,
            salt=node.salt,
            **kwargs,
        )

    # inventory.nvml.open_backend() calls it by this name.
    from_fleet = from_fleet_spec

    # --- state plumbing -----------------------------------------------------------------------

    def _new_handle(self, cls: type[_Handle], obj: Any) -> _Handle:
        handle = cls(cls._type_())
        handle._sim = obj
        self._addr[ctypes.addressof(handle.contents)] = obj
        return handle

    def _load(self) -> None:
        state, self._sig = self._store.load()
        self._adopt(state)

    def _adopt(self, state: dict[str, Any]) -> None:
        self._state = state
        self._version += 1
        by_gpu: list[list[dict[str, Any]]] = [[] for _ in self._gpus]
        for proc in state["processes"]:
            by_gpu[proc["gpu"]].append(proc)
        for gpu, gs, procs in zip(self._gpus, state["gpus"], by_gpu, strict=True):
            gpu.adopt(gs, procs)
        for gpu in self._gpus:
            for dev in gpu.mig_devices:
                self._by_uuid[dev.uuid] = dev

    def _poll(self, force: bool = False) -> None:
        """Reload the state if another process changed it (checked every reload_interval)."""
        now = _monotonic()
        if not force and now < self._next_poll:
            return
        self._next_poll = now + self._reload_interval
        if self._store.signature() != self._sig:
            self._load()

    def _mutate(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        """Apply ``change`` to the newest state under the store's lock, then adopt the result."""
        with self._store.transaction() as state:
            result = change(state)
        self._sig = self._store.last_signature
        self._adopt(state)
        return result

    def _resolve(self, handle: Any) -> Any:
        obj = getattr(handle, "_sim", None)
        if obj is not None and obj.owner is self:
            return obj
        if not isinstance(handle, ctypes._Pointer) or not handle:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        obj = self._addr.get(ctypes.addressof(handle.contents))
        if obj is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def _ready(self) -> None:
        if not self._refcount:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if _monotonic() >= self._next_poll:
            self._poll()

    def _gpu(self, handle: Any) -> _Gpu:
        """A physical GPU handle, checked for faults; MIG device handles are NOT_SUPPORTED."""
        self._ready()
        obj = self._resolve(handle)
        if obj.__class__ is _Gpu:
            if obj.fault:
                raise _err(obj.fault)
            return obj
        if isinstance(obj, _MigDevice):
            self._check_mig(obj)
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _check_mig(self, dev: _MigDevice) -> None:
        if dev.parent.fault:
            raise _err(dev.parent.fault)
        if not dev.alive:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _any(self, handle: Any) -> _Gpu | _MigDevice:
        """A GPU or MIG device handle, for the calls MIG devices answer too."""
        self._ready()
        obj = self._resolve(handle)
        if obj.__class__ is _Gpu:
            if obj.fault:
                raise _err(obj.fault)
            return obj
        if isinstance(obj, _MigDevice):
            self._check_mig(obj)
            return obj
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _mig_gpu(self, handle: Any) -> _Gpu:
        """A MIG-capable GPU (NOT_SUPPORTED otherwise)."""
        gpu = self._gpu(handle)
        if gpu.gs["mig"] is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig_enabled_gpu(self, handle: Any) -> _Gpu:
        gpu = self._mig_gpu(handle)
        if not gpu.mig_enabled:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _gi(self, handle: Any) -> tuple[_GpuInstance, dict[str, Any]]:
        self._ready()
        obj = self._resolve(handle)
        if obj.__class__ is not _GpuInstance:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if obj.parent.fault:
            raise _err(obj.parent.fault)
        return obj, obj.current()

    def _ci(self, handle: Any) -> tuple[_ComputeInstance, dict[str, Any], dict[str, Any]]:
        self._ready()
        obj = self._resolve(handle)
        if obj.__class__ is not _ComputeInstance:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if obj.parent.fault:
            raise _err(obj.parent.fault)
        gi, ci = obj.current()
        return obj, gi, ci

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # pynvml functions the simulator does not model behave like a symbol missing from
        # libnvidia-ml: pynvml raises NVMLError_FunctionNotFound for those.
        if name.startswith("nvml") and callable(getattr(pynvml, name, None)):

            def missing(*_args: Any, **_kwargs: Any) -> Any:
                raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

            return missing
        raise AttributeError(name)

    # --- simulator controls (not part of pynvml) ----------------------------------------------

    def clock(self) -> float:
        """The simulator's notion of now (wall time unless a clock was injected)."""
        return self._clock()

    @property
    def state(self) -> dict[str, Any]:
        """The current node state document (read-only by convention)."""
        self._poll(force=True)
        return self._state

    def edit_state(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        """Run ``change(state)`` under the store's lock; used by ``faults`` for in-memory nodes."""
        return self._mutate(change)

    def reset_gpu(self, index: int) -> None:
        """Simulate a GPU reset (``nvidia-smi -r``): pending MIG mode becomes current."""
        self._mutate(lambda st: statemod.reset_gpu(st, index, self._clock()))

    def event_message(self, eventSet: Any) -> str:
        """The text of the event last delivered on the set (``inject xid --message``): what the
        kernel log line of a real XID says, which NVML's event data does not carry."""
        return self._event_set(eventSet).last_message

    def reboot(self) -> None:
        """Simulate a node reboot: every GPU is reset and the driver clock restarts."""
        self._mutate(lambda st: statemod.reboot(st, self._clock()))

    # --- init / system ------------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> None:
        if self._refcount == 0:
            self._poll(force=True)
        self._refcount += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        if not self._refcount:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._ready()
        return self.machine.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._ready()
        return self.machine.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._ready()
        return self.machine.cuda_driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.nvmlSystemGetCudaDriverVersion()

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._ready()
        for proc in self._state["processes"]:
            if proc["pid"] == pid:
                return proc["name"]
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlSystemGetTopologyGpuSet(self, cpuNumber: int) -> list[Any]:
        self._ready()
        return [g.handle for g in self._gpus if cpuNumber in self._node_cpus(g.slot)]

    def nvmlDeviceGetCount(self) -> int:
        self._ready()
        return len(self._gpus)

    # --- handles ------------------------------------------------------------------------------

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._ready()
        if not 0 <= index < len(self._gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[index]
        if gpu.gs["lost"]:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu.handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._ready()
        obj = self._by_uuid.get(_text(uuid))
        if obj is None or (isinstance(obj, _MigDevice) and not obj.alive):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        if _physical(obj).gs["lost"]:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return obj.handle

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Any:
        self._ready()
        try:
            gpu = self._by_bus.get(parse_bus_id(_text(pciBusId)))
        except ValueError:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None
        if gpu is None:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        if gpu.gs["lost"]:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu.handle

    # --- device facts -------------------------------------------------------------------------

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle).index

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return _supported(self._gpu(handle).slot.minor_number)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        obj = self._any(handle)
        if isinstance(obj, _MigDevice):
            return f"{obj.parent.type.name} MIG {obj.ci_profile.name}"
        return obj.type.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._any(handle).uuid

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return _supported(self._gpu(handle).serial)

    def nvmlDeviceGetBoardPartNumber(self, handle: Any) -> str:
        return _supported(self._gpu(handle).type.board_part_number)

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        return self._gpu(handle).type.vbios_version

    def nvmlDeviceGetInforomImageVersion(self, handle: Any) -> str:
        return _supported(self._gpu(handle).type.inforom_image_version)

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        return self._gpu(handle).type.brand

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return _physical(self._any(handle)).type.architecture

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return _physical(self._any(handle)).type.cuda_cc

    def nvmlDeviceGetNumGpuCores(self, handle: Any) -> int:
        return _supported(self._gpu(handle).type.num_gpu_cores)

    def nvmlDeviceGetMultiGpuBoard(self, handle: Any) -> int:
        return self._gpu(handle).type.multi_gpu_board

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return _supported(self._gpu(handle).type.persistence_mode)

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return self._gpu(handle).type.compute_mode

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        slot = self._gpu(handle).slot
        return _pci_info(slot.domain, slot.bus, slot.device, slot.type.pci_device_id,
                         slot.type.pci_subsystem_id)  # fmt: skip

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        obj = self._any(handle)
        if isinstance(obj, _MigDevice):
            total = obj.gi_profile.memory_mib * _MIB
            reserved = 0
            used = sum(p["used_mib"] for p in obj.parent.procs if p["gi"] == obj.gi["id"]) * _MIB
        else:
            mem = obj.type.memory
            total = mem["total_mib"] * _MIB
            reserved = mem["reserved_mib"] * _MIB
            used = (mem["idle_used_mib"] + sum(p["used_mib"] for p in obj.procs)) * _MIB
        free = max(0, total - reserved - used)
        if not version:
            # v1 folds the driver's reservation into "used", as libnvidia-ml does.
            return pynvml.c_nvmlMemory_t(total=total, free=free, used=total - free)
        info = pynvml.c_nvmlMemory_v2_t(total=total, reserved=reserved, free=free, used=used)
        info.version = version
        return info

    def nvmlDeviceGetBAR1MemoryInfo(self, handle: Any) -> pynvml.c_nvmlBAR1Memory_t:
        obj = self._any(handle)
        if isinstance(obj, _MigDevice):
            per_slice = obj.parent.mig_table.bar1_mib_per_memory_slice
            total, used = int(per_slice * obj.gi_profile.memory_slices) * _MIB, 0
        else:
            mem = obj.type.memory
            # null: "BAR1 Memory Usage: N/A" (GH200's C2C memory has no BAR1 aperture).
            total = _supported(mem["bar1_total_mib"]) * _MIB
            used = mem["bar1_idle_used_mib"] * _MIB
        return pynvml.c_nvmlBAR1Memory_t(bar1Total=total, bar1Free=total - used, bar1Used=used)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._gpu(handle)
        return gpu.type.clocks_max[_clock_key(type)]

    def nvmlDeviceGetPowerManagementMode(self, handle: Any) -> int:
        # "Power Management: N/A" in the captures whose power limits are all N/A.
        _supported(self._gpu(handle).type.power["default_limit"])
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        # The limit set with `nvidia-smi -pl` ("Power Limit" / "Requested Power Limit").
        return _milliwatts(self._gpu(handle).type.power["enforced_limit"])

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return _milliwatts(self._gpu(handle).type.power["default_limit"])

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return _milliwatts(self._gpu(handle).type.power["enforced_limit"])

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        power = self._gpu(handle).type.power
        return [_milliwatts(power["min_limit"]), _milliwatts(power["max_limit"])]

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        return list(_supported(self._gpu(handle).type.ecc_mode))

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        temps = self._gpu(handle).type.temperature
        key = _TEMPERATURE_THRESHOLDS.get(threshold)
        if key is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _supported(temps[key])

    # --- NUMA / affinity ----------------------------------------------------------------------

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        # Only coherent-memory GPUs (Grace Hopper) are NUMA nodes themselves; every x86 capture
        # says "GPU NUMA ID: N/A" (nvmlDeviceGetMemoryAffinity gives the nearest CPU node).
        return _supported(self._gpu(handle).slot.gpu_numa_id)

    def _numa_nodes(self, gpu: _Gpu, scope: int) -> list[int]:
        nodes = gpu.slot.memory_nodes
        if not nodes:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if scope == pynvml.NVML_AFFINITY_SCOPE_NODE:
            return list(nodes)
        if scope == pynvml.NVML_AFFINITY_SCOPE_SOCKET:
            sockets = {self.machine.numa_socket[node] for node in nodes}
            return [n for n, s in self.machine.numa_socket.items() if s in sockets]
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _node_cpus(self, slot: GpuSlot) -> tuple[int, ...]:
        """The GPU's NODE-scope CPUs: its own list (single-socket desktops with "NUMA Affinity
        N/A", or several NUMA nodes of unknown CPUs), else its NUMA nodes' CPUs."""
        if slot.cpu_affinity is not None:
            return slot.cpu_affinity
        return tuple(c for n in slot.memory_nodes for c in self.machine.numa_cpus[n])

    def nvmlDeviceGetCpuAffinityWithinScope(self, handle: Any, cpuSetSize: int, scope: int) -> Any:
        gpu = self._gpu(handle)
        if not gpu.slot.memory_nodes and gpu.slot.cpu_affinity is not None:
            return _bitmask(list(gpu.slot.cpu_affinity), cpuSetSize)
        nodes = self._numa_nodes(gpu, scope)
        cpus = {c for n in nodes for c in self.machine.numa_cpus[n]} | set(
            self._node_cpus(gpu.slot)
        )
        return _bitmask(sorted(cpus), cpuSetSize)

    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpuSetSize: int) -> Any:
        return self.nvmlDeviceGetCpuAffinityWithinScope(
            handle, cpuSetSize, pynvml.NVML_AFFINITY_SCOPE_NODE
        )

    def nvmlDeviceGetMemoryAffinity(self, handle: Any, nodeSetSize: int, scope: int) -> Any:
        return _bitmask(self._numa_nodes(self._gpu(handle), scope), nodeSetSize)

    # --- live metrics -------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        gpu = self._gpu(handle)
        if gpu.mig_enabled:  # "Utilization: N/A" on MIG-enabled GPUs in the captures
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        snap = gpu.snapshot()
        return pynvml.c_nvmlUtilization_t(gpu=snap.util, memory=snap.mem_util)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.snapshot().temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return _supported(self._gpu(handle).snapshot().power_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        idle_w = _supported(gpu.type.power["idle"])  # no power readings: no energy counter
        boot = self._state["boot_time"]
        return metrics.energy_mj(idle_w, gpu.gs, gpu.procs, boot, self._clock())

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._gpu(handle)
        key = _clock_key(type)
        return gpu.snapshot().clocks[("graphics", "sm", "mem", "video").index(key)]

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        fan = self._gpu(handle).snapshot().fan
        if fan is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return fan

    def nvmlDeviceGetFanSpeed_v2(self, handle: Any, fan: int) -> int:
        speed = self.nvmlDeviceGetFanSpeed(handle)
        if fan != 0:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return speed

    def nvmlDeviceGetNumFans(self, device: Any) -> int:
        return 0 if self._gpu(device).type.fan is None else 1

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return self._gpu(handle).snapshot().pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle).snapshot().reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int:
        self._gpu(handle)
        return _SUPPORTED_REASONS

    def nvmlDeviceGetSupportedClocksThrottleReasons(self, handle: Any) -> int:
        return self.nvmlDeviceGetSupportedClocksEventReasons(handle)

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        gpu = self._gpu(device)
        if counter not in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        kbs = gpu.snapshot().pcie_kbs
        return kbs if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else kbs * 9 // 10

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        obj = self._any(handle)
        if isinstance(obj, _MigDevice):
            procs = [
                p for p in obj.parent.procs if p["gi"] == obj.gi["id"] and p["ci"] == obj.ci["id"]
            ]
        else:
            procs = obj.procs
        return [
            pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_v2_t(
                    pid=p["pid"],
                    usedGpuMemory=p["used_mib"] * _MIB,
                    gpuInstanceId=NO_ID if p["gi"] is None else p["gi"],
                    computeInstanceId=NO_ID if p["ci"] is None else p["ci"],
                )
            )
            for p in procs
        ]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        self._any(handle)
        return []

    # --- topology -----------------------------------------------------------------------------

    def _ancestor(self, a: _Gpu, b: _Gpu) -> int:
        if a is b:
            return pynvml.NVML_TOPOLOGY_INTERNAL
        return _common_ancestor(a.slot, b.slot)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        return self._ancestor(self._gpu(device1), self._gpu(device2))

    def nvmlDeviceGetTopologyNearestGpus(self, device: Any, level: int) -> list[Any]:
        gpu = self._gpu(device)
        return [
            other.handle
            for other in self._gpus
            if other is not gpu and self._ancestor(gpu, other) <= level
        ]

    def _nvlink_count(self, a: _Gpu, b: _Gpu) -> int:
        """Links between two GPUs as ``topo -m`` counts them (``NV#``): direct ones, or the
        switch links both have into the NVSwitch fabric."""
        if a.slot.nvlink_switch_links and b.slot.nvlink_switch_links:
            return min(len(a.slot.nvlink_switch_links), len(b.slot.nvlink_switch_links))
        return a.slot.nvlink_gpu_links.count(b.index)

    def host_resources(self) -> HostResources:
        """The machine's logical CPUs (its NUMA nodes' CPUs) and RAM (``host_memory_mib``), as a
        real host's agent reads them from the OS; None where the model does not say."""
        return HostResources(
            cpu_count=len(self.machine.cpus) or None,
            memory_total_mib=self.machine.host_memory_mib,
        )

    def topo_matrix_text(self) -> str:
        """``nvidia-smi topo -m`` as this machine prints it, NIC rows and legend included:
        the source of GPU-NIC affinity, which NVML does not report."""
        gpus = [gpu.slot for gpu in self._gpus]
        nics = self.machine.nics
        names = [f"GPU{slot.index}" for slot in gpus] + [f"NIC{i}" for i in range(len(nics))]
        slots: list[Any] = [*gpus, *nics]

        def cell(i: int, j: int) -> str:
            if i == j:
                return " X "
            if i < len(gpus) and j < len(gpus):
                links = self._nvlink_count(self._gpus[i], self._gpus[j])
                if links:
                    return f"NV{links}"
            return _TOPO_LEVELS[_common_ancestor(slots[i], slots[j])]

        lines = ["\t" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
        for i, name in enumerate(names):
            cells = [name, *(cell(i, j) for j in range(len(names)))]
            if i < len(gpus):
                cpus = self._node_cpus(gpus[i])
                numa = format_cpu_list(gpus[i].memory_nodes) or "N/A"
                own = "N/A" if gpus[i].gpu_numa_id is None else str(gpus[i].gpu_numa_id)
                cells += [format_cpu_list(cpus) if cpus else "N/A", numa, "", own]
            lines.append("\t".join(cells))
        if nics:
            lines += ["", "NIC Legend:", ""]
            lines += [f"  NIC{i}: {nic.name}" for i, nic in enumerate(nics)]
        return "\n".join(lines) + "\n"

    def _nvlinked(self, a: _Gpu, b: _Gpu) -> bool:
        if a.slot.nvlink_switch_links and b.slot.nvlink_switch_links:
            return True  # every GPU on the NVSwitch fabric reaches every other one
        return b.index in a.slot.nvlink_gpu_links

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: int) -> int:
        if not isinstance(p2pIndex, int):
            # pynvml.NVML_P2P_CAPS_INDEX_READ is the tuple (0,): the real binding fails in ctypes.
            raise ctypes.ArgumentError("argument 3: TypeError: Don't know how to convert parameter")
        a, b = self._gpu(device1), self._gpu(device2)
        if not 0 <= p2pIndex < pynvml.NVML_P2P_CAPS_INDEX_UNKNOWN:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if a is b:
            return pynvml.NVML_P2P_STATUS_OK
        if self._nvlinked(a, b):
            return pynvml.NVML_P2P_STATUS_OK
        if p2pIndex in (pynvml.NVML_P2P_CAPS_INDEX_NVLINK, pynvml.NVML_P2P_CAPS_INDEX_ATOMICS):
            return pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
        limit = self.machine.pcie_p2p_max_level
        if limit is None or self._ancestor(a, b) > limit:
            return pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
        return pynvml.NVML_P2P_STATUS_OK

    def _link(self, device: Any, link: int) -> tuple[_Gpu, str, int]:
        gpu = self._gpu(device)
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slot = gpu.slot
        if link < len(slot.nvlink_switch_links):
            return gpu, "switch", slot.nvlink_switch_links[link]
        if link < len(slot.nvlink_gpu_links):
            return gpu, "gpu", slot.nvlink_gpu_links[link]
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        self._link(device, link)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkVersion(self, device: Any, link: int) -> int:
        return _supported(self._link(device, link)[0].type.nvlink_version)

    def nvmlDeviceGetNvLinkCapability(self, device: Any, link: int, capability: int) -> int:
        gpu, _, _ = self._link(device, link)
        if capability not in gpu.type.nvlink_caps:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.type.nvlink_caps[capability]

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        _, kind, _ = self._link(handle, link)
        if kind == "switch":
            return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        return pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> pynvml.nvmlPciInfo_t:
        _, kind, remote = self._link(device, link)
        if kind == "switch":
            sw = self.machine.nvswitches[remote]
            return _pci_info(sw.domain, sw.bus, sw.device, sw.pci_device_id, sw.pci_subsystem_id)
        peer = self._gpus[remote].slot
        return _pci_info(peer.domain, peer.bus, peer.device, peer.type.pci_device_id,
                         peer.type.pci_subsystem_id)  # fmt: skip

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        gpu, _, _ = self._link(device, link)
        if not 0 <= counter < pynvml.NVML_NVLINK_ERROR_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        name = _NVLINK_COUNTERS.get(counter)  # DL_ECC_DATA: 0 (no ECC lane errors modelled)
        return 0 if name is None else _nvlink_errors(gpu, name, link)

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        """The fields gpuadmin samples (memory temperature, NVLink error counters, ECC totals);
        any other field comes back with its own ``nvmlReturn`` NOT_SUPPORTED, as NVML does for
        fields a GPU lacks."""
        gpu = self._gpu(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        stamp = int(self._clock() * 1_000_000)
        for value, field in zip(values, fieldIds, strict=True):
            if isinstance(field, tuple):
                value.fieldId, value.scopeId = field
            else:
                value.fieldId = field
            value.timestamp = stamp
            found = self._field(gpu, value.fieldId)
            if found is None:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            value.valueType, member, number = found
            value.nvmlReturn = pynvml.NVML_SUCCESS
            setattr(value.value, member, number)
        return values

    def _field(self, gpu: _Gpu, field: int) -> tuple[int, str, int] | None:
        """(value type, c_nvmlValue_t member, value) of one field, None when unsupported."""
        if field == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            celsius = gpu.snapshot().memory_temperature
            if celsius is None:
                return None
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", celsius
        if field in _NVLINK_FIELDS:
            counter, link = _NVLINK_FIELDS[field]
            links = len(gpu.slot.nvlink_switch_links) or len(gpu.slot.nvlink_gpu_links)
            if not links or (link is not None and link >= links):
                return None
            count = _nvlink_errors(gpu, counter, link)
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", count
        ecc = _ECC_FIELDS.get(field)
        if ecc is None or not gpu.type.ecc_enabled:
            return None
        counts = gpu.gs["ecc"][ecc[0]][ecc[1]]
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", counts["dram"] + counts["sram"]

    # --- MIG ----------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        block = self._mig_gpu(device).gs["mig"]
        return [block["current"], block["pending"]]

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        """Sets the pending mode; it becomes current at the next GPU reset or reboot. Returns the
        activation status NVML reports when a reset is still needed (RESET_REQUIRED)."""
        gpu = self._mig_gpu(device)
        if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if mode == pynvml.NVML_DEVICE_MIG_ENABLE and gpu.type.mig_table is None:
            # A captured MIG-capable board without a catalog table: no geometry to enable.
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.procs:
            raise _err(pynvml.NVML_ERROR_IN_USE)

        def change(state: dict[str, Any]) -> int:
            block = state["gpus"][gpu.index]["mig"]
            block["pending"] = mode
            if block["current"] == mode:
                return pynvml.NVML_SUCCESS
            return pynvml.NVML_ERROR_RESET_REQUIRED

        return self._mutate(change)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> ctypes.c_uint:
        # pynvml returns the c_uint itself here, not its value.
        return ctypes.c_uint(int(self._any(device).__class__ is _MigDevice))

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._gpu(device)
        table = gpu.type.mig_table
        return 0 if table is None else table.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._mig_enabled_gpu(device)
        if not 0 <= index < gpu.mig_table.max_mig_devices:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig_devices):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu.mig_devices[index].handle

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        obj = self._any(migDevice)
        if not isinstance(obj, _MigDevice):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj.parent.handle

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        obj = self._any(device)
        if not isinstance(obj, _MigDevice):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj.gi["id"]

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        obj = self._any(device)
        if not isinstance(obj, _MigDevice):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj.ci["id"]

    def nvmlDeviceGetAttributes_v2(self, device: Any) -> pynvml.c_nvmlDeviceAttributes:
        obj = self._any(device)
        if isinstance(obj, _MigDevice):
            gp, cp = obj.gi_profile, obj.ci_profile
            return pynvml.c_nvmlDeviceAttributes(
                multiprocessorCount=cp.sm,
                sharedCopyEngineCount=gp.ce,
                sharedDecoderCount=gp.dec,
                sharedEncoderCount=gp.enc,
                sharedJpegCount=gp.jpeg,
                sharedOfaCount=gp.ofa,
                gpuInstanceSliceCount=gp.compute_slices,
                computeInstanceSliceCount=cp.slices,
                memorySizeMB=gp.memory_mib,
            )
        table = obj.type.mig_table
        if table is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        full = max(table.profiles, key=lambda p: p.compute_slices)
        return pynvml.c_nvmlDeviceAttributes(
            multiprocessorCount=full.sm,
            sharedCopyEngineCount=full.ce,
            sharedDecoderCount=full.dec,
            sharedEncoderCount=full.enc,
            sharedJpegCount=full.jpeg,
            sharedOfaCount=full.ofa,
            gpuInstanceSliceCount=table.compute_slices,
            computeInstanceSliceCount=table.compute_slices,
            memorySizeMB=obj.type.memory["total_mib"],
        )

    def nvmlDeviceGetAttributes(self, device: Any) -> pynvml.c_nvmlDeviceAttributes:
        return self.nvmlDeviceGetAttributes_v2(device)

    def _gi_profile(self, gpu: _Gpu, profile: int) -> MigProfile:
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = gpu.mig_table.by_index(profile)
        if found is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return found

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        gpu = self._mig_enabled_gpu(device)
        p = self._gi_profile(gpu, profile)
        if version == 2:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            info.name = f"MIG {p.name}".encode()
        elif version == 1:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
        else:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info.id = p.id
        info.isP2pSupported = 0
        info.sliceCount = p.compute_slices
        info.instanceCount = p.instances
        info.multiprocessorCount = p.sm
        info.copyEngineCount = p.ce
        info.decoderCount = p.dec
        info.encoderCount = p.enc
        info.jpegCount = p.jpeg
        info.ofaCount = p.ofa
        info.memorySizeMB = p.memory_mib
        return info

    def nvmlDeviceGetGpuInstanceProfileInfoV(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        return self.nvmlDeviceGetGpuInstanceProfileInfo(device, profile, version)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        gpu = self._mig_enabled_gpu(device)
        profile = gpu.profile_by_id(profileId)
        return migmod.remaining_capacity(gpu.mig_table, gpu.gs["mig"]["instances"], profile)

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        """The ``_v2`` call: every placement the profile allows (used or not, MIG on or off),
        like ``-lgipp``. ``placementsRef`` may be None to ask for the count only."""
        gpu = self._mig_gpu(device)
        profile = gpu.profile_by_id(profileId)
        count = _out_param(countRef)
        if placementsRef is not None:
            for i, start in enumerate(profile.placements):
                placementsRef[i].start = start
                placementsRef[i].size = profile.memory_slices
        count.value = len(profile.placements)
        return pynvml.NVML_SUCCESS

    def _create_gi(self, device: Any, profileId: int, start: int | None) -> Any:
        gpu = self._mig_enabled_gpu(device)
        table = gpu.mig_table

        def change(state: dict[str, Any]) -> int:
            block = state["gpus"][gpu.index]["mig"]
            return migmod.create_gpu_instance(table, block, profileId, start)["id"]

        gi_id = self._mutate(change)
        return gpu.gpu_instance(gpu.gis[gi_id]).handle

    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        return self._create_gi(device, profileId, None)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any:
        gpu = self._mig_enabled_gpu(device)
        size = gpu.profile_by_id(profileId).memory_slices
        if placement is None or placement.size != size:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._create_gi(device, profileId, placement.start)

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        gpu = self._mig_enabled_gpu(device)
        profile = gpu.profile_by_id(profileId)
        found = [gi for gi in gpu.gs["mig"]["instances"] if gi["profile_id"] == profile.id]
        for i, gi in enumerate(found):
            gpuInstancesRef[i] = gpu.gpu_instance(gi).handle
        _out_param(countRef).value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        gpu = self._mig_enabled_gpu(device)
        gi = gpu.gis.get(gpuInstanceId)
        if gi is None:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu.gpu_instance(gi).handle

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> pynvml.c_nvmlGpuInstanceInfo_t:
        obj, gi = self._gi(gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t(id=gi["id"], profileId=gi["profile_id"])
        info.device = obj.parent.handle
        info.placement.start = gi["start"]
        info.placement.size = gi["size"]
        return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        obj, gi = self._gi(gpuInstance)
        gpu = obj.parent
        if gi["compute_instances"] or any(p["gi"] == gi["id"] for p in gpu.procs):
            raise _err(pynvml.NVML_ERROR_IN_USE)

        def change(state: dict[str, Any]) -> None:
            block = state["gpus"][gpu.index]["mig"]
            block["instances"] = [g for g in block["instances"] if g["id"] != gi["id"]]

        self._mutate(change)
        return pynvml.NVML_SUCCESS

    def _ci_profile(self, gpu: _Gpu, gi: dict[str, Any], profile: int) -> CiProfile:
        if not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = gpu.mig_table.ci_profiles(gpu.profile_by_id(gi["profile_id"])).get(profile)
        if found is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return found

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        obj, gi = self._gi(device)
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        cp = self._ci_profile(obj.parent, gi, profile)
        gp = obj.parent.profile_by_id(gi["profile_id"])
        if version == 2:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            info.name = f"MIG {cp.name}".encode()
        elif version == 1:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_t()
        else:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info.id = cp.index
        info.sliceCount = cp.slices
        info.instanceCount = len(cp.placements)
        info.multiprocessorCount = cp.sm
        info.sharedCopyEngineCount = gp.ce
        info.sharedDecoderCount = gp.dec
        info.sharedEncoderCount = gp.enc
        info.sharedJpegCount = gp.jpeg
        info.sharedOfaCount = gp.ofa
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        return self.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            device, profile, engProfile, version
        )

    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, gpuInstance: Any, profileId: int
    ) -> int:
        obj, gi = self._gi(gpuInstance)
        self._ci_profile(obj.parent, gi, profileId)
        return migmod.ci_remaining_capacity(obj.parent.mig_table, gi, profileId)

    def _create_ci(self, gpuInstance: Any, profileId: int, start: int | None) -> Any:
        obj, gi = self._gi(gpuInstance)
        gpu = obj.parent
        if not 0 <= profileId < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

        def change(state: dict[str, Any]) -> tuple[int, int]:
            block = state["gpus"][gpu.index]["mig"]
            target = next(g for g in block["instances"] if g["id"] == gi["id"])
            ci = migmod.create_compute_instance(gpu.mig_table, target, profileId, start)
            return target["id"], ci["id"]

        gi_id, ci_id = self._mutate(change)
        new_gi = gpu.gis[gi_id]
        new_ci = next(c for c in new_gi["compute_instances"] if c["id"] == ci_id)
        return gpu.compute_instance(new_gi, new_ci).handle

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        return self._create_ci(gpuInstance, profileId, None)

    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        self, gpuInstance: Any, profileId: int, placement: Any
    ) -> Any:
        if placement is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._create_ci(gpuInstance, profileId, placement.start)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        obj, gi = self._gi(gpuInstance)
        self._ci_profile(obj.parent, gi, profileId)
        found = [ci for ci in gi["compute_instances"] if ci["profile_id"] == profileId]
        for i, ci in enumerate(found):
            computeInstancesRef[i] = obj.parent.compute_instance(gi, ci).handle
        _out_param(countRef).value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: Any, computeInstanceId: int
    ) -> Any:
        obj, gi = self._gi(gpuInstance)
        for ci in gi["compute_instances"]:
            if ci["id"] == computeInstanceId:
                return obj.parent.compute_instance(gi, ci).handle
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlComputeInstanceGetInfo_v2(self, computeInstance: Any) -> Any:
        obj, gi, ci = self._ci(computeInstance)
        info = pynvml.c_nvmlComputeInstanceInfo_t(id=ci["id"], profileId=ci["profile_id"])
        info.device = obj.parent.handle
        info.gpuInstance = obj.parent.gpu_instance(gi).handle
        info.placement.start = ci["start"]
        info.placement.size = ci["size"]
        return info

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        return self.nvmlComputeInstanceGetInfo_v2(computeInstance)

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        obj, gi, ci = self._ci(computeInstance)
        gpu = obj.parent
        if any(p["gi"] == gi["id"] and p["ci"] == ci["id"] for p in gpu.procs):
            raise _err(pynvml.NVML_ERROR_IN_USE)

        def change(state: dict[str, Any]) -> None:
            block = state["gpus"][gpu.index]["mig"]
            target = next(g for g in block["instances"] if g["id"] == gi["id"])
            target["compute_instances"] = [
                c for c in target["compute_instances"] if c["id"] != ci["id"]
            ]

        self._mutate(change)
        return pynvml.NVML_SUCCESS

    # --- health -------------------------------------------------------------------------------

    def _ecc(self, handle: Any, errorType: int, counterType: int) -> dict[str, int]:
        gpu = self._gpu(handle)
        if not gpu.type.ecc_enabled:  # no ECC, or ECC disabled: the counters read "N/A"
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if errorType not in _ECC_ERRORS or counterType not in _ECC_COUNTERS:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.gs["ecc"][_ECC_COUNTERS[counterType]][_ECC_ERRORS[errorType]]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        counts = self._ecc(handle, errorType, counterType)
        return counts["dram"] + counts["sram"]

    def nvmlDeviceGetMemoryErrorCounter(
        self, handle: Any, errorType: int, counterType: int, locationType: int
    ) -> int:
        counts = self._ecc(handle, errorType, counterType)
        if not 0 <= locationType < pynvml.NVML_MEMORY_LOCATION_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        keys = _ECC_LOCATIONS.get(locationType)
        if keys is None:  # L1/L2/register file/texture: "N/A" on Ampere and later
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return sum(counts[k] for k in keys)

    def _retired(self, device: Any) -> dict[str, Any]:
        gpu = self._gpu(device)
        if not gpu.type.page_retirement:  # Ampere+ replaced it with row remapping
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.gs["retired_pages"]

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        pages = self._retired(device)
        key = _retirement_key(sourceFilter)
        return [page["address"] for page in pages[key]]

    def nvmlDeviceGetRetiredPages_v2(self, device: Any, sourceFilter: int) -> list[dict[str, int]]:
        pages = self._retired(device)
        return [dict(page) for page in pages[_retirement_key(sourceFilter)]]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        return int(self._retired(device)["pending"])

    def _remap(self, device: Any) -> tuple[_Gpu, dict[str, Any]]:
        gpu = self._gpu(device)
        if gpu.type.row_remapper_banks is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, gpu.gs["remapped_rows"]

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        _, rows = self._remap(device)
        return (rows["correctable"], rows["uncorrectable"], int(rows["pending"]),
                int(rows["failure"]))  # fmt: skip

    def nvmlDeviceGetRowRemapperHistogram(self, device: Any) -> Any:
        gpu, rows = self._remap(device)
        banks = gpu.type.row_remapper_banks
        used = min(banks, rows["correctable"] + rows["uncorrectable"])
        # One remapped row moves a bank from "max" to "high" availability (stas00 excerpt:
        # 1 correctable remap -> Max 639, High 1).
        return pynvml.c_nvmlRowRemapperHistogramValues(
            max=banks - used, high=used, partial=0, low=0, none=0
        )

    # --- events -------------------------------------------------------------------------------

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        return _EVENTS_BASE | (_EVENTS_ECC if gpu.type.ecc_enabled else 0)

    def nvmlEventSetCreate(self) -> Any:
        self._ready()
        return _EventSet(self).handle

    def _event_set(self, eventSet: Any) -> _EventSet:
        self._ready()
        obj = self._resolve(eventSet)
        if obj.__class__ is not _EventSet or obj.freed:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu(handle)
        es = self._event_set(eventSet)
        if eventTypes & ~self.nvmlDeviceGetSupportedEventTypes(handle):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        entry = es.registered.setdefault(gpu.index, [0, self._state["seq"]])
        entry[0] |= eventTypes

    def _next_event(self, es: _EventSet) -> dict[str, Any] | None:
        for event in self._state["events"]:
            entry = es.registered.get(event["gpu"])
            if entry and event["seq"] > entry[1] and event["type"] & entry[0]:
                entry[1] = event["seq"]
                return event
        return None

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> pynvml.c_nvmlEventData_t:
        es = self._event_set(eventSet)
        deadline = _monotonic() + timeoutms / 1000.0
        while True:
            self._poll(force=True)
            event = self._next_event(es)
            if event is not None:
                es.last_message = event["message"]
                data = pynvml.c_nvmlEventData_t(
                    eventType=event["type"],
                    eventData=event["data"],
                    gpuInstanceId=event["gi"],
                    computeInstanceId=event["ci"],
                )
                data.device = self._gpus[event["gpu"]].handle
                return data
            if any(self._gpus[i].gs["lost"] for i in es.registered):
                raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
            left = deadline - _monotonic()
            if left <= 0:
                raise _err(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.05, left))

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> pynvml.c_nvmlEventData_t:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._event_set(eventSet).freed = True


_TOPO_LEVELS = {
    pynvml.NVML_TOPOLOGY_SINGLE: "PIX",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
    pynvml.NVML_TOPOLOGY_NODE: "NODE",
    pynvml.NVML_TOPOLOGY_SYSTEM: "SYS",
}


def _common_ancestor(a: GpuSlot | NicSlot, b: GpuSlot | NicSlot) -> int:
    """NVML topology level of two distinct devices: SYS across root complexes (both given)
    or NUMA nodes, NODE across host bridges, then by the PCIe switches they share."""
    if sys_apart(a.numa_node, b.numa_node, a.root_complex, b.root_complex):
        return pynvml.NVML_TOPOLOGY_SYSTEM
    pa, pb = a.pcie_path, b.pcie_path
    if pa[0] != pb[0]:
        return pynvml.NVML_TOPOLOGY_NODE
    common = 0
    while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
        common += 1
    if common == 1:
        return pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    if common == len(pa) == len(pb):
        return pynvml.NVML_TOPOLOGY_SINGLE  # both hang off the same switch
    return pynvml.NVML_TOPOLOGY_MULTIPLE


def _pci_info(domain: int, bus: int, device: int, dev_id: int, subsys: int) -> Any:
    return pynvml.nvmlPciInfo_t(
        busIdLegacy=f"{domain:04X}:{bus:02X}:{device:02X}.0".encode(),
        domain=domain,
        bus=bus,
        device=device,
        pciDeviceId=dev_id,
        pciSubSystemId=subsys,
        busId=f"{domain:08X}:{bus:02X}:{device:02X}.0".encode(),
    )


_CLOCK_KEYS = {
    pynvml.NVML_CLOCK_GRAPHICS: "graphics",
    pynvml.NVML_CLOCK_SM: "sm",
    pynvml.NVML_CLOCK_MEM: "mem",
    pynvml.NVML_CLOCK_VIDEO: "video",
}


def _clock_key(clock_type: int) -> str:
    key = _CLOCK_KEYS.get(clock_type)
    if key is None:
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return key


_ECC_FIELDS = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: ("volatile", "corrected"),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: ("volatile", "uncorrected"),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: ("aggregate", "corrected"),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: ("aggregate", "uncorrected"),
}


def _nvlink_errors(gpu: _Gpu, counter: str, link: int | None) -> int:
    """One NVLink error counter of a link, or summed over all links (``link`` None)."""
    per_link = gpu.gs.get("nvlink_errors", {})  # absent in older state files
    if link is not None:
        return int(per_link.get(str(link), {}).get(counter, 0))
    return sum(int(counts.get(counter, 0)) for counts in per_link.values())


def _retirement_key(cause: int) -> str:
    if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
        return "single_bit"
    if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
        return "double_bit"
    raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)


def _bitmask(bits: list[int], words: int) -> Any:
    """pynvml's affinity shape: a ``c_ulonglong * words`` array, bit n = CPU (or node) n."""
    out = (ctypes.c_ulonglong * words)()
    for bit in bits:
        if bit < 64 * words:
            out[bit // 64] |= 1 << (bit % 64)
    return out
