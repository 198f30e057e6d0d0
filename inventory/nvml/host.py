"""The host around the GPUs: the logical CPUs and the memory its jobs could be given.

A real host reads them here (the CPUs this process may run on, ``MemTotal`` of
``/proc/meminfo``); the simulator answers from its machine model. Each backend's
``host_resources()`` gives its own, so both travel in the scan's ``SystemInfo`` the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

log = logging.getLogger("gpuadmin.nvml")

MEMINFO = Path("/proc/meminfo")
_KIB_PER_MIB = 1024


@dataclasses.dataclass(frozen=True)
class HostResources:
    """Logical CPUs and RAM (MiB) of a host; None where they could not be read."""

    cpu_count: int | None = None
    memory_total_mib: int | None = None


def this_host(meminfo: Path = MEMINFO) -> HostResources:
    """This machine's CPUs and memory, as its agent (and the jobs it starts) may use them."""
    return HostResources(cpu_count=usable_cpus(), memory_total_mib=memory_total_mib(meminfo))


def usable_cpus() -> int | None:
    """The logical CPUs this process may run on: its affinity mask (a cpuset or ``taskset``
    narrows it), else every CPU the OS counts; None when neither says."""
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count()


def memory_total_mib(meminfo: Path = MEMINFO) -> int | None:
    """``MemTotal`` of ``/proc/meminfo`` in MiB; None when the file is missing or has no
    such line."""
    try:
        text = meminfo.read_text()
    except OSError as err:
        log.warning("cannot read the host's memory: %s", err)
        return None
    total = parse_meminfo_total_mib(text)
    if total is None:
        log.warning("%s has no MemTotal line", meminfo)
    return total


def parse_meminfo_total_mib(text: str) -> int | None:
    """``MemTotal:  1056420740 kB`` -> 1031660 (MiB, rounded down); None without the line."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal":
            number, _, unit = value.strip().partition(" ")
            if unit.strip() == "kB" and number.isdecimal():
                return int(number) // _KIB_PER_MIB or None
            return None
    return None
