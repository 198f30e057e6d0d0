"""Create and destroy MIG GPU instances through NVML: one code path for real pynvml and the
simulator, like the scanner.

Plain Python, no Django. Every operation inits NVML and always shuts it down again; every NVML
refusal becomes a ``MigOperationError`` with a sentence an admin can act on and a stable code.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from ctypes import byref, c_uint
from typing import Any

import pynvml
from pynvml import NVMLError

from inventory.nvml.mig_catalog import MigProfile
from inventory.nvml.scanner import (
    UNSUPPORTED,
    describe_error,
    error_name,
    init_failure_reason,
    mig_profile_name,
    read_ci_profiles,
    read_mig_profiles,
)

log = logging.getLogger("gpuadmin.nvml")


class MigErrorCode(enum.StrEnum):
    """Why a MIG operation failed (stable, machine-readable; travels as a plain string)."""

    NVML_UNAVAILABLE = "nvml_unavailable"
    NO_SUCH_GPU = "no_such_gpu"
    MIG_NOT_SUPPORTED = "mig_not_supported"
    MIG_DISABLED = "mig_disabled"
    UNKNOWN_PROFILE = "unknown_profile"
    INVALID_PLACEMENT = "invalid_placement"
    NO_ROOM = "no_room"
    NO_SUCH_INSTANCE = "no_such_instance"
    IN_USE = "in_use"
    NVML_FAILED = "nvml_failed"


class MigOperationError(Exception):
    """A MIG operation NVML refused (or could not attempt); ``message`` says why."""

    def __init__(self, message: str, code: MigErrorCode | str) -> None:
        super().__init__(message)
        self.message = message
        self.code = MigErrorCode(code)


def create_gpu_instance(
    nvml: Any, gpu_index: int, profile_name: str, placement_start: int | None = None
) -> tuple[int, int]:
    """Create a ``profile_name`` GPU instance (at ``placement_start`` when given, else where
    NVML chooses) and its full-size compute instance, like ``nvidia-smi mig -cgi P -C``.

    Returns ``(gi_id, ci_id)``. When the compute instance cannot be made, the new GPU instance
    is destroyed again, so nothing is left half-made.
    """
    profile_name = mig_profile_name(profile_name)
    with _session(nvml):
        device = _mig_device(nvml, gpu_index)
        profile = _gi_profile(nvml, device, gpu_index, profile_name)
        where = "" if placement_start is None else f" at placement {placement_start}"
        try:
            if placement_start is None:
                gi = nvml.nvmlDeviceCreateGpuInstance(device, profile.id)
            else:
                placement = _placement(gpu_index, profile, placement_start)
                gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, profile.id, placement)
        except NVMLError as err:
            if err.value == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES:
                raise MigOperationError(
                    f"no room for {profile_name}{where} on GPU {gpu_index}: {error_name(err)}",
                    MigErrorCode.NO_ROOM,
                ) from err
            raise _failed(f"cannot create {profile_name}{where} on GPU {gpu_index}", err) from err
        gi_id = nvml.nvmlGpuInstanceGetInfo(gi).id
        try:
            ci_profile = _full_ci_profile(nvml, gi)
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
            ci_id = nvml.nvmlComputeInstanceGetInfo(ci).id
        except NVMLError as err:
            _destroy_quietly(nvml, gi, gpu_index, gi_id)
            raise _failed(
                f"cannot create the compute instance of {profile_name} (GPU instance {gi_id}) "
                f"on GPU {gpu_index}; the GPU instance was removed again",
                err,
            ) from err
        log.info("created %s GI %d / CI %d on GPU %d", profile_name, gi_id, ci_id, gpu_index)
        return gi_id, ci_id


def destroy_gpu_instance(nvml: Any, gpu_index: int, gi_id: int) -> None:
    """Destroy GPU instance ``gi_id``: its compute instances first, then the instance itself,
    like ``nvidia-smi mig -dci -gi N`` then ``-dgi -gi N``."""
    with _session(nvml):
        device = _mig_device(nvml, gpu_index)
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(device, gi_id)
        except NVMLError as err:
            if err.value in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                raise MigOperationError(
                    f"GPU {gpu_index} has no GPU instance {gi_id}", MigErrorCode.NO_SUCH_INSTANCE
                ) from err
            raise _failed(f"cannot find GPU instance {gi_id} on GPU {gpu_index}", err) from err
        for ci in _compute_instances(nvml, gi):
            ci_id = nvml.nvmlComputeInstanceGetInfo(ci).id
            try:
                nvml.nvmlComputeInstanceDestroy(ci)
            except NVMLError as err:
                raise _in_use_or_failed(
                    f"compute instance {ci_id} of GPU instance {gi_id} on GPU {gpu_index}", err
                ) from err
        try:
            nvml.nvmlGpuInstanceDestroy(gi)
        except NVMLError as err:
            raise _in_use_or_failed(f"GPU instance {gi_id} on GPU {gpu_index}", err) from err
        log.info("destroyed GI %d on GPU %d", gi_id, gpu_index)


# --------------------------------------------------------------------------- helpers


@contextmanager
def _session(nvml: Any) -> Iterator[None]:
    try:
        nvml.nvmlInit()
    except NVMLError as err:
        raise MigOperationError(init_failure_reason(err), MigErrorCode.NVML_UNAVAILABLE) from err
    try:
        yield
    except NVMLError as err:  # a call the operation did not expect to fail
        raise _failed("NVML call failed", err) from err
    finally:
        try:
            nvml.nvmlShutdown()
        except NVMLError as err:
            log.warning("nvmlShutdown failed: %s", describe_error(err))


def _mig_device(nvml: Any, gpu_index: int) -> Any:
    """The handle of a GPU whose MIG mode is currently enabled."""
    try:
        device = nvml.nvmlDeviceGetHandleByIndex(gpu_index)
    except NVMLError as err:
        if err.value in (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_FOUND):
            raise MigOperationError(
                f"no GPU {gpu_index} on this node ({nvml.nvmlDeviceGetCount()} GPUs)",
                MigErrorCode.NO_SUCH_GPU,
            ) from err
        raise _failed(f"cannot open GPU {gpu_index}", err) from err
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(device)
    except NVMLError as err:
        if err.value in UNSUPPORTED:
            raise MigOperationError(
                f"GPU {gpu_index} does not support MIG", MigErrorCode.MIG_NOT_SUPPORTED
            ) from err
        raise _failed(f"cannot read the MIG mode of GPU {gpu_index}", err) from err
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        waiting = (
            " (enabled, pending a GPU reset)" if pending == pynvml.NVML_DEVICE_MIG_ENABLE else ""
        )
        raise MigOperationError(
            f"MIG is not enabled on GPU {gpu_index}{waiting}", MigErrorCode.MIG_DISABLED
        )
    return device


def _gi_profile(nvml: Any, device: Any, gpu_index: int, name: str) -> MigProfile:
    """The GPU instance profile named ``name`` of the GPU's table."""
    try:
        profiles = read_mig_profiles(nvml, device)
    except NVMLError as err:
        raise _failed(f"cannot read the MIG profiles of GPU {gpu_index}", err) from err
    for profile in profiles:
        if profile.name == name:
            return profile
    offered = ", ".join(profile.name for profile in profiles) or "none"
    raise MigOperationError(
        f"unknown profile {name}; GPU {gpu_index} offers: {offered}",
        MigErrorCode.UNKNOWN_PROFILE,
    )


def _placement(gpu_index: int, profile: MigProfile, start: int) -> Any:
    """The ``c_nvmlGpuInstancePlacement_t`` of ``profile`` starting at memory slice ``start``."""
    if start not in profile.placements:
        raise MigOperationError(
            f"placement {start} is not valid for {profile.name} on GPU {gpu_index}; "
            f"valid starts: {', '.join(map(str, profile.placements)) or 'none'}",
            MigErrorCode.INVALID_PLACEMENT,
        )
    return pynvml.c_nvmlGpuInstancePlacement_t(start=start, size=profile.memory_slices)


def _full_ci_profile(nvml: Any, gi: Any) -> Any:
    """The compute instance profile that spans the whole GPU instance (lowest index on a tie,
    so the plain profile wins over its ``REV1`` variant)."""
    best = None
    for info in read_ci_profiles(nvml, gi):
        if best is None or info.sliceCount > best.sliceCount:
            best = info
    if best is None:
        raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return best


def _compute_instances(nvml: Any, gi: Any) -> list[Any]:
    found = []
    for info in read_ci_profiles(nvml, gi):
        handles = (pynvml.c_nvmlComputeInstance_t * info.instanceCount)()
        count = c_uint(0)
        nvml.nvmlGpuInstanceGetComputeInstances(gi, info.id, handles, byref(count))
        found.extend(handles[: count.value])
    return found


def _destroy_quietly(nvml: Any, gi: Any, gpu_index: int, gi_id: int) -> None:
    try:
        for ci in _compute_instances(nvml, gi):
            nvml.nvmlComputeInstanceDestroy(ci)
        nvml.nvmlGpuInstanceDestroy(gi)
    except NVMLError as err:
        log.error(
            "could not remove the half-made GPU instance %d on GPU %d: %s",
            gi_id,
            gpu_index,
            describe_error(err),
        )


def _in_use_or_failed(what: str, err: NVMLError) -> MigOperationError:
    if err.value == pynvml.NVML_ERROR_IN_USE:
        return MigOperationError(
            f"{what} is in use (processes are running in it): {error_name(err)}",
            MigErrorCode.IN_USE,
        )
    return _failed(f"cannot destroy {what}", err)


def _failed(what: str, err: NVMLError) -> MigOperationError:
    return MigOperationError(f"{what}: {describe_error(err)}", MigErrorCode.NVML_FAILED)
