"""MIG and MPS placement: jobs that take a share of one GPU, packed so that large blocks stay
free, by fragmentation gradient descent (Weng et al., USENIX ATC '23).

What fits where, the fragmentation measure and its tie-breaks:
docs/development/design-notes.md, "MIG and MPS packing". One module of about 1,300 lines: most
of it is ``SharingPass``, one pass's free slices, shares and offers, which its MIG and MPS steps
read and update together; split, each part would hand that state back and forth.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Generic, Literal, NamedTuple, TypeVar

from inventory.nvml.mig_catalog import MigProfile, MigTable, load_table, table_for_gpu
from inventory.nvml.mig_fit import Placed, free_starts, remaining_capacity
from inventory.units import memory_text
from scheduling.placement.decisions import MigCreate, Pending, Placement, Reason, TopologyClass
from scheduling.placement.hosts import (
    NO_ASK,
    Host,
    HostAsk,
    Hosts,
    after,
    ask_phrase,
    fits_free,
    most_phrase,
)
from scheduling.placement.predict import release_at
from scheduling.placement.reservations import ReservationBook
from scheduling.placement.snapshot import GpuSlot, JobRequest, PoolConfig, Snapshot
from scheduling.placement.text import gpu_noun, listing, plural

Packing = Literal["fragmentation", "best-fit", "first-fit"]
PACKINGS: tuple[Packing, ...] = ("fragmentation", "best-fit", "first-fit")

# GpuSlot.unavailable of the GPUs that take shares (inventory.usability.Reason.MIG and MPS).
MIG_MODE = "mig"
MPS_MODE = "mps"
# What holds a GPU switched to another mode while its work runs (``GpuSlot.held_as``).
BUSY_WITH = {
    "gpu": "a whole-GPU job on it",
    MIG_MODE: "MIG jobs on it",
    MPS_MODE: "MPS shares on it",
}
NO_LONGER = {MIG_MODE: "no longer in MIG mode", MPS_MODE: "no longer MPS-shared"}

# A MIG device as layouts compare them: (profile, placement start, memory slices, busy).
Device = tuple[str, int, int, bool]
# Request kinds of a workload, with the host CPUs and memory they ask for on the node.
MigKind = tuple[str, str | None, HostAsk]  # (profile, gpu_model, host)
MpsKind = tuple[int, int, str | None, HostAsk]  # (percent, memory MiB, gpu_model, host)
# A node's free host CPUs and memory as a state holds them; None: nothing limits the node.
HostFree = tuple[int | None, int | None] | None
# A GPU's place in the tie-break: (node in hostname order, GPU index, GPU id).
Order = tuple[int, int, int]
# What a candidate minimises, by packing, before the GPU's order.
Rank = tuple[float, ...]

_DIGITS = 9  # fragmentation is compared rounded, so that equal sums in another order tie


KindT = TypeVar("KindT", MigKind, MpsKind)


@dataclass(frozen=True, slots=True)
class Workload(Generic[KindT]):
    """What fragmentation is measured against: request kinds with their weights, and the
    weight of the uniform prior (every MIG profile of the GPU's table alike, every MPS percent
    from 1 to 100 alike). The weights sum to 1."""

    kinds: tuple[tuple[KindT, float], ...]
    prior: float = 0.0

    @classmethod
    def of(cls, counts: Mapping[KindT, int], prior_requests: int = 0) -> Workload[KindT]:
        """Weights by count, the prior counting as `prior_requests` requests."""
        total = sum(counts.values()) + prior_requests
        kinds = tuple((kind, n / total) for kind, n in sorted(counts.items(), key=repr))
        return cls(kinds, prior_requests / total)


MigWorkload = Workload[MigKind]
MpsWorkload = Workload[MpsKind]


def is_sharing(job: JobRequest) -> bool:
    """Whether `job` asks for a MIG device or an MPS share rather than whole GPUs."""
    return bool(job.mig_profile) or job.mps_percent is not None


class Layout(NamedTuple):
    """A MIG-mode GPU as placement sees it: GPUs with the same layout are interchangeable."""

    model: str
    table: str | None  # the name of its mig_catalog table; None: no table is known
    devices: tuple[Device, ...]  # by placement start

    @property
    def idle(self) -> bool:
        return not any(busy for *_, busy in self.devices)

    def first_free(self, profile: str) -> int | None:
        """The position of the free device of `profile` with the lowest start."""
        return next(
            (i for i, (name, *_, busy) in enumerate(self.devices) if name == profile and not busy),
            None,
        )


@dataclass(slots=True, eq=False)
class _Device:
    profile: str
    start: int
    size: int
    slot_id: int | None  # None: the instance this pass asks to create
    holder: int | None  # the job on it


@dataclass(slots=True, eq=False)
class _MigGpu:
    gpu: GpuSlot
    order: Order
    table: str | None
    devices: list[_Device]
    usable: bool  # on a schedulable node and in MIG mode (else it only explains)

    def layout(self) -> Layout:
        return Layout(
            self.gpu.model,
            self.table,
            tuple((d.profile, d.start, d.size, d.holder is not None) for d in self.devices),
        )


@dataclass(slots=True, eq=False)
class _MpsGpu:
    gpu: GpuSlot
    order: Order
    used_percent: int
    used_memory_mib: int
    jobs: list[int]
    usable: bool

    @property
    def free_percent(self) -> int:
        return 100 - self.used_percent

    @property
    def free_memory_mib(self) -> int:
        return self.gpu.memory_total_mib - self.used_memory_mib

    def state(self) -> MpsState:
        return MpsState(self.gpu.model, self.free_percent, self.free_memory_mib)


class MpsState(NamedTuple):
    """An MPS GPU as placement sees it."""

    model: str
    free_percent: int
    free_memory_mib: int


# A node's usable MIG (or MPS) GPUs of one pool as placement compares them: its free host
# figures and each GPU's layout (or state), in GPU index order.
MigNode = tuple[HostFree, tuple[Layout, ...]]
MpsNode = tuple[HostFree, tuple[MpsState, ...]]
# What a node state offers a request: (rank, GPU position on the node, device position or
# placement start; 0 for MPS). Compared with the node's order between the last two.
Offer = tuple[Rank, int, int]


def _host_free(host: Host) -> HostFree:
    return host.free if host.limited else None


@dataclass(slots=True, eq=False)
class _MigPart:
    """The usable MIG-mode GPUs of one pool on one node (index order), and the node's host."""

    order: int  # the node's position in hostname order
    host: Host
    gpus: list[_MigGpu]

    def state(self) -> MigNode:
        return (_host_free(self.host), tuple(mig.layout() for mig in self.gpus))


@dataclass(slots=True, eq=False)
class _MpsPart:
    """The usable MPS GPUs of one pool on one node (index order), and the node's host."""

    order: int
    host: Host
    gpus: list[_MpsGpu]

    def state(self) -> MpsNode:
        return (_host_free(self.host), tuple(mps.state() for mps in self.gpus))


K = TypeVar("K", bound=Hashable)
E = TypeVar("E", _MigPart, _MpsPart)
G = TypeVar("G", _MigGpu, _MpsGpu)
_by_order = attrgetter("order")


class _Groups(Generic[K, E]):
    """Node parts by state, each group in node order: a choice compares states, not nodes.
    A state gets a number when first seen, so that what it offers is cached by number."""

    def __init__(self) -> None:
        self.by_state: dict[K, tuple[int, list[E]]] = {}
        self._numbers: dict[K, int] = {}
        self._filed: dict[E, K] = {}

    def file(self, part: E, state: K) -> None:
        """File `part` under `state` (its current one), out of the group it was in."""
        old = self._filed.get(part)
        if old == state:
            return
        if old is not None:
            self._remove(old, part)
        self._filed[part] = state
        if state not in self.by_state:
            self.by_state[state] = (self._numbers.setdefault(state, len(self._numbers)), [])
        group = self.by_state[state][1]
        if not group or group[-1].order < part.order:
            group.append(part)
        else:
            insort(group, part, key=_by_order)

    def discard(self, part: E) -> None:
        old = self._filed.pop(part, None)
        if old is not None:
            self._remove(old, part)

    def _remove(self, state: K, part: E) -> None:
        group = self.by_state[state][1]
        del group[bisect_left(group, part.order, key=_by_order)]
        if not group:
            del self.by_state[state]


class _Pool:
    """The usable sharing GPUs of one pool, by node, and what its node states offer."""

    def __init__(self, config: PoolConfig) -> None:
        self.dynamic_mig = config.dynamic_mig
        self.mig: _Groups[MigNode, _MigPart] = _Groups()
        self.mps: _Groups[MpsNode, _MpsPart] = _Groups()
        # What a node state offers a request, by (state number, request kind, id of the
        # workload); None when nothing.
        self.takes: dict[tuple[int, Hashable, int], Offer | None] = {}
        self.creates: dict[tuple[int, Hashable, int], Offer | None] = {}
        self.shares: dict[tuple[int, Hashable, int], Offer | None] = {}


class SharingPass:
    """MIG and MPS placement over one snapshot, one job at a time: `place` keeps what it gives
    (or the GPU it asks to reconfigure) for the rest of the pass; `explain` says why a job it
    turned down waits, against the state after the placements so far.

    It reads only the MIG-mode and MPS GPUs, which whole-GPU placement never takes, so it runs
    beside `PlacementPass` on the same snapshot; the nodes' host CPUs and memory they share
    through one `Hosts` ledger.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        packing: Packing = "fragmentation",
        workload: Iterable[JobRequest] | None = None,
        hosts: Hosts | None = None,
    ) -> None:
        """`workload`: the requests fragmentation is measured against (default: the
        snapshot's queue); the replay bench passes the trace's mix. `hosts`: the pass's host
        CPUs and memory, when whole-GPU placement shares them (default: its own)."""
        if packing not in PACKINGS:
            raise ValueError(f"unknown packing {packing!r}; one of {', '.join(PACKINGS)}")
        self.now = snapshot.now
        self.packing = packing
        self._configs = snapshot.pools
        self._book = ReservationBook(snapshot.reservations, snapshot.now)
        self._release: dict[int, float] = {
            job.id: release_at(job, snapshot.now) for job in snapshot.running
        }
        self._mig_counts, self._mps_counts = _counts(
            snapshot.queue if workload is None else workload
        )
        self._mig_workloads: dict[tuple[str | None, MigKind | None], MigWorkload] = {}
        self._mps_workloads: dict[tuple[str | None, MpsKind | None], MpsWorkload] = {}
        self._pools: dict[str | None, _Pool] = {}
        self._mig_gpus: list[_MigGpu] = []
        self._mps_gpus: list[_MpsGpu] = []
        self._hosts = hosts or Hosts(snapshot)
        self._seen = len(self._hosts.changes)  # host changes the parts are filed after
        self._mig_parts: dict[tuple[str | None, str], _MigPart] = {}
        self._mps_parts: dict[tuple[str | None, str], _MpsPart] = {}
        self._creates: dict[int, tuple[MigCreate, _MigGpu]] = {}
        self._fragmentation: dict[tuple[object, ...], float] = {}
        self._explained: dict[tuple[object, ...], tuple[Reason, str, float | None, str | None]]
        self._explained = {}
        # Why a node takes no work ("draining", "offline", "unreachable"), None when it does.
        self._node_down: dict[str, str | None] = {
            info.hostname: None
            if info.schedulable
            else (info.state if info.state != "online" else "unreachable")
            for info in snapshot.nodes
        }
        positions = {name: i for i, name in enumerate(sorted(self._node_down))}
        # In tie-break order, so that each group is built by appending.
        for order, gpu in sorted(((positions[g.node], g.index, g.id), g) for g in snapshot.gpus):
            up = self._node_down[gpu.node] is None
            # A GPU takes shares of its mode only while no work of another kind holds it.
            if gpu.unavailable == MIG_MODE or gpu.mig_slots:
                usable = gpu.unavailable == MIG_MODE and gpu.held_as in (None, MIG_MODE)
                self._add_mig(gpu, order, up and usable)
            elif gpu.unavailable == MPS_MODE or gpu.mps_jobs or gpu.mps_used_percent:
                usable = gpu.unavailable == MPS_MODE and gpu.held_as in (None, MPS_MODE)
                self._add_mps(gpu, order, up and usable)
        # Per hostname, its parts with their pools (to refile when its host figures change).
        self._parts_of: dict[str, list[tuple[str | None, _MigPart | _MpsPart]]] = {}
        for (pool, hostname), mig_part in self._mig_parts.items():
            self._pool(pool).mig.file(mig_part, mig_part.state())
            self._parts_of.setdefault(hostname, []).append((pool, mig_part))
        for (pool, hostname), mps_part in self._mps_parts.items():
            self._pool(pool).mps.file(mps_part, mps_part.state())
            self._parts_of.setdefault(hostname, []).append((pool, mps_part))

    def place(self, job: JobRequest) -> Placement | MigCreate | None:
        """A MIG device or an MPS share for `job`, or a MIG instance to create for it on an
        idle GPU, or None when nothing fits now."""
        self._refresh()
        if job.mig_profile:
            return self._place_mig(job, job.mig_profile)
        if job.mps_percent is not None:
            return self._place_mps(job, job.mps_percent, job.mps_memory_mib or 0)
        raise ValueError(f"job {job.id} asks for whole GPUs, not a share")

    def explain(self, job: JobRequest, position: int) -> Pending:
        """Why `job`, which `place` turned down (or gave a MIG instance to create), waits."""
        self._refresh()
        if job.id in self._creates:
            reason, message, start, what_if = self._explain_create(job.id)
        else:
            key: tuple[object, ...] = (
                job.mig_profile,
                job.mps_percent,
                job.mps_memory_mib,
                job.pool,
                job.gpu_model,
                job.cpus,
                job.host_memory_mib,
            )
            if self._book.by_id:  # reservation windows close GPUs per job
                key += (job.reservation, job.owner, job.max_runtime_s)
            if key not in self._explained:
                if job.mig_profile:
                    self._explained[key] = self._explain_mig(job, job.mig_profile)
                else:
                    self._explained[key] = self._explain_mps(job)
            reason, message, start, what_if = self._explained[key]
        return Pending(job.id, position, reason, message, start, what_if)

    def unusable_gpus(self, requests: Iterable[JobRequest] | None = None) -> float:
        """The free capacity of the usable MIG and MPS GPUs that `requests` (default: the
        snapshot's queue), as a mix, cannot use, in GPUs (docs/development/design-notes.md,
        "MIG and MPS packing")."""
        if requests is None:
            mig_counts, mps_counts = self._mig_counts, self._mps_counts
        else:
            mig_counts, mps_counts = _counts(requests)
        hosts = self._hosts.by_name
        total = 0.0
        for mig in self._mig_gpus:
            if mig.usable and mig.gpu.pool in mig_counts:
                layout = mig.layout()
                creatable = layout.idle and self._config(mig.gpu.pool).dynamic_mig
                workload = Workload.of(mig_counts[mig.gpu.pool])
                host = _host_free(hosts[mig.gpu.node])
                total += _mig_fragmentation(layout, creatable, workload, host)
        for mps in self._mps_gpus:
            if mps.usable and mps.gpu.pool in mps_counts:
                workload_mps = Workload.of(mps_counts[mps.gpu.pool])
                host = _host_free(hosts[mps.gpu.node])
                total += _mps_fragmentation(mps.state(), workload_mps, host)
        return total

    # ------------------------------------------------------------------ building the state

    def _config(self, pool: str | None) -> PoolConfig:
        return self._configs.get(pool) or PoolConfig()

    def _pool(self, pool: str | None) -> _Pool:
        if pool not in self._pools:
            self._pools[pool] = _Pool(self._config(pool))
        return self._pools[pool]

    def _add_mig(self, gpu: GpuSlot, order: Order, usable: bool) -> None:
        table = _table_name(gpu)
        devices = [
            _Device(s.profile, s.placement_start, s.placement_size, s.id, s.allocated_to)
            for s in sorted(gpu.mig_slots, key=lambda s: (s.placement_start, s.id))
        ]
        mig = _MigGpu(gpu, order, table, devices, usable)
        self._mig_gpus.append(mig)
        if usable:
            key = (gpu.pool, gpu.node)
            if key not in self._mig_parts:
                self._mig_parts[key] = _MigPart(order[0], self._hosts.by_name[gpu.node], [])
            self._mig_parts[key].gpus.append(mig)

    def _add_mps(self, gpu: GpuSlot, order: Order, usable: bool) -> None:
        mps = _MpsGpu(
            gpu, order, gpu.mps_used_percent, gpu.mps_used_memory_mib, list(gpu.mps_jobs), usable
        )
        self._mps_gpus.append(mps)
        if usable:
            key = (gpu.pool, gpu.node)
            if key not in self._mps_parts:
                self._mps_parts[key] = _MpsPart(order[0], self._hosts.by_name[gpu.node], [])
            self._mps_parts[key].gpus.append(mps)

    def _refresh(self) -> None:
        """Refile the parts of the nodes whose host figures changed since the last look
        (placements by this pass or, on the shared ledger, by whole-GPU placement)."""
        changes = self._hosts.changes
        if self._seen == len(changes):
            return
        for hostname in set(changes[self._seen :]):
            for pool, part in self._parts_of.get(hostname, ()):
                if isinstance(part, _MigPart):
                    if part.gpus:
                        self._pool(pool).mig.file(part, part.state())
                else:
                    self._pool(pool).mps.file(part, part.state())
        self._seen = len(changes)
        self._explained.clear()  # they describe the host figures before

    def _open_and_held(self, gpus: list[G], job: JobRequest) -> tuple[list[G], list[G]]:
        """`gpus` split into those open to `job` and those reservation windows keep it off."""
        if not self._book.by_id:
            return gpus, []
        held = [gpu for gpu in gpus if self._book.closed(gpu.gpu.id, job)]
        return [gpu for gpu in gpus if gpu not in held], held

    def _closed(self, gpus: list[G], job: JobRequest) -> frozenset[int]:
        """The positions of `gpus` that reservation windows keep `job` off."""
        if not self._book.by_id:
            return frozenset()
        return frozenset(i for i, gpu in enumerate(gpus) if self._book.closed(gpu.gpu.id, job))

    def _best(
        self,
        groups: _Groups[K, E],
        cache: dict[tuple[int, Hashable, int], Offer | None],
        kind: Hashable,
        workload: object,
        offer: Callable[[K, frozenset[int]], Offer | None],
        job: JobRequest,
    ) -> tuple[Offer, E] | None:
        """The best offer over the node states of `groups` (cached per state, `kind` and
        `workload`), with the first node that makes it: the least (rank, node, GPU, device or
        start). Where reservation windows close GPUs to `job`, every node is looked at."""
        best: tuple[tuple[Rank, int, int, int], E] | None = None
        drawn = self.packing == "fragmentation"
        for state, (number, parts) in groups.by_state.items():
            key = (number, kind, id(workload))
            if key not in cache:
                cache[key] = offer(state, frozenset())
            if self._book.by_id:
                looked = parts
            elif drawn:  # nodes in one state tie: one of them, drawn by the job
                looked = [parts[_draw(job.id, number) % len(parts)]]
            else:
                looked = parts[:1]
            for part in looked:
                closed = self._closed(part.gpus, job)
                found = offer(state, closed) if closed else cache[key]
                if found is None:
                    continue
                rank, position, extra = found
                order = _draw(job.id, part.order) if drawn else part.order
                candidate = (rank, order, position, extra)
                if best is None or candidate < best[0]:
                    best = (candidate, part)
        if best is None:
            return None
        (rank, _, position, extra), part = best
        return (rank, position, extra), part

    def _runs_until(self, job: JobRequest) -> float:
        runtime = job.likely_runtime_s
        return math.inf if runtime is None else self.now + runtime

    # ------------------------------------------------------------------ MIG

    def _place_mig(self, job: JobRequest, profile: str) -> Placement | MigCreate | None:
        pool = self._pools.get(job.pool)
        if pool is None:
            return None
        kind = (profile, job.gpu_model, HostAsk.of(job))
        workload = _blended(self._mig_counts, self._mig_workloads, job.pool, kind)

        def take(state: MigNode, closed: frozenset[int]) -> Offer | None:
            return self._take(state, kind, pool.dynamic_mig, workload, closed)

        found = self._best(pool.mig, pool.takes, kind, workload, take, job)
        if found is not None:
            (_, gpu_position, position), part = found
            mig = part.gpus[gpu_position]
            device = mig.devices[position]
            device.holder = job.id
            self._taken(job, part.host)
            pool.mig.file(part, part.state())
            return _mig_placement(job, mig, device)
        if pool.dynamic_mig:
            return self._create_mig(job, kind, pool, workload)
        return None

    def _create_mig(
        self, job: JobRequest, kind: MigKind, pool: _Pool, workload: MigWorkload
    ) -> MigCreate | None:
        """A new instance of the profile on the idle GPU and at the start that spoil the
        least."""

        def create(state: MigNode, closed: frozenset[int]) -> Offer | None:
            return self._create(state, kind, workload, closed)

        found = self._best(pool.mig, pool.creates, kind, workload, create, job)
        if found is None:
            return None
        (_, gpu_position, start), part = found
        profile = kind[0]
        # Reconfigured in this pass: it takes nothing else until the instance exists.
        mig = part.gpus.pop(gpu_position)
        if part.gpus:
            pool.mig.file(part, part.state())
        else:
            pool.mig.discard(part)
        table = _table(mig.table)
        assert table is not None, "_creations needs a table"
        size = table.by_name(profile).memory_slices
        mig.devices.append(_Device(profile, start, size, None, job.id))
        mig.devices.sort(key=attrgetter("start"))
        free = _free_slices(mig.layout())
        create_it = MigCreate(
            job_id=job.id,
            gpu_id=mig.gpu.id,
            profile=profile,
            placement_start=start,
            explanation=(
                f"create a {profile} MIG instance on {mig.gpu.node} GPU {mig.gpu.index} at "
                f"memory slice {start} (dynamic MIG; the GPU is idle); "
                f"{self._fit_phrase()}: leaves {plural(free, 'free compute slice')} there"
            ),
        )
        self._creates[job.id] = (create_it, mig)
        self._taken(job, part.host)
        return create_it

    def _take(
        self,
        state: MigNode,
        kind: MigKind,
        dynamic: bool,
        workload: MigWorkload,
        closed: frozenset[int],
    ) -> Offer | None:
        """Taking the first free device of the profile on one of the node's GPUs (not
        `closed`): the best, with its rank, GPU position and device position."""
        profile, model, ask = kind
        free, layouts = state
        if free is not None and not fits_free(free, ask):
            return None
        later, shift = self._mig_shift(state, ask, dynamic, workload)
        best: Offer | None = None
        for i, layout in enumerate(layouts):
            if i in closed or model not in (None, layout.model):
                continue
            position = layout.first_free(profile)
            if position is None:
                continue
            taken = _replace_device(layout, position, busy=True)
            rank = self._rank(layout, taken, dynamic and layout.idle, workload, later, shift)
            if best is None or rank < best[0]:
                best = (rank, i, position)
        return best

    def _create(
        self, state: MigNode, kind: MigKind, workload: MigWorkload, closed: frozenset[int]
    ) -> Offer | None:
        """The best new instance of the profile on one of the node's idle GPUs (not
        `closed`): its rank, GPU position and placement start; None when none has room."""
        profile, model, ask = kind
        free, layouts = state
        if free is not None and not fits_free(free, ask):
            return None
        later, shift = self._mig_shift(state, ask, True, workload)
        best: Offer | None = None
        for i, layout in enumerate(layouts):
            if i in closed or model not in (None, layout.model) or not layout.idle:
                continue
            for start, created in _creations(layout, profile):
                offer = (self._rank(layout, created, True, workload, later, shift), i, start)
                if best is None or offer < best:
                    best = offer
        return best

    def _mig_shift(
        self, state: MigNode, ask: HostAsk, dynamic: bool, workload: MigWorkload
    ) -> tuple[HostFree, float]:
        """The node's free host figures once `ask` is taken, and how much that alone grows
        the fragmentation of its GPUs as they are (FGD's node rule)."""
        free, layouts = state
        if free is None or self.packing != "fragmentation":
            return free, 0.0
        later = after(free, ask)
        if later == free:
            return free, 0.0
        fragmentation = self._mig_fragmentation
        shift = sum(
            fragmentation(layout, dynamic and layout.idle, workload, later)
            - fragmentation(layout, dynamic and layout.idle, workload, free)
            for layout in layouts
        )
        return later, shift

    def _rank(
        self,
        before: Layout,
        after: Layout,
        creatable: bool,
        workload: MigWorkload,
        host: HostFree = None,
        shift: float = 0.0,
    ) -> Rank:
        """What turning `before` into `after` costs, lower first, by packing. `creatable`:
        the GPU could get new instances before (idle, dynamic MIG); after, it has work.
        `host`: the node's free host figures after; `shift`: what taking them alone adds to
        the node's fragmentation.

        Fragmentation compares F now (what the GPU's work locks away while it runs), then F
        of the layout it leaves (as if the GPU were idle and reconfigurable again: a small
        instance where it spoils the fewest larger ones), then best fit."""
        if self.packing == "first-fit":
            return ()
        left = float(_free_slices(after))
        if self.packing == "best-fit":
            return (left,)
        fragmentation = self._mig_fragmentation
        locked = fragmentation(after, False, workload, host)
        locked -= fragmentation(before, creatable, workload, host)
        room = fragmentation(after, True, workload, host)
        room -= fragmentation(before, True, workload, host)
        return (round(locked + shift, _DIGITS), round(room, _DIGITS), left)

    def _mig_fragmentation(
        self, layout: Layout, creatable: bool, workload: MigWorkload, host: HostFree
    ) -> float:
        # By the workload's id: hashing its kinds each time would cost more than the sum.
        key = (layout, creatable, id(workload), host)
        if key not in self._fragmentation:
            self._fragmentation[key] = _mig_fragmentation(layout, creatable, workload, host)
        return self._fragmentation[key]

    def _fit_phrase(self) -> str:
        return {"fragmentation": "least fragmentation", "best-fit": "best fit"}.get(
            self.packing, "first fit"
        )

    def _taken(self, job: JobRequest, host: Host) -> None:
        """Book the share's end, and its host CPUs and memory on its node."""
        self._release[job.id] = self._runs_until(job)
        self._hosts.take((host.info.hostname,), HostAsk.of(job))
        self._explained.clear()  # the explanations describe the state before this share

    def _explain_create(self, job_id: int) -> tuple[Reason, str, float | None, str | None]:
        create, mig = self._creates[job_id]
        message = (
            f"a {create.profile} MIG instance is being created for it on {mig.gpu.node} "
            f"GPU {mig.gpu.index} (dynamic MIG)"
        )
        return Reason.MIG_RECONFIGURING, message, self.now, None

    def _explain_mig(
        self, job: JobRequest, profile: str
    ) -> tuple[Reason, str, float | None, str | None]:
        model, where = job.gpu_model, _pool_phrase(job.pool)
        offering = [
            mig
            for mig in self._mig_gpus
            if model in (None, mig.gpu.model) and _offers(mig, profile)
        ]
        mine = [mig for mig in offering if mig.gpu.pool == job.pool]
        if not mine:
            message = f"no {gpu_noun(model)} in MIG mode {where} offers the {profile} profile"
            others = sorted({_pool_name(mig.gpu.pool) for mig in offering})
            if others:
                message += f"; {'it is' if len(others) == 1 else 'they are'} in {listing(others)}"
            return Reason.MODEL, message, None, None
        usable = [mig for mig in mine if mig.usable]
        if not usable:
            down = listing([f"{mig.gpu.node} GPU {mig.gpu.index}" for mig in mine])
            reason, whys = self._down([mig.gpu for mig in mine], MIG_MODE)
            message = (
                f"needs a {profile} MIG device; the GPUs in MIG mode that offer it are "
                f"unavailable ({whys}): {down}"
            )
            return reason, message, None, None
        dynamic = self._config(job.pool).dynamic_mig
        ask, device = HostAsk.of(job), f"a {profile} MIG device"
        too_large = self._host_too_large(device, usable, ask)
        if too_large is not None:
            return too_large
        usable, held = self._open_and_held(usable, job)
        if not usable or any(_could_take(mig, profile, dynamic) for mig in held):
            return Reason.RESERVATION, f"needs {device}; {_held(job)}", None, None
        able = [mig for mig in usable if _could_take(mig, profile, dynamic)]
        short = self._host_short(device, able, ask)
        if short is not None:
            return short
        with_devices = [mig for mig in usable if any(d.profile == profile for d in mig.devices)]
        if with_devices:
            found = f"GPUs in MIG mode with that profile: {len(with_devices)}, all in use"
        else:
            found = f"no GPU in MIG mode has a {profile} device"
        if dynamic:
            creating = self._dynamic_phrase(usable, profile, where)
        else:
            creating = f"dynamic MIG is off {where}"
        message = f"needs a free {profile} MIG device; {found}; {creating}"
        return (
            Reason.SHARE_UNAVAILABLE,
            message,
            self._mig_start(usable, profile, dynamic),
            _mig_what_if(usable, profile),
        )

    def _dynamic_phrase(self, usable: list[_MigGpu], profile: str, where: str) -> str:
        # A GPU reconfigured in this pass holds its new instance: it is not idle.
        idle = [mig for mig in usable if mig.layout().idle]
        if not idle:
            return f"dynamic MIG is on {where}, but every GPU in MIG mode there has work on it"
        return (
            f"dynamic MIG is on {where}, but none of the {plural(len(idle), 'idle GPU')} in MIG "
            f"mode has room for a {profile} instance next to its instances"
        )

    def _mig_start(self, usable: list[_MigGpu], profile: str, dynamic: bool) -> float | None:
        """When the first device of `profile` frees up, or (dynamic MIG) the first GPU with
        room for one next to its instances becomes idle."""
        start = math.inf
        for mig in usable:
            for device in mig.devices:
                if device.profile == profile and device.holder is not None:
                    start = min(start, self._release.get(device.holder, math.inf))
            if dynamic:
                idle_layout = Layout(
                    mig.gpu.model, mig.table, tuple((*d[:3], False) for d in mig.layout().devices)
                )
                if any(True for _ in _creations(idle_layout, profile)):
                    holders = [d.holder for d in mig.devices if d.holder is not None]
                    start = min(start, self._released(holders))
        return None if start == math.inf else max(self.now, start)

    def _released(self, holders: Iterable[int]) -> float:
        """When every job of `holders` has ended (now when there is none)."""
        return max((self._release.get(job_id, math.inf) for job_id in holders), default=self.now)

    def _host_too_large(
        self, what: str, gpus: list[G], ask: HostAsk
    ) -> tuple[Reason, str, float | None, str | None] | None:
        """TOO_LARGE when no node of `gpus` (usable ones) could ever hold `ask`."""
        if ask == NO_ASK or not gpus:
            return None
        hosts = {gpu.gpu.node: self._hosts.by_name[gpu.gpu.node] for gpu in gpus}
        if any(host.could_fit(ask) for host in hosts.values()):
            return None
        most = most_phrase(ask, ((h.info.cpus, h.info.memory_mib) for h in hosts.values()))
        message = (
            f"needs {what} and {ask_phrase(ask)} on its node; no node with such a GPU has "
            f"that much (at most {most})"
        )
        return Reason.TOO_LARGE, message, None, None

    def _host_short(
        self, what: str, able: list[G], ask: HostAsk
    ) -> tuple[Reason, str, float | None, str | None] | None:
        """HOST_RESOURCES when GPUs that would take the share now exist (`able`) but none of
        their nodes has `ask` free."""
        if ask == NO_ASK or not able:
            return None
        hosts = {gpu.gpu.node: self._hosts.by_name[gpu.gpu.node] for gpu in able}
        if any(host.fits(ask) for host in hosts.values()):
            return None
        nodes = "the node" if len(hosts) == 1 else f"the {len(hosts)} nodes"
        most = most_phrase(ask, (host.free for host in hosts.values()))
        message = (
            f"needs {what} and {ask_phrase(ask)} on its node; of {nodes} with a GPU that "
            f"has room for it, the most free is {most}"
        )
        return Reason.HOST_RESOURCES, message, None, None

    def _why_down(self, gpu: GpuSlot, mode: str) -> str:
        """Why a GPU listed for sharing in ``mode`` takes nothing: its node's state, else its
        own reason, else the work of another kind still on it (``BUSY_WITH``)."""
        if down := self._node_down[gpu.node]:
            return down
        held_as = gpu.held_as
        if held_as is not None and held_as != mode:
            return BUSY_WITH[held_as]
        if gpu.unavailable != mode:
            return gpu.unavailable or NO_LONGER[mode]
        return "unavailable"

    def _down(self, gpus: Sequence[GpuSlot], mode: str) -> tuple[Reason, str]:
        """The reason and the words for sharing GPUs that all take nothing: busy when it is
        only work of another kind that keeps them, else unavailable."""
        whys = sorted({self._why_down(gpu, mode) for gpu in gpus})
        busy = all(why in BUSY_WITH.values() for why in whys)
        return (Reason.RESOURCES_BUSY if busy else Reason.NODES_UNAVAILABLE), ", ".join(whys)

    # ------------------------------------------------------------------ MPS

    def _place_mps(self, job: JobRequest, percent: int, memory_mib: int) -> Placement | None:
        pool = self._pools.get(job.pool)
        if pool is None:
            return None
        kind = (percent, memory_mib, job.gpu_model, HostAsk.of(job))
        workload = _blended(self._mps_counts, self._mps_workloads, job.pool, kind)

        def share(state: MpsNode, closed: frozenset[int]) -> Offer | None:
            return self._share(state, kind, workload, closed)

        found = self._best(pool.mps, pool.shares, kind, workload, share, job)
        if found is None:
            return None
        (_, position, _), part = found
        mps = part.gpus[position]
        mps.used_percent += percent
        mps.used_memory_mib += memory_mib
        mps.jobs.append(job.id)
        self._taken(job, part.host)
        pool.mps.file(part, part.state())
        gpu = mps.gpu
        memory = f" and {memory_text(memory_mib)}" if memory_mib else ""
        return _on_one_gpu(
            job,
            gpu,
            f"an MPS share of {percent} %{memory} on {gpu.node} GPU {gpu.index}; "
            f"{self._fit_phrase()}: leaves {mps.free_percent} % and "
            f"{memory_text(mps.free_memory_mib)} free on that GPU",
            mps_percent=percent,
            mps_memory_mib=memory_mib,
        )

    def _share(
        self, state: MpsNode, kind: MpsKind, workload: MpsWorkload, closed: frozenset[int]
    ) -> Offer | None:
        """The best GPU of a node in `state` (not `closed`) for a share of `kind`: its rank
        and position; None when none holds it or the node's host does not."""
        free, states = state
        ask = kind[3]
        if free is not None and not fits_free(free, ask):
            return None
        fitting = [i for i, gpu in enumerate(states) if i not in closed and mps_fits(gpu, kind)]
        if not fitting:
            return None
        later, shift = free, 0.0
        if free is not None and self.packing == "fragmentation" and ask != NO_ASK:
            later = after(free, ask)
            fragmentation = self._mps_fragmentation
            shift = sum(
                fragmentation(gpu, workload, later) - fragmentation(gpu, workload, free)
                for gpu in states
            )
        best: Offer | None = None
        for i in fitting:
            gpu = states[i]
            if best is not None and gpu == states[best[1]]:
                continue  # the same rank on a later GPU
            rank = self._mps_rank(gpu, kind, workload, later, shift)
            if best is None or rank < best[0]:
                best = (rank, i, 0)
        return best

    def _mps_rank(
        self, before: MpsState, kind: MpsKind, workload: MpsWorkload, host: HostFree, shift: float
    ) -> Rank:
        """What giving a share of `kind` (that fits) on a GPU in state `before` costs, lower
        first, by packing. `host`: its node's free host figures after; `shift`: what taking
        them alone adds to the node's fragmentation."""
        percent, memory_mib, *_ = kind
        left_state = MpsState(
            before.model, before.free_percent - percent, before.free_memory_mib - memory_mib
        )
        if self.packing == "first-fit":
            return ()
        left = (float(left_state.free_percent), float(left_state.free_memory_mib))
        if self.packing == "best-fit":
            return left
        change = self._mps_fragmentation(left_state, workload, host)
        change -= self._mps_fragmentation(before, workload, host)
        return (round(change + shift, _DIGITS), *left)

    def _mps_fragmentation(self, state: MpsState, workload: MpsWorkload, host: HostFree) -> float:
        key = (state, id(workload), host)
        if key not in self._fragmentation:
            self._fragmentation[key] = _mps_fragmentation(state, workload, host)
        return self._fragmentation[key]

    def _explain_mps(self, job: JobRequest) -> tuple[Reason, str, float | None, str | None]:
        percent, memory_mib, model = job.mps_percent or 0, job.mps_memory_mib or 0, job.gpu_model
        where = _pool_phrase(job.pool)
        share = f"an MPS share of {percent} %" + (
            f" with {memory_text(memory_mib)}" if memory_mib else ""
        )
        shared = [mps for mps in self._mps_gpus if model in (None, mps.gpu.model)]
        mine = [mps for mps in shared if mps.gpu.pool == job.pool]
        if not mine:
            message = f"no {gpu_noun(model)} {where} is shared by MPS"
            others = sorted({_pool_name(mps.gpu.pool) for mps in shared})
            if others:
                message += f"; {'it is' if len(others) == 1 else 'they are'} in {listing(others)}"
            return Reason.MODEL, message, None, None
        largest = max(mps.gpu.memory_total_mib for mps in mine)
        if memory_mib > largest:
            message = (
                f"needs {share}; no {gpu_noun(model)} shared by MPS {where} has that much "
                f"memory, the largest has {memory_text(largest)}"
            )
            return Reason.MEMORY, message, None, None
        usable = [mps for mps in mine if mps.usable]
        if not usable:
            down = listing([f"{mps.gpu.node} GPU {mps.gpu.index}" for mps in mine])
            reason, whys = self._down([mps.gpu for mps in mine], MPS_MODE)
            message = f"needs {share}; the MPS GPUs {where} are unavailable ({whys}): "
            return reason, message + down, None, None
        ask = HostAsk.of(job)
        kind = (percent, memory_mib, model, ask)
        too_large = self._host_too_large(share, usable, ask)
        if too_large is not None:
            return too_large
        usable, held = self._open_and_held(usable, job)
        if not usable or any(mps_fits(mps.state(), kind) for mps in held):
            return Reason.RESERVATION, f"needs {share}; {_held(job)}", None, None
        short = self._host_short(share, [m for m in usable if mps_fits(m.state(), kind)], ask)
        if short is not None:
            return short
        roomy = [mps for mps in usable if mps.free_memory_mib >= memory_mib]
        most = max((mps.free_percent for mps in roomy), default=0)
        if roomy:
            found = f"the most free on one is {most} %"
        else:
            room = max(mps.free_memory_mib for mps in usable)
            found = f"none has {memory_text(memory_mib)} free (the most is {memory_text(room)})"
        message = f"needs {share} of one GPU; {plural(len(usable), 'MPS GPU')} {where}, {found}"
        fits = [mps for mps in usable if mps.gpu.memory_total_mib >= memory_mib]
        start = min((self._released(mps.jobs) for mps in fits), default=math.inf)
        what_if = f"with a share of {most} % it could start now" if 0 < most < percent else None
        return (
            Reason.SHARE_UNAVAILABLE,
            message,
            None if start == math.inf else max(self.now, start),
            what_if,
        )


def unusable_gpus(snapshot: Snapshot, requests: Iterable[JobRequest] | None = None) -> float:
    """GPUs' worth of free MIG and MPS capacity in `snapshot` that `requests` (default: its
    queue), as a mix, cannot use: FGD's fragmentation measure (docs/development/design-notes.md,
    "MIG and MPS packing")."""
    return SharingPass(snapshot).unusable_gpus(requests)


# ---------------------------------------------------------------------- pure helpers


def _counts(
    requests: Iterable[JobRequest],
) -> tuple[dict[str | None, Counter[MigKind]], dict[str | None, Counter[MpsKind]]]:
    """Per pool, how many requests of each MIG and each MPS kind there are."""
    jobs = list(requests)
    mig: dict[str | None, Counter[MigKind]] = {}
    mig_kinds = Counter(
        (job.pool, job.mig_profile, job.gpu_model, HostAsk.of(job))
        for job in jobs
        if job.mig_profile
    )
    for (pool, profile, model, host), n in mig_kinds.items():
        assert profile is not None
        mig.setdefault(pool, Counter())[(profile, model, host)] = n
    mps: dict[str | None, Counter[MpsKind]] = {}
    mps_kinds = Counter(
        (job.pool, job.mps_percent, job.mps_memory_mib or 0, job.gpu_model, HostAsk.of(job))
        for job in jobs
        if job.mps_percent is not None and not job.mig_profile
    )
    for (pool, percent, memory_mib, model, host), n in mps_kinds.items():
        assert percent is not None
        mps.setdefault(pool, Counter())[(percent, memory_mib, model, host)] = n
    return mig, mps


def _blended(
    counts: Mapping[str | None, Counter[KindT]],
    cache: dict[tuple[str | None, KindT | None], Workload[KindT]],
    pool: str | None,
    kind: KindT,
) -> Workload[KindT]:
    """What placing a request of `kind` in `pool` is measured against: the pool's requests
    (or the request alone), with the uniform prior counting as one more request, so that a
    short queue does not decide alone."""
    mine = counts.get(pool)
    key = (pool, None) if mine else (pool, kind)
    if key not in cache:
        cache[key] = Workload.of(mine or {kind: 1}, 1)
    return cache[key]


def _draw(job_id: int, number: int) -> int:
    """A fixed pseudo-random draw (splitmix64's mix) for `job_id` and a node (or state)
    `number`: equal offers go to a node drawn per job, as FGD's scheduler (kube-scheduler)
    picks one of its equal-score nodes at random, rather than always the first by hostname
    (which fills nodes in name order). Fixed, so that a snapshot always gives the same plan."""
    x = (job_id * 0x9E3779B97F4A7C15 + number * 0xBF58476D1CE4E5B9 + 1) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _table_name(gpu: GpuSlot) -> str | None:
    """The MIG table of `gpu`: the one the snapshot names, else the one of its model."""
    if gpu.mig_table is not None:
        return gpu.mig_table
    table = table_for_gpu(gpu.model)
    return None if table is None else table.name


def _table(name: str | None) -> MigTable | None:
    try:
        return None if name is None else load_table(name)
    except ValueError:  # a table this checkout does not have: use the devices as they are
        return None


def _profile(table: MigTable, name: str) -> MigProfile | None:
    return next((p for p in table.profiles if p.name == name), None)


def _slices(table: MigTable | None, profile: str) -> int:
    """Compute slices of a device of `profile` (its table's, else the "<n>g." of its name)."""
    found = None if table is None else _profile(table, profile)
    if found is not None:
        return found.compute_slices
    match = re.match(r"(\d+)g\.", profile)
    return int(match.group(1)) if match else 1


def _free_slices(layout: Layout) -> int:
    """Compute slices no busy device holds (of the free devices when no table is known)."""
    table = _table(layout.table)
    if table is None:
        return sum(_slices(None, name) for name, *_, busy in layout.devices if not busy)
    held = sum(_slices(table, name) for name, *_, busy in layout.devices if busy)
    return table.compute_slices - held


def _placed(table: MigTable, devices: Iterable[Device]) -> list[Placed]:
    ids = {p.name: p.id for p in table.profiles}
    return [Placed(ids.get(name, -1), start, size) for name, start, size, _ in devices]


def _creations(layout: Layout, profile: str) -> Iterable[tuple[int, Layout]]:
    """Each start where NVML would create a `profile` instance next to the layout's instances
    (mig_fit's rules, as the simulator enforces them), with the layout it would give."""
    table = _table(layout.table)
    found = None if table is None else _profile(table, profile)
    if table is None or found is None:
        return
    placed = _placed(table, layout.devices)
    if remaining_capacity(table, placed, found) == 0:
        return
    for start in free_starts(placed, found):
        device = (profile, start, found.memory_slices, True)
        yield start, layout._replace(devices=tuple(sorted((*layout.devices, device))))


def _replace_device(layout: Layout, position: int, *, busy: bool) -> Layout:
    devices = list(layout.devices)
    name, start, size, _ = devices[position]
    devices[position] = (name, start, size, busy)
    return layout._replace(devices=tuple(devices))


def _host_holds(host: HostFree, ask: HostAsk) -> bool:
    """Whether a node with free host figures `host` (None: no limit) holds `ask`."""
    return host is None or fits_free(host, ask)


def _mig_fragmentation(
    layout: Layout, creatable: bool, workload: MigWorkload, host: HostFree = None
) -> float:
    """F of one MIG-mode GPU in GPUs: its free compute slices that each request kind of
    `workload` could not use, weighted by the kind's share (of the uniform prior: the mean
    over the table's profiles). `creatable`: the GPU may get new instances (idle, in a
    dynamic-MIG pool). `host`: its node's free host figures; a kind they do not hold can use
    none of the GPU."""
    table = _table(layout.table)
    if table is None:
        return 0.0
    free = _free_slices(layout)
    if free <= 0:
        return 0.0
    placed = _placed(table, layout.devices)

    def lost(name: str, model: str | None, ask: HostAsk = NO_ASK) -> int:
        """The free slices that requests for `name` (on `model`, asking `ask` of the node)
        cannot use."""
        if model not in (None, layout.model) or not _host_holds(host, ask):
            return free
        count = sum(1 for d in layout.devices if d[0] == name and not d[3])
        profile = _profile(table, name)
        if creatable and profile is not None:
            count += remaining_capacity(table, placed, profile)
        return max(free - count * _slices(table, name), 0)

    total = sum(weight * lost(*kind) for kind, weight in workload.kinds)
    if workload.prior:
        prior = sum(lost(profile.name, None) for profile in table.profiles)
        total += workload.prior * prior / len(table.profiles)
    return total / table.compute_slices


def mps_fits(state: MpsState, kind: MpsKind) -> bool:
    """Whether the GPU's free share holds `kind` (its node's host aside): the pass's rule, and
    manual allocation's (`scheduling.allocations.manual`)."""
    percent, memory_mib, model, _ = kind
    return (
        percent <= state.free_percent
        and memory_mib <= state.free_memory_mib
        and model in (None, state.model)
    )


def _mps_fragmentation(state: MpsState, workload: MpsWorkload, host: HostFree = None) -> float:
    """F of one MPS GPU in GPUs: its free SM share, for the request kinds that do not fit,
    on the GPU or in its node's free host figures `host` (of the uniform prior, the percents
    above the free share)."""
    if state.free_percent <= 0:
        return 0.0
    # mps_fits and _host_holds inlined: this runs for every state a pass compares.
    free_percent, free_memory, model = state.free_percent, state.free_memory_mib, state.model
    cpus, memory = (None, None) if host is None else host
    blocked = 0.0
    for (percent, memory_mib, kind_model, ask), weight in workload.kinds:
        if (
            percent > free_percent
            or memory_mib > free_memory
            or (kind_model is not None and kind_model != model)
            or (cpus is not None and ask.cpus > 0 and cpus < ask.cpus)
            or (memory is not None and ask.memory_mib > 0 and memory < ask.memory_mib)
        ):
            blocked += weight
    blocked += workload.prior * (100 - state.free_percent) / 100
    return state.free_percent / 100 * blocked


def _could_take(mig: _MigGpu, profile: str, dynamic: bool) -> bool:
    """Whether the GPU has a free device of `profile` now, or (dynamic MIG) could get one."""
    if mig.layout().first_free(profile) is not None:
        return True
    return dynamic and mig.layout().idle and any(True for _ in _creations(mig.layout(), profile))


def _held(job: JobRequest) -> str:
    if job.reservation is not None:
        return f"the GPUs of reservation {job.reservation} have none free"
    return (
        "those free now are held by reservations it would still run into (by its maximum runtime)"
    )


def _offers(mig: _MigGpu, profile: str) -> bool:
    """Whether the GPU has a device of `profile` or its table has the profile."""
    if any(device.profile == profile for device in mig.devices):
        return True
    table = _table(mig.table)
    return table is not None and _profile(table, profile) is not None


def _mig_placement(job: JobRequest, mig: _MigGpu, device: _Device) -> Placement:
    gpu = mig.gpu
    free = [d.profile for d in mig.devices if d.holder is None]
    left = "no free MIG device" if not free else f"free: {listing(sorted(free), limit=7)}"
    assert device.slot_id is not None, "only existing devices are placed"
    return _on_one_gpu(
        job,
        gpu,
        f"MIG device {device.profile} on {gpu.node} GPU {gpu.index} (memory slices "
        f"{device.start}-{device.start + device.size - 1}); leaves {left} on that GPU",
        mig_slot=device.slot_id,
    )


def _on_one_gpu(
    job: JobRequest,
    gpu: GpuSlot,
    explanation: str,
    *,
    mig_slot: int | None = None,
    mps_percent: int | None = None,
    mps_memory_mib: int | None = None,
) -> Placement:
    """A share of one GPU (a MIG device or an MPS share) as a placement."""
    return Placement(
        job_id=job.id,
        by_node=((gpu.node, (gpu.id,)),),
        topology_class=TopologyClass.SINGLE,
        numa_nodes=() if gpu.numa_node is None else (gpu.numa_node,),
        score=(0, 0, 0, 0),
        explanation=explanation,
        mig_slot=mig_slot,
        mps_percent=mps_percent,
        mps_memory_mib=mps_memory_mib,
    )


def _mig_what_if(usable: list[_MigGpu], profile: str) -> str | None:
    """The largest other profile with a free device now, if any."""
    free = {
        (_slices(_table(mig.table), d.profile), d.profile)
        for mig in usable
        for d in mig.devices
        if d.holder is None and d.profile != profile
    }
    if not free:
        return None
    return f"with a {max(free)[1]} MIG device instead it could start now"


def _pool_name(pool: str | None) -> str:
    return "no pool" if pool is None else f"pool {pool}"


def _pool_phrase(pool: str | None) -> str:
    return "outside pools" if pool is None else f"in pool {pool}"
