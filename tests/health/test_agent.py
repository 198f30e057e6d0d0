"""The agent's health watcher and XID listener against the simulator, faults injected the way
an operator does (``gpuadmin sim inject ...`` on the node's state directory)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu.exceptions import OperationalError

from health import agent as health_agent
from health.agent import HealthWatcher, Outbox, XidListener
from health.wire import HealthReport
from inventory import agent as inventory_agent
from inventory import live
from inventory.nvml import scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.nvml.sim.cli import main as sim_cli
from inventory.signals import sample_taken

T0 = 1_700_000_000.0


class Broker:
    """Stands where the Celery send goes: records each batch, or refuses while ``down``."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[dict[str, Any]]]] = []
        self.down = False
        self.arrived = threading.Event()

    def __call__(self, name: str, args: tuple[Any, ...] = (), **_: Any) -> None:
        if self.down:
            raise OperationalError("Error 111 connecting to localhost:6379. Connection refused.")
        assert name == "health.report"
        hostname, reports = args
        self.batches.append((hostname, reports))
        self.arrived.set()

    @property
    def keys(self) -> list[str]:
        return [report["key"] for _, reports in self.batches for report in reports]


@pytest.fixture
def node(settings: Any, tmp_path: Path) -> Iterator[str]:
    """This process as the agent of a simulated DGX A100 40GB (GPUs 0-1 in MIG mode)."""
    hostname = f"health-{uuid.uuid4().hex[:8]}"
    settings.GPUADMIN_NVML = "sim"
    settings.GPUADMIN_SIM_MODEL = "dgx-a100-40gb"
    settings.GPUADMIN_NODE_NAME = hostname
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path / "sim"
    inventory_agent.scan_this_node()  # creates the node's simulator state
    yield hostname
    live.client().delete(live.KEY_PREFIX + hostname)


@pytest.fixture
def broker() -> Broker:
    return Broker()


@pytest.fixture
def watcher(node: str, broker: Broker) -> Iterator[HealthWatcher]:
    """The watcher connected to ``sample_taken``, as ``gpuadmin agent`` connects it."""
    found = HealthWatcher(node, Outbox(node, broker), clock=lambda: T0)
    sample_taken.connect(found.on_sample, weak=False)
    yield found
    sample_taken.disconnect(found.on_sample)


def inject(settings: Any, *argv: str) -> None:
    fault, node, *rest = argv
    state_dir = str(settings.GPUADMIN_SIM_STATE_DIR)
    assert sim_cli(["inject", fault, node, *rest, "--state-dir", state_dir]) == 0


def uuid_of(hostname: str, index: int) -> str:
    return inventory_agent.scan_this_node(include=("facts",)).gpus[index].facts.uuid or ""


def reports_after(node: str, broker: Broker) -> list[tuple[str, str]]:
    """Take a sample as the agent loop does; the (kind, key) of what the watcher sent for it."""
    before = len(broker.batches)
    inventory_agent.publish_sample(node)
    return [(r["kind"], r["key"]) for _, batch in broker.batches[before:] for r in batch]


MS = int(T0 * 1000)


@pytest.mark.parametrize(
    ("_case", "argv", "expected"),
    [
        ("ecc uncorrected", ("ecc", "2", "3"), [("ecc_uncorrected", "{uuid}:3:3")]),
        (
            "ecc corrected",
            ("ecc", "2", "40", "--error", "corrected", "--counter", "volatile"),
            [("ecc_corrected", "{uuid}:40:0")],
        ),
        (
            "uncorrectable row remapped, pending a reset",
            ("remap", "2", "--uncorrectable", "1", "--pending"),
            [("remap_pending", "{uuid}:0:1")],
        ),
        ("remap failure", ("remap", "2", "--failure"), [("remap_failure", "{uuid}:0:0")]),
        ("hot", ("temp", "2", "90"), [("thermal", f"{{uuid}}:{MS}")]),
        ("power brake", ("brake", "2"), [("power", f"{{uuid}}:{MS}")]),
        (
            "nvlink",
            ("nvlink", "2", "4", "--counter", "replay", "--link", "3"),
            [("nvlink", "{uuid}:4")],
        ),
        ("fallen off the bus", ("lost", "2"), [("gpu_lost", f"{{uuid}}:{MS}")]),
    ],
)
def test_each_injected_fault_is_reported_once(
    _case: str,
    argv: tuple[str, ...],
    expected: list[tuple[str, str]],
    node: str,
    broker: Broker,
    watcher: HealthWatcher,
    settings: Any,
) -> None:
    gpu = uuid_of(node, 2)
    assert reports_after(node, broker) == []  # the first sample is the baseline
    assert reports_after(node, broker) == []  # nothing changed

    inject(settings, argv[0], node, *argv[1:])

    assert reports_after(node, broker) == [
        (kind, f"{kind}:{key.format(uuid=gpu)}") for kind, key in expected
    ]
    assert reports_after(node, broker) == []  # the same state again is no news
    [[_, [report]]] = [batch for batch in broker.batches if batch[1]]
    assert report["gpu_index"] == 2 and report["gpu_uuid"] == gpu
    assert HealthReport.from_dict(report).to_dict() == report


def test_counters_report_before_and_after(
    node: str, broker: Broker, watcher: HealthWatcher, settings: Any
) -> None:
    reports_after(node, broker)
    inject(settings, "ecc", node, "5", "2", "--counter", "volatile")
    inject(settings, "nvlink", node, "5", "1")
    reports_after(node, broker)
    inject(settings, "ecc", node, "5", "7", "--counter", "volatile")

    reports_after(node, broker)

    [_, [ecc]] = broker.batches[-1]
    assert (ecc["kind"], ecc["data"]) == (
        "ecc_uncorrected",
        {"before": 2, "after": 7, "delta": 5, "aggregate": 0},
    )
    [nvlink] = [r for _, batch in broker.batches for r in batch if r["kind"] == "nvlink"]
    assert nvlink["data"] == {"before": 0, "after": 1, "delta": 1}


def test_a_thermal_episode_and_a_memory_over_its_limit(
    node: str, broker: Broker, watcher: HealthWatcher, settings: Any
) -> None:
    reports_after(node, broker)
    inject(settings, "temp", node, "4", "86")  # above the 85 C max operating temperature
    [(kind, _)] = reports_after(node, broker)
    inject(settings, "temp", node, "4", "90")  # and now the 89 C slowdown too: news
    [(_, key)] = reports_after(node, broker)

    [_, [sw]], [_, [hw]] = broker.batches[-2:]
    assert kind == "thermal" and sw["data"]["appeared"] == ["sw_thermal_slowdown"]
    assert hw["data"]["appeared"] == ["hw_thermal_slowdown"]
    assert hw["data"]["temperature_c"] == 90 and hw["data"]["memory_temperature_c"] == 98


def test_retired_pages_on_a_board_that_retires_pages(broker: Broker) -> None:
    hostname = f"health-{uuid.uuid4().hex[:8]}"
    nvml = SimulatedNvml.from_model("dgx-1-v100", node_name=hostname)
    watcher = HealthWatcher(hostname, Outbox(hostname, broker), clock=lambda: T0)

    def sample() -> list[HealthReport]:
        return watcher.compare(scan(nvml, include=inventory_agent.SAMPLE_SECTIONS))

    assert sample() == []

    faults.add_retired_pages(nvml, None, 1, [0x1F000, 0x2F000], cause="double_bit")
    [report] = sample()

    assert (report.kind, report.gpu_index) == ("retired_pages", 1)
    assert report.key == f"retired_pages:{report.gpu_uuid}:0:2:1"
    assert report.data["after"] == {"sbe": 0, "dbe": 2} and report.data["pending"] is True
    assert sample() == []


def test_queries_failing_are_reported_after_n_samples_once_per_episode(
    node: str, broker: Broker, watcher: HealthWatcher, settings: Any
) -> None:
    assert watcher.query_failures == settings.GPUADMIN_QUERY_FAILURES == 3
    gpu = uuid_of(node, 6)
    reports_after(node, broker)
    inject(settings, "fail", node, "6")

    found = [reports_after(node, broker) for _ in range(5)]

    assert found == [[], [], [("query_failing", f"query_failing:{gpu}:{MS}")], [], []]
    [[_, [report]]] = broker.batches
    assert report["data"]["samples"] == 3
    assert "NVML_ERROR_UNKNOWN" in report["data"]["error"]
    # It answers again, then fails again: a new episode, a new key.
    inject(settings, "clear", node, "6")
    reports_after(node, broker)
    watcher.clock = lambda: T0 + 60
    inject(settings, "fail", node, "6")
    again = [reports_after(node, broker) for _ in range(3)]
    assert again[-1] == [("query_failing", f"query_failing:{gpu}:{MS + 60_000}")]


def test_a_lost_gpu_is_reported_once_per_episode(
    node: str, broker: Broker, watcher: HealthWatcher, settings: Any
) -> None:
    gpu = uuid_of(node, 3)
    reports_after(node, broker)
    inject(settings, "lost", node, "3")

    first, second = reports_after(node, broker), reports_after(node, broker)

    assert first == [("gpu_lost", f"gpu_lost:{gpu}:{MS}")] and second == []
    [[_, [report]]] = broker.batches
    assert "NVML_ERROR_GPU_IS_LOST" in report["message"]
    assert sim_cli(["reset", node, "3", "--state-dir", str(settings.GPUADMIN_SIM_STATE_DIR)]) == 0
    assert reports_after(node, broker) == []  # back: no report, and a new episode may start


def test_unsent_reports_are_kept_and_resent_with_the_same_key(
    node: str, broker: Broker, watcher: HealthWatcher, settings: Any
) -> None:
    reports_after(node, broker)
    broker.down = True
    inject(settings, "ecc", node, "2", "1")
    reports_after(node, broker)  # refused: kept
    inject(settings, "ecc", node, "2", "2")
    reports_after(node, broker)  # refused again: both kept, in order
    broker.down = False

    reports_after(node, broker)  # the next sample delivers them
    reports_after(node, broker)

    gpu = uuid_of(node, 2)
    assert broker.keys == [f"ecc_uncorrected:{gpu}:1:1", f"ecc_uncorrected:{gpu}:2:2"]
    assert not watcher.outbox.unsent


def test_the_outbox_is_bounded(broker: Broker) -> None:
    outbox = Outbox("n1", broker, limit=2)
    broker.down = True
    reports = [HealthReport(kind="xid", key=f"xid:k{i}", occurred_at=T0) for i in range(3)]

    assert outbox.put(reports) is False

    broker.down = False
    assert outbox.put([]) is True
    assert broker.keys == ["xid:k1", "xid:k2"]  # the oldest went


def test_a_failing_receiver_never_stops_the_sampling(
    node: str, broker: Broker, watcher: HealthWatcher, settings: Any, caplog: Any
) -> None:
    def broken(**_: Any) -> None:
        raise RuntimeError("receiver bug")

    sample_taken.connect(broken, weak=False)
    try:
        reports_after(node, broker)
        inject(settings, "ecc", node, "1", "1")
        found = reports_after(node, broker)
    finally:
        sample_taken.disconnect(broken)

    assert [kind for kind, _ in found] == ["ecc_uncorrected"]
    assert "receiver bug" in caplog.text


def test_the_periodic_loop_sends_sample_taken(node: str, broker: Broker) -> None:
    seen: list[tuple[str, int]] = []

    def receiver(sender: Any, hostname: str, scan: Any, **_: Any) -> None:
        seen.append((hostname, len(scan.gpus)))

    sample_taken.connect(receiver, weak=False)
    loop = inventory_agent.AgentLoop(node, lambda *a, **k: None, sample_s=0.05)
    try:
        loop.start()
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        loop.stop()
        loop.join(timeout=10)
        sample_taken.disconnect(receiver)

    assert seen[:2] == [(node, 8), (node, 8)]  # the full sync, then a live sample


def test_the_xid_listener_reports_an_injected_xid_within_a_second(
    node: str, broker: Broker, settings: Any
) -> None:
    health = health_agent.start(node, inventory_agent.node_backend(), broker)
    try:
        assert health.listener.ready.wait(5)
        gpu = uuid_of(node, 0)
        started = time.monotonic()
        inject(settings, "xid", node, "0", "13", "--gi", "2", "--ci", "0", "--message", "Oops")
        assert broker.arrived.wait(1.0)
        elapsed = time.monotonic() - started
    finally:
        health.stop()

    [(hostname, [report])] = broker.batches
    assert hostname == node and elapsed < 1.0
    assert (report["kind"], report["xid"], report["gpu_index"]) == ("xid", 13, 0)
    assert report["gpu_uuid"] == gpu and report["key"].startswith(f"xid:{gpu}:13:")
    assert report["data"] == {
        "gpu_instance_id": 2,
        "compute_instance_id": 0,
        "text": "Oops",
    }
    assert not health.listener.is_alive()


def test_a_gpu_that_falls_off_the_bus_gives_xid_79_and_the_others_still_report(
    node: str, broker: Broker, settings: Any
) -> None:
    listener = XidListener(
        node, inventory_agent.node_backend(), Outbox(node, broker), wait_ms=100, retry_s=60
    )
    listener.start()
    state_dir = settings.GPUADMIN_SIM_STATE_DIR
    try:
        assert listener.ready.wait(5)
        faults.fall_off_bus(state_dir, node, 4)
        assert broker.arrived.wait(2)
        broker.arrived.clear()
        time.sleep(0.5)  # the set fails with GPU_IS_LOST and is made again without GPU 4
        faults.inject_xid(state_dir, node, 5, 48)
        assert broker.arrived.wait(2)
    finally:
        listener.stop()
        listener.join(timeout=5)

    found = [(r["xid"], r["gpu_index"]) for _, batch in broker.batches for r in batch]
    assert found == [(79, 4), (48, 5)]
    assert broker.batches[0][1][0]["message"] == "GPU has fallen off the bus."


def test_an_xid_right_after_a_gpu_is_lost_is_not_missed(
    node: str, broker: Broker, settings: Any
) -> None:
    """The listener registers a new event set without the lost GPU at once: an XID another
    GPU raises meanwhile (a job failing as the node shakes) is still seen."""
    listener = XidListener(
        node, inventory_agent.node_backend(), Outbox(node, broker), wait_ms=500, retry_s=60
    )
    listener.start()
    state_dir = settings.GPUADMIN_SIM_STATE_DIR
    try:
        assert listener.ready.wait(5)
        faults.fall_off_bus(state_dir, node, 4)
        assert broker.arrived.wait(2)
        broker.arrived.clear()
        faults.inject_xid(state_dir, node, 5, 13)
        assert broker.arrived.wait(3)
    finally:
        listener.stop()
        listener.join(timeout=5)
    found = [(r["xid"], r["gpu_index"]) for _, batch in broker.batches for r in batch]
    assert found == [(79, 4), (13, 5)]
