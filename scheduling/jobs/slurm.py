"""Slurm's request syntax, for scripts and habits ported from it: ``--array`` index specs and
``--dependency`` lists (pure Python; ``scheduling.jobs.submission`` turns a ``SpecError`` into a
refusal naming the field, and checks the numbers against ``SUBMISSION_LIMITS``).

- ``--array``: comma-separated indexes (``3``), ranges (``0-999``) and stepped ranges
  (``0-15:4`` = 0, 4, 8, 12), then an optional ``%N``: at most N tasks run at once.
- ``--dependency``: comma-separated ``kind:job[:job...]`` (every condition must hold, as in
  Slurm with ``,``; Slurm's ``?``, "any of them", is not supported).
- Usage as sacct shows it: ``cpu_time_text`` (TotalCPU) and ``peak_memory_text`` (MaxRSS).
- ``--mem``: a whole number of MiB, or with a unit suffix ``K``, ``M``, ``G`` or ``T`` (powers
  of 1024, as Slurm reads them; ``KiB``, ``MiB``, ``GiB``, ``TiB`` too), e.g. ``64G``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from inventory.units import memory_text

_NUMBER = r"[0-9]{1,9}"
_ITEM = re.compile(rf"(?P<first>{_NUMBER})(?:-(?P<last>{_NUMBER})(?::(?P<step>{_NUMBER}))?)?\Z")
_CAP = re.compile(rf"%(?P<cap>{_NUMBER})\Z")
_DEPENDENCY = re.compile(r"(?P<kind>[a-z]+)(?P<jobs>(?::[0-9]{1,18})+)\Z")
_MEMORY = re.compile(r"(?P<number>[0-9]{1,15})(?:(?P<unit>[KMGT])(?:iB)?)?\Z", re.IGNORECASE)
KIB_PER_UNIT = {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}


class SpecError(ValueError):
    """A spec that does not parse; the message says where and how to write it."""


@dataclass(frozen=True)
class ArraySpec:
    indexes: tuple[int, ...]  # ascending, each once
    max_running: int | None  # the %N cap; None: no cap


def parse_array(spec: str, *, max_tasks: int, max_index: int) -> ArraySpec:
    """``0-999%50``, ``1,3,5-9``, ``0-15:4`` as indexes and cap. ``SpecError`` for anything
    else, more than ``max_tasks`` tasks or an index above ``max_index``; the count is checked
    before any index list is built, so ``0-999999999`` costs nothing."""
    text = spec.strip()
    if not text:
        raise SpecError("empty: give indexes such as 0-999%50, 1,3,5-9 or 0-15:4")
    cap = None
    body, percent, tail = text.partition("%")
    if percent:
        match = _CAP.match(percent + tail)
        if match is None:
            raise SpecError(f"{percent + tail!r}: the cap is % and a whole number, e.g. %50")
        cap = int(match["cap"])
        if cap < 1:
            raise SpecError("the %N cap must be at least 1")
    ranges: list[range] = []
    for item in body.split(","):
        match = _ITEM.match(item.strip())
        if match is None:
            raise SpecError(
                f"{item.strip()!r} is not an index, a range A-B or a stepped range A-B:S "
                "(whole numbers of at most 9 digits)"
            )
        first = int(match["first"])
        last = int(match["last"]) if match["last"] is not None else first
        step = int(match["step"]) if match["step"] is not None else 1
        if last < first:
            raise SpecError(f"{item.strip()!r}: the range ends before it starts")
        if step < 1:
            raise SpecError(f"{item.strip()!r}: the step must be at least 1")
        if last > max_index:
            raise SpecError(f"{item.strip()!r}: indexes go up to {max_index}")
        ranges.append(range(first, last + 1, step))
    if sum(map(len, ranges)) > max_tasks:
        raise SpecError(f"more than {max_tasks} tasks; submit several arrays")
    indexes = sorted({index for span in ranges for index in span})
    return ArraySpec(tuple(indexes), cap)


def parse_dependency(text: str) -> list[tuple[str, int]]:
    """``afterok:12:13,afterany:14`` as ``[("afterok", 12), ("afterok", 13), ("afterany",
    14)]``, in the order written (the kinds are the caller's to check). ``SpecError`` for
    anything else."""
    pairs: list[tuple[str, int]] = []
    for part in text.split(","):
        match = _DEPENDENCY.match(part.strip())
        if match is None:
            hint = " (only ',': all of them; '?' is not supported)" if "?" in part else ""
            raise SpecError(f"{part.strip()!r} is not kind:job[:job...], e.g. afterok:12:13{hint}")
        pairs.extend((match["kind"], int(job)) for job in match["jobs"][1:].split(":"))
    return pairs


def compact_indexes(indexes: Iterable[int]) -> str:
    """Sorted indexes as Slurm prints them: ``0-3,7,9-12``."""
    parts: list[str] = []
    run: list[int] = []
    for index in sorted(indexes):
        if run and index == run[-1] + 1:
            run.append(index)
            continue
        if run:
            parts.append(_run_text(run))
        run = [index]
    if run:
        parts.append(_run_text(run))
    return ",".join(parts)


def array_label(array_id: int, indexes: str, max_running: int | None) -> str:
    """Tasks of a job array as ``squeue`` names them together: ``12_[3-999%50]`` (``indexes``
    compacted, ``%`` its cap on tasks running at once)."""
    cap = f"%{max_running}" if max_running else ""
    return f"{array_id}_[{indexes}{cap}]"


def _run_text(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def parse_memory(text: str) -> int:
    """Slurm's ``--mem`` as MiB: ``64G`` (65536), ``512M``, ``1T``, ``2048`` (MiB, Slurm's
    default unit), ``64GiB``; kibibytes round up to whole MiB. ``SpecError`` for anything
    else."""
    match = _MEMORY.match(text.strip())
    if match is None:
        raise SpecError(
            f"{text.strip()!r} is not a memory size: a whole number of MiB, or with a unit "
            "K, M, G or T (e.g. 64G, 512M)"
        )
    kib = int(match["number"]) * KIB_PER_UNIT[(match["unit"] or "M").upper()]
    return -(-kib // 1024)


def cpu_time_text(seconds: float) -> str:
    """CPU time as sacct's TotalCPU writes it, to the second: ``00:01:23``, ``1-02:03:04``."""
    minutes, second = divmod(round(seconds), 60)
    hours, minute = divmod(minutes, 60)
    days, hour = divmod(hours, 24)
    return (f"{days}-" if days else "") + f"{hour:02d}:{minute:02d}:{second:02d}"


def peak_memory_text(num_bytes: int) -> str:
    """A peak of memory (sacct's MaxRSS) as ``memory_text`` writes a request, in whole MiB
    rounded up: ``64 MiB``, ``2 GiB``, ``1537 MiB``."""
    return memory_text(-(-num_bytes // 2**20))


def host_request_text(cpus: int, memory_mib: int) -> str:
    """What a job asks of each node's host: ``16 CPUs, 64 GiB RAM per node``; empty when it
    asks for neither (0 each)."""
    parts = [f"{cpus} CPU{'s' if cpus != 1 else ''}"] if cpus else []
    if memory_mib:
        parts.append(f"{memory_text(memory_mib)} RAM")
    return f"{', '.join(parts)} per node" if parts else ""


def unsplit_text(unsplit: int) -> str:
    """`` (3 of them not made jobs yet)`` after how many of an array's tasks were canceled,
    for those the placement loop had not reached (the pages' and the CLI's words)."""
    return f" ({unsplit} of them not made jobs yet)" if unsplit else ""
