"""The MIG page's data: a GPU's instances drawn on its memory slices, the room left per
profile by the NVML layer's own rules (``inventory.nvml.mig_fit``), and a GPU's MIG history
(from the audit log)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from gpuadmin.audit.models import AuditEvent
from gpuadmin.registry import Occupant
from inventory.models import Gpu, MigInstance, Node
from inventory.nvml import mig_catalog, mig_fit
from inventory.nvml.mig_catalog import MigProfile, MigTable
from inventory.occupancy import Occupancy


@dataclasses.dataclass(frozen=True)
class ComputeInstanceRow:
    """A MIG device (a compute instance) and the job holding it, if any."""

    instance: MigInstance
    holder: Occupant | None


@dataclasses.dataclass
class GpuInstanceCard:
    """A MIG GPU instance drawn on the memory slices, with its compute instances."""

    gi_id: int
    profile_name: str
    placement_start: int
    placement_size: int
    memory_mib: int
    compute_slices: int
    compute_instances: list[ComputeInstanceRow]

    @property
    def grid_column(self) -> str:
        return f"{self.placement_start + 1} / span {self.placement_size}"


@dataclasses.dataclass
class ProfileFit:
    """How many more instances of one profile fit next to the current ones, and where."""

    name: str
    memory_mib: int
    compute_slices: int
    memory_slices: int
    fits: int
    starts: list[int]


@dataclasses.dataclass
class MigLayout:
    gpu: Gpu
    memory_slices: int
    compute_slices: int
    cards: list[GpuInstanceCard]
    free_slices: list[int]
    fits: list[ProfileFit]
    known_table: bool
    create_form: Any = None  # set by the MIG page for admins
    messages: list[Any] = dataclasses.field(default_factory=list)  # the MIG page's, about it

    @property
    def compute_used(self) -> int:
        return sum(card.compute_slices for card in self.cards)

    @property
    def slice_indexes(self) -> range:
        return range(self.memory_slices)

    @property
    def compute_bar(self) -> list[bool]:
        """One flag per compute slice: ``True`` where an instance uses it."""
        used = min(self.compute_used, self.compute_slices)
        return [True] * used + [False] * (self.compute_slices - used)


def _compute_slices(profile_name: str, table_profiles: Mapping[str, MigProfile]) -> int:
    if profile_name in table_profiles:
        return table_profiles[profile_name].compute_slices
    found = re.match(r"(\d+)g\.", profile_name)
    return int(found.group(1)) if found else 0


def mig_layout(
    gpu: Gpu, instances: Iterable[MigInstance], occupancy: Occupancy | None = None
) -> MigLayout:
    """The GPU's instances on its slices, each MIG device with the job holding it (asked of
    ``occupancy``; None: not named) and, while MIG is on, the room its profile table still
    leaves per profile (with MIG off no instance can be made: no room is listed)."""
    table = mig_catalog.table_for_gpu(gpu.name)
    profiles = {p.name: p for p in table.profiles} if table else {}
    memory_total = table.memory_slices if table else 8
    compute_total = table.compute_slices if table else 7
    by_gi: dict[int, list[MigInstance]] = {}
    for instance in instances:
        by_gi.setdefault(instance.gi_id, []).append(instance)
    cards = [
        GpuInstanceCard(
            gi_id=gi_id,
            profile_name=rows[0].profile_name,
            placement_start=rows[0].placement_start,
            placement_size=rows[0].placement_size,
            memory_mib=rows[0].memory_mib,
            compute_slices=_compute_slices(rows[0].profile_name, profiles),
            compute_instances=[
                ComputeInstanceRow(row, occupancy.of_mig_instance(row.pk) if occupancy else None)
                for row in sorted(rows, key=lambda row: row.ci_id)
            ],
        )
        for gi_id, rows in by_gi.items()
    ]
    cards.sort(key=lambda card: card.placement_start)
    taken = {
        index
        for card in cards
        for index in range(card.placement_start, card.placement_start + card.placement_size)
    }
    return MigLayout(
        gpu=gpu,
        memory_slices=memory_total,
        compute_slices=compute_total,
        cards=cards,
        free_slices=[index for index in range(memory_total) if index not in taken],
        fits=_fits(table, cards) if table and gpu.mig_enabled else [],
        known_table=table is not None,
    )


def _fits(table: MigTable, cards: list[GpuInstanceCard]) -> list[ProfileFit]:
    by_name = {profile.name: profile.id for profile in table.profiles}
    placed = [
        mig_fit.Placed(
            by_name.get(card.profile_name, -1), card.placement_start, card.placement_size
        )
        for card in cards
    ]
    fits = []
    for profile in table.profiles:
        room = mig_fit.remaining_capacity(table, placed, profile)
        fits.append(
            ProfileFit(
                name=profile.name,
                memory_mib=profile.memory_mib,
                compute_slices=profile.compute_slices,
                memory_slices=profile.memory_slices,
                fits=room,
                starts=mig_fit.free_starts(placed, profile)[:room],
            )
        )
    return fits


def mig_gpus(node: Node) -> QuerySet[Gpu]:
    """The node's present MIG-capable GPUs with their instances (two queries)."""
    return (
        node.gpus.present()
        .filter(mig_capable=True)
        .prefetch_related("mig_instances")
        .order_by("index")
    )


# The audit rows of a GPU's MIG changes: its layout as scans found it, an admin's instance
# made or destroyed; plus the facts changes that switched MIG mode.
_MIG_EVENTS = ("gpu.mig_changed", "gpu.mig_instance_created", "gpu.mig_instance_destroyed")
_MIG_MODE_FIELDS = ("mig_enabled", "mig_pending_enabled")
MIG_HISTORY = 50


@dataclasses.dataclass(frozen=True)
class MigChange:
    time: datetime
    actor_name: str
    text: str


def mig_history(gpu: Gpu, limit: int = MIG_HISTORY) -> list[MigChange]:
    """The GPU's last ``limit`` MIG changes, newest first, in words (one query)."""
    events = AuditEvent.objects.filter(target_type="inventory.gpu", target_id=gpu.uuid).filter(
        Q(event_type__in=_MIG_EVENTS)
        | Q(event_type="gpu.facts_changed", after__has_any_keys=_MIG_MODE_FIELDS)
    )
    return [MigChange(e.time, e.actor_name, _mig_change_text(e)) for e in events[:limit]]


def _mig_change_text(event: AuditEvent) -> str:
    after = event.after or {}
    if event.event_type == "gpu.facts_changed":
        if "mig_enabled" in after:
            return f"MIG mode {'enabled' if after['mig_enabled'] else 'disabled'}"
        pending = after["mig_pending_enabled"]
        return f"MIG mode {'enabled' if pending else 'disabled'} after the next GPU reset"
    if event.event_type == "gpu.mig_changed":
        before = ", ".join((event.before or {}).get("instances") or []) or "none"
        return f"instances: {before} \u2192 {', '.join(after.get('instances') or []) or 'none'}"
    return event.message
