"""GPUs given to or taken from a job by hand (the API's cluster endpoints, the admin), each
audited. Manual allocations (whole GPUs, a MIG device, an MPS share) go through
``scheduling.allocations.services.allocate`` like the loop's, so the same row locks, partial
unique indexes, sharing trigger and commit checks refuse what is taken; a release ends the job
through ``scheduling.jobs.control.cancel_job``, so a GPU is never handed on while the job's
processes still run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction

from gpuadmin.refusals import FieldRefusal
from inventory.models import Gpu, MigInstance
from inventory.units import memory_text
from scheduling import placement
from scheduling.allocations import services as allocation_services
from scheduling.jobs import control
from scheduling.loop import dispatch
from scheduling.models import (
    Allocation,
    AllocationKind,
    Job,
    JobState,
)
from scheduling.placement.hosts import NO_ASK
from scheduling.placement.text import indexes_phrase, plural
from scheduling.sharing import services as sharing


class AllocationInvalid(FieldRefusal):
    """A manual allocation that does not fit the job's request, naming the field."""


def allocate_by_hand(job: Job, gpu_uuids: list[str], *, actor: User) -> list[Allocation]:
    """Give a QUEUED job what ``gpu_uuids`` names and send it to its nodes, as the loop would:
    whole GPUs; to a MIG job a free MIG device of its profile on the one GPU named (the lowest
    placement start first, as the loop) or the MIG device named; to an MPS job its share of
    the one MPS-shared GPU named.

    What is named must fit the request (``gpu_count`` GPUs on each of ``node_count`` nodes,
    of ``gpu_model`` and ``min_gpu_memory_mib`` when set, and of the kind it asks for); the
    topology is the operator's choice. ``AllocationInvalid`` naming ``gpu_uuids`` for what
    does not fit; ``AllocationRefused`` (nothing written) when the job is not queued, or what
    is named is taken or the commit's checks (``allocation_services.allocate``) refuse it."""
    share = _share_for(job, gpu_uuids)
    if job.state != JobState.QUEUED:
        raise allocation_services.AllocationRefused(
            f"job {job.pk} is {job.state}: only a queued job can be given GPUs"
        )
    if share.taken:
        raise allocation_services.AllocationRefused(share.taken)
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
            rows = allocation_services.allocate(
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
    except allocation_services.AllocationRefused:
        holders = (
            Allocation.objects.active()
            .filter(gpu__in=gpus, kind=AllocationKind.GPU)
            .exclude(job=job)
            .values_list("gpu__uuid", "job_id")
            .order_by("gpu__uuid")
        )
        if job.allocation_kind != AllocationKind.GPU or not holders:
            raise
        raise allocation_services.AllocationRefused(
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
    return allocation_services.KIND_WORDS[AllocationKind.GPU]


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
    """Take a job's GPUs back by canceling it (``control.cancel_job``, audited). Raises
    ``AllocationRefused`` when it holds none."""
    held = sorted(Allocation.objects.active().filter(job=job).values_list("gpu__uuid", flat=True))
    if not held:
        raise allocation_services.AllocationRefused(
            f"job {job.pk} holds no GPUs (it is {job.state})"
        )
    job = control.cancel_job(job, actor=actor, reason=f"GPUs released by {actor.get_username()}")
    still = set(Allocation.objects.active().filter(job=job).values_list("gpu__uuid", flat=True))
    return Release(
        job,
        released=[uuid for uuid in held if uuid not in still],
        releasing=[uuid for uuid in held if uuid in still],
    )
