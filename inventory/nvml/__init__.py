"""The NVML layer: one pynvml-shaped backend (real or simulated) and the scanner above it.

Plain Python, no Django imports. See README.md for the backend contract.
"""

from __future__ import annotations

from typing import Any

from inventory.nvml.scanner import (
    SECTIONS,
    ComputeInstance,
    GpuFacts,
    GpuInstance,
    GpuMetrics,
    GpuScan,
    HealthCounters,
    MigLayout,
    MigProfile,
    NodeScan,
    ProcessInfo,
    SystemInfo,
    Topology,
    describe_error,
    scan,
)

__all__ = [
    "SECTIONS",
    "ComputeInstance",
    "GpuFacts",
    "GpuInstance",
    "GpuMetrics",
    "GpuScan",
    "HealthCounters",
    "MigLayout",
    "MigProfile",
    "NodeScan",
    "ProcessInfo",
    "SystemInfo",
    "Topology",
    "describe_error",
    "open_backend",
    "scan",
]


def open_backend(
    kind: str,
    *,
    sim_model: str | None = None,
    node_name: str | None = None,
    sim_fleet: str | None = None,
    state_dir: str | None = None,
) -> Any:
    """A pynvml-shaped backend: "real" a RealNvml (pynvml's functions), "sim" a SimulatedNvml
    built from a machine model (`sim_model`) or from this node's entry in a fleet spec
    (`sim_fleet`)."""
    if kind == "real":
        from inventory.nvml.real import RealNvml

        return RealNvml()
    if kind == "sim":
        # Imported here so that the real path never loads the simulator.
        from inventory.nvml.sim import SimulatedNvml

        if sim_model:
            return SimulatedNvml.from_model(sim_model, node_name=node_name, state_dir=state_dir)
        if sim_fleet and node_name:
            return SimulatedNvml.from_fleet_spec(
                sim_fleet, node_name=node_name, state_dir=state_dir
            )
        raise ValueError("a simulated backend needs sim_model, or sim_fleet and node_name")
    raise ValueError(f"unknown NVML backend {kind!r}: expected 'real' or 'sim'")
