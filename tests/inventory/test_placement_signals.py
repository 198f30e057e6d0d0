"""``inventory.signals.gpus_became_schedulable``: sent once a committed change makes GPUs
schedulable whole that were not (apps above inventory wake their placement on it), never for
one that only takes GPUs away, for a heartbeat of a node already heard from, or on rollback."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from inventory.choices import GpuState, NodeState
from inventory.models import Gpu, Node
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.services import (
    apply_discovery,
    record_heartbeat,
    set_gpu_state,
    set_node_state,
)
from inventory.signals import gpus_became_schedulable
from tests.inventory.conftest import SimNode, model_with_uuids

pytestmark = pytest.mark.django_db

Announced = Callable[[Callable[[], object]], list[list[int]]]


@pytest.fixture
def heard(monkeypatch) -> list[list[int]]:
    """The ``gpu_ids`` of every signal sent, heard by this test alone: the apps above
    inventory (scheduling waking its loop) are not called here."""
    sent: list[list[int]] = []

    def receiver(sender: type, gpu_ids: list[int], **kwargs: Any) -> None:
        assert sender is Gpu
        sent.append(gpu_ids)

    monkeypatch.setattr(gpus_became_schedulable, "receivers", [])
    gpus_became_schedulable.connect(receiver, weak=False)
    return sent


@pytest.fixture
def announced(heard, django_capture_on_commit_callbacks) -> Announced:
    """``announced(change)``: make the change, commit it, and return what the signal said."""

    def run(change: Callable[[], object]) -> list[list[int]]:
        heard.clear()
        with django_capture_on_commit_callbacks(execute=True):
            change()
        return list(heard)

    return run


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_user("olga", is_staff=True)


def online_node(hostname: str = "dgx-01", model: Any = "dgx-a100-40gb") -> Node:
    """A discovered node whose agent has just been heard from (DGX A100 40GB: GPUs 0 and 1 are
    in MIG mode, so never schedulable whole)."""
    apply_discovery(hostname, scan(SimulatedNvml.from_model(model, node_name=hostname)))
    record_heartbeat(hostname)
    return Node.objects.get(hostname=hostname)


def whole_gpus(node: Node) -> list[int]:
    return sorted(node.gpus.filter(mig_enabled=False).values_list("pk", flat=True))


def gpu(node: Node, index: int) -> Gpu:
    return node.gpus.get(index=index)


# --------------------------------------------------------------------------- state changes


def test_a_node_back_online_announces_its_schedulable_whole_gpus(announced, admin):
    node = online_node()
    seven = gpu(node, 7)
    set_gpu_state(seven, GpuState.OFFLINE, actor=admin)
    assert announced(lambda: set_node_state(node, NodeState.DRAINING, actor=admin)) == []
    assert announced(lambda: set_node_state(node, NodeState.OFFLINE, actor=admin)) == []

    # Not the MIG-mode GPUs 0 and 1, nor the offline GPU 7.
    usable = [pk for pk in whole_gpus(node) if pk != seven.pk]
    assert announced(lambda: set_node_state(node, NodeState.ONLINE, actor=admin)) == [usable]
    assert announced(lambda: set_node_state(node, NodeState.ONLINE, actor=admin)) == []


def test_a_gpu_back_to_available_is_announced_only_where_it_can_be_used(announced, admin):
    node = online_node()
    three = gpu(node, 3)
    assert announced(lambda: set_gpu_state(three, GpuState.DRAINING, actor=admin)) == []
    assert announced(lambda: set_gpu_state(three, GpuState.AVAILABLE, actor=admin)) == [[three.pk]]
    # In MIG mode, or on a drained node, a GPU set available still cannot be given whole.
    zero = gpu(node, 0)
    set_gpu_state(zero, GpuState.OFFLINE, actor=admin)
    assert announced(lambda: set_gpu_state(zero, GpuState.AVAILABLE, actor=admin)) == []
    set_node_state(node, NodeState.DRAINING, actor=admin)
    set_gpu_state(three, GpuState.OFFLINE, actor=admin)
    assert announced(lambda: set_gpu_state(three, GpuState.AVAILABLE, actor=admin)) == []


def test_admin_state_actions_announce(admin_client, announced):
    node = online_node()
    pks = whole_gpus(node)
    Gpu.objects.filter(pk__in=pks[:2]).update(state=GpuState.DRAINING)
    Node.objects.filter(pk=node.pk).update(state=NodeState.DRAINING)

    def admin_action(model: str, action: str, pks: list[int]) -> None:
        response = admin_client.post(
            f"/admin/inventory/{model}/",
            {"action": action, "_selected_action": pks, "apply": "1", "reason": "tests"},
        )
        assert response.status_code == 302

    assert announced(lambda: admin_action("gpu", "set_available", pks[:2])) == []
    assert announced(lambda: admin_action("node", "set_online", [node.pk])) == [pks]
    assert announced(lambda: admin_action("node", "set_draining", [node.pk])) == []


# --------------------------------------------------------------------------- heartbeats


def test_only_a_heartbeat_that_ends_a_silence_announces(announced):
    node = online_node()
    now = timezone.now()
    assert announced(lambda: record_heartbeat(node.hostname, now)) == []  # already heard from
    # A late heartbeat (a retried task) never moves the clock back.
    assert announced(lambda: record_heartbeat(node.hostname, now - timedelta(seconds=5))) == []
    assert Node.objects.get(pk=node.pk).last_heartbeat_at == now

    silent_since = now - timedelta(minutes=5)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=silent_since)
    # Heard of again, but from longer ago than the grace: still unreachable.
    a_minute_ago = now - timedelta(minutes=1)
    assert announced(lambda: record_heartbeat(node.hostname, a_minute_ago)) == []
    assert Node.objects.get(pk=node.pk).last_heartbeat_at == a_minute_ago

    assert announced(lambda: record_heartbeat(node.hostname)) == [whole_gpus(node)]
    assert announced(lambda: record_heartbeat(node.hostname)) == []


def test_a_silent_node_that_is_drained_or_unknown_announces_nothing(announced, admin):
    node = online_node()
    set_node_state(node, NodeState.DRAINING, actor=admin)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=None)
    assert announced(lambda: record_heartbeat(node.hostname)) == []
    assert Node.objects.get(pk=node.pk).is_reachable()
    assert announced(lambda: record_heartbeat("nowhere")) == []
    assert record_heartbeat("nowhere") is False


# --------------------------------------------------------------------------- discovery


def test_discovery_announces_gpus_only_once_their_node_is_heard_from(announced):
    assert announced(lambda: online_node("box-01", "pcie-l40s-4x")) == [
        whole_gpus(Node.objects.get(hostname="box-01"))  # by its first heartbeat, not its scan
    ]
    full = model_with_uuids("pcie-l40s-4x", "box-02")
    online_node("box-02", {**full, "gpus": full["gpus"][:3]})
    box = Node.objects.get(hostname="box-02")

    assert announced(lambda: online_node("box-02", full)) == [[gpu(box, 3).pk]]  # a new GPU


def test_discovery_announces_gpus_that_return_or_recover(announced):
    node = online_node("dgx-01", "dgx-h100")
    full = model_with_uuids("dgx-h100", "dgx-01")
    five = gpu(node, 5)
    without_five = {**full, "gpus": [g for i, g in enumerate(full["gpus"]) if i != 5]}

    def sync(model: Any) -> None:
        apply_discovery("dgx-01", scan(SimulatedNvml.from_model(model, node_name="dgx-01")))

    assert announced(lambda: sync(without_five)) == []
    assert announced(lambda: sync(full)) == [[five.pk]]
    assert announced(lambda: sync(full)) == []

    nvml = SimulatedNvml.from_model(full, node_name="dgx-01")
    faults.fall_off_bus(nvml, None, 4)
    assert announced(lambda: apply_discovery("dgx-01", scan(nvml))) == []
    assert gpu(node, 4).error_message
    faults.clear(nvml, None, 4)
    assert announced(lambda: apply_discovery("dgx-01", scan(nvml))) == [[gpu(node, 4).pk]]


def test_discovery_announces_a_gpu_that_leaves_mig_mode_not_a_new_mig_layout(announced):
    node = online_node()

    def sync(gpu0_layout: list[str] | None) -> None:
        spec = {"nodes": [{"name": "dgx-01", "model": "dgx-a100-40gb", "mig": {"0": gpu0_layout}}]}
        apply_discovery("dgx-01", scan(SimulatedNvml.from_fleet_spec(spec, "dgx-01")))

    assert announced(lambda: sync(["7g.40gb"])) == []  # still in MIG mode: no whole GPU freed
    assert announced(lambda: sync(None)) == [[gpu(node, 0).pk]]
    assert not gpu(node, 0).mig_enabled


def test_a_discover_through_the_api_announces_a_recovered_gpu(
    client, admin, announced, node: SimNode
):
    client.force_login(admin)
    faults.fall_off_bus(node.state_dir, node.hostname, 6)

    def discover() -> None:
        assert client.get(f"/gpu/discover?node={node.hostname}").status_code == 200

    assert announced(discover) == []
    faults.clear(node.state_dir, node.hostname, 6)
    assert announced(discover) == [[node.gpu(6).pk]]


# --------------------------------------------------------------------------- transactions


def test_sent_only_once_the_change_commits(heard, admin, django_capture_on_commit_callbacks):
    node = online_node()
    set_node_state(node, NodeState.DRAINING, actor=admin)
    with django_capture_on_commit_callbacks() as callbacks:
        set_node_state(node, NodeState.ONLINE, actor=admin)
        assert heard == []
    assert heard == []
    for callback in callbacks:  # the commit
        callback()
    assert heard == [whole_gpus(node)]


def test_nothing_is_sent_when_the_change_rolls_back(
    heard, admin, django_capture_on_commit_callbacks
):
    node = online_node()
    set_node_state(node, NodeState.DRAINING, actor=admin)
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        set_node_state(node, NodeState.ONLINE, actor=admin)
        raise RuntimeError("the surrounding change failed")
    assert callbacks == []
    assert heard == []
    assert Node.objects.get(pk=node.pk).state == NodeState.DRAINING
