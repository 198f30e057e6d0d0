"""Simulated nodes for inventory tests: scans (the real scanner over the NVML simulator), and
a registered node whose agent answers in-process (``send_task`` replaced by a direct call of
the node task over a simulator sharing the node's state dir)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import EagerResult

from gpuadmin.celery import app
from inventory import live, tasks
from inventory.agent import AgentLoop, node_backend
from inventory.models import Gpu
from inventory.nvml.scanner import NodeScan, scan
from inventory.nvml.sim import SimulatedNvml
from inventory.nvml.sim.model import load_model
from inventory.services import apply_discovery, record_heartbeat


def simulated_agent_sync(settings: Any, tmp_path: Path) -> tuple[str, tuple[Any, ...]]:
    """The one report (task name, arguments) a simulated L40S box's agent sends when it syncs
    as `box-01`."""
    settings.GPUADMIN_NVML = "sim"
    settings.GPUADMIN_SIM_MODEL = "pcie-l40s-4x"
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path / "sim"
    sent: list[tuple[str, tuple[Any, ...]]] = []
    AgentLoop("box-01", lambda name, args, **_: sent.append((name, args))).sync()
    [report] = sent
    return report


def model_with_uuids(model: str, node: str) -> dict[str, Any]:
    """The machine model as JSON, each GPU pinned to the UUID it has on ``node``.

    Pinned UUIDs let a test take a GPU out of the chassis, or swap two, and keep identities.
    """
    raw = copy.deepcopy(load_model(model).raw)
    uuids = [gpu.facts.uuid for gpu in scan(SimulatedNvml.from_model(model, node_name=node)).gpus]
    defaults = raw.get("gpu_defaults", {})
    raw["gpus"] = [
        {**defaults, **gpu, "uuid": uuid} for gpu, uuid in zip(raw["gpus"], uuids, strict=True)
    ]
    return raw


@pytest.fixture
def sim_scan():
    """``sim_scan(model, node, ...)`` -> a NodeScan of that simulated node."""

    def make(model: str | dict[str, Any], node: str = "node-01", **kwargs: Any) -> NodeScan:
        return scan(SimulatedNvml.from_model(model, node_name=node, **kwargs))

    return make


@dataclass
class FakeBroker:
    """Stands in for ``send_task``: runs the node task in this process, or never answers."""

    answer: bool = True
    sent: list[dict[str, Any]] = field(default_factory=list)
    revoked: int = 0

    def send_task(
        self,
        name: str,
        *,
        args: tuple,
        kwargs: dict[str, Any],
        headers: dict[str, Any],
        queue: str,
        expires: float,
        ignore_result: bool,
    ) -> Any:
        # A caller that waits for the answer asks for it (results are ignored by default).
        assert ignore_result is False, f"{name} was sent without asking for its result"
        assert app.tasks[name].ignore_result is False, f"{name} would store no result"
        self.sent.append({"name": name, "args": tuple(args), "queue": queue, "expires": expires})
        if not self.answer:
            return self.Silent(self)
        task = app.tasks[name]
        assert task.__module__ == tasks.__name__, f"{name} is not a node task"
        return EagerResult(uuid.uuid4().hex, task(*args, **kwargs), "SUCCESS")

    @dataclass
    class Silent:
        broker: FakeBroker

        def get(self, timeout: float, **_: Any) -> Any:
            raise CeleryTimeoutError("The operation timed out.")

        def revoke(self) -> None:
            self.broker.revoked += 1


@dataclass
class SimNode:
    hostname: str
    state_dir: Path
    broker: FakeBroker

    def gpu(self, index: int) -> Gpu:
        return Gpu.objects.get(node__hostname=self.hostname, index=index)


@pytest.fixture
def node(db, settings, tmp_path, monkeypatch) -> Iterator[SimNode]:
    """A registered, heartbeating simulated DGX A100 whose agent answers in-process."""
    hostname = f"mig-{uuid.uuid4().hex[:6]}"
    settings.GPUADMIN_NVML = "sim"
    settings.GPUADMIN_SIM_MODEL = "dgx-a100-40gb"
    settings.GPUADMIN_NODE_NAME = hostname
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path / "sim"
    settings.GPUADMIN_HEARTBEAT_GRACE_S = 30
    broker = FakeBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    result = scan(node_backend())
    apply_discovery(hostname, result)
    record_heartbeat(hostname)
    live.publish(hostname, result)
    yield SimNode(hostname, tmp_path / "sim", broker)
    live.client().delete(live.KEY_PREFIX + hostname)
