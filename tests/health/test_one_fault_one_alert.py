"""One fault, one alert that names it once. A fault is injected into a simulated node the way
an operator does (``health/agent``'s listener and watcher read it, as in ``test_agent``), its
reports go through the central side (``receive_reports``: the recovery policies) and the alert
rules' pass; whatever the fault reports several ways (an XID and a counter, an XID and a lost
GPU, a silent agent and an unreachable node), its GPU (or node) has one firing alert."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from health import rules, services
from health.agent import HealthWatcher, Outbox, XidListener
from health.choices import AlertState
from health.models import Alert, HealthEvent
from health.wire import HealthReport
from inventory import agent as inventory_agent
from inventory import live
from inventory.models import Gpu, Node
from inventory.nvml.sim import faults
from inventory.services import apply_discovery
from inventory.signals import sample_taken
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


class Collected:
    """Where the agent's Celery send goes: the reports, as the central task gets them."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def __call__(self, name: str, args: tuple[Any, ...] = (), **_: Any) -> None:
        assert name == "health.report"
        self.reports += args[1]


@pytest.fixture
def node(settings: Any, tmp_path: Path) -> Iterator[str]:
    """This process as the agent of a simulated DGX A100 80GB, discovered by the central side."""
    hostname = f"fault-{uuid.uuid4().hex[:8]}"
    settings.GPUADMIN_NVML = "sim"
    settings.GPUADMIN_SIM_MODEL = "dgx-a100-80gb"
    settings.GPUADMIN_NODE_NAME = hostname
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path / "sim"
    apply_discovery(hostname, inventory_agent.scan_this_node())
    Node.objects.filter(hostname=hostname).update(last_heartbeat_at=timezone.now())
    yield hostname
    live.client().delete(live.KEY_PREFIX + hostname)


def stutters(text: str) -> str | None:
    """A run of three or more words said twice ("XID 79 (GPU has fallen off the bus): XID 79:
    GPU has fallen off the bus"), or None."""
    words = re.findall(r"[\w.]+", text.casefold())
    seen = set()
    for i in range(len(words) - 2):
        run = tuple(words[i : i + 3])
        if run in seen:
            return " ".join(run)
        seen.add(run)
    return None


def inject_and_deliver(hostname: str, state_dir: Path, inject: Callable[[], None]) -> None:
    """Inject the fault with the agent's listener and watcher running, then hand what they
    reported to the central side and run two alert passes."""
    sent = Collected()
    outbox = Outbox(hostname, sent)
    watcher = HealthWatcher(hostname, outbox)
    listener = XidListener(hostname, inventory_agent.node_backend(), outbox, wait_ms=100)
    sample_taken.connect(watcher.on_sample, weak=False)
    listener.start()
    try:
        inventory_agent.publish_sample(hostname)  # the baseline
        assert listener.ready.wait(5)
        inject()
        for _ in range(3):  # the agent loop's samples
            inventory_agent.publish_sample(hostname)
        wait_for(lambda: any(r["xid"] for r in sent.reports), 5, "the XID listener's report")
    finally:
        sample_taken.disconnect(watcher.on_sample)
        listener.stop()
        listener.join(timeout=5)
    services.receive_reports(hostname, [HealthReport.from_dict(r) for r in sent.reports])
    rules.evaluate()
    rules.evaluate()


FAULTS: dict[str, Callable[[Path, str, int], None]] = {
    "fallen off the bus (XID 79, GPU lost)": lambda d, n, i: faults.fall_off_bus(d, n, i),
    "double-bit ECC (XID 48, the counter, a row remapped)": lambda d, n, i: (
        faults.set_ecc(d, n, i, count=2, error="uncorrected"),
        faults.remap_rows(d, n, i, uncorrectable=1, pending=True),
        faults.inject_xid(d, n, i, 48, message="Double Bit ECC Error"),
    ),
    "NVLink (XID 74, the counters)": lambda d, n, i: (
        faults.add_nvlink_errors(d, n, i, count=4),
        faults.inject_xid(d, n, i, 74),
    ),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_reported_several_ways_opens_one_alert_saying_it_once(node, settings, fault):
    state_dir = settings.GPUADMIN_SIM_STATE_DIR
    inject_and_deliver(node, state_dir, lambda: FAULTS[fault](state_dir, node, 2))

    gpu = Gpu.objects.get(node__hostname=node, index=2)
    kinds = set(HealthEvent.objects.filter(gpu=gpu).values_list("kind", flat=True))
    assert len(kinds) >= 2, f"the fault should report several ways, got {kinds}"
    firing = list(Alert.objects.filter(gpu=gpu, state=AlertState.FIRING))
    assert len(firing) == 1, [alert.summary for alert in firing]
    [alert] = firing
    assert stutters(alert.summary) is None, alert.summary
    assert f"GPU 2 of {node}" in alert.summary
    for event in HealthEvent.objects.filter(gpu=gpu):
        assert stutters(f"{event.describe()}: {event.message}") is None, event.message


def test_xid_79_alert_names_it_with_the_catalogs_name_once(node, settings):
    state_dir = settings.GPUADMIN_SIM_STATE_DIR
    inject_and_deliver(node, state_dir, lambda: faults.fall_off_bus(state_dir, node, 3))

    [alert] = Alert.objects.filter(gpu__index=3, gpu__node__hostname=node)
    assert alert.summary == f"XID 79 (GPU has fallen off the bus) on GPU 3 of {node}"


def test_a_silent_agent_opens_one_node_alert(node, settings):
    Node.objects.filter(hostname=node).update(
        last_heartbeat_at=timezone.now() - timezone.timedelta(hours=1)
    )
    services.watch_heartbeats()
    rules.evaluate()
    rules.evaluate()
    firing = list(Alert.objects.filter(node__hostname=node, gpu=None, state=AlertState.FIRING))
    assert len(firing) == 1, [alert.summary for alert in firing]
    assert stutters(firing[0].summary) is None, firing[0].summary
    # Heard from again: the node's alert resolves.
    Node.objects.filter(hostname=node).update(last_heartbeat_at=timezone.now())
    rules.evaluate()
    assert not Alert.objects.filter(node__hostname=node, state=AlertState.FIRING).exists()
