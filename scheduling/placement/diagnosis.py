"""Why jobs wait: reason, message, estimated start and a what-if, per job shape.

See docs/development/design-notes.md, "Why jobs wait".
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import NamedTuple

from inventory.units import memory_text
from inventory.usability import Reason as UsabilityReason
from scheduling.placement.decisions import Pending, Reason
from scheduling.placement.fleet import Fleet, FleetNode, Shape, available, matches
from scheduling.placement.hosts import ask_phrase, most_phrase
from scheduling.placement.snapshot import GpuSlot, JobRequest, NodeInfo, Snapshot
from scheduling.placement.text import (
    gpu_noun,
    gpus_phrase,
    listing,
    memory_phrase,
    plural,
)
from scheduling.placement.topology import REQUIREMENT_GROUPING, GroupKey, grouped

UNITS = {"numa": "NUMA node", "nvlink": "NVLink domain"}
HELD_OUTSIDE = str(UsabilityReason.HELD_OUTSIDE)
REQUIREMENT_NAMES = {"numa": "NUMA", "nvlink": "NVLink"}
ViewKey = tuple[str | None, int, str]  # (gpu_model, min_memory_mib, requirement)
# A node with its GPU models and the least total memory of its GPUs.
_NodeHardware = tuple[FleetNode, set[str], int]


class Blocks(NamedTuple):
    """One node as one shape sees it: the largest group of matching GPUs (a NUMA node, an
    NVLink domain or the whole node, per the requirement) in its hardware, up, free now, and
    free but for their memory; and per group, free GPUs and when the busy ones free up."""

    node: FleetNode
    hardware: int
    available: int
    free: int
    idle: int
    groups: tuple[tuple[int, tuple[float, ...]], ...]


class Group(NamedTuple):
    """One group of a node's matching GPUs: how many, how many are up, the free memory of
    those free now (ascending) and when the busy ones free up (ascending)."""

    size: int
    up: int
    free_memory: tuple[int, ...]
    busy: tuple[float, ...]


BLOCK_FIELDS = ("hardware", "available", "free", "idle")


class View:
    """The blocks of every node with a matching GPU (hostname order), and what explanations
    ask of them, each worked out once: per field the values sorted (how many nodes have a
    block of at least n), per GPU count the times nodes could hold it, sorted."""

    __slots__ = ("_best", "_sorted", "_starts", "blocks")

    def __init__(self, blocks: list[Blocks]) -> None:
        self.blocks = blocks
        self._sorted: dict[str, list[int]] = {}
        self._starts: dict[int, list[float]] = {}
        self._best: Blocks | None = None

    def values(self, field: str) -> list[int]:
        """`field` of every block, ascending."""
        if field not in self._sorted:
            self._sorted[field] = sorted(getattr(b, field) for b in self.blocks)
        return self._sorted[field]

    def at_least(self, field: str, count: int) -> int:
        """How many nodes have a block of at least `count` in `field`."""
        values = self.values(field)
        return len(values) - bisect_left(values, count)

    def most(self, field: str) -> int:
        return self.values(field)[-1]

    def starts(self, count: int) -> list[float]:
        """When each node could first hold `count` GPUs in one group, ascending."""
        if count not in self._starts:
            self._starts[count] = sorted(_node_ready_at(b.groups, count) for b in self.blocks)
        return self._starts[count]

    def best_free(self) -> Blocks:
        """The first node (hostname order) with the largest free block."""
        if self._best is None:
            self._best = max(self.blocks, key=lambda b: b.free)
        return self._best


class Diagnosis:
    """Explanations against one state of the fleet, cached per shape. `scope` names what the
    fleet is in messages: "the fleet", "pool a100", "reservation 7"."""

    def __init__(self, fleet: Fleet, now: float, scope: str = "the fleet") -> None:
        self.fleet = fleet
        self.now = now
        self.scope = scope
        self._free_ids = {gpu.id for node in fleet.nodes for gpu in node.free}
        # The most memory a GPU has, per model and (None) over all models.
        self._largest_memory: dict[str | None, int] = {}
        for node in fleet.nodes:
            for gpu in node.gpus:
                for model in (gpu.model, None):
                    most = self._largest_memory.get(model, 0)
                    self._largest_memory[model] = max(most, gpu.memory_total_mib)
        # Every memory size views compare with: totals, and what free GPUs have free.
        sizes = {gpu.memory_total_mib for node in fleet.nodes for gpu in node.gpus}
        sizes |= {gpu.memory_free_mib for node in fleet.nodes for gpu in node.free}
        self._memory_levels = sorted(sizes)
        self._views: dict[ViewKey, View] = {}
        self._shapes: dict[Shape, tuple[Reason, str, float | None, str | None]] = {}
        self._never: dict[Shape, tuple[Reason, str] | None] = {}
        # Each node with its GPU models and the least total memory of its GPUs, in hostname
        # order, and per model the nodes that have one; the groups and blocks of nodes all
        # of whose GPUs match a view, per (node, requirement) and (..., memory).
        self._hardware: list[_NodeHardware] = []
        self._with_model: dict[str, list[_NodeHardware]] = {}
        for node in fleet.nodes:
            if not node.gpus:
                continue  # matches no view
            models = {gpu.model for gpu in node.gpus}
            least = min((gpu.memory_total_mib for gpu in node.gpus), default=0)
            self._hardware.append((node, models, least))
            for model in models:
                self._with_model.setdefault(model, []).append((node, models, least))
        self._groups: dict[tuple[int, str], list[Group]] = {}
        self._whole_nodes: dict[tuple[int, str, int], Blocks] = {}
        # What `never` reads: per view, the largest group of each node's matching GPUs, and
        # that size per (node, requirement) for nodes all of whose GPUs match.
        self._hardware_views: dict[ViewKey, View] = {}
        self._largest: dict[tuple[int, str], int] = {}

    @classmethod
    def of_hardware(
        cls, nodes: Iterable[NodeInfo], gpus: Iterable[GpuSlot], scope: str
    ) -> Diagnosis:
        """A diagnosis of bare hardware (no jobs), to ask what it could `never` run."""
        return cls(Fleet(Snapshot(0.0, tuple(nodes), tuple(gpus))), 0.0, scope)

    def explain(self, job: JobRequest, position: int) -> Pending:
        shape = Shape.of(job)
        if shape not in self._shapes:
            self._shapes[shape] = self._explain(shape)
        reason, message, estimated_start, what_if = self._shapes[shape]
        return Pending(job.id, position, reason, message, estimated_start, what_if)

    def never(self, shape: Shape) -> tuple[Reason, str] | None:
        """Why no state of this fleet could ever run `shape`, whatever its nodes' and GPUs'
        states (drained, fenced and broken hardware counts): no GPU of its model or memory,
        no node (or too few) with enough such GPUs, in one NUMA node or NVLink domain where it
        asks for one, and with its host CPUs and memory. None when its hardware could. The
        one rule: a waiting job's reason starts with it, and submission refuses by it."""
        if shape not in self._never:
            self._never[shape] = self._hardware_refusal(shape)
        return self._never[shape]

    def _hardware_refusal(self, shape: Shape) -> tuple[Reason, str] | None:
        count, wanted, min_memory, model, requirement, *_ = shape
        if model not in self._largest_memory:
            return Reason.MODEL, f"no {gpu_noun(model)} in {self.scope}"
        largest = self._largest_memory[model]
        if min_memory > largest:
            message = (
                f"no {gpu_noun(model)}{memory_phrase(min_memory)} in {self.scope}; "
                f"the largest has {memory_text(largest)}"
            )
            return Reason.MEMORY, message
        whole, view = self._views_of(shape, self._hardware_view)
        host = shape.host
        gpus = gpus_phrase(count, model=model, min_memory_mib=min_memory)
        unit = UNITS.get(requirement)
        in_unit = "" if unit is None else f" in one {unit}"
        if not _enough(whole, "hardware", count, wanted):
            if wanted == 1:
                most = whole.most("hardware")
                return Reason.TOO_LARGE, f"needs {gpus} on one node; no node has more than {most}"
            having = whole.at_least("hardware", count)
            needs = _per_node(gpus, wanted, "")
            return Reason.TOO_LARGE, f"needs {needs}; {self.scope} has {having}"
        if unit is not None and not _enough(view, "hardware", count, wanted):
            most = view.most("hardware")
            if requirement == "nvlink" and most < 2:
                found = "no matching GPU has NVLink"
            elif wanted == 1:
                found = f"the largest {unit} has {most}"
            else:
                found = f"{self.scope} has {view.at_least('hardware', count)} such nodes"
            return Reason.TOPOLOGY, f"needs {_per_node(gpus, wanted, in_unit)}; {found}"
        if host.cpus or host.memory_mib:
            sized = [b.node.host.info for b in view.blocks if b.hardware >= count]
            able = sum(b.node.host.could_fit(host) for b in view.blocks if b.hardware >= count)
            if able < wanted:
                asked = f"needs {ask_phrase(host)} per node"
                if wanted > 1:
                    nodes = plural(able, "node")
                    found = f"{self.scope} has {nodes} with {gpus}{in_unit} and that much"
                    return Reason.TOO_LARGE, f"{asked} on {wanted} nodes; {found}"
                capacity = most_phrase(host, ((i.cpus, i.memory_mib) for i in sized))
                found = f"no node with {gpus}{in_unit} has that much (at most {capacity})"
                return Reason.TOO_LARGE, f"{asked}; {found}"
        return None

    def _views_of(
        self, shape: Shape, view: Callable[[ViewKey], View] | None = None
    ) -> tuple[View, View]:
        """The views of `shape` (by `view`: default, the full ones) without its requirement
        ("any") and with it. Views depend on the memory asked for only through which GPUs
        have that much, so requests between the same two memory sizes in the fleet share
        them."""
        _, _, min_memory, model, requirement, *_ = shape
        view = view or self._view
        level = self._memory_levels[bisect_left(self._memory_levels, min_memory)]
        return view((model, level, "any")), view((model, level, requirement))

    def _explain(self, shape: Shape) -> tuple[Reason, str, float | None, str | None]:
        count, wanted, *_ = shape
        never = self.never(shape)
        if never is not None and never[0] in (Reason.MODEL, Reason.MEMORY):
            return *never, None, None
        whole, view = self._views_of(shape)
        reason, message = never or self._reason(shape, whole, view)
        host_bound = reason == Reason.TOO_LARGE and (shape.cpus or shape.host_memory_mib)
        if reason == Reason.HOST_RESOURCES or host_bound:
            # Neither the start (when GPUs free up) nor fewer GPUs answers for the host.
            return reason, message, None, None
        return (
            reason,
            message,
            self._estimated_start(view, count, wanted),
            _what_if(shape, whole, view),
        )

    def _reason(self, shape: Shape, whole: View, view: View) -> tuple[Reason, str]:
        """Why `shape`, which its hardware could hold (`never`), waits now: which of that
        hardware is up, then what is free."""
        count, wanted, min_memory, model, requirement, *_ = shape
        host = shape.host
        asks_host = bool(host.cpus or host.memory_mib)
        gpus = gpus_phrase(count, model=model, min_memory_mib=min_memory)
        unit = UNITS.get(requirement)
        in_unit = "" if unit is None else f" in one {unit}"
        if not _enough(view, "available", count, wanted):
            down = [b.node for b in view.blocks if b.hardware >= count > b.available]
            sentence = _unavailable(down)
            if wanted > 1:
                sentence = f"needs {_per_node(gpus, wanted, '')}; {sentence}"
            return Reason.NODES_UNAVAILABLE, sentence
        if asks_host and _enough(view, "free", count, wanted):
            ready = [b for b in view.blocks if b.free >= count]
            fitting = sum(b.node.host.fits(host) for b in ready)
            if fitting < wanted:
                free_gpus = gpus_phrase(count, "free ", model, min_memory) + in_unit
                most_free = most_phrase(host, (b.node.host.free for b in ready))
                short = (
                    f"the most free is {most_free}"
                    if not fitting
                    else f"only {fitting} of them {'has' if fitting == 1 else 'have'} that much"
                )
                nodes = "node" if len(ready) == 1 else f"{len(ready)} nodes"
                return (
                    Reason.HOST_RESOURCES,
                    f"needs {ask_phrase(host)} per node; of the {nodes} with at least {free_gpus}, "
                    f"{short}",
                )
        if unit is not None and _enough(whole, "free", count, wanted):
            found = _free_blocks(view, count, wanted)
            return Reason.TOPOLOGY, f"needs {_per_node(gpus, wanted, in_unit)}; {found}"
        if min_memory and _enough(view, "idle", count, wanted):
            # Free GPUs that are large enough exist, but something else holds their memory.
            memory = f"{memory_phrase(min_memory)} free"
            if count == 1 and wanted == 1:
                return Reason.MEMORY, f"no {gpu_noun(model)}{memory}"
            short = gpus_phrase(count, model=model) + memory
            found = _free_blocks(view, count, wanted)
            return Reason.MEMORY, f"needs {_per_node(short, wanted, in_unit)}; {found}"
        if count == 1 and wanted == 1:
            return Reason.RESOURCES_BUSY, f"no {gpu_noun(model)}{memory_phrase(min_memory)} is free"
        free_gpus = gpus_phrase(count, "free ", model, min_memory)
        found = _free_blocks(view, count, wanted)
        return Reason.RESOURCES_BUSY, f"needs {_per_node(free_gpus, wanted, in_unit)}; {found}"

    def _view(self, key: ViewKey) -> View:
        if key not in self._views:
            self._views[key] = View(self._blocks(*key))
        return self._views[key]

    def _hardware_view(self, key: ViewKey) -> View:
        """A view of the hardware alone (`Blocks.hardware`; the rest 0), whatever its state:
        all that `never` reads, without the free memory and release times of every group."""
        if key not in self._hardware_views:
            model, min_memory, requirement = key
            grouping = REQUIREMENT_GROUPING[requirement]
            blocks = []
            nodes = self._hardware if model is None else self._with_model.get(model, [])
            for node, models, least_memory in nodes:
                if (model is None or len(models) == 1) and least_memory >= min_memory:
                    # Every GPU of the node matches: the same size in every such view, read
                    # off the groups that its full view (made next, by `_explain`) reads too.
                    size = self._largest.get((node.index, requirement))
                    if size is None:
                        groups = self._node_groups(node, requirement)
                        size = self._largest[node.index, requirement] = max(g.size for g in groups)
                else:
                    gpus = [gpu for gpu in node.gpus if matches(gpu, model, min_memory)]
                    if not gpus:
                        continue
                    size = _largest(gpus, grouping)
                blocks.append(Blocks(node, size, 0, 0, 0, ()))
            self._hardware_views[key] = View(blocks)
        return self._hardware_views[key]

    def _blocks(self, model: str | None, min_memory: int, requirement: str) -> list[Blocks]:
        """Blocks of every node with a matching GPU, in hostname order."""
        views = []
        whole_nodes = self._whole_nodes
        nodes = self._hardware if model is None else self._with_model.get(model, [])
        for node, models, least_memory in nodes:
            if (model is None or len(models) == 1) and least_memory >= min_memory:
                # Every GPU of the node matches: the same blocks in every such view.
                key = (node.index, requirement, min_memory)
                blocks = whole_nodes.get(key)
                if blocks is None:
                    groups = self._node_groups(node, requirement)
                    blocks = whole_nodes[key] = _blocks_of(node, groups, min_memory)
                views.append(blocks)
                continue
            gpus = [gpu for gpu in node.gpus if matches(gpu, model, min_memory)]
            if gpus:
                views.append(_blocks_of(node, self._group(node, gpus, requirement), min_memory))
        return views

    def _node_groups(self, node: FleetNode, requirement: str) -> list[Group]:
        """The groups of all of `node`'s GPUs (`_group`), worked out once per requirement."""
        key = (node.index, requirement)
        groups = self._groups.get(key)
        if groups is None:
            groups = self._groups[key] = self._group(node, node.gpus, requirement)
        return groups

    def _group(self, node: FleetNode, gpus: list[GpuSlot], requirement: str) -> list[Group]:
        """`gpus` (of `node`) in the groups `requirement` keeps a part in."""
        grouping = REQUIREMENT_GROUPING[requirement]
        free_ids = self._free_ids
        release_at = self.fleet.release_at
        found = []
        for group in [gpus] if grouping is None else grouped(gpus, grouping):
            up = available(node.info, group)
            free_memory = [gpu.memory_free_mib for gpu in up if gpu.id in free_ids]
            busy = [release_at.get(gpu.id, math.inf) for gpu in up if gpu.id not in free_ids]
            free_memory.sort()
            busy.sort()
            found.append(Group(len(group), len(up), tuple(free_memory), tuple(busy)))
        return found

    def _estimated_start(self, view: View, count: int, wanted: int) -> float | None:
        """When the `wanted`-th node could first hold `count` GPUs, as busy GPUs free up."""
        starts = view.starts(count)
        if len(starts) < wanted or starts[wanted - 1] == math.inf:
            return None
        return max(self.now, starts[wanted - 1])


def _largest(gpus: list[GpuSlot], grouping: GroupKey | None) -> int:
    """The most of `gpus` (one node's) that one group of `grouping` holds (None: the node)."""
    if grouping is None:
        return len(gpus)
    return max(len(group) for group in grouped(gpus, grouping))


def _blocks_of(node: FleetNode, groups: list[Group], min_memory: int) -> Blocks:
    """The node's blocks from its groups, counting free GPUs with `min_memory` free."""
    if len(groups) == 1:  # the whole node, or one NUMA node or NVLink domain: no maxima
        [(size, up, free_memory, busy)] = groups
        with_memory = len(free_memory) - bisect_left(free_memory, min_memory)
        return Blocks(node, size, up, with_memory, len(free_memory), ((with_memory, busy),))
    hardware = available = free = idle = 0
    timelines = []
    for size, up, free_memory, busy in groups:
        with_memory = len(free_memory) - bisect_left(free_memory, min_memory)
        hardware = max(hardware, size)
        available = max(available, up)
        free = max(free, with_memory)
        idle = max(idle, len(free_memory))
        timelines.append((with_memory, busy))
    return Blocks(node, hardware, available, free, idle, tuple(timelines))


def _node_ready_at(groups: tuple[tuple[int, tuple[float, ...]], ...], count: int) -> float:
    """When a node first has `count` GPUs in one of its `groups` (`Blocks.groups`: each
    group's GPUs free now and its busy ones' release times, ascending); -inf: now."""
    ready = math.inf
    for free, busy in groups:
        missing = count - free
        if missing <= 0:
            return -math.inf
        if missing <= len(busy) and busy[missing - 1] < ready:
            ready = busy[missing - 1]
    return ready


def _enough(view: View, field: str, count: int, wanted: int) -> bool:
    """Whether at least `wanted` nodes have a block of `count` in `field`."""
    return view.at_least(field, count) >= wanted


def _per_node(gpus: str, wanted: int, in_unit: str) -> str:
    """ "4 GPUs on one node", "4 GPUs in one NUMA node", "2 nodes with 8 GPUs each"."""
    if wanted == 1:
        return f"{gpus}{in_unit or ' on one node'}"
    return f"{wanted} nodes with {gpus}{in_unit} each"


def _free_blocks(view: View, count: int, wanted: int) -> str:
    """What is free now: the largest block, or for a gang the nodes that have `count`."""
    if wanted > 1:
        hosts = [b.node.hostname for b in view.blocks if b.free >= count]
        if not hosts:
            return "no node has them now"
        have = "has" if len(hosts) == 1 else "have"
        return f"only {plural(len(hosts), 'node')} {have} them now ({listing(hosts)})"
    best = view.best_free()
    if best.free == 0:
        return "none is free"
    return f"the largest free block is {best.free} on {best.node.hostname}"


def _unavailable(nodes: list[FleetNode]) -> str:
    """ "node a is draining", "nodes a and b are offline", "3 matching nodes are unavailable:
    a is draining, b is offline and c has unavailable GPUs (error)"."""
    whys = [_why_down(node) for node in nodes]
    if len(set(whys)) == 1:
        verb, state = whys[0]
        if len(nodes) == 1:
            return f"node {nodes[0].hostname} {verb} {state}"
        verb = {"is": "are", "has": "have"}[verb]
        return f"nodes {listing([node.hostname for node in nodes])} {verb} {state}"
    parts = [
        f"{node.hostname} {verb} {state}" for node, (verb, state) in zip(nodes, whys, strict=True)
    ]
    return f"{len(nodes)} matching nodes are unavailable: {listing(parts)}"


def _why_down(node: FleetNode) -> tuple[str, str]:
    if node.info.state != "online":
        return "is", node.info.state
    if not node.info.reachable:
        return "is", "unreachable"
    # A GPU held outside gpuadmin says by what ("held by Slurm job 1234 on hpc").
    whys = sorted(
        {
            f"held by {gpu.held_outside}"
            if gpu.unavailable == HELD_OUTSIDE and gpu.held_outside
            else gpu.unavailable
            for gpu in node.gpus
            if gpu.unavailable is not None
        }
    )
    return "has", f"unavailable GPUs ({', '.join(whys)})"


def _what_if(shape: Shape, whole: View, view: View) -> str | None:
    """The nearest request that fits now: without the topology requirement, else the largest
    smaller GPU count (fewer nodes, or fewer GPUs per node, for a gang)."""
    count, wanted, _, _, requirement, *_ = shape
    if requirement != "any" and _enough(whole, "free", count, wanted):
        return f"without the {REQUIREMENT_NAMES[requirement]} requirement it could start now"
    blocks = view.values("free")[::-1]
    if wanted == 1:
        smaller = min(count - 1, blocks[0] if blocks else 0)
        if smaller < 1:
            return None
        return f"with {plural(smaller, 'GPU')} instead of {count} it could start now"
    fewer_nodes = sum(free >= count for free in blocks)
    per_node = min(count - 1, blocks[wanted - 1]) if len(blocks) >= wanted else 0
    if fewer_nodes and fewer_nodes * count >= per_node * wanted:
        return (
            f"with {plural(fewer_nodes, 'node')} instead of {wanted} ({fewer_nodes * count} GPUs "
            f"instead of {wanted * count}) it could start now"
        )
    if per_node:
        return f"with {plural(per_node, 'GPU')} per node instead of {count} it could start now"
    return None
