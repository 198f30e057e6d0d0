"""Waiting on real processes: the integration tests' one way to poll for what they expect."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> float:
    """Poll ``condition`` every 0.1 s until it holds; the seconds that took. Fails the test
    naming ``what`` after ``timeout`` seconds."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - started


def wait_for_port(
    port: int,
    timeout: float,
    what: str,
    *,
    process: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> float:
    """Until ``what`` accepts TCP connections on 127.0.0.1:``port``; the seconds that took.
    Fails the test naming ``what``, the port and ``log``'s tail (where given) after ``timeout``
    seconds, or as soon as ``process`` (the one that should listen) has exited."""
    started = time.monotonic()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return time.monotonic() - started
        except OSError:
            pass
        if process is not None and process.poll() is not None:
            why = f"exited ({process.returncode}) before accepting"
        elif time.monotonic() - started >= timeout:
            why = f"did not accept in {timeout:g} s"
        else:
            time.sleep(0.1)
            continue
        tail = f":\n{log.read_text(errors='replace')[-2000:]}" if log and log.exists() else ""
        raise AssertionError(f"{what} on port {port} {why}{tail}")
