"""Which CPUs a job runs on: as many as it asked for, near its GPUs, not shared while the node
has free ones (Slurm's task/affinity with ``--cpus-per-task``). Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


def choose_cpus(
    count: int, near: Iterable[int], available: Iterable[int], taken: Counter[int]
) -> tuple[int, ...]:
    """``count`` CPUs of ``available`` (this host's), ranked: free before taken by another job
    (``taken`` counts the jobs on each), near the job's GPUs (``near``, their NUMA nodes' CPUs)
    before far, the least shared first. ``count`` 0 (none asked): every available CPU near its
    GPUs, shared. CPUs near GPUs that this host does not have (a simulated machine model on a
    small host) count as all of the host's."""
    usable = set(available)
    close = set(near) & usable or usable
    if count <= 0:
        return tuple(sorted(close))
    ranked = sorted(usable, key=lambda cpu: (taken[cpu] > 0, cpu not in close, taken[cpu], cpu))
    return tuple(sorted(ranked[:count]))
