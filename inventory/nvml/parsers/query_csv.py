"""Parser for ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

Also reads the other ``--query-*`` CSV outputs (``--query-compute-apps``, ...), which share the
format. Seen in the captures: drivers ~510 .. 610, from 3 fields up to every field the driver
knows (212). Header names carry units (``memory.total [MiB]``); values carry them too unless
``nounits`` (``81559 MiB`` vs ``81559``). Bracketed sentinels (``[N/A]``, ``[Not Supported]``,
``[Requested functionality has been deprecated]``) become ``None``; rows whose field count does
not match the header (e.g. a ``[...]`` elision line in a paste) are skipped.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence

from .common import (
    none_if_na,
    normalize_bus_id,
    parse_celsius,
    parse_float,
    parse_int,
    parse_mhz,
    parse_mib,
    parse_percent,
    parse_watts,
)

__all__ = ["QueryValue", "parse_query_csv"]

QueryValue = str | int | float | None

_HEADER_RE = re.compile(r"^(?P<name>[^\[]+?)\s*(?:\[(?P<unit>[^\]]+)\])?$")
_TRAILING_UNIT_RE = re.compile(r"^(?P<number>-?\d+(?:\.\d+)?)\s*[A-Za-z%]+$")


def _number(value: str | None) -> int | float | None:
    """``"100.00 %"`` -> 100.0, ``"0 us"`` -> 0, ``"7"`` -> 7."""
    text = none_if_na(value)
    if text is None:
        return None
    if match := _TRAILING_UNIT_RE.match(text):
        text = match["number"]
    number = parse_float(text)
    if number is None:
        return None
    return int(number) if "." not in text else number


Converter = Callable[[str | None], QueryValue]

_BY_UNIT: dict[str, Converter] = {
    "MiB": parse_mib,
    "W": parse_watts,
    "MHz": parse_mhz,
    "%": _number,
    "us": _number,
    "ms": _number,
}

# The short names ``nvidia-smi --help-query-gpu`` (drivers 510-610 in the captures) lists beside
# the long ones ("clocks.current.sm" or "clocks.sm"): an alias is typed as its long name.
ALIASES = {
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.video": "clocks.current.video",
    "clocks.applications.gr": "clocks.applications.graphics",
    "clocks.applications.mem": "clocks.applications.memory",
    "clocks.default_applications.gr": "clocks.default_applications.graphics",
    "clocks.default_applications.mem": "clocks.default_applications.memory",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
    "gpu.power.current_limit": "enforced.power.limit",
    "gpu.power.default_limit": "power.default_limit",
    "gpu.power.draw.average": "power.draw.average",
    "gpu.power.draw.instant": "power.draw.instant",
    "gpu.power.requested_limit": "power.limit",
    "gpu.power.max_limit": "power.max_limit",
    "gpu.power.min_limit": "power.min_limit",
    "module.power.current_limit": "module.enforced.power.limit",
    "module.power.requested_limit": "module.power.limit",
    "remapped_rows.sbe": "remapped_rows.correctable",
    "remapped_rows.dbe": "remapped_rows.uncorrectable",
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
    "retired_pages.dbe": "retired_pages.double_bit.count",
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "gpu_operation_mode.current": "gom.current",
    "gpu_operation_mode.pending": "gom.pending",
    "inforom.image": "inforom.img",
    "inforom.power": "inforom.pwr",
    "gpu_util": "gpu_utilization",  # --query-accounted-apps
    "mem_util": "mem_utilization",
    "used_memory": "used_gpu_memory",  # --query-compute-apps
}

# Fields (long names) without a unit in their header that still have a known type.
_BY_NAME: list[tuple[re.Pattern[str], Converter]] = [
    (re.compile(r"^pci\.bus_id$"), normalize_bus_id),
    (re.compile(r"^temperature\."), parse_celsius),
    (re.compile(r"^(memory|protected_memory)\.|^used_gpu_memory$"), parse_mib),
    (
        re.compile(
            r"^(module\.)?(enforced\.)?power\.(draw|limit|default_limit|min_limit|max_limit)"
        ),
        parse_watts,
    ),
    (re.compile(r"^clocks\.(current|applications|default_applications|max)\."), parse_mhz),
    (re.compile(r"^(utilization\.|fan\.speed$|(gpu|mem)_utilization$)"), parse_percent),
    (
        re.compile(
            r"^(index|count|pid|accounting\.buffer_size|encoder\.stats\.sessionCount|pcie\.link\."
            r"|retired_pages\.\w+\.count$|remapped_rows\.(correctable|uncorrectable|histogram)"
            r"|ecc\.errors\.[\w.]+(?<!thresholdExceeded)$)"
        ),
        parse_int,
    ),
]


def _converter(name: str, unit: str | None) -> Converter:
    if unit is not None and unit in _BY_UNIT:
        return _BY_UNIT[unit]
    long_name = ALIASES.get(name, name)
    for pattern, converter in _BY_NAME:
        if pattern.search(long_name):
            return converter
    return none_if_na


def parse_query_csv(text: str, fields: Sequence[str] | None = None) -> list[dict[str, QueryValue]]:
    """Parse ``--query-gpu`` (or ``--query-compute-apps`` ...) CSV into one dict per row.

    Keys are the bare field names as queried (``memory.total``, or an alias such as
    ``clocks.sm``); values are typed where the unit or field (or the alias's long name) is
    known (MiB/MHz/°C -> int, W -> float, % -> int or float), else stripped strings. For
    ``noheader`` output pass the queried ``fields`` in order.
    """
    rows = [row for row in csv.reader(text.splitlines(), skipinitialspace=True) if row]
    if fields is None:
        if not rows:
            return []
        fields, rows = rows[0], rows[1:]
    columns = []
    for field_name in fields:
        match = _HEADER_RE.match(field_name.strip())
        name = match["name"] if match else field_name.strip()
        columns.append((name, _converter(name, match["unit"] if match else None)))
    return [
        {name: convert(value) for (name, convert), value in zip(columns, row, strict=True)}
        for row in rows
        if len(row) == len(columns)
    ]
