"""Parsers for the ``nvidia-smi mig`` listings.

* ``mig -lgip`` (GPU instance profiles) and ``mig -lcip`` (compute instance profiles): boxed
  tables where each profile spans two lines, the second carrying CE/JPEG(/OFA) counts.
* ``mig -lgipp`` / ``mig -lcipp`` (placements): ``GPU 0 Profile ID 19 Placements: {0,1,2}:1``,
  or ``Placement : {0}:8`` when there is a single one.
* ``mig -lgi`` (GPU instances) and ``mig -lci`` (compute instances): boxed one-line rows.

Seen in the captures: A100-40GB (R470+ profile set incl. ``1g.5gb+me``), H100 PCIe (drv
525.125.06), H200 (partial multi-GPU paste). Rows are matched line by line, so pastes that
start or stop mid-table, or are indented (markdown), still yield the rows they contain.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from .common import parse_bool

__all__ = [
    "ComputeInstance",
    "ComputeInstanceProfile",
    "GpuInstance",
    "GpuInstanceProfile",
    "MigPlacements",
    "parse_mig_ci_profiles",
    "parse_mig_compute_instances",
    "parse_mig_gi_profiles",
    "parse_mig_gpu_instances",
    "parse_mig_placements",
]

_NAME = r"(?P<name>MIG\s+\S+)"
_GIP_RE = re.compile(
    rf"^\s*\|\s*(?P<gpu>\d{{1,18}})\s+{_NAME}\s+(?P<id>\d{{1,18}})\s+(?P<free>\d{{1,18}})/(?P<total>\d{{1,18}})\s+"
    r"(?P<mem>[\d.]+)\s+(?P<p2p>\w+)\s+(?P<sm>\d{1,18})\s+(?P<dec>\d{1,18})\s+(?P<enc>\d{1,18})\s*\|"
)
_GIP_CONT_RE = re.compile(
    r"^\s*\|\s+(?P<ce>\d{1,18})\s+(?P<jpeg>\d{1,18})\s+(?P<ofa>\d{1,18})\s*\|"
)
_CIP_RE = re.compile(
    rf"^\s*\|\s*(?P<gpu>\d{{1,18}})\s+(?P<gi>\d{{1,18}})\s+{_NAME}\s+(?P<id>\d{{1,18}})(?P<default>\*?)\s+"
    r"(?P<free>\d{1,18})/(?P<total>\d{1,18})\s+(?P<sm>\d{1,18})\s+(?P<dec>\d{1,18})\s+(?P<enc>\d{1,18})\s+(?P<ofa>\d{1,18})\s*\|"
)
_CIP_CONT_RE = re.compile(r"^\s*\|\s+(?P<ce>\d{1,18})\s+(?P<jpeg>\d{1,18})\s*\|")
_GI_RE = re.compile(
    rf"^\s*\|\s*(?P<gpu>\d{{1,18}})\s+{_NAME}\s+(?P<profile>\d{{1,18}})\s+(?P<id>\d{{1,18}})\s+"
    r"(?P<start>\d{1,18}):(?P<size>\d{1,18})\s*\|"
)
_CI_RE = re.compile(
    rf"^\s*\|\s*(?P<gpu>\d{{1,18}})\s+(?P<gi>\d{{1,18}})\s+{_NAME}\s+(?P<profile>\d{{1,18}})\*?\s+(?P<id>\d{{1,18}})"
    r"(?:\s+(?P<start>\d{1,18}):(?P<size>\d{1,18}))?\s*\|"
)
_PLACEMENT_RE = re.compile(
    r"GPU\s+(?P<gpu>\d{1,18})\s+(?:GI\s+(?P<gi>\d{1,18})\s+)?Profile\s+ID\s+(?P<id>\d{1,18})\s+"
    r"Placements?\s*:\s*\{(?P<starts>[\d,\s]*)\}\s*:\s*(?P<size>\d{1,18})"
)


@dataclass(frozen=True)
class GpuInstanceProfile:
    """One ``mig -lgip`` profile. CE/JPEG/OFA come from the second line (``None`` if cut)."""

    gpu: int
    name: str
    profile_id: int
    instances_free: int
    instances_total: int
    memory_gib: float
    p2p: bool | None
    sm: int
    dec: int
    enc: int
    ce: int | None
    jpeg: int | None
    ofa: int | None


@dataclass(frozen=True)
class ComputeInstanceProfile:
    """One ``mig -lcip`` profile; ``is_default`` is the ``*`` after the profile id."""

    gpu: int
    gpu_instance_id: int
    name: str
    profile_id: int
    is_default: bool
    instances_free: int
    instances_total: int
    sm: int
    dec: int
    enc: int
    ofa: int
    ce: int | None
    jpeg: int | None


@dataclass(frozen=True)
class MigPlacements:
    """``mig -lgipp``/``-lcipp``: valid start slots for a profile and the slots it spans."""

    gpu: int
    profile_id: int
    starts: tuple[int, ...]
    size: int
    gpu_instance_id: int | None = None


@dataclass(frozen=True)
class GpuInstance:
    gpu: int
    name: str
    profile_id: int
    instance_id: int
    placement_start: int
    placement_size: int


@dataclass(frozen=True)
class ComputeInstance:
    """``placement_*`` are ``None`` for drivers whose ``-lci`` has no Placement column."""

    gpu: int
    gpu_instance_id: int
    name: str
    profile_id: int
    instance_id: int
    placement_start: int | None = None
    placement_size: int | None = None


def _name(match: re.Match[str]) -> str:
    return " ".join(match["name"].split())


def _optional_int(match: re.Match[str] | None, group: str) -> int | None:
    return None if match is None or match[group] is None else int(match[group])


def _two_line_rows(
    text: str, first: re.Pattern[str], second: re.Pattern[str]
) -> Iterator[tuple[re.Match[str], re.Match[str] | None]]:
    """Yield each first-line match with the continuation line right after it (if any)."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if row := first.match(line):
            following = lines[index + 1] if index + 1 < len(lines) else ""
            yield row, second.match(following)


def parse_mig_gi_profiles(text: str) -> list[GpuInstanceProfile]:
    """Parse ``nvidia-smi mig -lgip`` (GPU instance profiles), one entry per GPU and profile."""
    return [
        GpuInstanceProfile(
            gpu=int(row["gpu"]),
            name=_name(row),
            profile_id=int(row["id"]),
            instances_free=int(row["free"]),
            instances_total=int(row["total"]),
            memory_gib=float(row["mem"]),
            p2p=parse_bool(row["p2p"]),
            sm=int(row["sm"]),
            dec=int(row["dec"]),
            enc=int(row["enc"]),
            ce=_optional_int(cont, "ce"),
            jpeg=_optional_int(cont, "jpeg"),
            ofa=_optional_int(cont, "ofa"),
        )
        for row, cont in _two_line_rows(text, _GIP_RE, _GIP_CONT_RE)
    ]


def parse_mig_ci_profiles(text: str) -> list[ComputeInstanceProfile]:
    """Parse ``nvidia-smi mig -lcip`` (compute instance profiles of each GPU instance)."""
    return [
        ComputeInstanceProfile(
            gpu=int(row["gpu"]),
            gpu_instance_id=int(row["gi"]),
            name=_name(row),
            profile_id=int(row["id"]),
            is_default=row["default"] == "*",
            instances_free=int(row["free"]),
            instances_total=int(row["total"]),
            sm=int(row["sm"]),
            dec=int(row["dec"]),
            enc=int(row["enc"]),
            ofa=int(row["ofa"]),
            ce=_optional_int(cont, "ce"),
            jpeg=_optional_int(cont, "jpeg"),
        )
        for row, cont in _two_line_rows(text, _CIP_RE, _CIP_CONT_RE)
    ]


def parse_mig_placements(text: str) -> list[MigPlacements]:
    """Parse ``nvidia-smi mig -lgipp`` (or ``-lcipp``): possible placements per profile."""
    return [
        MigPlacements(
            gpu=int(match["gpu"]),
            profile_id=int(match["id"]),
            starts=tuple(int(s) for s in match["starts"].replace(" ", "").split(",") if s),
            size=int(match["size"]),
            gpu_instance_id=_optional_int(match, "gi"),
        )
        for match in _PLACEMENT_RE.finditer(text)
    ]


def parse_mig_gpu_instances(text: str) -> list[GpuInstance]:
    """Parse ``nvidia-smi mig -lgi`` (existing GPU instances)."""
    return [
        GpuInstance(
            gpu=int(row["gpu"]),
            name=_name(row),
            profile_id=int(row["profile"]),
            instance_id=int(row["id"]),
            placement_start=int(row["start"]),
            placement_size=int(row["size"]),
        )
        for row in map(_GI_RE.match, text.splitlines())
        if row is not None
    ]


def parse_mig_compute_instances(text: str) -> list[ComputeInstance]:
    """Parse ``nvidia-smi mig -lci`` (existing compute instances)."""
    return [
        ComputeInstance(
            gpu=int(row["gpu"]),
            gpu_instance_id=int(row["gi"]),
            name=_name(row),
            profile_id=int(row["profile"]),
            instance_id=int(row["id"]),
            placement_start=_optional_int(row, "start"),
            placement_size=_optional_int(row, "size"),
        )
        for row in map(_CI_RE.match, text.splitlines())
        if row is not None
    ]
