"""The processes of ``gpuadmin up``: each started in its own process group, restarted with
backoff when it dies, and stopped in the order the caller gives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import TextIO

Start = Callable[[list[str], str], subprocess.Popen[bytes]]


class CrashLoop(Exception):
    """A child died too often within the window: the stack stops instead of restarting it."""


@dataclass
class Child:
    name: str
    argv: list[str]
    stop_grace_s: float
    process: subprocess.Popen[bytes]
    restart_at: float | None = None  # monotonic time of a pending restart
    exits: deque[float] = field(default_factory=deque)  # monotonic times of recent deaths


def exit_status(returncode: int) -> str:
    """``status 3``, or ``killed by SIGKILL`` for a child a signal ended."""
    if returncode < 0:
        with suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"status {returncode}"


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


class Supervisor:
    """Keeps its children running: a child that dies is restarted after 1, 2, 4 ... s (at
    most ``max_backoff_s``); ``crash_loop_exits`` deaths of one child within
    ``crash_loop_window_s`` raise :class:`CrashLoop`."""

    def __init__(
        self,
        start: Start,
        *,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        crash_loop_exits: int = 5,
        crash_loop_window_s: float = 120.0,
        out: TextIO = sys.stdout,
    ) -> None:
        self._start = start
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.crash_loop_exits = crash_loop_exits
        self.crash_loop_window_s = crash_loop_window_s
        self.out = out
        self.children: dict[str, Child] = {}

    def start(self, name: str, argv: list[str], *, stop_grace_s: float) -> None:
        self.children[name] = Child(name, argv, stop_grace_s, self._start(argv, name))

    def poll(self) -> None:
        """Notice dead children and restart those whose backoff is over."""
        now = time.monotonic()
        for child in self.children.values():
            if child.restart_at is None and child.process.poll() is not None:
                self._died(child, now)
            elif child.restart_at is not None and now >= child.restart_at:
                child.restart_at = None
                child.process = self._start(child.argv, child.name)

    def _died(self, child: Child, now: float) -> None:
        _signal_group(child.process, signal.SIGKILL)  # what it left behind (pool processes)
        child.exits.append(now)
        while child.exits[0] < now - self.crash_loop_window_s:
            child.exits.popleft()
        status = exit_status(child.process.returncode)
        if len(child.exits) >= self.crash_loop_exits:
            self._say(
                f"{child.name} exited with {status}, {len(child.exits)} exits within "
                f"{self.crash_loop_window_s:g} s: crash loop, stopping everything"
            )
            raise CrashLoop(child.name)
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (len(child.exits) - 1))
        child.restart_at = now + delay
        at = datetime.now().astimezone().strftime("%H:%M:%S")
        self._say(f"{child.name} exited with {status} at {at}; restarting it in {delay:g} s")

    def stop(self, names: Iterable[str]) -> None:
        """SIGTERM these children's process groups, wait for each up to its grace, then
        SIGKILL what is left."""
        children = [self.children[name] for name in names]
        started = time.monotonic()
        for child in children:
            child.restart_at = None
            if child.process.poll() is None:
                _signal_group(child.process, signal.SIGTERM)
        for child in children:
            remaining = started + child.stop_grace_s - time.monotonic()
            try:
                child.process.wait(timeout=max(0.1, remaining))
            except subprocess.TimeoutExpired:
                self._say(f"{child.name} did not stop within {child.stop_grace_s:g} s; killing it")
                _signal_group(child.process, signal.SIGKILL)
                child.process.wait()
            _signal_group(child.process, signal.SIGKILL)

    def running(self, name: str) -> bool:
        child = self.children.get(name)
        return child is not None and child.restart_at is None and child.process.poll() is None

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)
