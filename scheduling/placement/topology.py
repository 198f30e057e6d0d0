"""Choosing GPUs inside one node.

A choice is ranked by topology class, best first: all GPUs in one NVLink domain (rank 0), in
one NUMA node (1), on one socket (2), anywhere on the node (3); a single GPU is rank 0. Inside
a class, fewer sockets and then fewer NUMA nodes win, and at every level the group with the
fewest free GPUs that still holds the request is used (best fit), so larger groups stay whole.
A GPU whose NUMA node, socket or domain is unknown forms a group of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from typing import NamedTuple

from scheduling.placement.decisions import TopologyClass
from scheduling.placement.snapshot import GpuSlot

GroupKey = Callable[[GpuSlot], object]

by_domain: GroupKey = attrgetter("nvlink_domain")
by_numa: GroupKey = attrgetter("numa_node")


def by_socket(gpu: GpuSlot) -> object:
    """The socket; when unknown, the NUMA node stands in for it (a NUMA node never spans
    sockets), so that choices still keep to few NUMA nodes."""
    if gpu.socket is not None:
        return gpu.socket
    return None if gpu.numa_node is None else ("numa", gpu.numa_node)


# The grouping a requirement imposes on each node's part: None means the whole node.
REQUIREMENT_GROUPING: dict[str, GroupKey | None] = {
    "any": None,
    "node": None,
    "numa": by_numa,
    "nvlink": by_domain,
}
RANK_CLASSES = (TopologyClass.NVLINK, TopologyClass.NUMA, TopologyClass.SOCKET, TopologyClass.NODE)


class NodeChoice(NamedTuple):
    """GPUs chosen on one node, with what they cost (lower is better)."""

    rank: int
    sockets: int
    numa_nodes: int
    gpus: tuple[GpuSlot, ...]

    @property
    def cost(self) -> tuple[int, int, int]:
        return (self.rank, self.sockets, self.numa_nodes)

    @property
    def topology_class(self) -> TopologyClass:
        return TopologyClass.SINGLE if len(self.gpus) == 1 else RANK_CLASSES[self.rank]


def grouped(gpus: Iterable[GpuSlot], key: GroupKey) -> list[list[GpuSlot]]:
    """GPUs grouped by `key`, groups in order of first appearance."""
    groups: dict[object, list[GpuSlot]] = {}
    for gpu in gpus:
        value = key(gpu)
        groups.setdefault(("unknown", gpu.id) if value is None else value, []).append(gpu)
    return list(groups.values())


def choose(free: Sequence[GpuSlot], count: int, requirement: str) -> NodeChoice | None:
    """The best `count` of one node's `free` GPUs (sorted by index) meeting `requirement`
    ("any", "node", "numa" or "nvlink"), or None when they cannot."""
    if len(free) < count:
        return None
    if count == 1:
        return _single(free)
    if requirement == "numa":
        numa_groups = [g for g in grouped(free, by_numa) if len(g) >= count]
        return _best(_inside_numa(group, count) for group in numa_groups)
    domains = [g for g in grouped(free, by_domain) if len(g) >= count]
    if domains or requirement == "nvlink":
        return _best((_rated(_compact(domain, count), 0), len(domain)) for domain in domains)
    gpus = _compact(list(free), count)
    return _rated(gpus, None)


def _single(free: Sequence[GpuSlot]) -> NodeChoice:
    """One GPU, from the NUMA node (then socket) with the fewest free GPUs: the best fit."""
    numa = Counter(gpu.numa_node for gpu in free)
    sockets = Counter(by_socket(gpu) for gpu in free)
    # An unknown NUMA node or socket counts as a group of one, as in grouped().
    numa[None] = sockets[None] = 1
    gpu = min(free, key=lambda g: (numa[g.numa_node], sockets[by_socket(g)]))
    return NodeChoice(0, 1, 1, (gpu,))


def _inside_numa(group: list[GpuSlot], count: int) -> tuple[NodeChoice, int]:
    """`count` GPUs of one NUMA node, in one NVLink domain when it has one that large."""
    domains = [d for d in grouped(group, by_domain) if len(d) >= count]
    if domains:
        return NodeChoice(0, 1, 1, tuple(min(domains, key=len)[:count])), len(group)
    return NodeChoice(1, 1, 1, tuple(group[:count])), len(group)


def _best(candidates: Iterable[tuple[NodeChoice, int]]) -> NodeChoice | None:
    """The cheapest choice; ties go to the smallest container (best fit), then the first."""
    best = min(candidates, key=lambda pair: (pair[0].cost, pair[1]), default=None)
    return None if best is None else best[0]


def _rated(gpus: list[GpuSlot], rank: int | None) -> NodeChoice:
    """A NodeChoice for `gpus`; rank None derives it from the NUMA/socket spread."""
    gpus.sort(key=attrgetter("index"))
    sockets = len(grouped(gpus, by_socket))
    numa_nodes = len(grouped(gpus, by_numa))
    if rank is None:
        rank = 1 if numa_nodes == 1 else 2 if sockets == 1 else 3
    return NodeChoice(rank, sockets, numa_nodes, tuple(gpus))


def _compact(gpus: list[GpuSlot], count: int) -> list[GpuSlot]:
    """`count` of `gpus` on as few sockets, then NUMA nodes, as possible (best fit)."""
    if len(gpus) == count:
        return list(gpus)
    sockets = [s for s in grouped(gpus, by_socket) if len(s) >= count]
    if sockets:
        picks = [_fewest_groups(s, count, by_numa) for s in sockets]
        return min(
            zip(picks, sockets, strict=True),
            key=lambda pair: (len(grouped(pair[0], by_numa)), len(pair[1])),
        )[0]
    return _fewest_groups(gpus, count, by_socket, fill=lambda s, n: _fewest_groups(s, n, by_numa))


def _first(group: list[GpuSlot], count: int) -> list[GpuSlot]:
    return group[:count]


def _fewest_groups(
    gpus: list[GpuSlot],
    count: int,
    key: GroupKey,
    fill: Callable[[list[GpuSlot], int], list[GpuSlot]] = _first,
) -> list[GpuSlot]:
    """`count` GPUs from as few `key` groups as possible: whole groups largest first, the rest
    from the smallest group that holds it (chosen inside that group by `fill`)."""
    groups = sorted(grouped(gpus, key), key=len, reverse=True)
    chosen: list[GpuSlot] = []
    while count:
        fitting = [group for group in groups if len(group) >= count]
        if fitting:
            chosen += fill(min(fitting, key=len), count)
            break
        largest = groups.pop(0)
        chosen += largest
        count -= len(largest)
    return chosen
