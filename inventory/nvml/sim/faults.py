"""Fault injection and simulated workload for a node's GPUs.

Every function takes a *target* and a node name: either a state directory (the change is written
to ``<state_dir>/<node>.json`` under its lock, and every ``SimulatedNvml`` of that node sees it on
its next poll), or a ``SimulatedNvml`` instance (``node`` may then be ``None``), which is how
in-memory simulators are driven.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pynvml

from . import metrics
from . import state as statemod
from .backend import SimulatedNvml
from .model import MachineModel, gpu_uuid, load_model
from .state import NO_ID, FileStore

Target = str | os.PathLike[str] | SimulatedNvml

XID_FALLEN_OFF_BUS = 79
NVLINK_COUNTERS = ("crc_flit", "crc_data", "replay", "recovery")
POWER_BRAKE = "nvmlClocksEventReasonHwPowerBrakeSlowdown"


def _edit(
    target: Target,
    node: str | None,
    change: Callable[[dict[str, Any], float], Any],
    now: float | None = None,
) -> Any:
    """Apply ``change(state, now)``; ``now`` defaults to the simulator's clock (or wall time)."""
    if isinstance(target, SimulatedNvml):
        if node is not None and node != target.node_name:
            raise ValueError(f"simulator is node {target.node_name!r}, not {node!r}")
        t = target.clock() if now is None else now
        return target.edit_state(lambda state: change(state, t))
    if node is None:
        raise ValueError("node is required with a state directory")
    t = time.time() if now is None else now
    with FileStore(target, node).transaction() as state:
        return change(state, t)


def _gpu(state: dict[str, Any], index: int) -> dict[str, Any]:
    if not 0 <= index < len(state["gpus"]):
        raise ValueError(f"node {state['node']} has no GPU {index}")
    return state["gpus"][index]


def _machine(state: dict[str, Any]) -> MachineModel:
    return load_model(state["model"])


def ensure_node(state_dir: str | os.PathLike[str], node: str, model: str | dict[str, Any]) -> None:
    """Create the node's state file from the model if no agent has created it yet."""
    machine = load_model(model)
    fresh = statemod.new_state(machine, node, model, 0, {}, time.time())
    FileStore(state_dir, node).create_if_missing(fresh)


def inject_xid(
    target: Target,
    node: str | None,
    gpu_index: int,
    xid: int,
    *,
    message: str = "",
    gpu_instance: int | None = None,
    compute_instance: int | None = None,
    now: float | None = None,
) -> None:
    """Deliver XID ``xid`` to event sets registered for NVML_EVENT_TYPE_XID_CRITICAL_ERROR."""

    def change(state: dict[str, Any], t: float) -> None:
        _gpu(state, gpu_index)
        statemod.add_event(
            state,
            gpu_index,
            pynvml.nvmlEventTypeXidCriticalError,
            xid,
            t,
            gi=NO_ID if gpu_instance is None else gpu_instance,
            ci=NO_ID if compute_instance is None else compute_instance,
            message=message,
        )

    _edit(target, node, change, now)


def set_ecc(
    target: Target,
    node: str | None,
    gpu_index: int,
    *,
    count: int,
    error: str = "uncorrected",
    counter: str = "both",
    location: str = "dram",
    now: float | None = None,
) -> None:
    """Set an ECC counter (``error`` corrected|uncorrected, ``counter`` volatile|aggregate|both,
    ``location`` dram|sram). A rise of the volatile count raises the matching NVML ECC event."""
    if error not in ("corrected", "uncorrected") or location not in ("dram", "sram"):
        raise ValueError("error must be corrected|uncorrected and location dram|sram")
    counters = ("volatile", "aggregate") if counter == "both" else (counter,)
    if any(c not in ("volatile", "aggregate") for c in counters):
        raise ValueError("counter must be volatile, aggregate or both")

    def change(state: dict[str, Any], t: float) -> None:
        if not _machine(state).gpus[gpu_index].type.ecc_enabled:
            raise ValueError(f"GPU {gpu_index} has no ECC or ECC is disabled")
        ecc = _gpu(state, gpu_index)["ecc"]
        before = ecc["volatile"][error][location]
        for name in counters:
            ecc[name][error][location] = count
        if ecc["volatile"][error][location] > before:
            kind = (
                pynvml.nvmlEventTypeSingleBitEccError
                if error == "corrected"
                else pynvml.nvmlEventTypeDoubleBitEccError
            )
            statemod.add_event(state, gpu_index, kind, 0, t)

    _edit(target, node, change, now)


def remap_rows(
    target: Target,
    node: str | None,
    gpu_index: int,
    *,
    correctable: int | None = None,
    uncorrectable: int | None = None,
    pending: bool | None = None,
    failure: bool | None = None,
) -> None:
    """Set the row-remapper counters (Ampere and later; a reset clears ``pending``)."""

    def change(state: dict[str, Any], t: float) -> None:
        if _machine(state).gpus[gpu_index].type.row_remapper_banks is None:
            raise ValueError(f"GPU {gpu_index} has no row remapper")
        rows = _gpu(state, gpu_index)["remapped_rows"]
        for key, value in (("correctable", correctable), ("uncorrectable", uncorrectable),
                           ("pending", pending), ("failure", failure)):  # fmt: skip
            if value is not None:
                rows[key] = value

    _edit(target, node, change)


def add_retired_pages(
    target: Target,
    node: str | None,
    gpu_index: int,
    addresses: list[int],
    *,
    cause: str = "double_bit",
    pending: bool = True,
    now: float | None = None,
) -> None:
    """Retire pages (pre-Ampere boards only; Ampere+ models refuse, as NVML reports N/A)."""
    if cause not in ("single_bit", "double_bit"):
        raise ValueError("cause must be single_bit or double_bit")

    def change(state: dict[str, Any], t: float) -> None:
        if not _machine(state).gpus[gpu_index].type.page_retirement:
            raise ValueError(f"GPU {gpu_index} uses row remapping, not page retirement")
        pages = _gpu(state, gpu_index)["retired_pages"]
        stamp = int(t)
        pages[cause].extend({"address": a, "timestamp": stamp} for a in addresses)
        pages["pending"] = pending

    _edit(target, node, change, now)


def set_temperature(
    target: Target,
    node: str | None,
    gpu_index: int,
    celsius: int | None,
    *,
    over_s: float | None = None,
    now: float | None = None,
) -> None:
    """Pin the GPU temperature (``None`` returns to the load model), or with ``over_s`` ramp it
    from what it reads now to ``celsius`` in a straight line over that many seconds, then hold
    it there: worked out from the clock whenever the GPU is read, so nothing runs meanwhile.
    Clock-event reasons follow: SW_THERMAL at the max operating temperature,
    HW_SLOWDOWN|HW_THERMAL at the slowdown one."""
    if over_s is not None and (celsius is None or not over_s > 0):
        raise ValueError("a ramp needs a target temperature and a duration above 0 s")

    def change(state: dict[str, Any], t: float) -> None:
        gpu = _gpu(state, gpu_index)
        ramp = None
        if over_s is not None:
            start = _temperature_now(state, gpu_index, t)
            ramp = {"from_c": start, "to_c": celsius, "start": t, "over_s": over_s}
        gpu["temperature_c"] = None if ramp else celsius
        gpu["temperature_ramp"] = ramp

    _edit(target, node, change, now)


def _temperature_now(state: dict[str, Any], gpu_index: int, t: float) -> int:
    """The GPU's temperature as it reads at ``t`` (the simulator's own ``metrics.snapshot``)."""
    machine = _machine(state)
    slot = machine.gpus[gpu_index]
    uuid = slot.uuid or gpu_uuid(machine.name, state["node"], gpu_index, state["salt"])
    procs = [proc for proc in state["processes"] if proc["gpu"] == gpu_index]
    gpu = state["gpus"][gpu_index]
    return metrics.snapshot(slot.type, gpu, procs, t, metrics.seed_of(uuid)).temperature


def add_nvlink_errors(
    target: Target,
    node: str | None,
    gpu_index: int,
    *,
    count: int = 1,
    counter: str = "crc_flit",
    link: int = 0,
) -> None:
    """Add ``count`` errors to one NVLink error counter of one link (``counter``: crc_flit,
    crc_data, replay or recovery), as ``nvmlDeviceGetNvLinkErrorCounter`` and the
    ``NVML_FI_DEV_NVLINK_*_ERROR_COUNT_*`` fields report them."""
    if counter not in NVLINK_COUNTERS or count < 1:
        raise ValueError(f"counter must be one of {', '.join(NVLINK_COUNTERS)} and count >= 1")

    def change(state: dict[str, Any], t: float) -> None:
        slot = _machine(state).gpus[gpu_index]
        links = len(slot.nvlink_switch_links) or len(slot.nvlink_gpu_links)
        if not 0 <= link < links:
            raise ValueError(f"GPU {gpu_index} has no NVLink {link}")
        per_link = _gpu(state, gpu_index).setdefault("nvlink_errors", {})
        counts = per_link.setdefault(str(link), {})
        counts[counter] = counts.get(counter, 0) + count

    _edit(target, node, change)


def power_brake(target: Target, node: str | None, gpu_index: int, engaged: bool = True) -> None:
    """Assert (or release) the external power brake: the GPU reports HW_POWER_BRAKE_SLOWDOWN
    and HW_SLOWDOWN, and its clocks drop."""

    def change(state: dict[str, Any], t: float) -> None:
        reasons = _gpu(state, gpu_index).setdefault("clock_event_reasons", [])
        if POWER_BRAKE in reasons:
            reasons.remove(POWER_BRAKE)
        if engaged:
            reasons.append(POWER_BRAKE)

    _edit(target, node, change)


def fall_off_bus(
    target: Target, node: str | None, gpu_index: int, *, now: float | None = None
) -> None:
    """XID 79, then every call on the GPU (and getting its handle) raises GPU_IS_LOST."""

    def change(state: dict[str, Any], t: float) -> None:
        _gpu(state, gpu_index)["lost"] = True
        statemod.add_event(
            state,
            gpu_index,
            pynvml.nvmlEventTypeXidCriticalError,
            XID_FALLEN_OFF_BUS,
            t,
            message="GPU has fallen off the bus.",
        )

    _edit(target, node, change, now)


def fail_queries(
    target: Target, node: str | None, gpu_index: int, code: int = pynvml.NVML_ERROR_UNKNOWN
) -> None:
    """Every query on this GPU raises NVMLError(code); its handle can still be obtained."""

    def change(state: dict[str, Any], t: float) -> None:
        _gpu(state, gpu_index)["fail_code"] = code

    _edit(target, node, change)


def clear(target: Target, node: str | None, gpu_index: int | None = None) -> None:
    """Remove injected faults (temperature, lost, failing queries, ECC, remaps, retired pages,
    NVLink errors, the power brake) from one GPU or all of them. MIG layouts and processes are
    left alone."""

    def change(state: dict[str, Any], t: float) -> None:
        indexes = range(len(state["gpus"])) if gpu_index is None else [gpu_index]
        for index in indexes:
            gpu = _gpu(state, index)
            fresh = statemod.new_gpu_state(gpu["mig"] is not None)
            for key in ("ecc", "retired_pages", "remapped_rows", "temperature_c",
                        "temperature_ramp", "lost", "fail_code", "nvlink_errors"):  # fmt: skip
                gpu[key] = fresh[key]
            reasons = gpu.get("clock_event_reasons", [])
            gpu["clock_event_reasons"] = [r for r in reasons if r != POWER_BRAKE]

    _edit(target, node, change)


def start_process(
    target: Target,
    node: str | None,
    gpu_index: int,
    pid: int,
    *,
    used_mib: int,
    util: int = 100,
    gpu_instance: int | None = None,
    compute_instance: int | None = None,
    name: str = "python",
    now: float | None = None,
) -> None:
    """Run a compute process on a GPU, or on a MIG device (``gpu_instance``/``compute_instance``
    of a MIG-enabled GPU). It drives utilization, memory, power and temperature."""
    if not 0 <= util <= 100 or used_mib < 0:
        raise ValueError("util must be 0-100 and used_mib >= 0")

    def change(state: dict[str, Any], t: float) -> None:
        gpu = _gpu(state, gpu_index)
        gpu_type = _machine(state).gpus[gpu_index].type
        # One process may use several GPUs (NVML lists it on each), but each GPU once.
        if any(p["pid"] == pid and p["gpu"] == gpu_index for p in state["processes"]):
            raise ValueError(f"pid {pid} is already running on GPU {gpu_index}")
        mig_on = gpu["mig"] is not None and gpu["mig"]["current"]
        mig_table = gpu_type.mig_table if mig_on else None
        if (mig_table is not None) != (gpu_instance is not None):
            raise ValueError("a MIG-enabled GPU needs gpu_instance; other GPUs take none")
        fraction = 1.0
        ci_id = None
        if mig_table is not None:
            gi = next((g for g in gpu["mig"]["instances"] if g["id"] == gpu_instance), None)
            ci_id = 0 if compute_instance is None else compute_instance
            ci = gi and next((c for c in gi["compute_instances"] if c["id"] == ci_id), None)
            if ci is None:
                raise ValueError(f"GPU {gpu_index} has no MIG device {gpu_instance}/{ci_id}")
            fraction = ci["size"] / mig_table.compute_slices
        state["processes"].append(
            {
                "pid": pid,
                "gpu": gpu_index,
                "gi": gpu_instance,
                "ci": ci_id,
                "used_mib": used_mib,
                "util": util,
                "fraction": fraction,
                "extra_w": metrics.process_extra_w(gpu_type, util, fraction),
                "started_at": t,
                "name": name,
            }
        )

    _edit(target, node, change, now)


def stop_process(target: Target, node: str | None, pid: int, *, now: float | None = None) -> None:
    """End a process started with :func:`start_process`, on every GPU it uses."""

    def change(state: dict[str, Any], t: float) -> None:
        procs = [p for p in state["processes"] if p["pid"] == pid]
        if not procs:
            raise ValueError(f"no simulated process {pid}")
        for proc in procs:
            statemod.end_process(state, proc, t)

    _edit(target, node, change, now)


def reset_gpu(
    target: Target, node: str | None, gpu_index: int, *, now: float | None = None
) -> None:
    """``nvidia-smi -r``: pending MIG mode becomes current, MIG instances and processes go."""

    def change(state: dict[str, Any], t: float) -> None:
        _gpu(state, gpu_index)
        statemod.reset_gpu(state, gpu_index, t)

    _edit(target, node, change, now)


def reboot(target: Target, node: str | None, *, now: float | None = None) -> None:
    """Reboot the node: every GPU is reset and energy counters restart."""
    _edit(target, node, lambda state, t: statemod.reboot(state, t), now)
