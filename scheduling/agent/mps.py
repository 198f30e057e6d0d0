"""MPS on a node: one control daemon per MPS-shared GPU, and what a job's share puts in its
environment. Plain Python (no Django), used by the executor.

Each GPU gets its own pipe and log directory under the agent's state (``<root>/<GPU uuid>/``),
so its daemon sees that GPU alone (``CUDA_VISIBLE_DEVICES`` = its UUID) and its clients reach
it through ``CUDA_MPS_PIPE_DIRECTORY``. The daemon runs while MPS jobs run on the GPU: started
(``nvidia-cuda-mps-control -d``) before the first, told to ``quit`` after the last, so an idle
MPS GPU shows no process (which would read as foreign work). On simulated nodes the command is
``scheduling/agent/mps_standin.py``, which behaves the same way (a daemon that writes its pid file),
and the agent's hooks show the daemon's process on the simulated GPU.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: NVIDIA's control program (its ``-d`` starts the daemon; ``quit`` on its stdin stops it).
CONTROL_COMMAND = ("nvidia-cuda-mps-control",)
#: The file the control daemon writes in its pipe directory.
PID_FILE = "nvidia-cuda-mps-control.pid"
_START_WAIT_S = 10.0
_CALL_TIMEOUT_S = 30.0

#: ``hook(gpu_uuid, pid)`` after a daemon started or stopped.
DaemonHook = Callable[[str, int], None]


class MpsError(RuntimeError):
    """The control daemon of a GPU could not be started."""


@dataclass(frozen=True)
class GpuDirs:
    pipe: Path
    log: Path


def memory_limit(memory_mib: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for a client that sees one device (ordinal 0):
    NVIDIA's ``<device>=<limit>`` form, in MiB."""
    return f"0={memory_mib}M"


class MpsDaemons:
    """The MPS control daemons of this node's GPUs, under ``root``."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        command: Sequence[str] = CONTROL_COMMAND,
        on_started: DaemonHook | None = None,
        on_stopped: DaemonHook | None = None,
    ) -> None:
        self.root = Path(root)
        self.command = tuple(command)
        self._on_started = on_started
        self._on_stopped = on_stopped

    def dirs(self, gpu_uuid: str) -> GpuDirs:
        base = self.root / gpu_uuid
        return GpuDirs(base / "pipe", base / "log")

    def client_variables(
        self, gpu_uuid: str, percent: int, memory_mib: int | None
    ) -> dict[str, str]:
        """What a job with a share of ``gpu_uuid`` needs in its environment."""
        dirs = self.dirs(gpu_uuid)
        variables = {
            "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent),
        }
        if memory_mib is not None:
            variables["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = memory_limit(memory_mib)
        return variables

    def pid(self, gpu_uuid: str) -> int | None:
        """The pid of the GPU's running control daemon, else ``None``."""
        try:
            pid = int((self.dirs(gpu_uuid).pipe / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def ensure(self, gpu_uuid: str, base_env: Mapping[str, str]) -> int:
        """Start the GPU's control daemon unless it runs; its pid. ``MpsError`` saying why it
        cannot start."""
        pid = self.pid(gpu_uuid)
        if pid is not None:
            return pid
        dirs = self.dirs(gpu_uuid)
        for path in (dirs.pipe, dirs.log):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o755)  # the jobs' accounts reach the daemon's sockets here
        (dirs.pipe / PID_FILE).unlink(missing_ok=True)
        self._call(gpu_uuid, base_env, ["-d"], b"")
        deadline = time.monotonic() + _START_WAIT_S
        while (pid := self.pid(gpu_uuid)) is None:
            if time.monotonic() > deadline:
                raise MpsError(f"the MPS control daemon of {gpu_uuid} wrote no pid file")
            time.sleep(0.05)
        log.info("MPS control daemon of %s started (pid %d)", gpu_uuid, pid)
        if self._on_started is not None:
            self._on_started(gpu_uuid, pid)
        return pid

    def stop(self, gpu_uuid: str, base_env: Mapping[str, str]) -> None:
        """Tell the GPU's control daemon to quit (nothing when none runs)."""
        pid = self.pid(gpu_uuid)
        if pid is None:
            return
        try:
            self._call(gpu_uuid, base_env, [], b"quit\n")
        except MpsError as exc:
            log.warning("cannot stop the MPS control daemon of %s: %s", gpu_uuid, exc)
            return
        deadline = time.monotonic() + _START_WAIT_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        log.info("MPS control daemon of %s stopped (pid %d)", gpu_uuid, pid)
        if self._on_stopped is not None:
            self._on_stopped(gpu_uuid, pid)

    def _call(
        self, gpu_uuid: str, base_env: Mapping[str, str], args: list[str], stdin: bytes
    ) -> None:
        dirs = self.dirs(gpu_uuid)
        env = {
            **base_env,
            "CUDA_VISIBLE_DEVICES": gpu_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
        }
        argv = [*self.command, *args]
        try:
            result = subprocess.run(
                argv, env=env, input=stdin, capture_output=True, timeout=_CALL_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{' '.join(argv)}: {exc}") from exc
        if result.returncode != 0:
            error = result.stderr.decode(errors="replace").strip()
            raise MpsError(f"{' '.join(argv)} exited with {result.returncode}: {error}")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            state = file.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
