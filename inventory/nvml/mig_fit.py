"""Which MIG GPU instance profiles fit where on a GPU: NVML's rules over a profile table
(``mig_catalog``), pure. The simulator answers and refuses by them; the MIG page shows the
room per profile by them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inventory.nvml.mig_catalog import MigProfile, MigTable


@dataclass(frozen=True, slots=True)
class Placed:
    """A GPU instance on the GPU: its profile id and the memory slices it spans."""

    profile_id: int
    start: int
    size: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


def free_starts(placed: Iterable[Placed], profile: MigProfile) -> list[int]:
    """The placements of ``profile`` whose memory slices no GPU instance uses."""
    used = {index for gi in placed for index in gi.slices}
    size = profile.memory_slices
    return [s for s in profile.placements if used.isdisjoint(range(s, s + size))]


def remaining_capacity(table: MigTable, placed: Iterable[Placed], profile: MigProfile) -> int:
    """How many more GPU instances of ``profile`` fit (the "Free" column of ``mig -lgip``):
    bounded by the profile's instance limit, its free placements, the compute slices left and
    the GPU's MIG device limit."""
    placed = list(placed)
    profiles = {p.id: p for p in table.profiles}
    compute_used = sum(
        profiles[gi.profile_id].compute_slices for gi in placed if gi.profile_id in profiles
    )
    same = sum(1 for gi in placed if gi.profile_id == profile.id)
    # A profile's own placements never overlap each other (aligned, equal size), so every
    # free placement can be used at once.
    return max(
        0,
        min(
            profile.instances - same,
            len(free_starts(placed, profile)),
            (table.compute_slices - compute_used) // max(profile.compute_slices, 1),
            table.max_mig_devices - len(placed),
        ),
    )
