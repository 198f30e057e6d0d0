"""Reservation windows as one pass sees them: which GPUs they close to which jobs.

A window holds its GPUs for [start, end). Before it starts, a job may use them only if it is
sure to be gone by `start`: its maximum runtime (`max_runtime_s`; unknown means forever) ends
by then. Inside the window, only jobs naming it (`JobRequest.reservation`) use them. A job
naming a window runs only on its GPUs, only inside it, and only if its maximum runtime ends by
the window's end.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Protocol

from scheduling.placement.snapshot import ReservationWindow


class Booker(Protocol):
    """What the windows ask of a job: a ``JobRequest``, or a job about to be committed."""

    @property
    def owner(self) -> str: ...

    @property
    def max_runtime_s(self) -> float | None: ...

    @property
    def reservation(self) -> int | None: ...


def moment(epoch: float) -> str:
    """ "2025-06-01 14:00 UTC" """
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


def max_end(job: Booker, now: float) -> float:
    """When the job is sure to be gone if it started now (never without a maximum runtime)."""
    return math.inf if job.max_runtime_s is None else now + job.max_runtime_s


class ReservationBook:
    """The windows of one pass: those running now, and those still to come by start time."""

    def __init__(self, windows: Iterable[ReservationWindow], now: float) -> None:
        self.now = now
        live = [window for window in windows if window.end > now]
        self.by_id = {window.id: window for window in live}
        self.active = [window for window in live if window.start <= now]
        self.upcoming = sorted(
            (window for window in live if window.start > now), key=lambda w: (w.start, w.id)
        )
        self._starts = [window.start for window in self.upcoming]
        self._window_of = {gpu_id: window for window in self.active for gpu_id in window.gpu_ids}
        self._upcoming_at: dict[int, list[ReservationWindow]] = {}
        for window in self.upcoming:
            for gpu_id in window.gpu_ids:
                self._upcoming_at.setdefault(gpu_id, []).append(window)

    def active_window(self, gpu_id: int) -> ReservationWindow | None:
        """The window that holds `gpu_id` now, if any."""
        return self._window_of.get(gpu_id)

    def closing(self, job: Booker) -> list[ReservationWindow]:
        """Upcoming windows `job` would still run into (by its maximum runtime), by start."""
        return self.upcoming[: bisect_left(self._starts, max_end(job, self.now))]

    def refusal(self, job: Booker) -> tuple[str, float | None] | None:
        """Why a job naming a reservation cannot run in it now, with when it could start at
        the earliest; None when it may run on the window's GPUs."""
        if job.reservation is None:
            return None
        window = self.by_id.get(job.reservation)
        name = f"reservation {job.reservation}"
        if window is None:
            return f"{name} is not approved, or has ended", None
        if window.owner != job.owner:
            return f"{name} belongs to another user", None
        if window.start > self.now:
            return f"{name} starts at {moment(window.start)}", window.start
        ends = moment(window.end)
        if job.max_runtime_s is None:
            return f"needs a maximum runtime to run in {name} (it ends at {ends})", None
        if max_end(job, self.now) > window.end:
            return f"its maximum runtime runs past the end of {name} at {ends}", None
        return None

    def closed(self, gpu_id: int, job: Booker) -> bool:
        """Whether the reservations keep `job` off `gpu_id` now (the whole rule, one GPU at a
        time, for callers without the pass's partitions: sharing, and the commit of a
        placement, which checks it again with the GPU rows locked)."""
        if job.reservation is not None:
            if self.refusal(job) is not None:
                return True
            window = self._window_of.get(gpu_id)
            return window is None or window.id != job.reservation
        if gpu_id in self._window_of:
            return True
        ends = max_end(job, self.now)
        return any(window.start < ends for window in self._upcoming_at.get(gpu_id, ()))
