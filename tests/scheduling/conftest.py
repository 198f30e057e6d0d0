"""A simulated fleet in the catalog, and a broker that records what the loop sends."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from gpuadmin.celery import app
from inventory.models import Node
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from inventory.services import apply_discovery
from scheduling.agent.supervisor import Executor
from scheduling.agent.wire import FinalState, JobFinished, executor_id
from scheduling.jobs import reports
from scheduling.models import Job
from tests.scheduling.executors import GRACE_S, POLL_S, MakeExecutor, Recorder


def add_sim_node(hostname: str, model: str = "dgx-a100-80gb") -> Node:
    """A discovered, heartbeating simulated node."""
    apply_discovery(hostname, scan(SimulatedNvml.from_model(model, node_name=hostname)))
    Node.objects.filter(hostname=hostname).update(last_heartbeat_at=timezone.now())
    return Node.objects.get(hostname=hostname)


def processes_gone(job: Job, *, exit_code: int = -15) -> str | None:
    """The agents that ``job``'s stop waits for (``Job.ending``) report its processes there
    gone (stopped by the signal): the state it reached then, if any."""
    job.refresh_from_db()
    assert job.ending is not None, f"job {job.pk} is not stopping"
    reached = None
    for node in job.ending["nodes"]:
        ended = JobFinished(
            executor_id(job.pk, job.attempt), FinalState.CANCELED, exit_code, timezone.now()
        )
        reached = reports.job_events([ended], sender=node).reached.get(job.pk)
    job.refresh_from_db()
    return reached


@dataclass
class RecordingBroker:
    """Stands in for ``send_task``: records (task name, args, queue)."""

    sent: list[tuple[str, tuple, str | None]] = field(default_factory=list)

    def send_task(self, name: str, args: tuple = (), queue: str | None = None, **_: Any) -> None:
        self.sent.append((name, tuple(args), queue))

    def named(self, name: str) -> list[tuple[tuple, str | None]]:
        return [(args, queue) for sent, args, queue in self.sent if sent == name]

    def job_specs(self) -> list[tuple[dict, str | None]]:
        """Each job spec sent to an agent (``scheduling.run_jobs`` messages carry several),
        with its node's queue, in the order sent."""
        return [
            (spec, queue) for (specs,), queue in self.named("scheduling.run_jobs") for spec in specs
        ]


@pytest.fixture
def broker(monkeypatch) -> RecordingBroker:
    recorder = RecordingBroker()
    monkeypatch.setattr(app, "send_task", recorder.send_task)
    return recorder


@pytest.fixture
def make_executor(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MakeExecutor]:
    """Executors on one log and state directory (a second one plays the restarted agent), with
    the test module's ``EXECUTOR_OPTIONS`` (e.g. a container runtime) unless a test overrides
    them. They run jobs as the test's own account, as an agent that is not root does (see
    ``test_executor_accounts`` for an agent that starts each job as its owner)."""
    executors: list[Executor] = []
    module_options = getattr(request.module, "EXECUTOR_OPTIONS", {})

    def make(**options: Any) -> tuple[Executor, Recorder]:
        events = Recorder()
        options = {
            "kill_grace_s": GRACE_S,
            "poll_interval_s": POLL_S,
            "jobs_as_owner": False,
            **module_options,
            **options,
        }
        executor = Executor(tmp_path / "logs", tmp_path / "state", events, **options)
        executors.append(executor)
        return executor, events

    yield make
    for executor in executors:
        executor.shutdown(kill=True)
