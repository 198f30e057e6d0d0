"""Waiting on real processes: the integration tests' one way to poll for what they expect."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> float:
    """Poll ``condition`` every 0.1 s until it holds; the seconds that took. Fails the test
    naming ``what`` after ``timeout`` seconds."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - started
