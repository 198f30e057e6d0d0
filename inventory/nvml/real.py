"""The real NVML backend: the `pynvml` module of nvidia-ml-py, loaded against the driver's
libnvidia-ml.so.1."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from types import ModuleType

import pynvml

from inventory.nvml.scanner import scan

log = logging.getLogger("gpuadmin.nvml")


def load() -> ModuleType:
    """The real backend. The library itself loads on the first nvmlInit, not here."""
    return pynvml


@dataclasses.dataclass(frozen=True)
class Probe:
    """Whether this machine can use NVML, and why not when it cannot."""

    available: bool
    reason: str | None = None
    driver_version: str | None = None
    gpu_count: int = 0


def probe() -> Probe:
    """Init NVML once, count the GPUs and shut it down again (e.g. to skip GPU tests)."""
    system = scan(load(), include=()).system
    if system.error:
        return Probe(available=False, reason=system.error)
    if not system.gpu_count:
        return Probe(
            available=False,
            reason=f"NVIDIA driver {system.driver_version} is loaded but shows no GPU",
            driver_version=system.driver_version,
        )
    return Probe(available=True, driver_version=system.driver_version, gpu_count=system.gpu_count)


def nvidia_smi_topo_matrix(timeout_s: float = 30.0) -> str | None:
    """`nvidia-smi topo -m` output (GPU-NIC affinity, which NVML does not report), or None when
    nvidia-smi is missing or fails."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "topo", "-m"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("nvidia-smi topo -m failed: %s", err)
        return None
    return done.stdout
