"""Invariants every scan must satisfy, on the simulator and on real GPUs alike."""

from __future__ import annotations

import json
import re

from inventory.nvml import NodeScan

UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID_RE = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_ID_RE = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
LINK_RE = re.compile(r"^(NV\d+|PIX|PXB|PHB|NODE|SYS)$")
MIG_MEMORY_SLICES = 8


def assert_clean_scan(scan: NodeScan) -> None:
    """A full scan of a healthy node: every section present and self-consistent."""
    system = scan.system
    assert system.error is None
    assert system.gpu_count == len(scan.gpus) > 0
    assert system.driver_version
    assert re.fullmatch(r"\d+\.\d+", system.cuda_driver_version or "")
    assert [gpu.index for gpu in scan.gpus] == list(range(system.gpu_count))
    bus_ids = [gpu.facts.pci_bus_id for gpu in scan.gpus]
    assert len(set(bus_ids)) == len(bus_ids)
    for gpu in scan.gpus:
        facts = gpu.facts
        assert facts.error_message is None, facts.error_message
        assert UUID_RE.match(facts.uuid or ""), facts.uuid
        assert BUS_ID_RE.match(facts.pci_bus_id or ""), facts.pci_bus_id
        assert facts.name and facts.name.startswith(("NVIDIA", "Tesla"))  # V100: "Tesla V100-..."
        assert re.fullmatch(r"\d+\.\d+", facts.compute_capability or "")
        assert facts.memory_total_mib and facts.memory_total_mib > 0
        assert facts.memory_used_mib is not None and facts.memory_free_mib is not None
        assert facts.memory_used_mib + facts.memory_free_mib <= facts.memory_total_mib
        assert gpu.metrics is not None and gpu.health is not None
        assert 0 <= (gpu.metrics.utilization_gpu_pct or 0) <= 100
        assert 0 < (gpu.metrics.temperature_c or 1) < 120
        assert not gpu.health.gpu_lost
        if gpu.mig is not None:
            assert_sane_mig(scan, gpu.index)
    assert_sane_topology(scan)
    assert_round_trip(scan)


def assert_sane_mig(scan: NodeScan, index: int) -> None:
    gpu = scan.gpus[index]
    mig = gpu.mig
    assert mig is not None
    assert mig.enabled == gpu.facts.mig_enabled
    if not mig.enabled:
        assert mig.gpu_instances == ()
        assert all(profile.remaining is None for profile in mig.profiles)
        assert mig.profiles_source == ("catalog" if mig.profiles else None)
        return
    assert mig.profiles and mig.profiles_source == "nvml"
    for profile in mig.profiles:
        assert "g." in profile.name and not profile.name.startswith("MIG")
        assert 1 <= profile.compute_slices <= MIG_MEMORY_SLICES
        assert 0 < profile.memory_mib <= (gpu.facts.memory_total_mib or 0)
        assert profile.sm > 0 and profile.instances >= 1
        assert profile.remaining is not None and 0 <= profile.remaining <= profile.instances
        assert profile.placements
        assert profile.memory_slices >= profile.compute_slices
        for start in profile.placements:
            assert start + profile.memory_slices <= MIG_MEMORY_SLICES
    by_id = {profile.id: profile for profile in mig.profiles}
    used: set[int] = set()
    for gi in mig.gpu_instances:
        slices = set(range(gi.placement_start, gi.placement_start + gi.placement_size))
        assert not slices & used, f"GPU {index}: GI {gi.gi_id} overlaps another GI"
        used |= slices
        profile = by_id[gi.profile_id]
        assert gi.placement_start in profile.placements
        assert gi.placement_size == profile.memory_slices
        assert gi.compute_instances, f"GPU {index}: GI {gi.gi_id} has no compute instance"
        for ci in gi.compute_instances:
            assert ci.sm_count <= profile.sm
            assert MIG_UUID_RE.match(ci.uuid or ""), ci.uuid


def assert_sane_topology(scan: NodeScan) -> None:
    topology = scan.topology
    assert topology is not None
    size = len(scan.gpus)
    assert topology.gpus == tuple(range(size))
    assert len(topology.matrix) == size and all(len(row) == size for row in topology.matrix)
    for a in range(size):
        assert topology.link(a, a) == "X"
        for b in range(size):
            assert topology.link(a, b) == topology.link(b, a)
            if a != b:
                assert LINK_RE.match(topology.link(a, b) or ""), (a, b, topology.link(a, b))
    assert topology.numa_nodes == tuple(gpu.facts.numa_node for gpu in scan.gpus)
    assert topology.cpu_affinity == tuple(gpu.facts.cpu_affinity for gpu in scan.gpus)


def assert_round_trip(scan: NodeScan) -> None:
    """A scan survives JSON (the Celery transport) unchanged."""
    payload = json.dumps(scan.to_dict())
    assert NodeScan.from_dict(json.loads(payload)) == scan
