"""A simulated fleet in the catalog, and a broker that records what the loop sends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from django.utils import timezone

from gpuadmin.celery import app
from inventory.models import Node
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from inventory.services import apply_discovery


def add_sim_node(hostname: str, model: str = "dgx-a100-80gb") -> Node:
    """A discovered, heartbeating simulated node."""
    apply_discovery(hostname, scan(SimulatedNvml.from_model(model, node_name=hostname)))
    Node.objects.filter(hostname=hostname).update(last_heartbeat_at=timezone.now())
    return Node.objects.get(hostname=hostname)


@dataclass
class RecordingBroker:
    """Stands in for ``send_task``: records (task name, args, queue)."""

    sent: list[tuple[str, tuple, str | None]] = field(default_factory=list)

    def send_task(self, name: str, args: tuple = (), queue: str | None = None, **_: Any) -> None:
        self.sent.append((name, tuple(args), queue))

    def named(self, name: str) -> list[tuple[tuple, str | None]]:
        return [(args, queue) for sent, args, queue in self.sent if sent == name]


@pytest.fixture
def broker(monkeypatch) -> RecordingBroker:
    recorder = RecordingBroker()
    monkeypatch.setattr(app, "send_task", recorder.send_task)
    return recorder
