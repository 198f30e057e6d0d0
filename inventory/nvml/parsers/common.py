"""Small value helpers shared by every nvidia-smi parser.

nvidia-smi prints values with units (``81559 MiB``, ``66.92 W``, ``1410 MHz``, ``33 C``,
``30 %``) and a family of "no value" sentinels (``N/A``, ``[N/A]``, ``[Not Supported]``,
``Requested functionality has been deprecated`` ...). Every helper here returns ``None`` for a
sentinel or for anything it cannot read, and never raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

__all__ = [
    "ParseError",
    "none_if_na",
    "normalize_bus_id",
    "parse_bool",
    "parse_celsius",
    "parse_cpu_list",
    "parse_float",
    "parse_hex_id",
    "parse_int",
    "parse_mhz",
    "parse_mib",
    "parse_percent",
    "parse_watts",
    "strip_ansi",
]


class ParseError(ValueError):
    """Raised when a whole document is not the nvidia-smi output a parser expects."""


_NA_VALUES = frozenset(
    s.casefold()
    for s in (
        "",
        "N/A",
        "NA",
        "Not Supported",
        "Not Available",
        "Unknown Error",
        "Insufficient Permissions",
        "Requested functionality has been deprecated",
    )
)

_QUANTITY_RE = re.compile(r"^(-?\d+(?:\.\d+)?)\s*([A-Za-z%]*)$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BUS_ID_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?"
    r"(?P<bus>[0-9a-fA-F]{1,2}):(?P<device>[0-9a-fA-F]{1,2})(?:\.(?P<function>[0-7]))?$"
)
# Linux's NR_CPUS tops out at 8192; a larger id is a corrupt paste, not a CPU (and expanding
# "0-99999999999" would take forever).
_MAX_CPUS = 1 << 16
_TRUE = frozenset({"enabled", "yes", "active", "on", "true"})
_FALSE = frozenset({"disabled", "no", "not active", "off", "false"})


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (``\\x1b[4m`` underline etc.) from ``text``."""
    return _ANSI_RE.sub("", text)


def none_if_na(value: str | None) -> str | None:
    """Return the stripped value, or ``None`` for a missing value or an nvidia-smi sentinel.

    ``[N/A]`` style brackets (CSV output) are treated like the bare sentinel.
    """
    if value is None:
        return None
    text = value.strip()
    inner = text[1:-1].strip() if text.startswith("[") and text.endswith("]") else text
    if inner.casefold() in _NA_VALUES:
        return None
    return text


def _quantity(value: str | None, units: dict[str, float]) -> float | None:
    """Parse ``"<number> <unit>"`` where the unit (or no unit) must be a key of ``units``."""
    text = none_if_na(value)
    if text is None:
        return None
    match = _QUANTITY_RE.match(text)
    if match is None:
        return None
    number, unit = match.groups()
    factor = units.get(unit)
    if factor is None:
        return None
    quantity = float(number) * factor
    return quantity if math.isfinite(quantity) else None  # "9" * 400 is no reading


def parse_float(value: str | None) -> float | None:
    """A plain number (no unit) as float, else ``None``."""
    return _quantity(value, {"": 1.0})


def parse_int(value: str | None) -> int | None:
    """A plain integer (``"0"``, ``"12"``), else ``None``. Hex needs :func:`parse_hex_id`."""
    number = _quantity(value, {"": 1.0})
    if number is None or not number.is_integer():
        return None
    return int(number)


def parse_mib(value: str | None) -> int | None:
    """Memory as whole MiB: ``"81559 MiB"``, ``"4 GiB"``, bare ``"81559"`` (``nounits``)."""
    number = _quantity(value, {"MiB": 1.0, "": 1.0, "GiB": 1024.0, "KiB": 1 / 1024})
    return None if number is None else round(number)


def parse_watts(value: str | None) -> float | None:
    """Power in W: ``"66.92 W"``, ``"700.00"``, ``"500 mW"``."""
    return _quantity(value, {"W": 1.0, "": 1.0, "mW": 0.001, "kW": 1000.0})


def parse_mhz(value: str | None) -> int | None:
    """Clock in whole MHz: ``"1410 MHz"``, ``"1410"``."""
    number = _quantity(value, {"MHz": 1.0, "": 1.0, "GHz": 1000.0})
    return None if number is None else round(number)


def parse_celsius(value: str | None) -> int | None:
    """Temperature in whole °C: ``"33 C"``, ``" 37 C "``, ``"-5 C"``, ``"33"``."""
    number = _quantity(value, {"C": 1.0, "": 1.0})
    return None if number is None else round(number)


def parse_percent(value: str | None) -> int | None:
    """Percentage as a whole number: ``"30 %"``, ``"100.00%"``, ``"30"``."""
    number = _quantity(value, {"%": 1.0, "": 1.0})
    return None if number is None else round(number)


def parse_bool(value: str | None) -> bool | None:
    """``Enabled``/``Yes``/``Active``/``On`` -> True, their opposites -> False, else None."""
    text = none_if_na(value)
    if text is None:
        return None
    folded = text.casefold()
    if folded in _TRUE:
        return True
    if folded in _FALSE:
        return False
    return None


def parse_hex_id(value: str | None) -> str | None:
    """A PCI id such as ``"20B010DE"`` or ``"0x233510DE"`` as 8 upper-case hex digits."""
    text = none_if_na(value)
    if text is None:
        return None
    if text[:2].lower() == "0x":
        text = text[2:]
    if not re.fullmatch(r"[0-9a-fA-F]{1,8}", text):
        return None
    return text.upper().zfill(8)


def normalize_bus_id(value: str | None) -> str | None:
    """Canonical PCI bus id ``00000000:2F:00.0`` (8-hex-digit domain, upper case).

    Accepts the spellings seen in nvidia-smi and kernel logs: ``00000000:2F:00.0`` (``-q``,
    ``--query-gpu``), ``0000:2f:00.0`` (4-digit domain, sysfs), ``PCI:0000:8a:00`` (Xid lines),
    ``2f:00.0`` (no domain -> 0). A missing function number means function 0.
    """
    text = none_if_na(value)
    if text is None:
        return None
    match = _BUS_ID_RE.match(text)
    if match is None:
        return None
    domain = int(match["domain"] or "0", 16)
    bus = int(match["bus"], 16)
    device = int(match["device"], 16)
    function = int(match["function"] or "0")
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function}"


def parse_cpu_list(value: str | None) -> tuple[int, ...] | None:
    """A cpulist such as ``"0-31,64-95"`` as a sorted tuple: ``topo -m`` CPU Affinity, and NUMA
    Affinity too (``"0-1"`` on a GPU equally near two nodes).

    Returns ``None`` for a sentinel or for a malformed list (e.g. a paste cut to ``"-31,64-95"``),
    rather than guessing.
    """
    text = none_if_na(value)
    if text is None:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if match is None:
            return None
        start = int(match[1])
        end = int(match[2]) if match[2] is not None else start
        if end < start or end >= _MAX_CPUS:
            return None
        cpus.update(range(start, end + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``: a Linux cpulist, as ``topo -m`` and cgroups print it."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in ranges)
