"""MIG profile tables and the placement rules NVML enforces for them.

Everything here works on plain JSON-able dicts (the per-GPU ``mig`` block of the node state) so
the same code serves the simulator and the fault/CLI helpers. Errors are raised as
``pynvml.NVMLError`` with the codes NVML returns for the same mistake.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import pynvml

from inventory.nvml import mig_catalog

# nvmlComputeInstanceProfile index for a CI of k compute slices (NVML_COMPUTE_INSTANCE_PROFILE_*).
CI_PROFILE_FOR_SLICES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}


def nvml_error(code: int) -> pynvml.NVMLError:
    """Build the NVMLError subclass pynvml raises for ``code``."""
    return pynvml.NVMLError(code)


@dataclass(frozen=True)
class GiProfile:
    """One GPU instance profile row (what ``nvidia-smi mig -lgip`` prints)."""

    index: int  # NVML_GPU_INSTANCE_PROFILE_* constant
    id: int  # profile id used to create instances (19, 20, 15, 14, 9, 5, 0)
    name: str  # "3g.20gb"
    compute_slices: int
    memory_slices: int
    instances: int
    memory_mib: int
    sm: int
    ce: int
    dec: int
    enc: int
    jpeg: int
    ofa: int
    placements: tuple[int, ...]


@dataclass(frozen=True)
class CiProfile:
    """A compute instance profile inside a GPU instance of a given GI profile."""

    index: int  # NVML_COMPUTE_INSTANCE_PROFILE_* constant, also its id
    name: str  # "1c.3g.20gb", or the GI name for the full-size CI
    slices: int
    placements: tuple[int, ...]
    sm: int


@dataclass(frozen=True)
class MigTable:
    """The MIG geometry of one GPU model."""

    name: str
    compute_slices: int
    memory_slices: int
    max_mig_devices: int
    bar1_mib_per_memory_slice: float
    profiles: tuple[GiProfile, ...]

    def by_index(self, index: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.index == index), None)

    def by_id(self, profile_id: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)

    def by_name(self, name: str) -> GiProfile:
        bare = name.removeprefix("MIG ")
        for profile in self.profiles:
            if profile.name == bare:
                return profile
        raise ValueError(f"{self.name}: no MIG profile named {name!r}")

    def ci_profiles(self, gi: GiProfile) -> dict[int, CiProfile]:
        return _ci_profiles(gi)


@cache
def _ci_profiles(gi: GiProfile) -> dict[int, CiProfile]:
    """CI profiles of a GI: k-slice CIs start on multiples of k rounded up to a power of two.

    Reproduces ``mig -lcip`` on a 3g.20gb GI (1c x3, 2c x1, 3g x1) and the 7g lcipp
    placements {0..6}:1, {0,2,4}:2, {0,4}:3, {0}:4, {0}:7.
    """
    out = {}
    size = gi.compute_slices
    for slices, index in CI_PROFILE_FOR_SLICES.items():
        if slices > size:
            continue
        step = 1 if slices == 1 else 2 if slices == 2 else 4
        starts = tuple(range(0, size - slices + 1, step))
        name = gi.name if slices == size else f"{slices}c.{gi.name}"
        sm = gi.sm if slices == size else gi.sm * slices // size
        out[index] = CiProfile(index, name, slices, starts, sm)
    return out


@cache
def load_table(name: str) -> MigTable:
    """The table ``inventory/nvml/mig_profiles/<name>.json`` with NVML's profile constants."""
    data = mig_catalog.table_data(name)
    profiles = tuple(
        GiProfile(
            index=getattr(pynvml, row["profile"]),
            id=row["id"],
            name=row["name"],
            compute_slices=row["compute_slices"],
            memory_slices=row["memory_slices"],
            instances=row["instances"],
            memory_mib=row["memory_mib"],
            sm=row["sm"],
            ce=row["ce"],
            dec=row["dec"],
            enc=row["enc"],
            jpeg=row["jpeg"],
            ofa=row["ofa"],
            placements=tuple(row["placements"]),
        )
        for row in data["gpu_instance_profiles"]
    )
    return MigTable(
        name=data["table"],
        compute_slices=data["compute_slices"],
        memory_slices=data["memory_slices"],
        max_mig_devices=data["max_mig_devices"],
        bar1_mib_per_memory_slice=data["mig_bar1_mib_per_memory_slice"],
        profiles=profiles,
    )


def gpu_instance_id(start: int, size: int) -> int:
    """GI id NVML assigns to a placement (a buddy-tree index over the 8 memory slices).

    Matches every capture with ids: 1-slice GIs at 0..6 are 7..13, 2-slice GIs at 0,2,4,6 are
    3..6, 4-slice GIs at 0 and 4 are 1 and 2, the full GPU is 0.
    """
    return {8: 0, 4: 1, 2: 3, 1: 7}[size] + start // size


def _span(start: int, size: int) -> range:
    return range(start, start + size)


def _free_starts(instances: list[dict[str, Any]], profile: GiProfile) -> list[int]:
    used = {s for gi in instances for s in _span(gi["start"], gi["size"])}
    size = profile.memory_slices
    return [s for s in profile.placements if used.isdisjoint(_span(s, size))]


def _count_of(instances: list[dict[str, Any]], profile: GiProfile) -> int:
    return sum(1 for gi in instances if gi["profile_id"] == profile.id)


def remaining_capacity(table: MigTable, instances: list[dict[str, Any]], profile: GiProfile) -> int:
    """How many more GIs of ``profile`` fit (the "Free" column of ``mig -lgip``)."""
    left = profile.instances - _count_of(instances, profile)
    if left <= 0:
        return 0
    # A profile's own placements never overlap each other (aligned, equal size), so every
    # free placement can be used at once.
    return min(left, len(_free_starts(instances, profile)))


def choose_placement(table: MigTable, instances: list[dict[str, Any]], profile: GiProfile) -> int:
    """The placement NVML picks when none is given.

    NVML takes the free placement that blocks the fewest still-possible placements of every
    profile, lowest start on a tie. This reproduces all creation orders in the fixtures: an empty
    A100 gives 1g at 6 then 4, 2g at 4, 3g at 4 then 0 (MIG guide lines 1699-1828), and the H100
    capture's 3g/2g/1g/1g layout lands on GI ids 2, 3, 9, 10.
    """
    free = _free_starts(instances, profile)
    if not free or remaining_capacity(table, instances, profile) == 0:
        raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    others = [
        (p, s)
        for p in table.profiles
        if remaining_capacity(table, instances, p) > 0
        for s in _free_starts(instances, p)
    ]

    def blocked(start: int) -> int:
        mine = set(_span(start, profile.memory_slices))
        return sum(
            1
            for p, s in others
            if (p, s) != (profile, start) and not mine.isdisjoint(_span(s, p.memory_slices))
        )

    return min(free, key=lambda s: (blocked(s), s))


def create_gpu_instance(
    table: MigTable, mig: dict[str, Any], profile_id: int, start: int | None = None
) -> dict[str, Any]:
    """Add a GI to ``mig["instances"]`` and return it (no compute instances yet)."""
    if not mig["current"]:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    profile = table.by_id(profile_id)
    if profile is None:
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    instances = mig["instances"]
    if start is None:
        start = choose_placement(table, instances, profile)
    else:
        if start not in profile.placements:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if start not in _free_starts(instances, profile) or (
            remaining_capacity(table, instances, profile) == 0
        ):
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    gi = {
        "id": gpu_instance_id(start, profile.memory_slices),
        "profile_id": profile.id,
        "start": start,
        "size": profile.memory_slices,
        "compute_instances": [],
    }
    instances.append(gi)
    instances.sort(key=lambda g: g["id"])
    return gi


def create_compute_instance(
    table: MigTable, gi: dict[str, Any], ci_profile: int, start: int | None = None
) -> dict[str, Any]:
    """Add a CI to ``gi`` (lowest free placement and lowest free id, as NVML does)."""
    profile = table.ci_profiles(table.by_id(gi["profile_id"])).get(ci_profile)
    if profile is None:
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    cis = gi["compute_instances"]
    used = {s for ci in cis for s in _span(ci["start"], ci["size"])}
    free = [s for s in profile.placements if used.isdisjoint(_span(s, profile.slices))]
    if start is not None and start not in profile.placements:
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if start is not None and start not in free:
        raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    if not free:
        raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    taken = {ci["id"] for ci in cis}
    ci = {
        "id": next(i for i in range(len(cis) + 1) if i not in taken),
        "profile_id": profile.index,
        "start": free[0] if start is None else start,
        "size": profile.slices,
    }
    cis.append(ci)
    cis.sort(key=lambda c: c["id"])
    return ci


def ci_remaining_capacity(table: MigTable, gi: dict[str, Any], ci_profile: int) -> int:
    profile = table.ci_profiles(table.by_id(gi["profile_id"]))[ci_profile]
    used = {s for ci in gi["compute_instances"] for s in _span(ci["start"], ci["size"])}
    return sum(1 for s in profile.placements if used.isdisjoint(_span(s, profile.slices)))


def apply_layout(table: MigTable, mig: dict[str, Any], layout: list[Any]) -> None:
    """Create GIs (each with CIs) from a layout such as ``["3g.20gb", "2g.10gb"]``.

    An entry may also be ``{"gpu_instance": "3g.20gb", "compute_instances": ["1c.3g.20gb", ...]}``;
    a plain string gets one full-size CI, like ``nvidia-smi mig -cgi ... -C``.
    """
    for entry in layout:
        if isinstance(entry, str):
            gi_name, ci_names = entry, None
        else:
            gi_name, ci_names = entry["gpu_instance"], entry.get("compute_instances")
        profile = table.by_name(gi_name)
        gi = create_gpu_instance(table, mig, profile.id)
        ci_by_name = {p.name: p.index for p in table.ci_profiles(profile).values()}
        for ci_name in ci_names or [profile.name]:
            bare = ci_name.removeprefix("MIG ")
            if bare not in ci_by_name:
                raise ValueError(f"{gi_name}: no compute instance profile {ci_name!r}")
            create_compute_instance(table, gi, ci_by_name[bare])
