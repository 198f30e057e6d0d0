"""Host CPUs and memory: what each node may still give jobs during one pass.

A job asks for `JobRequest.cpus` and `host_memory_mib` on each of its nodes; a node gives at
most `NodeInfo.cpus` and `memory_mib` (None: not known, then not a limit). A running job
holds its figures on every node its GPUs are on, once per node. One `Hosts` ledger is shared
by every part of a pass (each pool's whole-GPU placement and the MIG/MPS pass), since a node's
CPUs serve all of its GPUs whatever their pool or mode.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from inventory.units import memory_text
from scheduling.placement.snapshot import JobRequest, NodeInfo, Snapshot
from scheduling.placement.text import plural


class HostAsk(NamedTuple):
    """Host resources one node's part of a job asks for (0: none)."""

    cpus: int = 0
    memory_mib: int = 0

    @classmethod
    def of(cls, job: JobRequest) -> HostAsk:
        return cls(job.cpus, job.host_memory_mib)


NO_ASK = HostAsk()


def _covers(free: int | None, asked: int) -> bool:
    return asked <= 0 or free is None or free >= asked


class Host:
    """One node's free CPUs and memory in this pass (None: unknown, no limit), and what it
    gives jobs at most (`info`)."""

    __slots__ = ("cpus", "info", "memory_mib")

    def __init__(self, info: NodeInfo) -> None:
        self.info = info
        self.cpus = info.cpus
        self.memory_mib = info.memory_mib

    @property
    def limited(self) -> bool:
        """Whether the node's CPUs or memory are known (else nothing limits it)."""
        return self.info.cpus is not None or self.info.memory_mib is not None

    @property
    def free(self) -> tuple[int | None, int | None]:
        return (self.cpus, self.memory_mib)

    def fits(self, ask: HostAsk) -> bool:
        """Whether what is free now holds `ask`."""
        return _covers(self.cpus, ask.cpus) and _covers(self.memory_mib, ask.memory_mib)

    def could_fit(self, ask: HostAsk) -> bool:
        """Whether the node, idle, could ever hold `ask`."""
        return _covers(self.info.cpus, ask.cpus) and _covers(self.info.memory_mib, ask.memory_mib)

    def add(self, cpus: int, memory_mib: int) -> None:
        """Change what is free by these amounts (negative: taken)."""
        if self.cpus is not None:
            self.cpus += cpus
        if self.memory_mib is not None:
            self.memory_mib += memory_mib


def fits_free(free: tuple[int | None, int | None], ask: HostAsk) -> bool:
    """`Host.fits` on a node's free figures as `Host.free` gives them."""
    return _covers(free[0], ask.cpus) and _covers(free[1], ask.memory_mib)


def after(free: tuple[int | None, int | None], ask: HostAsk) -> tuple[int | None, int | None]:
    """A node's free figures once `ask` is taken from them."""
    cpus, memory_mib = free
    return (
        None if cpus is None else cpus - ask.cpus,
        None if memory_mib is None else memory_mib - ask.memory_mib,
    )


class Hosts:
    """Every node's `Host`, by hostname, with what running jobs hold taken. `changes` lists
    the hostnames of each take in this pass, in order: a reader that caches per node state
    re-reads the nodes named after the point it has seen."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.by_name = {info.hostname: Host(info) for info in snapshot.nodes}
        self.changes: list[str] = []
        held = [job for job in snapshot.running if job.cpus or job.host_memory_mib]
        if held:
            node_of = {gpu.id: gpu.node for gpu in snapshot.gpus}
            for job in held:
                for hostname in {node_of[g] for g in job.gpu_ids if g in node_of}:
                    self.by_name[hostname].add(-job.cpus, -job.host_memory_mib)

    def take(self, hostnames: Iterable[str], ask: HostAsk) -> None:
        """Give `ask` on each of `hostnames`."""
        if ask == NO_ASK:
            return
        for hostname in hostnames:
            self.by_name[hostname].add(-ask.cpus, -ask.memory_mib)
            self.changes.append(hostname)


def ask_phrase(ask: HostAsk) -> str:
    """ "16 CPUs and 64 GiB of host memory", "4 CPUs", "8 GiB of host memory"."""
    parts = []
    if ask.cpus:
        parts.append(plural(ask.cpus, "CPU"))
    if ask.memory_mib:
        parts.append(f"{memory_text(ask.memory_mib)} of host memory")
    return " and ".join(parts)


def most_phrase(ask: HostAsk, figures: Iterable[tuple[int | None, int | None]]) -> str:
    """The most of each host resource `ask` names among nodes with these (free or total)
    figures: "8 CPUs and 32 GiB". An unknown figure is no limit, never short: left out."""
    known = list(figures)
    cpus = [c for c, _ in known if c is not None]
    memory_mib = [m for _, m in known if m is not None]
    return free_phrase(
        (max(cpus, default=None), max(memory_mib, default=None)),
        HostAsk(ask.cpus if cpus else 0, ask.memory_mib if memory_mib else 0),
    )


def free_phrase(free: tuple[int | None, int | None], ask: HostAsk) -> str:
    """What a node has free of what `ask` names: "8 CPUs", "8 CPUs and 32 GiB"."""
    cpus, memory_mib = free
    parts = []
    if ask.cpus and cpus is not None:
        parts.append(plural(max(cpus, 0), "CPU"))
    if ask.memory_mib and memory_mib is not None:
        parts.append(memory_text(max(memory_mib, 0)))
    return " and ".join(parts)
