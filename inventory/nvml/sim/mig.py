"""The placement rules NVML enforces for the MIG profile tables (``mig_catalog``).

Everything here works on plain JSON-able dicts (the per-GPU ``mig`` block of the node state) so
the same code serves the simulator and the fault/CLI helpers. Errors are raised as
``pynvml.NVMLError`` with the codes NVML returns for the same mistake.
"""

from __future__ import annotations

from typing import Any

import pynvml

from inventory.nvml import mig_fit
from inventory.nvml.mig_catalog import MigProfile, MigTable


def nvml_error(code: int) -> pynvml.NVMLError:
    """Build the NVMLError subclass pynvml raises for ``code``."""
    return pynvml.NVMLError(code)


def _span(start: int, size: int) -> range:
    return range(start, start + size)


def _placed(instances: list[dict[str, Any]]) -> list[mig_fit.Placed]:
    return [mig_fit.Placed(gi["profile_id"], gi["start"], gi["size"]) for gi in instances]


def _free_starts(instances: list[dict[str, Any]], profile: MigProfile) -> list[int]:
    return mig_fit.free_starts(_placed(instances), profile)


def _profile_of(table: MigTable, gi: dict[str, Any]) -> MigProfile:
    profile = table.by_id(gi["profile_id"])
    if profile is None:
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return profile


def remaining_capacity(
    table: MigTable, instances: list[dict[str, Any]], profile: MigProfile
) -> int:
    """How many more GIs of ``profile`` fit (the "Free" column of ``mig -lgip``), by the rule
    the MIG page shows too (``mig_fit``)."""
    return mig_fit.remaining_capacity(table, _placed(instances), profile)


def choose_placement(table: MigTable, instances: list[dict[str, Any]], profile: MigProfile) -> int:
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
        "id": table.gpu_instance_id(start, profile.memory_slices),
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
    profile = table.ci_profiles(_profile_of(table, gi)).get(ci_profile)
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
    profile = table.ci_profiles(_profile_of(table, gi))[ci_profile]
    used = {s for ci in gi["compute_instances"] for s in _span(ci["start"], ci["size"])}
    return sum(1 for s in profile.placements if used.isdisjoint(_span(s, profile.slices)))


def apply_layout(table: MigTable, mig: dict[str, Any], layout: list[Any]) -> None:
    """Create GIs (each with CIs) from a layout such as ``["3g.20gb", "2g.10gb"]``.

    An entry may also be ``{"gpu_instance": "3g.20gb", "compute_instances": ["1c.3g.20gb", ...]}``
    (with ``"start"``: at that memory slice, else where NVML's default rule puts it); a plain
    string gets one full-size CI, like ``nvidia-smi mig -cgi ... -C``.
    """
    for entry in layout:
        if isinstance(entry, str):
            gi_name, ci_names, start = entry, None, None
        else:
            gi_name, ci_names = entry["gpu_instance"], entry.get("compute_instances")
            start = entry.get("start")
        profile = table.by_name(gi_name)
        gi = create_gpu_instance(table, mig, profile.id, start)
        ci_by_name = {p.name: p.index for p in table.ci_profiles(profile).values()}
        for ci_name in ci_names or [profile.name]:
            bare = ci_name.removeprefix("MIG ")
            if bare not in ci_by_name:
                raise ValueError(f"{gi_name}: no compute instance profile {ci_name!r}")
            create_compute_instance(table, gi, ci_by_name[bare])
