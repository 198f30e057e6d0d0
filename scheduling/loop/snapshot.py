"""What a placement pass reads: the fleet, the running jobs and the queue as one snapshot for the
engine, with the rows reused across passes where they did not change.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from functools import cache
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

from django.db.models import (
    BooleanField,
    ExpressionWrapper,
    F,
    FloatField,
    Func,
    Max,
    Q,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, NullIf
from django.utils import timezone

from inventory import live
from inventory.models import Gpu, Node
from inventory.nvlink import GpuPlace, nvlink_domains
from inventory.nvml.mig_catalog import table_for_gpu
from inventory.querysets import heartbeat_cutoff, pool_name
from inventory.usability import refuses_unconfined_jobs, why_unusable
from scheduling import placement
from scheduling.allocations import services as allocation_services
from scheduling.allocations.accounting import gpu_share
from scheduling.jobs import dependencies, shape
from scheduling.loop import history
from scheduling.models import (
    HOLDING_STATES,
    Allocation,
    AllocationKind,
    Job,
    JobState,
    expected_end,
)
from scheduling.policies import quotas
from scheduling.sharing import services as sharing

# How long a pass reuses the fair-share usage an earlier pass read (see _fairshare_usage).
USAGE_MAX_AGE_S = 60.0


# --------------------------------------------------------------------------- snapshot


class NodeRow(NamedTuple):
    """What a pass reads of a node (plain rows: a pass reads thousands of them)."""

    pk: int
    hostname: str
    state: placement.NodeState  # the column's choices (inventory.choices.NodeState)
    last_heartbeat_at: datetime | None
    cpu_count: int | None  # discovered; None: unknown
    memory_total_mib: int | None
    cpus_reserved: int
    memory_reserved_mib: int
    nvml_backend: str
    isolation: str
    allow_unconfined: bool

    @property
    def refuses_unconfined(self) -> bool:
        """Its agent refuses every job (``inventory.usability.refuses_unconfined_jobs``)."""
        return refuses_unconfined_jobs(
            nvml_backend=self.nvml_backend,
            isolation=self.isolation,
            allow_unconfined=self.allow_unconfined,
        )


class GpuRow(NamedTuple):
    """What a pass reads of a GPU."""

    pk: int
    node_id: int
    uuid: str
    # Shadows tuple.index on purpose (the column's name): legal at runtime, refused by mypy.
    index: int  # type: ignore[assignment]
    name: str
    memory_total_mib: int
    numa_node: int | None
    socket: int | None
    state: str
    error_message: str
    mig_enabled: bool
    mps_shared: bool
    held_outside: str  # the work outside gpuadmin holding it (a Slurm job), else empty
    pool: str | None  # its own pool's name, else its node's


# The loop's stored word on a waiting job: pending_code, pending_reason, queue_position,
# estimated_start_at (epoch seconds), what_if (``save_pending`` writes only what differs).
WAIT_FIELDS = ("pending_code", "pending_reason", "queue_position", "estimated_start_at", "what_if")
Wait = tuple[str, str, int | None, float | None, str]


class Epoch(Func):
    """A timestamp column read as epoch seconds (float8; NULL stays None): turning tens of
    thousands of timestamps into aware datetimes costs a pass more than its queries."""

    function = "date_part"
    template = "%(function)s('epoch', %(expressions)s)"
    output_field = FloatField()

    @property
    def convert_value(self) -> Callable[[object, object, object], object]:
        """None: a float8 arrives as a float (Django would call float() on every row)."""
        return self._convert_value_noop  # type: ignore[attr-defined]  # Django's no-op


WAIT_COLUMNS = tuple(Epoch(name) if name == "estimated_start_at" else name for name in WAIT_FIELDS)


def _columns(row: type[tuple], epochs: tuple[str, ...]) -> list[str | Epoch]:
    """The columns of a NamedTuple row type, those named in ``epochs`` as epoch seconds."""
    fields: tuple[str, ...] = row._fields  # type: ignore[attr-defined]
    return [Epoch(name) if name in epochs else name for name in fields]


InputsT = TypeVar("InputsT", bound=tuple)
MadeT = TypeVar("MadeT")


class Reuse(Generic[InputsT, MadeT]):
    """The snapshot's frozen objects of the previous pass, each kept with everything it was
    made from: a row whose inputs compare equal gives the same object again instead of a
    new one (``make`` is a pure function of the inputs, so the object is the one it would
    make). Building a frozen dataclass per row is a visible part of a pass; most rows
    are the same from one pass to the next. Each pass keeps only the rows it read, so a
    changed or gone row is never served."""

    def __init__(self, make: Callable[[InputsT], MadeT]) -> None:
        self._make = make
        self._kept: dict[int, tuple[InputsT, MadeT]] = {}

    def all(self, rows: Iterable[tuple[int, InputsT]]) -> list[MadeT]:
        """The object for each (id, inputs), in order: the kept one when its inputs are
        equal, else a new one."""
        before = self._kept
        kept: dict[int, tuple[InputsT, MadeT]] = {}
        made = []
        for key, inputs in rows:
            known = before.get(key)
            if known is not None and known[0] == inputs:
                kept[key] = known
                made.append(known[1])
            else:
                value = self._make(inputs)
                kept[key] = (inputs, value)
                made.append(value)
        self._kept = kept
        return made


class PassInput(NamedTuple):
    """What a pass reads: the engine's snapshot, its GPU slots by id, the stored word on
    each waiting job, by job id, and the word on each job kept out of the queue by its
    dependencies (what it waits for)."""

    snapshot: placement.Snapshot
    slots: dict[int, placement.GpuSlot]
    waiting: dict[int, Wait]
    dependent: tuple[placement.Pending, ...]


def take_snapshot(
    now: datetime | None = None,
) -> tuple[placement.Snapshot, dict[int, placement.GpuSlot]]:
    """The engine's view of the fleet and the queue, and its GPU slots by id."""
    read = read_pass_input(now)
    return read.snapshot, read.slots


def read_pass_input(now: datetime | None = None) -> PassInput:
    """The fleet, the running jobs, the queue and the pools' policies, quotas, reservations
    and array caps, read in a fixed number of queries as plain rows, whatever their sizes.
    Jobs whose dependencies do not hold yet stay out of the queue."""
    now = now or timezone.now()
    cutoff = heartbeat_cutoff(now)
    nodes = [
        NodeRow._make(row)
        for row in Node.objects.order_by("hostname").values_list(*NodeRow._fields)
    ]
    node_infos = tuple(
        placement.NodeInfo(
            hostname=node.hostname,
            state=node.state,
            reachable=bool(node.last_heartbeat_at and node.last_heartbeat_at >= cutoff),
            cpus=shape.for_jobs(node.cpu_count, node.cpus_reserved),
            memory_mib=shape.for_jobs(node.memory_total_mib, node.memory_reserved_mib),
        )
        for node in nodes
    )
    by_pk = {node.pk: node for node in nodes}
    reachable = {info.hostname for info in node_infos if info.reachable}
    gpus = [
        GpuRow._make(row)
        for row in Gpu.objects.present()
        .order_by("node_id", "index")
        .values_list(*GpuRow._fields[:-1], pool_name())
    ]
    # Whole GPUs are held by one job; MIG devices and MPS shares share theirs.
    held: dict[int, list[int]] = defaultdict(list)
    whole: dict[int, int] = {}
    device_holders: dict[int, int] = {}  # MIG device (MigInstance pk) -> job id
    allocations = Allocation.objects.active().values_list(
        "gpu_id", "job_id", "kind", "mig_instance_id"
    )
    for gpu_id, job_id, kind, device in allocations:
        held[job_id].append(gpu_id)
        if kind == AllocationKind.GPU:
            whole[gpu_id] = job_id
        elif kind == AllocationKind.MIG and device is not None:
            device_holders[device] = job_id
    in_use = {gpu_id for gpu_ids in held.values() for gpu_id in gpu_ids}
    domains = nvlink_domains(
        [GpuPlace(gpu.pk, gpu.node_id, gpu.index, by_pk[gpu.node_id].hostname) for gpu in gpus]
    )
    samples = live.latest_for_loop(sorted(reachable))
    mig_mode = [gpu.pk for gpu in gpus if gpu.mig_enabled]
    devices = sharing.mig_slots(mig_mode, holders=device_holders) if mig_mode else {}
    shares = sharing.mps_use()
    no_share = (0, 0, ())
    places = {
        node.pk: (
            node.hostname,
            node.state,
            node.hostname in reachable,
            node.refuses_unconfined,
            samples.get(node.hostname, {}),
        )
        for node in nodes
    }
    inputs: list[tuple[int, SlotInputs]] = []
    for gpu in gpus:
        hostname, state, heard, refusing, node_samples = places[gpu.node_id]
        inputs.append(
            (
                gpu.pk,
                (
                    gpu,
                    hostname,
                    state,
                    heard,
                    refusing,
                    node_samples.get(gpu.uuid),
                    gpu.pk in in_use,
                    domains.get(gpu.pk),
                    whole.get(gpu.pk),
                    devices.get(gpu.pk, ()),
                    shares.get(gpu.pk, no_share),
                ),
            )
        )
    slots = _slots.all(inputs)
    attained = _attained_service()
    running = tuple(_running_jobs(held, now, attained))
    queue, waiting, dependent = _queue(now, attained)
    configs = quotas.pool_configs()
    snapshot = placement.Snapshot(
        now=now.timestamp(),
        nodes=node_infos,
        gpus=tuple(slots),
        running=running,
        queue=queue,
        pools=MappingProxyType(configs),
        quotas=quotas.quota_limits(now),
        usage=_fairshare_usage(now, configs),
        reservations=allocation_services.reservation_windows(now),
        array_limits=MappingProxyType(dependencies.array_limits()),
    )
    return PassInput(snapshot, {slot.id: slot for slot in slots}, waiting, dependent)


# A GpuSlot is made of its GPU's row; its node's hostname, state, whether its agent was heard
# from lately and whether it refuses unconfined jobs (``NodeRow.refuses_unconfined``); the
# GPU's latest live sample (``live.latest_for_loop``'s) or None; whether an active
# allocation (a job's, a MIG device's or an MPS share's) accounts for its processes; its
# NVLink domain, its whole-GPU holder, its MIG devices and its MPS use: nothing else (see
# ``Reuse``: an unchanged GPU's slot is neither made nor judged usable again).
SlotInputs = tuple[
    GpuRow,
    str,
    str,
    bool,
    bool,
    Mapping[str, Any] | None,
    bool,
    str | None,
    int | None,
    tuple[placement.MigSlot, ...],
    tuple[int, int, tuple[int, ...]],
]


def _gpu_slot(inputs: SlotInputs) -> placement.GpuSlot:
    """A GPU slot made of its inputs alone (``SlotInputs``)."""
    (
        gpu,
        hostname,
        node_state,
        reachable,
        refuses_unconfined,
        sample,
        allocated,
        domain,
        allocated_to,
        devices,
        share,
    ) = inputs
    percent, memory, share_jobs = share
    why = why_unusable(  # the snapshot holds present GPUs only
        node_state=node_state,
        reachable=reachable,
        gpu_state=gpu.state,
        missing=False,
        error_message=gpu.error_message,
        mig_enabled=gpu.mig_enabled,
        sample=sample,
        allocated=allocated,
        mps_shared=gpu.mps_shared,
        refuses_unconfined=refuses_unconfined,
        held_outside=gpu.held_outside,
    )
    return placement.GpuSlot(
        id=gpu.pk,
        uuid=gpu.uuid,
        node=hostname,
        index=gpu.index,
        model=gpu.name,
        memory_total_mib=gpu.memory_total_mib or 0,
        memory_free_mib=_free_mib(gpu, sample),
        numa_node=gpu.numa_node,
        socket=gpu.socket,
        nvlink_domain=domain,
        unavailable=None if why is None else str(why.code),
        allocated_to=allocated_to,
        pool=gpu.pool,
        mig_slots=devices,
        mig_table=_mig_table(gpu.name) if gpu.mig_enabled else None,
        mps_used_percent=percent,
        mps_used_memory_mib=memory,
        mps_jobs=share_jobs,
        held_outside=gpu.held_outside,
    )


_slots: Reuse[SlotInputs, placement.GpuSlot] = Reuse(_gpu_slot)


class HeldRow(NamedTuple):
    """What a pass reads of a job holding GPUs (times in epoch seconds, see ``Epoch``)."""

    pk: int
    started_at: float | None
    scheduled_at: float | None
    estimated_duration_s: int | None
    max_runtime_s: int | None
    owner_id: int
    project: str
    pool__name: str | None
    priority: placement.Priority
    submitted_at: float
    preemptible: bool
    borrowed: bool
    preempt_requested_at: float | None
    cancel_requested_at: float | None
    parts_stopping: bool  # its end decided, its parts on other nodes stopping (``Job.ending``)
    array_id: int | None
    gpu_count: int
    node_count: int
    name: str
    cpus: int
    host_memory_mib: int


HELD_EPOCHS = (
    "started_at",
    "scheduled_at",
    "submitted_at",
    "preempt_requested_at",
    "cancel_requested_at",
)
# A RunningJob is made of its row, its GPUs, the pass's clock when it has no start yet, its
# earlier attempts' service (``_attained_service``) and its predicted end (``history``):
# nothing else (see ``Reuse``).
RunningInputs = tuple[tuple, tuple[int, ...], float | None, "Attained | None", float | None]


def _running_jobs(
    held: Mapping[int, list[int]], now: datetime, attained: Mapping[int, Attained]
) -> list[placement.RunningJob]:
    """The jobs holding GPUs (``held``: their GPU ids, by job id; ``attained``: their earlier
    attempts' service, ``_attained_service``)."""
    # Unordered: the engine orders what it needs (every policy and cost order ends on the id).
    rows = (
        Job.objects.filter(state__in=HOLDING_STATES)
        .order_by()
        .annotate(parts_stopping=ExpressionWrapper(Q(ending__isnull=False), BooleanField()))
        .values_list(*_columns(HeldRow, HELD_EPOCHS))
    )
    clock = now.timestamp()
    started, scheduled = HeldRow._fields.index("started_at"), HeldRow._fields.index("scheduled_at")
    predictor, estimate = history.predictor(now), HeldRow._fields.index("estimated_duration_s")
    return _running.all(
        (
            row[0],
            (
                row,
                tuple(held.get(row[0], ())),
                clock if row[started] is None and row[scheduled] is None else None,
                attained.get(row[0]),
                None
                if row[estimate] is not None
                else history.predicted_end(
                    predictor, HeldRow._make(row), row[started] or row[scheduled]
                ),
            ),
        )
        for row in rows
    )


def _running_job(inputs: RunningInputs) -> placement.RunningJob:
    """A running job made of its inputs alone (``RunningInputs``)."""
    row, gpu_ids, clock, attained, predicted_end = inputs
    job = HeldRow._make(row)
    start = job.started_at if job.started_at is not None else job.scheduled_at
    end = expected_end(epoch_datetime(start), job.estimated_duration_s, job.max_runtime_s)
    return placement.RunningJob(
        id=job.pk,
        gpu_ids=gpu_ids,
        started_at=start if start is not None else clock or 0.0,
        expected_end=_timestamp(end),
        predicted_end=predicted_end,
        owner=str(job.owner_id),
        project=job.project,
        pool=job.pool__name,
        priority=job.priority,
        submitted_at=job.submitted_at,
        preemptible=job.preemptible,
        borrowed=job.borrowed,
        stopping=job.preempt_requested_at is not None
        or job.cancel_requested_at is not None
        or job.parts_stopping,
        array=job.array_id,
        attained_service_s=0.0 if attained is None else attained[0],
        cpus=job.cpus,
        host_memory_mib=job.host_memory_mib,
    )


_running: Reuse[RunningInputs, placement.RunningJob] = Reuse(_running_job)


class QueuedRow(NamedTuple):
    """What a pass reads of a QUEUED job to make its request (times in epoch seconds)."""

    pk: int
    owner_id: int
    priority: placement.Priority
    submitted_at: float
    gpu_count: int
    node_count: int
    min_gpu_memory_mib: int
    gpu_model: str
    topology: placement.TopologyRequirement
    estimated_duration_s: int | None
    max_runtime_s: int | None
    preemptible: bool
    pool__name: str | None
    project: str
    mig_profile: str
    mps_percent: int | None
    mps_memory_mib: int | None
    reservation_id: int | None
    array_id: int | None
    name: str
    cpus: int
    host_memory_mib: int


# A JobRequest is made of its row, its earlier attempts' service and last end, and its
# predicted runtime (``history``): nothing else.
RequestInputs = tuple[tuple, float, datetime | None, float | None]


def _queue(
    now: datetime, attained: Mapping[int, Attained]
) -> tuple[tuple[placement.JobRequest, ...], dict[int, Wait], tuple[placement.Pending, ...]]:
    """The QUEUED jobs whose dependencies hold, as requests; the stored word on every QUEUED
    job; and for those whose dependencies do not hold yet, what they wait for."""
    blocked = dependencies.resolve()
    rows = (
        Job.objects.filter(state=JobState.QUEUED)
        .order_by()  # every policy orders the queue, ties by id
        .values_list(*_columns(QueuedRow, ("submitted_at",)), *WAIT_COLUMNS)
    )
    width = len(QueuedRow._fields)
    predictor, estimate = history.predictor(now), QueuedRow._fields.index("estimated_duration_s")
    inputs: list[tuple[int, RequestInputs]] = []
    waiting: dict[int, Wait] = {}
    for row in rows:
        pk = row[0]
        waiting[pk] = row[width:]
        if pk in blocked:
            continue
        service, last_end = attained.get(pk, (0.0, None))
        predicted = None
        if row[estimate] is None:
            predicted = history.predicted_runtime(predictor, QueuedRow._make(row[:width]))
        inputs.append((pk, (row[:width], service, last_end, predicted)))
    dependent = tuple(
        placement.Pending(
            pk, None, placement.Reason.DEPENDENCY, dependencies.waiting_text(unmet), None, None
        )
        for pk, unmet in blocked.items()
    )
    return tuple(_requests.all(inputs)), waiting, dependent


def _job_request(inputs: RequestInputs) -> placement.JobRequest:
    """A waiting job's request made of its inputs alone (``RequestInputs``)."""
    row, service, last_end, predicted = inputs
    job = QueuedRow._make(row)
    return placement.JobRequest(
        id=job.pk,
        owner=str(job.owner_id),
        priority=job.priority,
        submitted_at=job.submitted_at,
        gpus_per_node=job.gpu_count,
        node_count=job.node_count,
        min_memory_mib=job.min_gpu_memory_mib,
        gpu_model=job.gpu_model or None,
        topology=job.topology,
        estimated_duration_s=job.estimated_duration_s,
        max_runtime_s=job.max_runtime_s,
        preemptible=job.preemptible,
        pool=job.pool__name,
        project=job.project,
        mig_profile=job.mig_profile or None,
        mps_percent=job.mps_percent,
        mps_memory_mib=job.mps_memory_mib,
        reservation=job.reservation_id,
        array=job.array_id,
        attained_service_s=service,
        queued_at=_timestamp(last_end),
        predicted_runtime_s=predicted,
        cpus=job.cpus,
        host_memory_mib=job.host_memory_mib,
    )


_requests: Reuse[RequestInputs, placement.JobRequest] = Reuse(_job_request)


Attained = tuple[float, datetime]  # GPU-seconds of earlier attempts, when the last one ended


def _attained_service() -> dict[int, Attained]:
    """GPU-seconds the earlier attempts of each QUEUED or GPU-holding job held (a share counts
    its part of its GPU, ``accounting.gpu_share``) and when the last of them ended, in one
    grouped query."""
    rows = (
        Allocation.objects.filter(
            job__state__in=(JobState.QUEUED, *HOLDING_STATES), released_at__isnull=False
        )
        .values_list(
            "job_id",
            "kind",
            "gpu__name",
            Coalesce("mig_instance__profile_name", NullIf("job__mig_profile", Value(""))),
            "mps_percent",
        )
        .annotate(held=Sum(F("released_at") - F("allocated_at")), last=Max("released_at"))
        .order_by()
    )
    attained: dict[int, Attained] = {}
    for job_id, kind, gpu_name, profile, percent, duration, last in rows:
        service = gpu_share(kind, gpu_name, profile, percent) * duration.total_seconds()
        if job_id in attained:
            before, last_before = attained[job_id]
            service, last = service + before, max(last, last_before)
        attained[job_id] = (service, last)
    return attained


UsageKey = tuple[str | None, tuple[str, str]]  # as Snapshot.usage's
_usage: tuple[float, Mapping[UsageKey, float] | None] = (0.0, None)


def _fairshare_usage(
    now: datetime, configs: Mapping[str | None, placement.PoolConfig]
) -> Mapping[UsageKey, float]:
    """The pools' decayed fair-share usage (``quotas.fairshare_usage``), read again at most
    every ``USAGE_MAX_AGE_S``: it moves by a fraction of a GPU-hour a minute against usage
    of thousands, and its query reads weeks of allocations."""
    global _usage
    read_at, usage = _usage
    if usage is None or time.monotonic() - read_at > USAGE_MAX_AGE_S:
        fresh: dict[UsageKey, float] = dict(quotas.fairshare_usage(now, configs).items())
        usage = MappingProxyType(fresh)
        _usage = (time.monotonic(), usage)
    return usage


def forget_usage() -> None:
    """Drop the cached fair-share usage (the next pass reads it again)."""
    global _usage
    _usage = (0.0, None)


@cache
def _mig_table(model: str) -> str | None:
    """The name of the MIG placement rules of a GPU model (``inventory.nvml.mig_catalog``)."""
    table = table_for_gpu(model)
    return None if table is None else table.name


def _free_mib(gpu: GpuRow, sample: Mapping[str, Any] | None) -> int:
    total = gpu.memory_total_mib or 0
    if not sample or sample.get("memory_used_mib") is None:
        return total
    return max(total - int(sample["memory_used_mib"]), 0)


def _timestamp(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def epoch_datetime(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)
