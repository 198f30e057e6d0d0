"""How gpuadmin writes quantities for people, in one place for the pages, the admin, the CLI,
the API's sentences and the placement engine's reasons: memory sizes and durations.

Plain Python, no Django (the placement engine imports it). Memory is stored in MiB, as NVML
and ``nvidia-smi`` count it, and written in binary units only (MiB, GiB: never "GB").
"""

from __future__ import annotations

MIB_PER_GIB = 1024
MIB_PER_TIB = 1024 * MIB_PER_GIB
_EXACT_BELOW_MIB = 100 * MIB_PER_GIB  # smaller sizes are written exactly, as nvidia-smi does


def memory_text(mib: float) -> str:
    """``80 GiB``, ``2 TiB`` for a whole number of them; otherwise the exact MiB below
    100 GiB, as ``nvidia-smi`` prints it (``8000 MiB``, ``81559 MiB``); larger sizes (a
    host's RAM) in GiB to one decimal (``1007.5 GiB``, ``1024.5 GiB``)."""
    whole = round(mib)
    if whole and whole % MIB_PER_TIB == 0:
        return f"{whole // MIB_PER_TIB} TiB"
    if whole and whole % MIB_PER_GIB == 0:
        return f"{whole // MIB_PER_GIB} GiB"
    if abs(whole) < _EXACT_BELOW_MIB:
        return f"{whole} MiB"
    return f"{whole / MIB_PER_GIB:.1f} GiB"


_UNITS = ((86400, " day", " days"), (3600, " h", " h"), (60, " min", " min"), (1, " s", " s"))


def duration_text(seconds: float | None) -> str:
    """A duration in its two largest units, to the second: ``7 days``, ``1 day 2 h``,
    ``1 h 30 min``, ``45 min``, ``2 min 5 s``, ``0 s``; a dash for none."""
    if seconds is None:
        return "–"
    left = round(seconds)
    parts: list[str] = []
    for size, one, many in _UNITS:
        count, left = divmod(left, size)
        if count or parts:
            parts.append(f"{count}{one if count == 1 else many}" if count else "")
        if len(parts) == 2:
            break
    return " ".join(part for part in parts if part) or "0 s"
