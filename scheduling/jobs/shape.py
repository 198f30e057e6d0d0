"""The fleet's shape for submission: what each pool's GPUs could ever hold, so that a job that can
never run is refused when it is submitted rather than left waiting.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from inventory.models import Gpu, Pool
from inventory.nvlink import GpuPlace, nvlink_domains
from inventory.nvml.mig_catalog import table_for_gpu
from inventory.pages.common import short_gpu_name
from inventory.querysets import pool_name
from inventory.units import memory_text
from scheduling import placement
from scheduling.jobs.limits import JobRejected
from scheduling.placement.decisions import Reason
from scheduling.placement.diagnosis import Diagnosis
from scheduling.placement.fleet import Shape, grouping
from scheduling.placement.text import plural


@dataclass
class PoolShape:
    """What the GPUs of one pool (or those in no pool) could ever hold."""

    # model -> (most such GPUs on one node, nodes with them, largest memory in MiB), of the
    # GPUs that take whole-GPU jobs (every GPU but the MPS-shared ones)
    models: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    mig_models: set[str] = field(default_factory=set)  # models of its MIG-capable GPUs
    mps_models: dict[str, int] = field(default_factory=dict)  # MPS-shared: model -> memory MiB
    # The most CPUs and host MiB one of its nodes can give a job (total less reserved); None:
    # a node's is unknown (so any request may fit).
    cpus: int | None = 0
    memory_mib: int | None = 0

    def add_host(self, cpus: int | None, memory_mib: int | None) -> None:
        """Count a node that gives jobs ``cpus`` and ``memory_mib`` (None: unknown)."""
        self.cpus = _most(self.cpus, cpus)
        self.memory_mib = _most(self.memory_mib, memory_mib)

    def mig_profiles(self, gpu_model: str = "") -> dict[str, list[str]]:
        """The MIG profiles its MIG-capable GPUs (of ``gpu_model`` only, when given) have, in
        their tables' order: profile name -> the models that have it."""
        models = sorted({gpu_model} & self.mig_models if gpu_model else self.mig_models)
        profiles: dict[str, list[str]] = {}
        for model in models:
            table = table_for_gpu(model)
            for profile in table.profiles if table is not None else ():
                profiles.setdefault(profile.name, []).append(model)
        return profiles


def _most(known: int | None, other: int | None) -> int | None:
    """The larger, where None (unknown) is larger than any."""
    return None if known is None or other is None else max(known, other)


@dataclass(frozen=True)
class FleetShape:
    """What the fleet could ever hold, per pool, to refuse impossible requests up front. A
    GPU's pool is its own, else its node's; ``None``: the GPUs in no pool, the only ones a job
    without a pool runs on."""

    pools: dict[str | None, PoolShape]
    pool_names: frozenset[str]  # every pool, with GPUs or not
    # The engine's view of each pool's whole-GPU hardware: what it could never run.
    hardware: dict[str | None, Diagnosis] = field(default_factory=dict)

    @classmethod
    def cached(cls, max_age_s: float = 5.0) -> FleetShape:
        """The shape as of at most ``max_age_s`` ago (submissions come in bursts)."""
        global _fleet_shape
        taken_at, shape = _fleet_shape
        if shape is None or time.monotonic() - taken_at > max_age_s:
            shape = cls.now()
            _fleet_shape = (time.monotonic(), shape)
        return shape

    @staticmethod
    def forget() -> None:
        """Drop the cached shape (the next submission reads the fleet again)."""
        global _fleet_shape
        _fleet_shape = (0.0, None)

    @classmethod
    def now(cls) -> FleetShape:
        """Read the fleet: its present GPUs, with their nodes' host figures and NVLink domains,
        and the pools, in three queries however large it is. The shape read last is returned
        again while they are equal (the hardware changes seldom), with what its ``hardware``
        worked out for the requests so far."""
        global _fleet_read
        rows = tuple(
            _GpuShapeRow._make(row)
            for row in Gpu.objects.present()
            .order_by("node_id", "index")
            .values_list(*_GPU_SHAPE_COLUMNS, pool_name())
        )
        domains = nvlink_domains([GpuPlace(*row[:4]) for row in rows])
        names = frozenset(Pool.objects.values_list("name", flat=True))
        read = (rows, names, domains)
        if _fleet_read is not None and _fleet_read[0] == read:
            return _fleet_read[1]
        shape = cls._of(rows, names, domains)
        _fleet_read = (read, shape)
        return shape

    @classmethod
    def _of(
        cls,
        rows: Sequence[_GpuShapeRow],
        names: frozenset[str],
        domains: Mapping[int, str],
    ) -> FleetShape:
        per_node: dict[tuple[str | None, int, str, bool], list[_GpuShapeRow]] = defaultdict(list)
        hosts: dict[int, placement.NodeInfo] = {}
        slots: dict[str | None, list[placement.GpuSlot]] = defaultdict(list)
        for row in rows:
            per_node[row.pool, row.node_id, row.name, row.mps_shared].append(row)
            if row.node_id not in hosts:
                hosts[row.node_id] = placement.NodeInfo(
                    row.hostname,
                    cpus=for_jobs(row.cpu_count, row.cpus_reserved),
                    memory_mib=for_jobs(row.memory_total_mib_node, row.memory_reserved_mib),
                )
            if not row.mps_shared:  # an MPS-shared GPU takes no whole-GPU job
                slots[row.pool].append(_hardware_slot(row, domains.get(row.pk)))
        pools: dict[str | None, PoolShape] = {}
        for (pool, node_id, name, mps_shared), gpus in per_node.items():
            shape = pools.setdefault(pool, PoolShape())
            info = hosts[node_id]
            shape.add_host(info.cpus, info.memory_mib)
            memory = max(gpu.memory_total_mib or 0 for gpu in gpus)
            if mps_shared:
                shape.mps_models[name] = max(shape.mps_models.get(name, 0), memory)
                continue  # nor a MIG device: an MPS-shared GPU is never in MIG mode
            if any(gpu.mig_capable for gpu in gpus):
                shape.mig_models.add(name)
            count, nodes, largest = shape.models.get(name, (0, 0, 0))
            shape.models[name] = (max(count, len(gpus)), nodes + 1, max(largest, memory))
        with_pools = any(pool is not None for pool in pools)
        infos = {info.hostname: info for info in hosts.values()}
        hardware = {}
        for pool, pool_slots in slots.items():
            scope = f"pool {pool}" if pool else "the GPUs in no pool" if with_pools else "the fleet"
            hostnames = sorted({slot.node for slot in pool_slots})
            hardware[pool] = Diagnosis.of_hardware(
                [infos[hostname] for hostname in hostnames], pool_slots, scope
            )
        return cls(pools, names, hardware)

    def mig_profile_offers(self) -> list[tuple[str, str]]:
        """Every MIG profile some GPU has, with where: (``1g.10gb``, ``A100-SXM4-80GB in pool
        a100; H100 80GB HBM3 outside the pools``), for a form to offer (``check`` decides)."""
        where: dict[str, list[str]] = {}
        for pool in sorted(self.pools, key=lambda name: (name is None, name or "")):
            for profile, models in self.pools[pool].mig_profiles().items():
                names = ", ".join(short_gpu_name(model) for model in models)
                where.setdefault(profile, []).append(f"{names} {self.where(pool)}")
        return [(profile, "; ".join(places)) for profile, places in where.items()]

    @property
    def model_names(self) -> set[str]:
        """Every GPU model of the fleet, in any pool, whole, MIG-capable or MPS-shared."""
        return {
            name
            for shape in self.pools.values()
            for name in (*shape.models, *shape.mig_models, *shape.mps_models)
        }

    def where(self, pool: str | None) -> str:
        """``in pool a100``, ``outside the pools``, or ``in the fleet`` when no GPU is in a
        pool."""
        if pool is not None:
            return f"in pool {pool}"
        return "in the fleet" if set(self.pools) <= {None} else "outside the pools"

    def check(
        self,
        *,
        pool: str | None,
        gpu_count: int,
        node_count: int,
        gpu_model: str,
        min_mib: int,
        topology: str = "any",
        mig_profile: str = "",
        mps_memory_mib: int | None = None,
        mps: bool = False,
        cpus: int = 0,
        host_memory_mib: int = 0,
    ) -> None:
        """``JobRejected`` naming the first field no GPU of ``pool`` could ever satisfy (nor
        the host of any: ``cpus`` and ``host_memory_mib`` per node), then, for whole GPUs,
        the field the engine's rule for what the pool could never run (``Diagnosis.never``:
        all of them together, its topology too) points at. The catalog decides, not the
        state: drained and fenced GPUs count."""
        if not self.pools:
            raise JobRejected("gpu_count", "the fleet has no GPUs yet")
        if pool is not None and pool not in self.pool_names:
            pools = ", ".join(sorted(self.pool_names)) or "none"
            raise JobRejected("pool", f"no pool {pool!r}; the pools are: {pools}")
        shape = self.pools.get(pool)
        if shape is None:
            with_gpus = ", ".join(sorted(name for name in self.pools if name is not None))
            if pool is None:
                raise JobRejected("pool", f"every GPU is in a pool: name one of {with_gpus}")
            raise JobRejected("pool", f"pool {pool} has no GPUs; these have: {with_gpus}")
        if mig_profile:
            self._check_mig(pool, shape, gpu_model, mig_profile)
        elif mps:
            self._check_mps(pool, shape, gpu_model, mps_memory_mib)
        else:
            self._check_whole(pool, shape, gpu_count, node_count, gpu_model, min_mib)
        if shape.cpus is not None and cpus > shape.cpus:
            raise JobRejected(
                "cpus",
                f"{cpus} CPUs per node, but no node {self.where(pool)} has more than "
                f"{shape.cpus} for jobs",
            )
        if shape.memory_mib is not None and host_memory_mib > shape.memory_mib:
            raise JobRejected(
                "host_memory_mib",
                f"{memory_text(host_memory_mib)} per node, but no node {self.where(pool)} has "
                f"more than {memory_text(shape.memory_mib)} for jobs",
            )
        if not mig_profile and not mps:
            ask = Shape(
                gpu_count,
                node_count,
                min_mib,
                gpu_model or None,
                grouping(topology),
                cpus,
                host_memory_mib,
            )
            self._check_hardware(self.hardware[pool], ask)

    @staticmethod
    def _check_hardware(hardware: Diagnosis, ask: Shape) -> None:
        """``JobRejected`` when the engine says ``hardware`` could never run ``ask``, naming
        the field at fault: the topology, the memory, the host figures (when the GPUs alone
        would do), else the size."""
        never = hardware.never(ask)
        if never is None:
            return
        reason, message = never
        field = _NEVER_FIELDS.get(reason)
        if field is None:
            host_only = ask.cpus or ask.host_memory_mib
            if host_only and hardware.never(ask._replace(cpus=0, host_memory_mib=0)) is None:
                field = "cpus" if ask.cpus else "host_memory_mib"
            else:
                field = "node_count" if ask.node_count > 1 else "gpu_count"
        raise JobRejected(field, message)

    def _check_whole(
        self,
        pool: str | None,
        shape: PoolShape,
        gpu_count: int,
        node_count: int,
        gpu_model: str,
        min_mib: int,
    ) -> None:
        if not shape.models:
            raise JobRejected(
                "gpu_count",
                f"every GPU {self.where(pool)} is MPS-shared: ask for a share (mps_percent)",
            )
        if gpu_model and gpu_model not in shape.models:
            known = ", ".join(sorted(shape.models))
            has = {"in the fleet": "the fleet has", "outside the pools": "the GPUs in no pool are"}
            where = has.get(self.where(pool), f"pool {pool} has")
            raise JobRejected("gpu_model", f"no GPU model {gpu_model!r}; {where}: {known}")
        candidates = [shape.models[gpu_model]] if gpu_model else list(shape.models.values())
        largest = max(count for count, _, _ in candidates)
        if gpu_count > largest:
            what = f"{gpu_model} " if gpu_model else ""
            raise JobRejected(
                "gpu_count",
                f"{plural(gpu_count, 'GPU')} per node, but no node has more than {largest} "
                f"{what}GPUs",
            )
        memory = max(mib for _, _, mib in candidates)
        if min_mib > memory:
            raise JobRejected(
                "min_gpu_memory_mib",
                f"{memory_text(min_mib)} per GPU, but the largest GPU has {memory_text(memory)}",
            )
        nodes = sum(nodes for count, nodes, _ in candidates if count >= gpu_count)
        if node_count > nodes:
            raise JobRejected(
                "node_count",
                f"{plural(node_count, 'node')} with {plural(gpu_count, 'GPU')} each, but only "
                f"{plural(nodes, 'node')} {'has' if nodes == 1 else 'have'} that many",
            )

    def _check_mig(self, pool: str | None, shape: PoolShape, gpu_model: str, profile: str) -> None:
        where = self.where(pool)
        if gpu_model and gpu_model not in shape.mig_models:
            raise JobRejected("gpu_model", f"no MIG-capable {gpu_model} {where}")
        if not shape.mig_models:
            raise JobRejected("mig_profile", f"no MIG-capable GPU {where}")
        known = shape.mig_profiles(gpu_model)
        if profile not in known:
            raise JobRejected(
                "mig_profile",
                f"no MIG-capable GPU {where} has a {profile!r} profile; they have: "
                f"{', '.join(known) or 'none known'}",
            )

    def _check_mps(
        self, pool: str | None, shape: PoolShape, gpu_model: str, memory_mib: int | None
    ) -> None:
        where = self.where(pool)
        memories = [mib for model, mib in shape.mps_models.items() if gpu_model in ("", model)]
        if not memories:
            what = f"{gpu_model} " if gpu_model else ""
            raise JobRejected("mps_percent", f"no MPS-shared {what}GPU {where}")
        if memory_mib is not None and memory_mib > max(memories):
            raise JobRejected(
                "mps_memory_mib",
                f"{memory_text(memory_mib)}, but the largest MPS-shared GPU {where} has "
                f"{memory_text(max(memories))}",
            )


_fleet_shape: tuple[float, FleetShape | None] = (0.0, None)
# What ``FleetShape.now`` read last (GPU rows, pool names, NVLink domains), and its shape.
_fleet_read: tuple[tuple[object, ...], FleetShape] | None = None
# The request field each of the engine's "never" reasons points at (TOO_LARGE: see
# ``FleetShape._check_hardware``).
_NEVER_FIELDS = {
    Reason.MODEL: "gpu_model",
    Reason.MEMORY: "min_gpu_memory_mib",
    Reason.TOPOLOGY: "topology",
}


class _GpuShapeRow(NamedTuple):
    """What ``FleetShape`` reads of a GPU and its node."""

    pk: int
    node_id: int
    # Shadows tuple.index on purpose (the column's name): legal at runtime, refused by mypy.
    index: int  # type: ignore[assignment]
    hostname: str
    name: str
    memory_total_mib: int | None
    numa_node: int | None
    socket: int | None
    mig_capable: bool
    mps_shared: bool
    cpu_count: int | None
    memory_total_mib_node: int | None
    cpus_reserved: int
    memory_reserved_mib: int
    pool: str | None  # its own pool's name, else its node's


_GPU_SHAPE_COLUMNS = (
    "pk",
    "node_id",
    "index",
    "node__hostname",
    "name",
    "memory_total_mib",
    "numa_node",
    "socket",
    "mig_capable",
    "mps_shared",
    "node__cpu_count",
    "node__memory_total_mib",
    "node__cpus_reserved",
    "node__memory_reserved_mib",
)


def _hardware_slot(row: _GpuShapeRow, domain: str | None) -> placement.GpuSlot:
    """A GPU as bare hardware, as the engine groups it (model, memory, NUMA, NVLink)."""
    memory = row.memory_total_mib or 0
    return placement.GpuSlot(
        id=row.pk,
        uuid="",
        node=row.hostname,
        index=row.index,
        model=row.name,
        memory_total_mib=memory,
        memory_free_mib=memory,
        numa_node=row.numa_node,
        socket=row.socket,
        nvlink_domain=domain,
        pool=row.pool,
    )


def for_jobs(total: int | None, reserved: int) -> int | None:
    """What jobs may be given of a node's ``total`` CPUs or host MiB: the total less what is
    ``reserved`` (at least 0); None when the total is unknown, and then no limit. The one
    rule: the placement loop's snapshot and the submission checks use it."""
    return None if total is None else max(total - reserved, 0)
