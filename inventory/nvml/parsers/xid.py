"""Parser for NVIDIA kernel Xid lines (``dmesg``, ``dmesg -T``, ``journalctl -k``, ``/dev/kmsg``).

A line looks like ``NVRM: Xid (PCI:0000:8a:00): 79, pid=123, name=python, GPU has fallen off
the bus.``. Seen in the captures: legacy lines without ``pid``/``name`` (2015 laptops, NVLink5
Xids 144-149 on GB200), ``pid='<unknown>', name=<unknown>``, ``pid`` without ``name``, 4-digit
PCI domains other than 0000, and the timestamp prefixes of ``dmesg`` (``[24128.828315]``),
``dmesg -T`` (``[Sun Feb 23 16:24:18 2025]``), ``dmesg --time-format=iso`` and syslog
(``May 15 08:57:36 host kernel: NVRM: Xid ...``, as ``/var/log/syslog`` and ``journalctl`` print
it; the kernel's own bracket time wins where a line has both). Drivers of the
300 series and older print the bus id without ``PCI:`` (``NVRM: Xid (0000:03:00): 13, 0003 ...``);
396-series lines may repeat the tag in the message (``13, NVRM: Graphics TEX Exception ...``).
On a MIG GPU the driver names the GPU instance (and compute instance) an error is attributed to
inside the parenthesis: ``NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: ...``
(NVIDIA's memory error management guide), ``(PCI:... GPU-I:01 GPU-CI:02)`` (the driver's format).
Lines that merely mention Xid (``_kgspLogXid119:`` banners, "fallen off the bus" blocks) are not
events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .common import normalize_bus_id, parse_int

__all__ = ["XidEvent", "parse_xid_line", "parse_xid_log"]

_XID_RE = re.compile(
    r"NVRM: Xid \((?P<pci>(?:PCI:)?[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
    r"(?:\.[0-7])?)"
    r"(?:\s+GPU-I:(?P<gi>\d{1,5}))?(?:\s+GPU-CI:(?P<ci>\d{1,5}))?\):\s*"
    r"(?P<xid>\d{1,18}),\s*"
    r"(?:pid=(?P<pid>'[^']*'|[^,\s]*),\s*)?"
    r"(?:name=(?P<name>[^,]*),\s*)?"
    r"(?P<message>.*)$"
)
_ISO_TS_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:[+-]\d{2}:?\d{2}|Z)?")
_BRACKET_TS_RE = re.compile(
    r"\[\s*(\d+\.\d+|[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\s*\]"
)
# Syslog's "Mmm dd hh:mm:ss[.frac] host kernel:" (journalctl -o short / short-precise).
_SYSLOG_TS_RE = re.compile(r"^\s*([A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2}(?:\.\d+)?) \S+ kernel:")
_CAUSED_BY_RE = re.compile(r"caused by previous Xid (\d{1,18})")


@dataclass(frozen=True)
class XidEvent:
    """One Xid report. ``timestamp`` is the prefix as printed (seconds since boot for plain
    ``dmesg``, wall-clock text for ``-T``/ISO/syslog), ``None`` when the line had none. Syslog
    prints no year: its ``"May 15 08:57:36"`` is kept as is, no year is guessed.
    ``gpu_instance_id``/``compute_instance_id``: the MIG instance the driver attributed the
    error to (``GPU-I:``/``GPU-CI:``), ``None`` when the line names none."""

    xid: int
    pci_bus_id: str
    message: str
    pid: int | None = None
    process_name: str | None = None
    caused_by_xid: int | None = None
    timestamp: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


def _timestamp(prefix: str) -> str | None:
    if match := _ISO_TS_RE.search(prefix):
        return match[0]
    if match := _BRACKET_TS_RE.search(prefix):
        return match[1]
    if match := _SYSLOG_TS_RE.match(prefix):
        return match[1]
    return None


def parse_xid_line(line: str) -> XidEvent | None:
    """Parse one kernel log line; ``None`` if it is not an ``NVRM: Xid (...)`` report."""
    match = _XID_RE.search(line)
    if match is None:
        return None
    prefix = line[: match.start()]
    message = match["message"].strip().removeprefix("NVRM: ")
    if prefix.rstrip().endswith('"'):  # quoted by a log tool: "NVRM: Xid ...."
        message = message.removesuffix('"')
    name = (match["name"] or "").strip()
    caused_by = _CAUSED_BY_RE.search(message)
    return XidEvent(
        xid=int(match["xid"]),
        pci_bus_id=normalize_bus_id(match["pci"]) or match["pci"],
        message=message,
        pid=parse_int((match["pid"] or "").strip("'")),
        process_name=None if not name or name == "<unknown>" else name,
        caused_by_xid=int(caused_by[1]) if caused_by else None,
        timestamp=_timestamp(prefix),
        gpu_instance_id=parse_int(match["gi"]),
        compute_instance_id=parse_int(match["ci"]),
    )


def parse_xid_log(text: str) -> list[XidEvent]:
    """All Xid events in a kernel log, in order; other lines are ignored."""
    return [event for line in text.splitlines() if (event := parse_xid_line(line)) is not None]
