"""Whether a GPU can take a whole-GPU job now: the one rule, as a pure function.

``why_unusable`` gives the first reason a GPU cannot be handed out, or ``None``. Its database
part (``stored_unusable``) is what ``Gpu.objects.schedulable()`` filters on; its live part
(``sample_unusable``) reads the GPU's latest live sample. The placement loop's snapshot,
``allocate``, the pages, the API filters and the status counts all ask it. No Django here:
plain values in, so the placement engine may import it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# The values of inventory.choices' NodeState/GpuState this rule reads (no Django here;
# tests/inventory/test_usability.py checks they match).
ONLINE = "online"
AVAILABLE = "available"
OFFLINE = "offline"
DEGRADED = "degraded"
RESETTING = "resetting"
REAL_NVML = "real"  # inventory.choices.NvmlBackend.REAL
ISOLATION_NONE = "none"  # inventory.choices.ISOLATION_NONE


class Reason(StrEnum):
    """Machine codes (the placement engine's ``GpuSlot.unavailable``), gravest first."""

    OFFLINE = "offline"  # the node or the GPU
    UNREACHABLE = "unreachable"  # no heartbeat from the node's agent within the grace
    MISSING = "missing"  # not seen by the last scan of its node
    ERROR = "error"  # NVML failed on it: in the last scan, or in its latest live sample
    RESETTING = "resetting"  # a GPU reset is under way
    DEGRADED = "degraded"  # fenced by a health policy (a fault, heat, an ECC rate)
    DRAINING = "draining"  # the node or the GPU
    UNCONFINED = "unconfined"  # its real node confines no job, and none may run unconfined
    HELD_OUTSIDE = "held-outside"  # work outside gpuadmin holds it (a Slurm job)
    MIG = "mig"  # MIG mode: only slices can be given, never the whole GPU
    MPS = "mps"  # shared through MPS: only shares can be given, never the whole GPU
    FOREIGN_PROCESS = "foreign-process"  # work that no allocation accounts for


@dataclass(frozen=True, slots=True)
class Unusable:
    code: Reason
    message: str


def stored_unusable(
    *,
    node_state: str,
    reachable: bool,
    gpu_state: str,
    missing: bool,
    error_message: str,
    mig_enabled: bool,
    mps_shared: bool = False,
    refuses_unconfined: bool = False,
    held_outside: str = "",
) -> Unusable | None:
    """The reason the stored rows give (``Gpu.objects.schedulable()`` is exactly these GPUs
    minus the ones with a reason), first match wins. ``refuses_unconfined``: its node's agent
    refuses every job (``refuses_unconfined_jobs``); ``held_outside``: the work outside
    gpuadmin holding it (``Gpu.held_outside``: "Slurm job 1234 on hpc"), empty: none. It ranks
    before MIG and MPS: neither a slice nor a share of a GPU Slurm holds is given."""
    if node_state == OFFLINE:
        return Unusable(Reason.OFFLINE, "its node is offline")
    if gpu_state == OFFLINE:
        return Unusable(Reason.OFFLINE, "the GPU is offline")
    if not reachable:
        return Unusable(Reason.UNREACHABLE, "its node's agent has not been heard from lately")
    if missing:
        return Unusable(Reason.MISSING, "the last scan of its node did not see it")
    if error_message:
        return Unusable(Reason.ERROR, f"the last scan failed on it: {error_message}")
    if gpu_state == RESETTING:
        return Unusable(Reason.RESETTING, "the GPU is being reset")
    if gpu_state == DEGRADED:
        return Unusable(Reason.DEGRADED, "the GPU is degraded (fenced by a health policy)")
    if node_state != ONLINE:
        return Unusable(Reason.DRAINING, f"its node is {node_state}")
    if gpu_state != AVAILABLE:
        return Unusable(Reason.DRAINING, f"the GPU is {gpu_state}")
    if refuses_unconfined:
        return Unusable(
            Reason.UNCONFINED,
            "its node confines no job and an admin has not allowed unconfined jobs there",
        )
    if held_outside:
        return Unusable(Reason.HELD_OUTSIDE, f"it is held by {held_outside}")
    if mig_enabled:
        return Unusable(Reason.MIG, "it is in MIG mode: only its MIG slices can be given")
    if mps_shared:
        return Unusable(Reason.MPS, "it is shared through MPS: only shares of it can be given")
    return None


def refuses_unconfined_jobs(*, nvml_backend: str, isolation: str, allow_unconfined: bool) -> bool:
    """Whether a node's agent refuses every job: it drives real GPUs (other people's, at
    stake), its agent said it confines none of a job's resources, and no admin allowed
    unconfined jobs on it."""
    return nvml_backend == REAL_NVML and isolation == ISOLATION_NONE and not allow_unconfined


def sample_unusable(sample: Mapping[str, Any] | None, *, allocated: bool) -> Unusable | None:
    """The reason the GPU's latest live sample gives (``None`` when its agent published none):
    an NVML error, or a process while no allocation holds the GPU. It reads no other field
    than those two: the placement loop reads samples cut to ``inventory.live.LOOP_FIELDS``."""
    if not sample:
        return None
    if error := sample.get("error_message"):
        return Unusable(Reason.ERROR, f"its latest sample reports an NVML error: {error}")
    if not allocated and (count := sample.get("processes")):
        return Unusable(
            Reason.FOREIGN_PROCESS, f"{count} process(es) run on it outside any allocation"
        )
    return None


def why_unusable(
    *,
    node_state: str,
    reachable: bool,
    gpu_state: str,
    missing: bool,
    error_message: str,
    mig_enabled: bool,
    sample: Mapping[str, Any] | None,
    allocated: bool,
    mps_shared: bool = False,
    refuses_unconfined: bool = False,
    held_outside: str = "",
) -> Unusable | None:
    """Why the GPU cannot take a whole-GPU job now, or ``None`` when it can: of the stored
    and the live reason, the one first in ``Reason``'s order. ``allocated``: an active
    allocation holds it (its processes are that job's, not foreign)."""
    stored = stored_unusable(
        node_state=node_state,
        reachable=reachable,
        gpu_state=gpu_state,
        missing=missing,
        error_message=error_message,
        mig_enabled=mig_enabled,
        mps_shared=mps_shared,
        refuses_unconfined=refuses_unconfined,
        held_outside=held_outside,
    )
    found = [why for why in (stored, sample_unusable(sample, allocated=allocated)) if why]
    return min(found, key=lambda why: _RANK[why.code], default=None)


_RANK = {reason: rank for rank, reason in enumerate(Reason)}
