"""GPU resets a recovery policy asks for: whether one is allowed, the reset itself on the node's
agent (the simulator's, or ``nvidia-smi --gpu-reset``), and its result back on the central side.

While it runs the GPU is ``resetting``; afterwards it is available again, or degraded when the
reset failed or a quarantine holds it (a successful reset then starts its probation).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from gpuadmin.access.nodes import NoCredential, send_order
from health import quarantine
from health.models import HealthEvent
from inventory.agent import node_backend
from inventory.choices import GpuState, NvmlBackend
from inventory.models import Gpu
from inventory.nvml.gpu_reset import reset_idle_gpu
from inventory.services import IllegalGpuTransition, set_gpu_state

log = logging.getLogger("gpuadmin.health")

ACTOR = "health"


def reset_allowed(nvml_backend: str) -> bool:
    """Whether a GPU of a node on ``nvml_backend`` may be reset by a policy:
    ``GPUADMIN_GPU_RESET`` on or off, or ``auto``: on for the simulator only (a reset of
    real hardware is an admin's decision unless they turn it on)."""
    mode = settings.GPUADMIN_GPU_RESET
    if mode == "auto":
        return nvml_backend == NvmlBackend.SIM
    return mode == "on"


def reset_on_this_node(index: int, *, wait_s: float | None = None) -> str | None:
    """Reset GPU ``index`` of this node (on its agent): the simulator's reset, or
    ``nvidia-smi --gpu-reset -i N`` on real NVML. Refused while processes run on it, after
    waiting ``wait_s`` (default: the jobs' kill grace and 5 s) for the jobs the policy stopped
    to go; on real NVML also when its processes cannot be read (a simulated GPU that fell off
    the bus comes back with its reset). ``None`` when done, else why not."""
    if not reset_allowed(settings.GPUADMIN_NVML):
        return f"GPU resets are off on this node (GPUADMIN_GPU_RESET={settings.GPUADMIN_GPU_RESET})"
    return reset_idle_gpu(
        node_backend(),
        index,
        wait_s=settings.GPUADMIN_JOB_KILL_GRACE_S + 5.0 if wait_s is None else wait_s,
        unreadable_is_idle=settings.GPUADMIN_NVML == NvmlBackend.SIM,
    )


def start_reset(gpu: Gpu, *, reason: str) -> None:
    """Mark ``gpu`` ``resetting`` (inside the policy's transaction; the caller sends the
    agent its ``health.reset_gpu`` on commit: ``ask_agent``). A quarantine follows health's
    own change."""
    set_gpu_state(gpu, GpuState.RESETTING, actor_name=ACTOR, reason=reason)


def ask_agent(hostname: str, gpu_index: int, gpu_uuid: str, event_id: int | None) -> None:
    """Ask the node's agent to reset the GPU; a node without a credential cannot be asked,
    and the reset fails saying so."""
    try:
        send_order(hostname, "health.reset_gpu", (gpu_index, gpu_uuid, event_id))
    except NoCredential as exc:
        finish_reset(hostname, gpu_uuid, str(exc), event_id)


def finish_reset(hostname: str, gpu_uuid: str, error: str | None, event_id: int | None) -> bool:
    """The agent says a reset ended: the GPU is available again, or degraded when the reset
    failed (a human looks at it) or when a quarantine holds it: a successful reset counts for
    the quarantine, whose probation returns the GPU (``quarantine.reset_ended``). Only a GPU
    still ``resetting`` moves (an admin may have taken it over meanwhile); the event's outcome
    gains the result. ``False`` if nothing moved."""
    gpu = Gpu.objects.filter(node__hostname=hostname, uuid=gpu_uuid).select_related("node").first()
    if gpu is None:
        return False
    what = f"reset of GPU {gpu.index} of {hostname}"
    step = f"{what} done" if error is None else f"{what} failed: {error}"
    with transaction.atomic():
        gpu, held = quarantine.lock_for_reset(gpu.pk)
        to_state = GpuState.AVAILABLE if error is None and held is None else GpuState.DEGRADED
        try:
            moved = set_gpu_state(
                gpu, to_state, actor_name=ACTOR, reason=step, expect={GpuState.RESETTING}
            )
        except IllegalGpuTransition as exc:
            moved, step = False, f"{step}; left as it is: {exc}"
        if moved and held is not None:
            quarantine.reset_ended(held, to_state=to_state, error=error, why=step)
        event = (
            HealthEvent.objects.select_for_update(no_key=True).filter(pk=event_id).first()
            if event_id is not None
            else None
        )
        if event is not None:
            event.outcome = [*event.outcome, step]
            event.save(update_fields=["outcome"])
    log.info("%s", step)
    return moved
