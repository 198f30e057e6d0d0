"""MIG and MPS placement: jobs that take a share of one GPU, packed so that large blocks stay
free.

A MIG job (`JobRequest.mig_profile`, e.g. "3g.40gb") gets a free MIG device of that profile on
a MIG-mode GPU of its pool (`GpuSlot.unavailable == "mig"`). When none is free and the pool
allows dynamic MIG (`PoolConfig.dynamic_mig`), an idle MIG-mode GPU (no device in use) may get
a new GPU instance where NVML allows one next to its existing instances (the GPU model's table
in `inventory.nvml.mig_catalog`, the rules of `inventory.nvml.mig_fit`: free memory slices at
an allowed start, compute slices, instance and device limits). The pass then returns a
`MigCreate`; the GPU takes nothing else in that pass, so it is never reconfigured with work on
it. An MPS job (`mps_percent`, `mps_memory_mib`) gets a share of an MPS GPU
(`unavailable == "mps"`) as long as the shares on it, those given in this pass included, stay
within 100 % of its SMs and within its memory.

Where a share goes: fragmentation gradient descent, after Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent" (USENIX
ATC '23, the paper of Alibaba's "openb" trace). The fragmentation of a GPU relative to a
workload is the free capacity on it that a request drawn from the workload could not use:

    F(gpu) = sum over the workload's request kinds m of  p(m) * (free(gpu) - usable(gpu, m))

- MPS: free is the GPU's free SM percent; a request can use all of it when its percent and
  memory fit, none of it otherwise.
- MIG: free is the compute slices no busy device holds; a profile can use its free devices
  and, on an idle GPU of a dynamic-MIG pool, every further instance NVML would still create.
  Slices that no instance covers on a GPU that cannot be reconfigured are lost to everyone.

The workload is the pass's queue (or the requests the caller names): the MIG (or MPS)
requests of each pool, by profile (or share) and GPU model, weighted by count (a job whose pool
has none stands alone), plus a uniform prior that counts as one more request: every MIG
profile of the GPU's table alike, every MPS percent from 1 to 100 alike. The prior keeps a
short queue from deciding alone: it is what packs shares onto the fullest GPU and puts a 1g
instance where it spoils the fewest larger ones (NVML's own choice on an empty GPU). A share
goes where it raises F the least. For MIG that is compared twice: F now (a device taken on an
idle GPU of a dynamic-MIG pool locks its uncovered slices while the job runs), then F of the
layout left behind, as if the GPU were idle again. Then best fit (the least free capacity
left, so whole GPUs stay free), then the hostname, the GPU index and the placement start. The
classic baselines are there for the replay bench: `packing="best-fit"`, `packing="first-fit"`.

`unusable_gpus` sums F, without the prior, over the MIG and MPS GPUs that can take work, in
GPUs: the free capacity that the waiting requests, as a mix, cannot use (FGD's measure).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Generic, Literal, NamedTuple, TypeVar

from inventory.nvml.mig_catalog import MigProfile, MigTable, load_table, table_for_gpu
from inventory.nvml.mig_fit import Placed, free_starts, remaining_capacity
from scheduling.placement.decisions import MigCreate, Pending, Placement, Reason, TopologyClass
from scheduling.placement.predict import release_at
from scheduling.placement.reservations import ReservationBook
from scheduling.placement.snapshot import GpuSlot, JobRequest, PoolConfig, Snapshot
from scheduling.placement.text import gigabytes, gpu_noun, listing, plural

Packing = Literal["fragmentation", "best-fit", "first-fit"]
PACKINGS: tuple[Packing, ...] = ("fragmentation", "best-fit", "first-fit")

# GpuSlot.unavailable of the GPUs that take shares (inventory.usability.Reason.MIG and MPS).
MIG_MODE = "mig"
MPS_MODE = "mps"

# A MIG device as layouts compare them: (profile, placement start, memory slices, busy).
Device = tuple[str, int, int, bool]
# Request kinds of a workload.
MigKind = tuple[str, str | None]  # (profile, gpu_model)
MpsKind = tuple[int, int, str | None]  # (percent, memory MiB, gpu_model)
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


K = TypeVar("K", bound=Hashable)
E = TypeVar("E", _MigGpu, _MpsGpu)
_by_order = attrgetter("order")


class _Groups(Generic[K, E]):
    """GPUs by state, each group in tie-break order: a choice compares states, not GPUs.
    A state gets a number when first seen, so that what it offers is cached by number."""

    def __init__(self) -> None:
        self.by_state: dict[K, tuple[int, list[E]]] = {}
        self._numbers: dict[K, int] = {}

    def add(self, state: K, gpu: E) -> None:
        if state not in self.by_state:
            self.by_state[state] = (self._numbers.setdefault(state, len(self._numbers)), [])
        group = self.by_state[state][1]
        if not group or group[-1].order < gpu.order:
            group.append(gpu)
        else:
            insort(group, gpu, key=_by_order)

    def remove(self, state: K, gpu: E) -> None:
        group = self.by_state[state][1]
        del group[bisect_left(group, gpu.order, key=_by_order)]
        if not group:
            del self.by_state[state]


class _Pool:
    """The usable sharing GPUs of one pool and what its queue asks for."""

    def __init__(self, config: PoolConfig) -> None:
        self.dynamic_mig = config.dynamic_mig
        self.mig: _Groups[Layout, _MigGpu] = _Groups()
        self.mps: _Groups[MpsState, _MpsGpu] = _Groups()
        # What a state offers a request, by (state number, request, id of the workload):
        # (rank, device position or placement start), None when nothing.
        self.takes: dict[tuple[int, str, int], tuple[Rank, int] | None] = {}
        self.creates: dict[tuple[int, str, int], tuple[Rank, int] | None] = {}
        self.shares: dict[tuple[int, MpsKind, int], Rank | None] = {}


class SharingPass:
    """MIG and MPS placement over one snapshot, one job at a time: `place` keeps what it gives
    (or the GPU it asks to reconfigure) for the rest of the pass; `explain` says why a job it
    turned down waits, against the state after the placements so far.

    It reads only the MIG-mode and MPS GPUs, which whole-GPU placement never takes, so it runs
    beside `PlacementPass` on the same snapshot.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        packing: Packing = "fragmentation",
        workload: Iterable[JobRequest] | None = None,
    ) -> None:
        """`workload`: the requests fragmentation is measured against (default: the
        snapshot's queue); the replay bench passes the trace's mix."""
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
            if gpu.unavailable == MIG_MODE or gpu.mig_slots:
                self._add_mig(gpu, order, up and gpu.unavailable == MIG_MODE)
            elif gpu.unavailable == MPS_MODE or gpu.mps_jobs or gpu.mps_used_percent:
                self._add_mps(gpu, order, up and gpu.unavailable == MPS_MODE)

    def place(self, job: JobRequest) -> Placement | MigCreate | None:
        """A MIG device or an MPS share for `job`, or a MIG instance to create for it on an
        idle GPU, or None when nothing fits now."""
        if job.mig_profile:
            return self._place_mig(job, job.mig_profile)
        if job.mps_percent is not None:
            return self._place_mps(job, job.mps_percent, job.mps_memory_mib or 0)
        raise ValueError(f"job {job.id} asks for whole GPUs, not a share")

    def explain(self, job: JobRequest, position: int) -> Pending:
        """Why `job`, which `place` turned down (or gave a MIG instance to create), waits."""
        if job.id in self._creates:
            reason, message, start, what_if = self._explain_create(job.id)
        else:
            key: tuple[object, ...] = (
                job.mig_profile,
                job.mps_percent,
                job.mps_memory_mib,
                job.pool,
                job.gpu_model,
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
        snapshot's queue), as a mix, cannot use, in GPUs. See the module docstring."""
        if requests is None:
            mig_counts, mps_counts = self._mig_counts, self._mps_counts
        else:
            mig_counts, mps_counts = _counts(requests)
        total = 0.0
        for mig in self._mig_gpus:
            if mig.usable and mig.gpu.pool in mig_counts:
                layout = mig.layout()
                creatable = layout.idle and self._config(mig.gpu.pool).dynamic_mig
                workload = Workload.of(mig_counts[mig.gpu.pool])
                total += _mig_fragmentation(layout, creatable, workload)
        for mps in self._mps_gpus:
            if mps.usable and mps.gpu.pool in mps_counts:
                total += _mps_fragmentation(mps.state(), Workload.of(mps_counts[mps.gpu.pool]))
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
            self._pool(gpu.pool).mig.add(mig.layout(), mig)

    def _add_mps(self, gpu: GpuSlot, order: Order, usable: bool) -> None:
        mps = _MpsGpu(
            gpu, order, gpu.mps_used_percent, gpu.mps_used_memory_mib, list(gpu.mps_jobs), usable
        )
        self._mps_gpus.append(mps)
        if usable:
            self._pool(gpu.pool).mps.add(mps.state(), mps)

    def _open_and_held(self, gpus: list[E], job: JobRequest) -> tuple[list[E], list[E]]:
        """`gpus` split into those open to `job` and those reservation windows keep it off."""
        if not self._book.by_id:
            return gpus, []
        held = [gpu for gpu in gpus if self._book.closed(gpu.gpu.id, job)]
        return [gpu for gpu in gpus if gpu not in held], held

    def _first_open(self, gpus: list[E], job: JobRequest) -> E | None:
        """The first of `gpus` that no reservation window keeps `job` off."""
        if not self._book.by_id:
            return gpus[0]
        return next((gpu for gpu in gpus if not self._book.closed(gpu.gpu.id, job)), None)

    def _runs_until(self, job: JobRequest) -> float:
        runtime = job.likely_runtime_s
        return math.inf if runtime is None else self.now + runtime

    # ------------------------------------------------------------------ MIG

    def _place_mig(self, job: JobRequest, profile: str) -> Placement | MigCreate | None:
        pool = self._pools.get(job.pool)
        if pool is None:
            return None
        kind = (profile, job.gpu_model)
        workload = _blended(self._mig_counts, self._mig_workloads, job.pool, kind)
        best: tuple[Rank, Order, Layout, int, _MigGpu] | None = None
        for layout, (number, gpus) in pool.mig.by_state.items():
            if job.gpu_model not in (None, layout.model):
                continue
            key = (number, profile, id(workload))
            if key not in pool.takes:
                pool.takes[key] = self._take(layout, profile, pool.dynamic_mig, workload)
            offer = pool.takes[key]
            mig = None if offer is None else self._first_open(gpus, job)
            if offer is None or mig is None:
                continue
            rank, position = offer
            if best is None or (rank, mig.order) < best[:2]:
                best = (rank, mig.order, layout, position, mig)
        if best is not None:
            _, _, layout, position, mig = best
            pool.mig.remove(layout, mig)
            device = mig.devices[position]
            device.holder = job.id
            pool.mig.add(mig.layout(), mig)
            self._taken(job)
            return _mig_placement(job, mig, device)
        if pool.dynamic_mig:
            return self._create_mig(job, profile, pool, workload)
        return None

    def _create_mig(
        self, job: JobRequest, profile: str, pool: _Pool, workload: MigWorkload
    ) -> MigCreate | None:
        """A new instance of `profile` on the idle GPU and at the start that spoil the least."""
        best: tuple[Rank, Order, int, Layout, _MigGpu] | None = None
        for layout, (number, gpus) in pool.mig.by_state.items():
            if job.gpu_model not in (None, layout.model):
                continue
            key = (number, profile, id(workload))
            if key not in pool.creates:
                pool.creates[key] = self._create(layout, profile, workload)
            offer = pool.creates[key]
            mig = None if offer is None else self._first_open(gpus, job)
            if offer is None or mig is None:
                continue
            rank, start = offer
            if best is None or (rank, mig.order, start) < best[:3]:
                best = (rank, mig.order, start, layout, mig)
        if best is None:
            return None
        _, _, start, layout, mig = best
        # Reconfigured in this pass: it takes nothing else until the instance exists.
        pool.mig.remove(layout, mig)
        table = _table(mig.table)
        assert table is not None, "_creations needs a table"
        size = table.by_name(profile).memory_slices
        mig.devices.append(_Device(profile, start, size, None, job.id))
        mig.devices.sort(key=attrgetter("start"))
        free = _free_slices(mig.layout())
        create = MigCreate(
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
        self._creates[job.id] = (create, mig)
        self._taken(job)
        return create

    def _take(
        self, layout: Layout, profile: str, dynamic: bool, workload: MigWorkload
    ) -> tuple[Rank, int] | None:
        """The rank of taking the layout's first free device of `profile`, and its position."""
        position = layout.first_free(profile)
        if position is None:
            return None
        after = _replace_device(layout, position, busy=True)
        return self._rank(layout, after, dynamic and layout.idle, workload), position

    def _create(
        self, layout: Layout, profile: str, workload: MigWorkload
    ) -> tuple[Rank, int] | None:
        """The best start for a new `profile` instance on the layout, with its rank; None when
        it has work on it or no room."""
        if not layout.idle:
            return None
        offers = [
            (self._rank(layout, after, True, workload), start)
            for start, after in _creations(layout, profile)
        ]
        return min(offers, default=None)

    def _rank(self, before: Layout, after: Layout, creatable: bool, workload: MigWorkload) -> Rank:
        """What turning `before` into `after` costs, lower first, by packing. `creatable`:
        the GPU could get new instances before (idle, dynamic MIG); after, it has work.

        Fragmentation compares F now (what the GPU's work locks away while it runs), then F
        of the layout it leaves (as if the GPU were idle and reconfigurable again: a small
        instance where it spoils the fewest larger ones), then best fit."""
        if self.packing == "first-fit":
            return ()
        left = float(_free_slices(after))
        if self.packing == "best-fit":
            return (left,)
        fragmentation = self._mig_fragmentation
        locked = fragmentation(after, False, workload) - fragmentation(before, creatable, workload)
        room = fragmentation(after, True, workload) - fragmentation(before, True, workload)
        return (round(locked, _DIGITS), round(room, _DIGITS), left)

    def _mig_fragmentation(self, layout: Layout, creatable: bool, workload: MigWorkload) -> float:
        key = (layout, creatable, workload)
        if key not in self._fragmentation:
            self._fragmentation[key] = _mig_fragmentation(layout, creatable, workload)
        return self._fragmentation[key]

    def _fit_phrase(self) -> str:
        return {"fragmentation": "least fragmentation", "best-fit": "best fit"}.get(
            self.packing, "first fit"
        )

    def _taken(self, job: JobRequest) -> None:
        self._release[job.id] = self._runs_until(job)
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
            whys = sorted({self._why_down(mig.gpu) for mig in mine})
            message = (
                f"needs a {profile} MIG device; the GPUs in MIG mode that offer it are "
                f"unavailable ({', '.join(whys)}): {down}"
            )
            return Reason.NODES_UNAVAILABLE, message, None, None
        dynamic = self._config(job.pool).dynamic_mig
        usable, held = self._open_and_held(usable, job)
        if not usable or any(_could_take(mig, profile, dynamic) for mig in held):
            return Reason.RESERVATION, f"needs a {profile} MIG device; {_held(job)}", None, None
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

    def _why_down(self, gpu: GpuSlot) -> str:
        """Why a sharing GPU takes nothing: its node's state, else its own reason."""
        return self._node_down[gpu.node] or gpu.unavailable or "unavailable"

    # ------------------------------------------------------------------ MPS

    def _place_mps(self, job: JobRequest, percent: int, memory_mib: int) -> Placement | None:
        pool = self._pools.get(job.pool)
        if pool is None:
            return None
        kind = (percent, memory_mib, job.gpu_model)
        workload = _blended(self._mps_counts, self._mps_workloads, job.pool, kind)
        best: tuple[Rank, Order, MpsState, _MpsGpu] | None = None
        for state, (number, gpus) in pool.mps.by_state.items():
            key = (number, kind, id(workload))
            if key not in pool.shares:
                pool.shares[key] = self._mps_rank(state, kind, workload)
            rank = pool.shares[key]
            mps = None if rank is None else self._first_open(gpus, job)
            if rank is None or mps is None:
                continue
            if best is None or (rank, mps.order) < best[:2]:
                best = (rank, mps.order, state, mps)
        if best is None:
            return None
        _, _, state, mps = best
        pool.mps.remove(state, mps)
        mps.used_percent += percent
        mps.used_memory_mib += memory_mib
        mps.jobs.append(job.id)
        pool.mps.add(mps.state(), mps)
        self._taken(job)
        gpu = mps.gpu
        memory = f" and {gigabytes(memory_mib)}" if memory_mib else ""
        return _on_one_gpu(
            job,
            gpu,
            f"an MPS share of {percent} %{memory} on {gpu.node} GPU {gpu.index}; "
            f"{self._fit_phrase()}: leaves {mps.free_percent} % and "
            f"{gigabytes(mps.free_memory_mib)} free on that GPU",
            mps_percent=percent,
            mps_memory_mib=memory_mib,
        )

    def _mps_rank(self, before: MpsState, kind: MpsKind, workload: MpsWorkload) -> Rank | None:
        """What giving a share of `kind` on a GPU in state `before` costs, lower first, by
        packing; None when it does not fit."""
        if not _mps_fits(before, kind):
            return None
        percent, memory_mib, _ = kind
        after = MpsState(
            before.model, before.free_percent - percent, before.free_memory_mib - memory_mib
        )
        if self.packing == "first-fit":
            return ()
        left = (float(after.free_percent), float(after.free_memory_mib))
        if self.packing == "best-fit":
            return left
        change = self._mps_fragmentation(after, workload)
        change -= self._mps_fragmentation(before, workload)
        return (round(change, _DIGITS), *left)

    def _mps_fragmentation(self, state: MpsState, workload: MpsWorkload) -> float:
        key = (state, workload)
        if key not in self._fragmentation:
            self._fragmentation[key] = _mps_fragmentation(state, workload)
        return self._fragmentation[key]

    def _explain_mps(self, job: JobRequest) -> tuple[Reason, str, float | None, str | None]:
        percent, memory_mib, model = job.mps_percent or 0, job.mps_memory_mib or 0, job.gpu_model
        where = _pool_phrase(job.pool)
        share = f"an MPS share of {percent} %" + (
            f" with {gigabytes(memory_mib)}" if memory_mib else ""
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
                f"memory, the largest has {gigabytes(largest)}"
            )
            return Reason.MEMORY, message, None, None
        usable = [mps for mps in mine if mps.usable]
        if not usable:
            down = listing([f"{mps.gpu.node} GPU {mps.gpu.index}" for mps in mine])
            whys = sorted({self._why_down(mps.gpu) for mps in mine})
            message = f"needs {share}; the MPS GPUs {where} are unavailable ({', '.join(whys)}): "
            return Reason.NODES_UNAVAILABLE, message + down, None, None
        usable, held = self._open_and_held(usable, job)
        kind = (percent, memory_mib, model)
        if not usable or any(_mps_fits(mps.state(), kind) for mps in held):
            return Reason.RESERVATION, f"needs {share}; {_held(job)}", None, None
        roomy = [mps for mps in usable if mps.free_memory_mib >= memory_mib]
        most = max((mps.free_percent for mps in roomy), default=0)
        if roomy:
            found = f"the most free on one is {most} %"
        else:
            room = max(mps.free_memory_mib for mps in usable)
            found = f"none has {gigabytes(memory_mib)} free (the most is {gigabytes(room)})"
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
    queue), as a mix, cannot use: FGD's fragmentation measure (see the module docstring)."""
    return SharingPass(snapshot).unusable_gpus(requests)


# ---------------------------------------------------------------------- pure helpers


def _counts(
    requests: Iterable[JobRequest],
) -> tuple[dict[str | None, Counter[MigKind]], dict[str | None, Counter[MpsKind]]]:
    """Per pool, how many requests of each MIG and each MPS kind there are."""
    jobs = list(requests)
    mig: dict[str | None, Counter[MigKind]] = {}
    mig_kinds = Counter(
        (job.pool, job.mig_profile, job.gpu_model) for job in jobs if job.mig_profile
    )
    for (pool, profile, model), n in mig_kinds.items():
        assert profile is not None
        mig.setdefault(pool, Counter())[(profile, model)] = n
    mps: dict[str | None, Counter[MpsKind]] = {}
    mps_kinds = Counter(
        (job.pool, job.mps_percent, job.mps_memory_mib or 0, job.gpu_model)
        for job in jobs
        if job.mps_percent is not None and not job.mig_profile
    )
    for (pool, percent, memory_mib, model), n in mps_kinds.items():
        assert percent is not None
        mps.setdefault(pool, Counter())[(percent, memory_mib, model)] = n
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


def _mig_fragmentation(layout: Layout, creatable: bool, workload: MigWorkload) -> float:
    """F of one MIG-mode GPU in GPUs: its free compute slices that each request kind of
    `workload` could not use, weighted by the kind's share (of the uniform prior: the mean
    over the table's profiles). `creatable`: the GPU may get new instances (idle, in a
    dynamic-MIG pool)."""
    table = _table(layout.table)
    if table is None:
        return 0.0
    free = _free_slices(layout)
    if free <= 0:
        return 0.0
    placed = _placed(table, layout.devices)

    def lost(name: str, model: str | None) -> int:
        """The free slices that requests for `name` (on `model`) cannot use."""
        if model not in (None, layout.model):
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


def _mps_fits(state: MpsState, kind: MpsKind) -> bool:
    percent, memory_mib, model = kind
    return (
        percent <= state.free_percent
        and memory_mib <= state.free_memory_mib
        and model in (None, state.model)
    )


def _mps_fragmentation(state: MpsState, workload: MpsWorkload) -> float:
    """F of one MPS GPU in GPUs: its free SM share, for the request kinds that do not fit
    (of the uniform prior, the percents above the free share)."""
    if state.free_percent <= 0:
        return 0.0
    blocked = sum(weight for kind, weight in workload.kinds if not _mps_fits(state, kind))
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
