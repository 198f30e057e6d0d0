"""The GPU state machine (``inventory.services.set_gpu_state``): every pair of states against
``GPU_TRANSITIONS``, the audit row of each change, ``expect=``, and ``gpus_went_offline`` sent
once on commit when GPUs go offline (never for a change that rolled back)."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from gpuadmin.audit.models import AuditEvent
from inventory.choices import GpuState, NodeState
from inventory.models import Gpu, Node
from inventory.services import (
    GPU_TRANSITIONS,
    IllegalGpuTransition,
    apply_discovery,
    record_heartbeat,
    set_gpu_state,
    set_node_state,
)
from inventory.signals import gpus_went_offline

pytestmark = pytest.mark.django_db

STATES = list(GpuState.values)


@pytest.fixture
def node(sim_scan) -> Node:
    apply_discovery("box-01", sim_scan("pcie-l40s-4x", "box-01"))
    record_heartbeat("box-01")
    return Node.objects.get(hostname="box-01")


@pytest.fixture
def gpu(node) -> Gpu:
    return node.gpus.get(index=0)


@pytest.fixture
def ops(django_user_model):
    return django_user_model.objects.create_user("ops")


@pytest.fixture
def offline_signals():
    """What ``gpus_went_offline`` receivers are sent, as (gpu_ids, reason, actor_name)."""
    sent: list[tuple[list[int], str, str]] = []

    def receiver(sender, *, gpu_ids, reason, actor_name, **kwargs):
        sent.append((list(gpu_ids), reason, actor_name))

    gpus_went_offline.connect(receiver, dispatch_uid="test-offline")
    yield sent
    gpus_went_offline.disconnect(dispatch_uid="test-offline")


def test_the_table_covers_every_state_and_names_only_states():
    assert set(GPU_TRANSITIONS) == set(STATES)
    for source, targets in GPU_TRANSITIONS.items():
        assert targets <= set(STATES) and source not in targets, source
    # A reset is interrupted by nothing but its end (available or degraded) or an offline.
    assert GPU_TRANSITIONS[GpuState.RESETTING] == {
        GpuState.AVAILABLE,
        GpuState.DEGRADED,
        GpuState.OFFLINE,
    }


@pytest.mark.parametrize(("source", "target"), list(itertools.product(STATES, STATES)))
def test_every_pair_is_applied_or_refused_as_the_table_says(gpu, ops, source, target):
    Gpu.objects.filter(pk=gpu.pk).update(state=source)
    gpu.refresh_from_db()
    before = AuditEvent.objects.count()
    if source == target:
        assert set_gpu_state(gpu, target, actor=ops, reason="same") is False
        assert AuditEvent.objects.count() == before
    elif target in GPU_TRANSITIONS[source]:
        assert set_gpu_state(gpu, target, actor=ops, reason="maintenance window") is True
        row = AuditEvent.objects.get(event_type="gpu.state_changed")
        assert (row.before, row.after) == ({"state": source}, {"state": target})
        assert (row.actor, row.actor_name, row.message) == (ops, "ops", "maintenance window")
        assert (row.target_type, row.target_id) == ("inventory.gpu", gpu.uuid)
    else:
        with pytest.raises(IllegalGpuTransition) as refused:
            set_gpu_state(gpu, target, actor=ops, reason="nope")
        allowed = ", ".join(sorted(GPU_TRANSITIONS[source]))
        assert str(refused.value) == (
            f"GPU 0 of box-01 is {source}: it can go to {allowed}, not {target}"
        )
        assert AuditEvent.objects.count() == before
    gpu.refresh_from_db()
    assert gpu.state == (target if target in GPU_TRANSITIONS[source] else source)


def test_a_change_keeps_its_reason_and_time_on_the_gpu(gpu):
    assert set_gpu_state(gpu, GpuState.DEGRADED, actor_name="health", reason="XID 48") is True
    stored = Gpu.objects.get(pk=gpu.pk)
    assert (stored.state, stored.state_reason) == ("degraded", "XID 48")
    assert stored.state_changed_at is not None and stored.state_changed_at == gpu.state_changed_at
    row = AuditEvent.objects.get(event_type="gpu.state_changed")
    assert (row.actor, row.actor_name, row.message) == (None, "health", "XID 48")


def test_expect_refuses_when_someone_else_moved_the_gpu(gpu, ops):
    set_gpu_state(gpu, GpuState.DEGRADED, actor_name="health", reason="XID 48")
    stale = Gpu.objects.get(pk=gpu.pk)  # what a policy read before the admin acted
    set_gpu_state(gpu, GpuState.OFFLINE, actor=ops, reason="RMA")
    with pytest.raises(IllegalGpuTransition, match="GPU 0 of box-01 is offline, not degraded"):
        set_gpu_state(stale, GpuState.AVAILABLE, actor_name="health", expect={GpuState.DEGRADED})
    assert Gpu.objects.get(pk=gpu.pk).state == GpuState.OFFLINE
    assert AuditEvent.objects.filter(event_type="gpu.state_changed").count() == 2
    # As expected: it goes.
    set_gpu_state(gpu, GpuState.AVAILABLE, actor=ops, expect={GpuState.OFFLINE, "draining"})
    assert Gpu.objects.get(pk=gpu.pk).state == GpuState.AVAILABLE


def test_an_unknown_state_is_a_value_error(gpu, node):
    with pytest.raises(ValueError, match="'broken' is not a Gpu state"):
        set_gpu_state(gpu, "broken", actor_name="health")
    with pytest.raises(ValueError, match="'degraded' is not a Node state"):
        set_node_state(node, "degraded", actor_name="health")


def test_degraded_and_resetting_gpus_are_not_schedulable(node):
    zero, one, two, _three = node.gpus.order_by("index")
    set_gpu_state(zero, GpuState.DEGRADED, actor_name="health")
    set_gpu_state(one, GpuState.RESETTING, actor_name="health")
    set_gpu_state(two, GpuState.DRAINING, actor_name="health")
    schedulable = set(Gpu.objects.filter(node=node).schedulable().values_list("index", flat=True))
    assert schedulable == {3}


# --------------------------------------------------------------------------- gpus_went_offline


def test_offline_is_announced_once_on_commit(
    gpu, ops, offline_signals, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        set_gpu_state(gpu, GpuState.OFFLINE, actor=ops, reason="fan broken")
        assert offline_signals == []  # not before the commit
    assert len(callbacks) == 1
    assert offline_signals == [([gpu.pk], "GPU 0 of box-01 went offline: fan broken", "ops")]
    # Already offline: nothing more; back online and draining: no offline announced.
    with django_capture_on_commit_callbacks(execute=True):
        set_gpu_state(gpu, GpuState.OFFLINE, actor=ops)
        set_gpu_state(gpu, GpuState.AVAILABLE, actor=ops)
        set_gpu_state(gpu, GpuState.DRAINING, actor=ops)
    assert len(offline_signals) == 1


def test_offline_that_rolls_back_is_never_announced(
    gpu, offline_signals, django_capture_on_commit_callbacks
):
    class Abort(Exception):
        pass

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(Abort),
        transaction.atomic(),
    ):
        set_gpu_state(gpu, GpuState.OFFLINE, actor_name="health", reason="XID 79")
        raise Abort
    assert callbacks == [] and offline_signals == []
    assert Gpu.objects.get(pk=gpu.pk).state == GpuState.AVAILABLE


def test_a_node_going_offline_announces_its_gpus_not_already_offline(
    node, offline_signals, django_capture_on_commit_callbacks
):
    zero, one, two, three = node.gpus.order_by("index")
    set_gpu_state(one, GpuState.OFFLINE, actor_name="health", reason="XID 79")
    with django_capture_on_commit_callbacks(execute=True):
        set_node_state(node, NodeState.DRAINING, actor_name="tests")
        set_node_state(node, NodeState.OFFLINE, actor_name="tests", reason="rack power")
    assert offline_signals == [
        (sorted([zero.pk, two.pk, three.pk]), "node box-01 went offline: rack power", "tests")
    ]


def test_a_user_actor_is_named_in_the_offline_signal(
    node, offline_signals, django_capture_on_commit_callbacks
):
    admin = get_user_model().objects.create_user("root")
    with django_capture_on_commit_callbacks(execute=True):
        set_node_state(node, NodeState.OFFLINE, actor=admin)
    [(ids, reason, actor_name)] = offline_signals
    assert (len(ids), reason, actor_name) == (4, "node box-01 went offline", "root")
