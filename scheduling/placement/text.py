"""Small English helpers for explanations and pending messages."""

from __future__ import annotations

from collections.abc import Sequence

from gpuadmin.english import plural
from inventory.units import memory_text
from scheduling.placement.snapshot import GpuSlot


def gpus_phrase(
    count: int, adjective: str = "", model: str | None = None, min_memory_mib: int = 0
) -> str:
    """E.g. "4 GPUs", "1 free GPU", "8 NVIDIA H100 80GB HBM3 GPUs with >= 70 GiB"."""
    return f"{plural(count, adjective + gpu_noun(model))}{memory_phrase(min_memory_mib)}"


def gpu_noun(model: str | None) -> str:
    return "GPU" if model is None else f"{model} GPU"


def memory_phrase(min_memory_mib: int) -> str:
    return f" with >= {memory_text(min_memory_mib)}" if min_memory_mib else ""


def listing(items: Sequence[str], limit: int = 3) -> str:
    """ "a", "a and b", "a, b and c", "a, b, c and 2 more"."""
    if len(items) > limit:
        return f"{', '.join(items[:limit])} and {len(items) - limit} more"
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def indexes_phrase(indexes: Sequence[int]) -> str:
    """ "GPU 5", "GPUs 0-3", "GPUs 0, 2 and 5" (indexes sorted)."""
    if len(indexes) == 1:
        return f"GPU {indexes[0]}"
    if indexes[-1] - indexes[0] == len(indexes) - 1:
        return f"GPUs {indexes[0]}-{indexes[-1]}"
    return f"GPUs {listing([str(i) for i in indexes], limit=len(indexes))}"


def numa_phrase(gpus: Sequence[GpuSlot], with_sockets: bool = True) -> str:
    """ ", NUMA node 3", ", NUMA nodes 1 and 3 on one socket", ", NUMA nodes 1, 3, 5 and 7
    across 2 sockets" (``with_sockets`` off: without the sockets); empty when unknown. Sockets
    are counted, never numbered: a GPU's socket is named by its lowest NUMA node (NVML names
    none), so its number is a NUMA node's ("sockets 0 and 4" on a two-socket DGX A100)."""
    numa = sorted({gpu.numa_node for gpu in gpus if gpu.numa_node is not None})
    if not numa:
        return ""
    text = f", NUMA {'node' if len(numa) == 1 else 'nodes'} {listing([str(n) for n in numa], 8)}"
    sockets = {gpu.socket for gpu in gpus if gpu.socket is not None}
    if with_sockets and len(numa) > 1 and sockets:
        text += (
            " on one socket" if len(sockets) == 1 else f" across {plural(len(sockets), 'socket')}"
        )
    return text
