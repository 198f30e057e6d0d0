"""Real agents and a real central worker keep the catalog current; a dead agent shows."""

import signal
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest

from gpuadmin.audit.models import AuditEvent
from inventory import live
from inventory.models import Gpu, Node
from tests.conftest import REPO_DIR, agent_env, session_database_url
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

GRACE_S = 3


def node_is(hostname: str, *, reachable: bool) -> Callable[[], bool]:
    def check() -> bool:
        node = Node.objects.filter(hostname=hostname).first()
        return node is not None and node.is_reachable() is reachable

    return check


def test_agents_register_sync_heartbeat_and_reconcile(gpuadmin_env, settings):
    settings.GPUADMIN_HEARTBEAT_GRACE_S = GRACE_S
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_HEARTBEAT_INTERVAL_S": "1",
    }
    hostname = f"it-{uuid.uuid4().hex[:6]}"

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "gpuadmin", *args],
            env=agent_env(env, hostname) if args[0] == "agent" else env,
            cwd=REPO_DIR,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    agent_args = ("agent", "--node", hostname, "--sim", "pcie-l40s-4x")
    worker = start("worker", "--concurrency", "1")
    agent = start(*agent_args)
    try:
        wait_for(node_is(hostname, reachable=True), 90, "the node to register and heartbeat")
        wait_for(lambda: Gpu.objects.on_node(hostname).count() == 4, 30, "its 4 GPUs")
        wait_for(lambda: len(live.latest([hostname])[hostname]) == 4, 30, "live samples")
        samples = live.latest([hostname])[hostname]
        assert {sample["temperature_c"] for sample in samples.values()} <= set(range(20, 40))
        node = Node.objects.get(hostname=hostname)
        assert (node.model, node.nvml_backend, node.driver_version, node.agent_version) == (
            "pcie-l40s-4x",
            "sim",
            "595.80",
            "0.1.0",
        )

        agent.send_signal(signal.SIGKILL)  # a crash: no goodbye
        agent.wait(timeout=10)
        wait_for(node_is(hostname, reachable=False), GRACE_S + 10, "the node to go unreachable")
        assert not Gpu.objects.schedulable().on_node(hostname).exists()

        agent = start(*agent_args)
        wait_for(node_is(hostname, reachable=True), 60, "the node to come back")
        wait_for(
            lambda: Gpu.objects.schedulable().on_node(hostname).count() == 4,
            30,
            "its GPUs to be schedulable again",
        )
    finally:
        for process in (agent, worker):
            process.terminate()
        for process in (agent, worker):
            process.wait(timeout=30)

    assert Node.objects.filter(hostname=hostname).count() == 1
    assert Gpu.objects.on_node(hostname).count() == 4
    registered = AuditEvent.objects.filter(event_type="node.registered", target_id=str(node.pk))
    assert registered.count() == 1
    # Scoped to this node: agents of other tests may still have scans queued on the broker.
    uuids = list(Gpu.objects.on_node(hostname).values_list("uuid", flat=True))
    appeared = AuditEvent.objects.filter(event_type="gpu.appeared", target_id__in=uuids)
    assert appeared.count() == 4  # the restart reconciled without duplicates
