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

# Fields without a unit in their header that still have a known type.
_BY_NAME: list[tuple[re.Pattern[str], Converter]] = [
    (re.compile(r"^(pci\.bus_id|gpu_bus_id)$"), normalize_bus_id),
    (re.compile(r"^temperature\."), parse_celsius),
    (re.compile(r"^(memory|protected_memory)\.|^used_(gpu_)?memory$"), parse_mib),
    (
        re.compile(
            r"^(module\.)?(enforced\.)?power\.(draw|limit|default_limit|min_limit|max_limit)"
        ),
        parse_watts,
    ),
    (re.compile(r"^clocks\.(current|applications|default_applications|max)\."), parse_mhz),
    (re.compile(r"^(utilization\.|fan\.speed$)"), parse_percent),
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
    for pattern, converter in _BY_NAME:
        if pattern.search(name):
            return converter
    return none_if_na


def parse_query_csv(text: str, fields: Sequence[str] | None = None) -> list[dict[str, QueryValue]]:
    """Parse ``--query-gpu`` (or ``--query-compute-apps`` ...) CSV into one dict per row.

    Keys are the bare field names (``memory.total``); values are typed where the unit or field
    is known (MiB/MHz/°C -> int, W -> float, % -> int or float), else stripped strings. For
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
