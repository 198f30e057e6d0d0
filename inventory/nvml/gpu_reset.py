"""Resetting one GPU through a backend, once no process runs on it: the backend's
``reset_gpu`` (the simulator's own reset; ``nvidia-smi --gpu-reset`` on real NVML).

Whether a reset is allowed and how long to wait for the jobs to go are the caller's to decide
(``health.resets``).
"""

from __future__ import annotations

import time
from typing import Any

from pynvml import NVMLError

POLL_S = 0.25


class GpuResetFailed(RuntimeError):
    """The backend could not reset the GPU; the message says why."""


def reset_idle_gpu(nvml: Any, index: int, *, wait_s: float, unreadable_is_idle: bool) -> str | None:
    """Reset GPU ``index`` once no compute process runs on it, waiting up to ``wait_s`` for
    them to go. ``unreadable_is_idle``: a GPU whose processes cannot be read (one lost from the
    bus) counts as idle instead of refusing the reset. ``None`` when done, else why not."""
    try:
        nvml.nvmlInit()
    except NVMLError as exc:
        return f"NVML: {exc}"
    try:
        deadline = time.monotonic() + wait_s
        while pids := _running_pids(nvml, index, unreadable_is_idle=unreadable_is_idle):
            if time.monotonic() >= deadline:
                return f"processes still run on it (pids {', '.join(map(str, pids))})"
            time.sleep(POLL_S)
    except NVMLError as exc:
        return f"NVML: {exc}"
    finally:
        nvml.nvmlShutdown()
    try:
        nvml.reset_gpu(index)
    except GpuResetFailed as exc:
        return str(exc)
    return None


def _running_pids(nvml: Any, index: int, *, unreadable_is_idle: bool) -> list[int]:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        return [proc.pid for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except NVMLError:
        if unreadable_is_idle:
            return []
        raise
