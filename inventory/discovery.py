"""The pure part of discovery: what must change in the catalog to match one node's scan.

``plan_sync`` compares a ``NodeScan`` with what the database holds (as plain dicts) and returns
a ``SyncPlan``: the rows to create or update and one ``Change`` per audited difference. It does
no I/O, so every rule (missing, returned, moved, MIG layout, topology) is tested without a
database; ``inventory.services.apply_discovery`` applies the plan in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inventory.nvml.scanner import GpuScan, NodeScan

# Discovered GPU fields, as stored on inventory.models.Gpu (None becomes "" for text fields).
TEXT_FIELDS = (
    "name",
    "serial",
    "pci_bus_id",
    "pci_device_id",
    "board_part_number",
    "vbios_version",
    "architecture",
    "compute_capability",
    "cpu_affinity",
)
VALUE_FIELDS = (
    "index",
    "minor_number",
    "memory_total_mib",
    "power_limit_default_w",
    "numa_node",
    "gpu_numa_node",
    "socket",
)
# Every field a clean scan sets (the keys of ``gpu_fields``), in display order: the one list
# that services, admin and API read through ``inventory.models.Gpu.DISCOVERED_FIELDS``.
GPU_FIELDS = (
    *VALUE_FIELDS,
    *TEXT_FIELDS,
    "nvlink_count",
    "mig_capable",
    "mig_enabled",
    "mig_pending_enabled",
    "error_message",
)
# Changes of these fields are worth an audit row of their own kind.
NODE_FIELDS = ("driver_version", "cuda_driver_version", "nvml_version")
# The host's logical CPUs and RAM (MiB), as stored on inventory.models.Node. A scan that did not
# read them (None) leaves the stored values alone; a change is audited as ``node.host_changed``.
HOST_FIELDS = ("cpu_count", "memory_total_mib")

LinkKey = tuple[str, str]  # the two GPU UUIDs, sorted
NicKey = tuple[str, str]  # GPU UUID, NIC name (mlx5_0)


@dataclass(frozen=True)
class StoredGpu:
    """What the database holds for one GPU."""

    uuid: str
    hostname: str
    missing: bool
    fields: dict[str, Any]
    mig: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Change:
    """One audited difference: ``kind`` is the audit event type."""

    kind: str
    uuid: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass
class SyncPlan:
    node_updates: dict[str, Any] = field(default_factory=dict)
    gpu_creates: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpu_updates: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpu_missing: list[str] = field(default_factory=list)
    gpu_returned: list[str] = field(default_factory=list)
    gpu_moved: list[str] = field(default_factory=list)
    mig_layouts: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    links: dict[LinkKey, tuple[str, int]] | None = None  # None: topology unchanged
    nic_links: dict[NicKey, str] | None = None  # set with ``links``
    changes: list[Change] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (
            self.node_updates
            or self.gpu_creates
            or self.gpu_updates
            or self.gpu_missing
            or self.mig_layouts
            or self.links is not None
        )


def gpu_fields(gpu: GpuScan) -> dict[str, Any]:
    """The discovered fields of a GPU that scanned cleanly."""
    facts = gpu.facts
    values: dict[str, Any] = {name: getattr(facts, name) or "" for name in TEXT_FIELDS}
    values.update({name: getattr(facts, name) for name in VALUE_FIELDS})
    values.update(
        memory_total_mib=facts.memory_total_mib or 0,
        nvlink_count=facts.nvlink_count or 0,
        mig_capable=facts.mig_enabled is not None,
        mig_enabled=bool(facts.mig_enabled),
        mig_pending_enabled=bool(facts.mig_pending_enabled),
        error_message="",
    )
    return values


def mig_layout(gpu: GpuScan) -> tuple[dict[str, Any], ...]:
    """The GPU's MIG compute instances as rows of inventory.models.MigInstance."""
    if gpu.mig is None or not gpu.mig.enabled:
        return ()
    return tuple(
        {
            "uuid": ci.uuid,
            "gi_id": gi.gi_id,
            "ci_id": ci.ci_id,
            "profile_name": gi.profile_name,
            "profile_id": gi.profile_id,
            "ci_profile_name": ci.name,
            "placement_start": gi.placement_start,
            "placement_size": gi.placement_size,
            "memory_mib": gi.memory_mib,
            "sm_count": ci.sm_count,
        }
        for gi in gpu.mig.gpu_instances
        for ci in gi.compute_instances
    )


def _clean_uuids(scan: NodeScan) -> dict[int, str]:
    """Index -> UUID of every cleanly scanned GPU."""
    return {
        gpu.facts.index: gpu.facts.uuid
        for gpu in scan.gpus
        if gpu.facts.uuid and not gpu.facts.error_message
    }


def topology_links(scan: NodeScan) -> dict[LinkKey, tuple[str, int]]:
    """Every pair of cleanly scanned GPUs -> (topo -m link name, NVLink count)."""
    if scan.topology is None:
        return {}
    uuid_at = _clean_uuids(scan)
    links: dict[LinkKey, tuple[str, int]] = {}
    for row, a in enumerate(scan.topology.gpus):
        for column, b in enumerate(scan.topology.gpus):
            link = scan.topology.matrix[row][column]
            if a < b and link and a in uuid_at and b in uuid_at:
                first, second = sorted((uuid_at[a], uuid_at[b]))
                count = int(link[2:]) if link.startswith("NV") else 0
                links[first, second] = (link, count)
    return links


def topology_nic_links(scan: NodeScan) -> dict[NicKey, str]:
    """Every cleanly scanned GPU and NIC of ``topo -m`` -> their link (PIX ... SYS)."""
    if scan.topology is None:
        return {}
    topology = scan.topology
    uuid_at = _clean_uuids(scan)
    return {
        (uuid_at[index], nic): link
        for index, row in zip(topology.gpus, topology.nic_links, strict=False)
        if index in uuid_at
        for nic, link in zip(topology.nics, row, strict=True)
        if link
    }


def plan_sync(
    hostname: str,
    scan: NodeScan,
    *,
    node: dict[str, Any],
    stored: dict[str, StoredGpu],
    stored_links: dict[LinkKey, tuple[str, int]],
    stored_nic_links: dict[NicKey, str],
) -> SyncPlan:
    """What to change so the catalog matches ``scan`` of node ``hostname``.

    ``node`` holds the node's stored discovered fields; ``stored`` the GPUs on this node plus
    any GPU elsewhere whose UUID this scan reports (a GPU that moved here).
    """
    plan = SyncPlan()
    _plan_node(scan, node, plan)
    seen: set[str] = set()
    failed_indexes: dict[int, str] = {}
    for gpu in scan.gpus:
        facts = gpu.facts
        if facts.error_message:
            if facts.uuid:
                seen.add(facts.uuid)
                _plan_failed(facts.uuid, facts.error_message, stored, plan)
            else:
                failed_indexes[facts.index] = facts.error_message
            continue
        assert facts.uuid is not None, "a GPU scanned without an error has a UUID"
        seen.add(facts.uuid)
        _plan_gpu(hostname, facts.uuid, gpu, stored.get(facts.uuid), plan)
    for uuid, known in stored.items():
        if known.hostname != hostname or uuid in seen or known.missing:
            continue
        error = failed_indexes.get(known.fields["index"])
        if error is not None:  # failed before NVML told its UUID: same slot, same GPU
            _plan_failed(uuid, error, stored, plan)
        else:
            plan.gpu_missing.append(uuid)
            plan.changes.append(Change("gpu.missing", uuid, {"index": known.fields["index"]}, None))
    if scan.topology is not None:
        links = topology_links(scan)
        nic_links = topology_nic_links(scan)
        if links != stored_links or nic_links != stored_nic_links:
            plan.links, plan.nic_links = links, nic_links
            plan.changes.append(
                Change(
                    "node.topology_changed",
                    None,
                    {"links": len(stored_links), "nic_links": len(stored_nic_links)},
                    {"links": len(links), "nic_links": len(nic_links)},
                )
            )
    return plan


def _plan_node(scan: NodeScan, node: dict[str, Any], plan: SyncPlan) -> None:
    system = scan.system
    found = {name: getattr(system, name) or "" for name in NODE_FIELDS}
    found["scan_error"] = system.error or ""
    changed = {name: value for name, value in found.items() if node.get(name) != value}
    host = {
        name: value
        for name in HOST_FIELDS
        if (value := getattr(system, name)) is not None and node.get(name) != value
    }
    plan.node_updates = {**changed, **host}
    # A first report (nothing stored yet) is news, not a change: not audited.
    if any(name in NODE_FIELDS and node.get(name) for name in changed):
        before = {name: node.get(name) for name in changed}
        plan.changes.append(Change("node.driver_changed", None, before, changed))
    host_changed = {name: value for name, value in host.items() if node.get(name) is not None}
    if host_changed:
        before = {name: node.get(name) for name in host_changed}
        plan.changes.append(Change("node.host_changed", None, before, host_changed))


def _plan_gpu(
    hostname: str, uuid: str, gpu: GpuScan, stored: StoredGpu | None, plan: SyncPlan
) -> None:
    values = gpu_fields(gpu)
    layout = mig_layout(gpu)
    if stored is None:
        plan.gpu_creates[uuid] = values
        plan.changes.append(Change("gpu.appeared", uuid, None, values))
        if layout:
            plan.mig_layouts[uuid] = layout
        return
    changed = {name: value for name, value in values.items() if stored.fields.get(name) != value}
    if stored.hostname != hostname:
        plan.gpu_moved.append(uuid)
        plan.changes.append(
            Change("gpu.moved", uuid, {"node": stored.hostname}, {"node": hostname})
        )
    if stored.missing:
        plan.gpu_returned.append(uuid)
        plan.changes.append(Change("gpu.returned", uuid, None, {"index": values["index"]}))
    if changed or stored.hostname != hostname or stored.missing:
        plan.gpu_updates[uuid] = changed
        if changed:
            before = {name: stored.fields.get(name) for name in changed}
            plan.changes.append(Change("gpu.facts_changed", uuid, before, changed))
    if layout != stored.mig:
        plan.mig_layouts[uuid] = layout
        plan.changes.append(
            Change(
                "gpu.mig_changed",
                uuid,
                {"instances": [_mig_label(row) for row in stored.mig]},
                {"instances": [_mig_label(row) for row in layout]},
            )
        )


def _plan_failed(uuid: str, error: str, stored: dict[str, StoredGpu], plan: SyncPlan) -> None:
    """A GPU whose queries fail keeps its facts; only its error changes (and is audited)."""
    known = stored.get(uuid)
    if known is None or known.fields.get("error_message") == error:
        return
    plan.gpu_updates[uuid] = {"error_message": error}
    plan.changes.append(
        Change(
            "gpu.error",
            uuid,
            {"error_message": known.fields.get("error_message")},
            {"error_message": error},
        )
    )


def _mig_label(row: dict[str, Any]) -> str:
    return f"GI{row['gi_id']}/CI{row['ci_id']} {row['ci_profile_name']}@{row['placement_start']}"
