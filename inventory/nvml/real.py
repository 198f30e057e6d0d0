"""The real NVML backend: nvidia-ml-py's `pynvml` functions, loaded against the driver's
libnvidia-ml.so.1, and what the simulator answers beside NVML read from this host."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from typing import Any

import pynvml

from inventory.nvml.gpu_reset import GpuResetFailed
from inventory.nvml.host import HostResources, this_host
from inventory.nvml.scanner import scan

log = logging.getLogger("gpuadmin.nvml")


class RealNvml:
    """The real backend: every `nvml*` attribute is pynvml's own function, and the calls the
    simulator offers beside NVML (`host_resources`, `topo_matrix_text`, `reset_gpu`,
    `event_message`) have the same names and shapes as `SimulatedNvml`'s, so the scanner and
    the agent call both backends the same way. The library itself loads on the first
    nvmlInit, not here."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def host_resources(self) -> HostResources:
        """This host's CPUs and memory (`host.this_host`)."""
        return this_host()

    def topo_matrix_text(self) -> str | None:
        """This host's `nvidia-smi topo -m` (`nvidia_smi_topo_matrix`)."""
        return nvidia_smi_topo_matrix()

    def reset_gpu(self, index: int) -> None:
        """`nvidia-smi --gpu-reset -i INDEX`; raises `GpuResetFailed` saying why it failed."""
        smi = shutil.which("nvidia-smi")
        if smi is None:
            raise GpuResetFailed("nvidia-smi is not installed")
        done = subprocess.run(  # noqa: S603 - a fixed program and arguments
            [smi, "--gpu-reset", "-i", str(index)], capture_output=True, text=True, timeout=120
        )
        if done.returncode:
            raise GpuResetFailed(
                (done.stderr or done.stdout).strip() or f"nvidia-smi exited {done.returncode}"
            )

    def event_message(self, eventSet: Any) -> str:
        """Empty: NVML's event data carries no text (the kernel log line of the XID does)."""
        return ""


@dataclasses.dataclass(frozen=True)
class Probe:
    """Whether this machine can use NVML, and why not when it cannot."""

    available: bool
    reason: str | None = None
    driver_version: str | None = None
    gpu_count: int = 0


def probe() -> Probe:
    """Init NVML once, count the GPUs and shut it down again (e.g. to skip GPU tests)."""
    system = scan(RealNvml(), include=()).system
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
