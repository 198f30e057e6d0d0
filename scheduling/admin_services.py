"""Operator and admin actions on the scheduler, each audited in the transaction of its change:
the placement loop's switch, each pool's policy, and GPUs given to or taken from a job by hand.

Manual allocations (whole GPUs, a MIG device, an MPS share) go through ``services.allocate``
like the loop's, so the same row locks, partial unique indexes, sharing trigger and commit
checks refuse what is taken; a release ends the job through
``services.cancel_job``, so a GPU is never handed on while the job's processes still run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import transaction

from gpuadmin.audit.services import changed_values, record
from gpuadmin.refusals import FieldRefusal
from inventory.models import Gpu, MigInstance, Pool
from inventory.units import memory_text
from scheduling import dispatch, placement, quotas, services, sharing
from scheduling.models import (
    Allocation,
    AllocationKind,
    Job,
    JobState,
    PolicyName,
    PoolPolicy,
    SchedulerSettings,
)
from scheduling.placement.hosts import NO_ASK
from scheduling.placement.text import indexes_phrase, plural


class AllocationInvalid(FieldRefusal):
    """A manual allocation that does not fit the job's request, naming the field."""


# --------------------------------------------------------------------------- the loop


def _locked_settings() -> SchedulerSettings:
    SchedulerSettings.load()  # the row exists from now on
    return SchedulerSettings.objects.select_for_update().get(pk=1)


def set_scheduler_enabled(enabled: bool, *, actor: User) -> SchedulerSettings:
    """Start or stop placing jobs (audited ``scheduler.started``/``scheduler.stopped``; a
    no-op when it already is). Either wakes the loop: a pass of a started scheduler places
    jobs, one of a stopped scheduler tells every waiting job so (``loop.explain_stopped``)."""
    with transaction.atomic():
        config = _locked_settings()
        if config.enabled != enabled:
            config.enabled = enabled
            config.save(update_fields=["enabled", "updated_at"])
            record(
                "scheduler.started" if enabled else "scheduler.stopped",
                actor=actor,
                target=config,
                before={"enabled": not enabled},
                after={"enabled": enabled},
            )
            services.request_placement_pass()
    return config


# What each policy field may say: (least, most) for numbers (the API's, the admin's and the
# service's bounds); the signals a job may be asked to checkpoint on before its grace ends.
POLICY_LIMITS: dict[str, tuple[int, int]] = {
    "aging_interval_s": (1, 7 * 24 * 3600),
    "fairshare_half_life_s": (60, 365 * 24 * 3600),
    "fairshare_weight": (0, 1_000_000),
    "preempt_grace_s": (0, 3600),
    "preempt_exempt_s": (0, 7 * 24 * 3600),
    "reservation_release_after_s": (0, 7 * 24 * 3600),
    "qssf_points_per_halving": (1, 100_000),
    "prediction_trust_intervals": (0, 1_000_000),
}
LAS_THRESHOLDS_MAX = 8  # queues of least attained service: at most 9
LAS_THRESHOLD_LIMITS = (1, 10**9)  # GPU-seconds
PREEMPT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
POLICY_FIELDS: tuple[str, ...] = (
    "policy",
    "backfill",
    "aging_interval_s",
    "fairshare_half_life_s",
    "fairshare_weight",
    "las_thresholds_gpu_s",
    "qssf_points_per_halving",
    "prediction_trust_intervals",
    "allow_borrowing",
    "preemption",
    "preempt_exempt_s",
    "preempt_signal",
    "preempt_grace_s",
    "dynamic_mig",
    "reservation_auto_approve",
    "reservation_release_after_s",
)
BOOLEAN_POLICY_FIELDS = frozenset(
    {"backfill", "allow_borrowing", "preemption", "dynamic_mig", "reservation_auto_approve"}
)


class PolicyInvalid(FieldRefusal):
    """A policy value that cannot be set, naming the field and why."""


def _bounded(field: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyInvalid(field, "a whole number")
    try:
        MinValueValidator(low)(value)
        MaxValueValidator(high)(value)
    except ValidationError as exc:
        raise PolicyInvalid(field, exc.messages[0]) from None


def check_policy(fields: Mapping[str, Any]) -> None:
    """``PolicyInvalid`` naming the first of ``fields`` (policy field -> new value) that a
    pool's policy cannot take."""
    for name, value in fields.items():
        if name not in POLICY_FIELDS:
            raise PolicyInvalid(name, "not a policy setting")
        if name == "policy" and value not in PolicyName.values:
            raise PolicyInvalid(name, f"one of {', '.join(PolicyName.values)}")
        if name in BOOLEAN_POLICY_FIELDS and not isinstance(value, bool):
            raise PolicyInvalid(name, "true or false")
        if name in POLICY_LIMITS:
            _bounded(name, value, *POLICY_LIMITS[name])
        if name == "preempt_signal" and value not in PREEMPT_SIGNALS:
            raise PolicyInvalid(name, f"one of {', '.join(PREEMPT_SIGNALS)}")
        if name == "las_thresholds_gpu_s":
            if not isinstance(value, list | tuple) or len(value) > LAS_THRESHOLDS_MAX:
                raise PolicyInvalid(name, f"a list of at most {LAS_THRESHOLDS_MAX} GPU-seconds")
            for threshold in value:
                _bounded(name, threshold, *LAS_THRESHOLD_LIMITS)
            if list(value) != sorted(set(value)):
                raise PolicyInvalid(name, "GPU-seconds in increasing order, each once")


def set_pool_policy(pool: Pool | None, *, actor: User, **fields: Any) -> PoolPolicy:
    """Change ``pool``'s policy (None: the GPUs in no pool): ``PolicyInvalid`` names a bad
    value; the fields that change are audited ``scheduler.policy_changed`` (before/after, the
    pool in the message) and the loop is woken to re-order its queue. A pool without a policy
    row gets one with its first change (nothing is written when nothing changes: its
    ``updated_at`` stays null, "the defaults, never changed")."""
    check_policy(fields)

    def changes(config: PoolPolicy) -> tuple[dict[str, Any], dict[str, Any]]:
        return changed_values({name: getattr(config, name) for name in fields}, fields)

    with transaction.atomic():
        locked = PoolPolicy.objects.select_for_update()
        config = locked.filter(pool=pool).first() or PoolPolicy(pool=pool)
        if config.pk is None and changes(config)[1]:
            PoolPolicy.objects.get_or_create(pool=pool)
            config = locked.get(pool=pool)
        old, new = changes(config)
        if new:
            for name, value in new.items():
                setattr(config, name, value)
            config.save(update_fields=[*new, "updated_at"])
            record(
                "scheduler.policy_changed",
                actor=actor,
                target=config,
                before=old,
                after=new,
                message=f"policy of {quotas.pool_label(pool.name if pool else None)}",
            )
            services.request_placement_pass()
    return config


# --------------------------------------------------------------------------- by hand


def allocate_by_hand(job: Job, gpu_uuids: list[str], *, actor: User) -> list[Allocation]:
    """Give a QUEUED job what ``gpu_uuids`` names and send it to its nodes, as the loop would:
    whole GPUs; to a MIG job a free MIG device of its profile on the one GPU named (the lowest
    placement start first, as the loop) or the MIG device named; to an MPS job its share of
    the one MPS-shared GPU named.

    What is named must fit the request (``gpu_count`` GPUs on each of ``node_count`` nodes,
    of ``gpu_model`` and ``min_gpu_memory_mib`` when set, and of the kind it asks for); the
    topology is the operator's choice. ``AllocationInvalid`` naming ``gpu_uuids`` for what
    does not fit; ``AllocationRefused`` (nothing written) when the job is not queued, or what
    is named is taken or the commit's checks (``services.allocate``) refuse it."""
    share = _share_for(job, gpu_uuids)
    if job.state != JobState.QUEUED:
        raise services.AllocationRefused(
            f"job {job.pk} is {job.state}: only a queued job can be given GPUs"
        )
    if share.taken:
        raise services.AllocationRefused(share.taken)
    gpus = share.gpus
    why = {
        "topology_class": "manual",
        "numa_nodes": sorted({gpu.numa_node for gpu in gpus if gpu.numa_node is not None}),
        "score": [],
        "explanation": f"allocated by hand by {actor.get_username()}: {share.what(job)}",
        "nodes": share.by_node(),
    }
    try:
        with transaction.atomic():
            rows = services.allocate(
                job,
                [gpu.pk for gpu in gpus],
                actor=actor,
                placement=why,
                manual=True,
                mig_instance=share.device.id if share.device else None,
                mps_percent=job.mps_percent,
                # The loop's grant: no limit asked is 0 (scheduling.placement.sharing).
                mps_memory_mib=None if job.mps_percent is None else job.mps_memory_mib or 0,
            )
            transaction.on_commit(lambda: dispatch.dispatch(job.pk))
    except services.AllocationRefused:
        holders = (
            Allocation.objects.active()
            .filter(gpu__in=gpus, kind=AllocationKind.GPU)
            .exclude(job=job)
            .values_list("gpu__uuid", "job_id")
            .order_by("gpu__uuid")
        )
        if job.allocation_kind != AllocationKind.GPU or not holders:
            raise
        raise services.AllocationRefused(
            "; ".join(f"GPU {uuid} is allocated to job {holder}" for uuid, holder in holders)
        ) from None
    return rows


@dataclass(frozen=True)
class _Share:
    """What a manual allocation gives: whole GPUs, or the MIG device ``device`` of its one
    GPU, or (the job asking one) an MPS share of its one GPU; ``taken``: why not now, when
    the device or the GPU's MPS capacity is taken (whole GPUs taken are the commit's to find,
    by its unique index)."""

    gpus: list[Gpu]
    device: placement.MigSlot | None = None
    taken: str = ""

    def by_node(self) -> dict[str, list[int]]:
        """The GPUs' indexes by hostname, in order (``Job.placement``'s ``nodes``)."""
        nodes: dict[str, list[int]] = {}
        for gpu in sorted(self.gpus, key=lambda g: (g.node.hostname, g.index)):
            nodes.setdefault(gpu.node.hostname, []).append(gpu.index)
        return nodes

    def what(self, job: Job) -> str:
        """``GPUs 2-3 on dgx-01``, ``GPU 2 on dgx-01; GPU 5 on dgx-02``, ``MIG device 3g.20gb
        (MIG-...) of GPU 0 on dgx-01``, ``an MPS share of 30 % of GPU 2 on dgx-01``."""
        if self.device is not None or job.mps_percent is not None:
            [gpu] = self.gpus
            where = f"GPU {gpu.index} on {gpu.node.hostname}"
            if self.device is None:
                return f"{_asks(job)} of {where}"
            return f"MIG device {self.device.profile} ({self.device.uuid}) of {where}"
        return "; ".join(f"{indexes_phrase(idx)} on {host}" for host, idx in self.by_node().items())


def _asks(job: Job) -> str:
    """What the job asks for, in words: ``whole GPUs``, ``a 3g.20gb MIG device``, ``an MPS
    share of 30 % and 4096 MiB``."""
    if job.mig_profile:
        return f"a {job.mig_profile} MIG device"
    if job.mps_percent is not None:
        memory = f" and {memory_text(job.mps_memory_mib)}" if job.mps_memory_mib else ""
        return f"an MPS share of {job.mps_percent} %{memory}"
    return services.KIND_WORDS[AllocationKind.GPU]


def _shared_as(gpu: Gpu) -> AllocationKind:
    """What a GPU gives: MIG devices in MIG mode, shares when MPS-shared, else itself."""
    if gpu.mig_enabled:
        return AllocationKind.MIG
    return AllocationKind.MPS if gpu.mps_shared else AllocationKind.GPU


# Why a GPU of another kind than the job asks for cannot be given, by what it gives.
_GIVES = {
    AllocationKind.GPU: "is neither in MIG mode nor shared through MPS",
    AllocationKind.MIG: "is in MIG mode (only its MIG devices can be given)",
    AllocationKind.MPS: "is shared through MPS (only shares of it can be given)",
}


def _share_for(job: Job, gpu_uuids: list[str]) -> _Share:
    """What the UUIDs name (present GPUs, or MIG devices of them), checked against the job's
    request; ``AllocationInvalid`` naming ``gpu_uuids``."""
    duplicates = sorted(uuid for uuid, n in Counter(gpu_uuids).items() if n > 1)
    if duplicates:
        raise AllocationInvalid("gpu_uuids", f"named twice: {', '.join(duplicates)}")
    present = Gpu.objects.present().select_related("node")
    gpus = list(present.filter(uuid__in=gpu_uuids))
    devices = list(
        MigInstance.objects.filter(
            uuid__in=set(gpu_uuids) - {gpu.uuid for gpu in gpus}, gpu__in=present
        ).select_related("gpu__node")
    )
    unknown = sorted(set(gpu_uuids) - {gpu.uuid for gpu in gpus} - {d.uuid for d in devices})
    if unknown:
        raise AllocationInvalid(
            "gpu_uuids", f"no present GPU or MIG device has UUID {', '.join(unknown)}"
        )
    wanted = job.allocation_kind
    if devices and wanted != AllocationKind.MIG:
        raise AllocationInvalid(
            "gpu_uuids",
            f"{devices[0].uuid} is a MIG device; job {job.pk} asks for {_asks(job)}",
        )
    gpus += [device.gpu for device in devices]
    _check_shape(job, gpus)
    for gpu in gpus:
        if _shared_as(gpu) != wanted:
            raise AllocationInvalid(
                "gpu_uuids",
                f"GPU {gpu.uuid} {_GIVES[_shared_as(gpu)]}; job {job.pk} asks for {_asks(job)}",
            )
    if wanted == AllocationKind.MIG:
        return _mig_device(job, gpus[0], devices[0] if devices else None)
    if wanted == AllocationKind.MPS:
        return _mps_share(job, gpus[0])
    return _Share(gpus)


def _check_shape(job: Job, gpus: list[Gpu]) -> None:
    """``gpu_count`` GPUs on each of ``node_count`` nodes, of the model and memory asked."""
    per_node = Counter(gpu.node.hostname for gpu in gpus)
    if len(per_node) != job.node_count or set(per_node.values()) != {job.gpu_count}:
        got = ", ".join(f"{n} on {host}" for host, n in sorted(per_node.items()))
        raise AllocationInvalid(
            "gpu_uuids",
            f"job {job.pk} needs {plural(job.gpu_count, 'GPU')} on each of "
            f"{plural(job.node_count, 'node')}; "
            f"got {got}",
        )
    for gpu in gpus:
        if job.gpu_model and gpu.name != job.gpu_model:
            raise AllocationInvalid(
                "gpu_uuids", f"GPU {gpu.uuid} is a {gpu.name}; job {job.pk} needs {job.gpu_model}"
            )
        if gpu.memory_total_mib < job.min_gpu_memory_mib:
            raise AllocationInvalid(
                "gpu_uuids",
                f"GPU {gpu.uuid} has {memory_text(gpu.memory_total_mib)}; job {job.pk} needs "
                f"{memory_text(job.min_gpu_memory_mib)}",
            )


def _mig_device(job: Job, gpu: Gpu, named: MigInstance | None) -> _Share:
    """The MIG device of ``gpu`` a MIG job gets: the one named, else the free device of its
    profile with the lowest placement start (the loop's choice on one GPU). Devices as the
    loop sees them (``sharing.mig_slots``: a compute instance filling its GPU instance)."""
    slots = sharing.mig_slots([gpu.pk]).get(gpu.pk, ())
    if named is not None:
        slot = next((slot for slot in slots if slot.id == named.pk), None)
        if slot is None:
            raise AllocationInvalid(
                "gpu_uuids",
                f"MIG device {named.uuid} is a compute instance of part of its GPU instance, "
                f"not a whole MIG device",
            )
        if slot.profile != job.mig_profile:
            raise AllocationInvalid(
                "gpu_uuids",
                f"MIG device {slot.uuid} is a {slot.profile}; job {job.pk} asks for {_asks(job)}",
            )
        held = slot.allocated_to
        taken = "" if held is None else f"MIG device {slot.uuid} is allocated to job {held}"
        return _Share([gpu], slot, taken)
    mine = [slot for slot in slots if slot.profile == job.mig_profile]
    if not mine:
        has = ", ".join(slot.profile for slot in slots) or "none"
        raise AllocationInvalid(
            "gpu_uuids",
            f"GPU {gpu.uuid} has no {job.mig_profile} MIG device (its devices: {has}); "
            f"job {job.pk} asks for {_asks(job)}",
        )
    free = next((slot for slot in mine if slot.allocated_to is None), None)
    if free is None:
        holders = ", ".join(str(slot.allocated_to) for slot in mine)
        taken = (
            f"every {job.mig_profile} MIG device of GPU {gpu.uuid} is allocated (to jobs {holders})"
        )
        return _Share([gpu], mine[0], taken)
    return _Share([gpu], free)


def _mps_share(job: Job, gpu: Gpu) -> _Share:
    """An MPS job's share of ``gpu``: taken when the GPU's shares leave less than it asks
    for (the loop's rule, ``placement.mps_fits``)."""
    memory_mib = job.mps_memory_mib or 0
    if memory_mib > gpu.memory_total_mib:
        raise AllocationInvalid(
            "gpu_uuids",
            f"GPU {gpu.uuid} has {memory_text(gpu.memory_total_mib)}; "
            f"job {job.pk} asks for {_asks(job)}",
        )
    percent, used_mib, holders = sharing.mps_use([gpu.pk]).get(gpu.pk, (0, 0, ()))
    free = placement.MpsState(gpu.name, 100 - percent, gpu.memory_total_mib - used_mib)
    if placement.mps_fits(free, (job.mps_percent or 0, memory_mib, None, NO_ASK)):
        return _Share([gpu])
    return _Share(
        [gpu],
        taken=f"GPU {gpu.uuid} has {free.free_percent} % of its SMs and "
        f"{memory_text(free.free_memory_mib)} free for MPS shares (jobs "
        f"{', '.join(map(str, holders))} hold the rest); job {job.pk} asks for {_asks(job)}",
    )


@dataclass(frozen=True)
class Release:
    """What a release did: GPUs given back now, and GPUs still held until the agent reports
    the job's processes gone (SIGTERM, then SIGKILL after the grace)."""

    job: Job
    released: list[str]
    releasing: list[str]


def release_by_hand(job: Job, *, actor: User) -> Release:
    """Take a job's GPUs back by canceling it (``services.cancel_job``, audited). Raises
    ``AllocationRefused`` when it holds none."""
    held = sorted(Allocation.objects.active().filter(job=job).values_list("gpu__uuid", flat=True))
    if not held:
        raise services.AllocationRefused(f"job {job.pk} holds no GPUs (it is {job.state})")
    job = services.cancel_job(job, actor=actor, reason=f"GPUs released by {actor.get_username()}")
    still = set(Allocation.objects.active().filter(job=job).values_list("gpu__uuid", flat=True))
    return Release(
        job,
        released=[uuid for uuid in held if uuid not in still],
        releasing=[uuid for uuid in held if uuid in still],
    )
