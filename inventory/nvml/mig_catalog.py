"""MIG profile tables of the MIG-capable GPU models (``mig_profiles/*.json``), and the one
definition of a MIG profile row that the scanner, the simulator, the importer and the pages share.

The tables come from NVIDIA's MIG user guide and real ``nvidia-smi mig -lgip/-lgipp`` captures
(each file names its sources). NVML reports a GPU's profile table only while MIG is enabled, so
the scanner falls back to this catalog for a MIG-capable GPU whose MIG mode is off; the simulator
enforces the same tables.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import pynvml

from inventory.nvml.record import Record

TABLE_DIR = Path(__file__).with_name("mig_profiles")

# nvmlComputeInstanceProfile index for a CI of k compute slices (NVML_COMPUTE_INSTANCE_PROFILE_*).
CI_PROFILE_FOR_SLICES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}


@dataclasses.dataclass(frozen=True)
class MigProfile(Record):
    """One GPU instance profile: a row of ``nvidia-smi mig -lgip`` with its ``-lgipp`` starts.

    The catalog's JSON rows carry the same keys (plus ``profile``, the name of ``index``).
    """

    index: int  # NVML_GPU_INSTANCE_PROFILE_* constant
    id: int  # profile id used to create instances (19, 20, 15, 14, 9, 5, 0)
    name: str  # "3g.20gb"
    compute_slices: int
    memory_slices: int  # 0 where NVML listed no placements
    instances: int  # how many a GPU can hold at most
    memory_mib: int
    sm: int
    ce: int
    dec: int
    enc: int
    jpeg: int
    ofa: int
    placements: tuple[int, ...]  # start slices; an instance spans memory_slices from there
    remaining: int | None = None  # more that fit now: NVML's answer, unknown in the catalog


@dataclasses.dataclass(frozen=True)
class CiProfile:
    """A compute instance profile inside a GPU instance of a given GI profile."""

    index: int  # NVML_COMPUTE_INSTANCE_PROFILE_* constant, also its id
    name: str  # "1c.3g.20gb", or the GI name for the full-size CI
    slices: int
    placements: tuple[int, ...]
    sm: int


@dataclasses.dataclass(frozen=True)
class MigTable:
    """The MIG geometry of one GPU model: how many compute and memory slices it has (7 and 8 on
    an A100/H100, 4 and 4 on an A30) comes from its table, never from a constant."""

    name: str
    gpu_name: str
    compute_slices: int
    memory_slices: int
    max_mig_devices: int
    bar1_mib_per_memory_slice: float
    profiles: tuple[MigProfile, ...]
    # The sizes a compute instance may have (all of CI_PROFILE_FOR_SLICES unless the table
    # names fewer: an A30's 4g GI has 1c, 2c and 4g CIs, no 3c).
    compute_instance_slices: tuple[int, ...] = tuple(CI_PROFILE_FOR_SLICES)

    def gpu_instance_id(self, start: int, size: int) -> int:
        """The GI id NVML gives a placement: a buddy-tree index over the memory slices, the
        whole GPU 0, then its halves, quarters... left to right. On 8 slices: 4-slice GIs at
        0 and 4 are 1 and 2, 2-slice ones 3..6, 1-slice ones 7..14; on an A30's 4: 2-slice
        GIs 1 and 2, 1-slice ones 3..6 (``mig -lgi`` captures of both)."""
        return self.memory_slices // size - 1 + start // size

    def gpu_instance_size(self, gi_id: int) -> int:
        """Memory slices of the GI with id ``gi_id`` (the inverse of :meth:`gpu_instance_id`)."""
        size = self.memory_slices
        while size > 1 and gi_id >= 2 * (self.memory_slices // size) - 1:
            size //= 2
        return size

    def gpu_instance_start(self, gi_id: int) -> int:
        """The first memory slice of the GI with id ``gi_id``."""
        size = self.gpu_instance_size(gi_id)
        return (gi_id - (self.memory_slices // size - 1)) * size

    def by_index(self, index: int) -> MigProfile | None:
        return next((p for p in self.profiles if p.index == index), None)

    def by_id(self, profile_id: int) -> MigProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)

    def by_name(self, name: str) -> MigProfile:
        bare = name.removeprefix("MIG ")
        for profile in self.profiles:
            if profile.name == bare:
                return profile
        raise ValueError(f"{self.name}: no MIG profile named {name!r}")

    def ci_profiles(self, gi: MigProfile) -> dict[int, CiProfile]:
        slice_sms: dict[int, int] = {}
        for profile in self.profiles:
            sms = slice_sms.get(profile.compute_slices, profile.sm)
            slice_sms[profile.compute_slices] = min(sms, profile.sm)
        return _ci_profiles(gi, tuple(sorted(slice_sms.items())), self.compute_instance_slices)


@cache
def _ci_profiles(
    gi: MigProfile, slice_sms: tuple[tuple[int, int], ...], sizes: tuple[int, ...]
) -> dict[int, CiProfile]:
    """CI profiles of a GI: k-slice CIs start on multiples of k rounded up to a power of two.

    Reproduces ``mig -lcip`` on a 3g.20gb GI (1c x3, 2c x1, 3g x1) and the 7g lcipp
    placements {0..6}:1, {0,2,4}:2, {0,4}:3, {0}:4, {0}:7. A k-slice CI has the SMs of the
    table's k-slice GI (``slice_sms``: the fewest, 1g.10gb's not 1g.20gb's), not a k-th share of
    its GI's: an H200 3g.71gb (60 SMs) splits into 1c/2c CIs of 16 and 32 SMs
    (nvidia-smi-q-text/nvidia_gpu_exporter__H200-MIG__q-idle_590.48.01.txt).
    """
    sms_of = dict(slice_sms)
    out = {}
    size = gi.compute_slices
    for slices, index in CI_PROFILE_FOR_SLICES.items():
        if slices > size or (slices < size and slices not in sizes):
            continue
        step = 1 if slices == 1 else 2 if slices == 2 else 4
        starts = tuple(range(0, size - slices + 1, step))
        name = gi.name if slices == size else f"{slices}c.{gi.name}"
        sm = gi.sm if slices == size else sms_of.get(slices, gi.sm * slices // size)
        out[index] = CiProfile(index, name, slices, starts, sm)
    return out


@cache
def load_table(name: str) -> MigTable:
    """The table ``mig_profiles/<name>.json`` with NVML's profile constants."""
    path = TABLE_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no MIG profile table named {name!r}")
    data = json.loads(path.read_text())
    return MigTable(
        name=data["table"],
        gpu_name=data["gpu_name"],
        compute_slices=data["compute_slices"],
        memory_slices=data["memory_slices"],
        max_mig_devices=data["max_mig_devices"],
        bar1_mib_per_memory_slice=data["mig_bar1_mib_per_memory_slice"],
        compute_instance_slices=tuple(data.get("compute_instance_slices", CI_PROFILE_FOR_SLICES)),
        profiles=tuple(
            MigProfile.from_dict({**row, "index": getattr(pynvml, row["profile"])})
            for row in data["gpu_instance_profiles"]
        ),
    )


@cache
def _table_names_by_gpu() -> dict[str, str]:
    return {
        json.loads(path.read_text())["gpu_name"]: path.stem
        for path in sorted(TABLE_DIR.glob("*.json"))
    }


def table_for_gpu(gpu_name: str) -> MigTable | None:
    """The table for a GPU by the name NVML reports (e.g. ``NVIDIA A100-SXM4-40GB``)."""
    name = _table_names_by_gpu().get(gpu_name)
    return None if name is None else load_table(name)


def compute_share(profile_name: str, gpu_name: str | None = None) -> float | None:
    """The share of its GPU's compute that one instance of a GPU instance profile holds (a
    3g.40gb on an A100: 3 of 7 slices), by the GPU's table, or without a GPU name by the
    first table that has the profile (names are model-specific); None when no table has it."""
    if gpu_name is not None:
        table = table_for_gpu(gpu_name)
        tables = [] if table is None else [table]
    else:
        tables = [load_table(path.stem) for path in sorted(TABLE_DIR.glob("*.json"))]
    for table in tables:
        try:
            return table.by_name(profile_name).compute_slices / table.compute_slices
        except ValueError:
            continue
    return None
