"""A stand-in for ``nvidia-cuda-mps-control`` on simulated nodes (no NVIDIA driver there).

``-d`` starts a daemon in the background that writes its pid to
``$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid`` and waits; without ``-d`` it reads
commands from stdin, as the real control program does, and ``quit`` stops the daemon. Plain
Python with no imports of gpuadmin: the executor runs it as a program (``scheduling.agent.mps``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"


def _pid_file() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")) / PID_FILE


def _daemon() -> None:
    if os.fork():
        return  # the caller's process returns at once, as ``-d`` does
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    path = _pid_file()
    path.write_text(f"{os.getpid()}\n")

    def stop(*_: object) -> None:
        path.unlink(missing_ok=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        signal.pause()


def _commands() -> int:
    for line in sys.stdin:
        if line.strip() == "quit":
            try:
                pid = int(_pid_file().read_text().strip())
            except (OSError, ValueError):
                return 0
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    return 0


if __name__ == "__main__":
    if "-d" in sys.argv[1:]:
        _daemon()
        sys.exit(0)
    sys.exit(_commands())
