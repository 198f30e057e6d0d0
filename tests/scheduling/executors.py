"""What the executor tests share: their timings and an event recorder to wait on."""

from __future__ import annotations

import threading
from collections.abc import Callable

from scheduling.agent.supervisor import Executor
from scheduling.agent.wire import ExecutorEvent, JobFinished, JobStarted

GRACE_S = 0.3
POLL_S = 0.02


class Recorder:
    """An ``on_event`` that lets a test wait for events."""

    def __init__(self) -> None:
        self.events: list[ExecutorEvent] = []
        self._changed = threading.Condition()

    def __call__(self, event: ExecutorEvent) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def of(self, job_id: str) -> list[ExecutorEvent]:
        with self._changed:
            return [event for event in self.events if event.job_id == job_id]

    def finished(self, job_id: str, timeout: float = 10.0) -> JobFinished:
        with self._changed:
            self._changed.wait_for(lambda: self._finished(job_id) is not None, timeout)
            event = self._finished(job_id)
        assert event is not None, f"job {job_id} did not finish within {timeout} s"
        return event

    def started(self, job_id: str, timeout: float = 10.0) -> JobStarted:
        with self._changed:
            self._changed.wait_for(lambda: self._started(job_id) is not None, timeout)
            event = self._started(job_id)
        assert event is not None, f"job {job_id} did not start within {timeout} s"
        return event

    def _finished(self, job_id: str) -> JobFinished | None:
        return next(
            (e for e in self.events if isinstance(e, JobFinished) and e.job_id == job_id), None
        )

    def _started(self, job_id: str) -> JobStarted | None:
        return next(
            (e for e in self.events if isinstance(e, JobStarted) and e.job_id == job_id), None
        )


MakeExecutor = Callable[..., tuple[Executor, Recorder]]
