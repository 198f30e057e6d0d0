"""Live metrics of a simulated GPU: idle values from the captures, rising with the load of the
registered processes, plus a small noise that is a pure function of (seed, second), so a test with
a fixed clock sees fixed numbers."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import pynvml

from .model import GpuType

TEMP_TIME_CONSTANT_S = 20.0  # how fast the die heats towards its loaded temperature
_MASK64 = (1 << 64) - 1

_R = pynvml
REASON_IDLE = _R.nvmlClocksEventReasonGpuIdle
REASON_SW_POWER_CAP = _R.nvmlClocksEventReasonSwPowerCap
REASON_HW_SLOWDOWN = _R.nvmlClocksEventReasonHwSlowdown
REASON_SW_THERMAL = _R.nvmlClocksEventReasonSwThermalSlowdown
REASON_HW_THERMAL = _R.nvmlClocksEventReasonHwThermalSlowdown
REASON_HW_POWER_BRAKE = _R.nvmlClocksEventReasonHwPowerBrakeSlowdown


def seed_of(uuid: str) -> int:
    """A GPU's noise seed, from its UUID."""
    return int.from_bytes(hashlib.sha256(uuid.encode()).digest()[:8], "big")


def ramped(ramp: dict[str, Any], t: float) -> float:
    """The temperature a ramp (``faults.set_temperature(..., over_s=)``) gives at ``t``: from
    ``from_c`` at ``start`` in a straight line to ``to_c`` ``over_s`` seconds later, then
    held there."""
    done = min(1.0, max(0.0, (t - ramp["start"]) / ramp["over_s"]))
    return float(ramp["from_c"] + (ramp["to_c"] - ramp["from_c"]) * done)


def noise(seed: int, second: int, channel: int) -> float:
    """Deterministic value in [-1, 1] (splitmix64 of seed/second/channel)."""
    x = seed * 0x9E3779B97F4A7C15 + second * 0xBF58476D1CE4E5B9 + channel * 0x94D049BB133111EB
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return (x & 0xFFFF) / 32767.5 - 1.0


def process_load(proc: dict[str, Any]) -> float:
    """Share of the whole GPU a process keeps busy (a MIG process only loads its slices)."""
    return proc["util"] / 100.0 * proc["fraction"]


def process_extra_w(gpu_type: GpuType, util: float, fraction: float) -> float:
    """Watts a process adds above idle, at its utilization on its share of the GPU (0 on a
    board without power readings)."""
    idle, full_load = gpu_type.power["idle"], gpu_type.power["full_load"]
    if idle is None or full_load is None:
        return 0.0
    return (full_load - idle) * util / 100.0 * fraction


@dataclass(slots=True)
class Snapshot:
    util: int
    mem_util: int
    temperature: int
    memory_temperature: int | None  # None: no memory sensor (GDDR boards: NOT_SUPPORTED)
    power_mw: int | None  # None: no power readings (NOT_SUPPORTED)
    clocks: tuple[int, int, int, int]  # graphics, sm, mem, video (NVML_CLOCK_* order)
    pstate: int
    reasons: int
    fan: int | None
    pcie_kbs: int


def snapshot(
    gpu_type: GpuType, gpu_state: dict[str, Any], procs: list[dict[str, Any]], t: float, seed: int
) -> Snapshot:
    load = min(1.0, sum(process_load(p) for p in procs))
    second = int(t)
    temps = gpu_type.temperature
    ramp = gpu_state.get("temperature_ramp")  # absent in older state files
    if ramp is not None:
        temp = ramped(ramp, t)
    elif gpu_state["temperature_c"] is not None:
        temp = float(gpu_state["temperature_c"])
    else:
        temp = float(temps["idle"])
        if load:
            heating = t - max(p["started_at"] for p in procs)
            ramp = 1.0 - math.exp(-max(0.0, heating) / TEMP_TIME_CONSTANT_S)
            temp += (temps["full_load"] - temps["idle"]) * load * ramp
        temp += 0.6 * noise(seed, second, 1)
    temperature = round(temp)
    # HBM sits on the GPU's package: its sensor follows the die at the captured idle offset.
    memory_idle = temps.get("memory_idle")
    memory_temperature = None if memory_idle is None else round(temp + memory_idle - temps["idle"])

    reasons = 0 if load else REASON_IDLE
    for name in gpu_state.get("clock_event_reasons", ()):  # absent in older state files
        reasons |= getattr(_R, name)
    power_mw = None
    idle_w, cap_w = gpu_type.power["idle"], gpu_type.power["enforced_limit"]
    if idle_w is not None:
        watts = idle_w + sum(p["extra_w"] for p in procs)
        watts *= 1.0 + 0.01 * noise(seed, second, 2)
        if cap_w is not None and watts > cap_w:
            watts = cap_w
            reasons |= REASON_SW_POWER_CAP
        power_mw = round(watts * 1000)

    source = gpu_type.clocks_max if load else gpu_type.clocks_idle
    scale = 1.0
    # NVML's SW thermal slowdown: the GPU above its max operating temperature, or the memory
    # above its own; the HW slowdown at the slowdown threshold comes on top of it (the die is
    # above the max operating temperature too). An external power brake engages HW slowdown.
    if (temps["gpu_max"] is not None and temperature >= temps["gpu_max"]) or (
        memory_temperature is not None
        and temps["mem_max"] is not None
        and memory_temperature >= temps["mem_max"]
    ):
        reasons |= REASON_SW_THERMAL
        scale = 0.8
    if temps["slowdown"] is not None and temperature >= temps["slowdown"]:
        reasons |= REASON_HW_SLOWDOWN | REASON_HW_THERMAL
    if reasons & REASON_HW_POWER_BRAKE:
        reasons |= REASON_HW_SLOWDOWN
    if reasons & REASON_HW_SLOWDOWN:
        scale = 0.5
    graphics = max(gpu_type.clocks_idle["graphics"], int(source["graphics"] * scale))
    sm = max(gpu_type.clocks_idle["sm"], int(source["sm"] * scale))

    fan = None
    if gpu_type.fan is not None:
        curve = gpu_type.fan
        if temperature < curve["start_c"]:
            fan = 0
        else:
            slope = (100 - curve["min_pct"]) / (curve["full_c"] - curve["start_c"])
            fan = min(100, round(curve["min_pct"] + (temperature - curve["start_c"]) * slope))

    pcie = gpu_type.pcie_kbs
    return Snapshot(
        util=round(load * 100),
        mem_util=round(load * gpu_type.mem_util_at_full_load),
        temperature=temperature,
        memory_temperature=memory_temperature,
        power_mw=power_mw,
        clocks=(graphics, sm, source["mem"], source["video"]),
        pstate=gpu_type.pstate["load" if load else "idle"],
        reasons=reasons,
        fan=fan,
        pcie_kbs=round(pcie["idle"] + (pcie["full_load"] - pcie["idle"]) * load),
    )


def energy_mj(
    idle_w: float,
    gpu_state: dict[str, Any],
    procs: list[dict[str, Any]],
    boot_time: float,
    t: float,
) -> int:
    """Energy since the driver loaded: idle draw plus what every process added while it ran
    (only for boards with power readings)."""
    total = idle_w * max(0.0, t - boot_time) * 1000.0 + gpu_state["energy_mj"]
    total += sum(p["extra_w"] * max(0.0, t - p["started_at"]) * 1000.0 for p in procs)
    return int(total)
