"""MIG instance create/destroy through the node agent (inventory.services), audited.

Most tests run the agent's task in-process (``send_task`` replaced by a direct call of the task
over a simulator sharing the node's state dir); the integration test runs a real agent.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from gpuadmin import registry
from gpuadmin.audit.models import AuditEvent
from inventory import live, tasks
from inventory.agent import node_backend
from inventory.models import Gpu, MigInstance, Node
from inventory.nvml.scanner import scan
from inventory.nvml.sim import faults
from inventory.services import (
    MIG_TASK_TIMEOUT_S,
    AgentTimedOut,
    MigChangeRefused,
    create_mig_instance,
    destroy_mig_instance,
)
from tests.integration.stack import worker_and_agent
from tests.inventory.conftest import SimNode
from tests.waiting import wait_for

# dgx-a100-40gb: GPU 0 = 3g.20gb (GI 2 at 4) + 2x 2g.10gb (GI 3 at 0, GI 4 at 2); GPU 2: no MIG.
INITIAL_GPU0 = [(2, 0, "3g.20gb", 4), (3, 0, "2g.10gb", 0), (4, 0, "2g.10gb", 2)]


def mig_layout(gpu: Gpu) -> list[tuple[int, int, str, int]]:
    return list(
        MigInstance.objects.filter(gpu=gpu)
        .order_by("gi_id", "ci_id")
        .values_list("gi_id", "ci_id", "profile_name", "placement_start")
    )


def audit_rows(*kinds: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(event_type__in=kinds).order_by("pk"))


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_user("mig-admin", password="x", is_staff=True)


def test_destroy_then_create_goes_through_the_agent_and_is_audited(node, admin):
    gpu = node.gpu(0)
    rows = destroy_mig_instance(gpu, 2, actor=admin)
    assert [(r.gi_id, r.profile_name) for r in rows] == [(3, "2g.10gb"), (4, "2g.10gb")]

    rows = create_mig_instance(gpu, "3g.20gb", actor=admin, placement_start=4)
    assert [(r.gi_id, r.ci_id, r.profile_name, r.placement_start) for r in rows] == INITIAL_GPU0
    assert all(r.uuid and r.uuid.startswith("MIG-") for r in rows)

    assert node.broker.sent == [
        {
            "name": "inventory.mig_destroy",
            "args": (0, 2),
            "queue": f"node.{node.hostname}",
            "expires": MIG_TASK_TIMEOUT_S,
        },
        {
            "name": "inventory.mig_create",
            "args": (0, "3g.20gb", 4),
            "queue": f"node.{node.hostname}",
            "expires": MIG_TASK_TIMEOUT_S,
        },
    ]
    destroyed, created = audit_rows("gpu.mig_instance_destroyed", "gpu.mig_instance_created")
    assert (destroyed.actor, destroyed.target_id) == (admin, gpu.uuid)
    assert destroyed.before["gi_id"] == 2
    assert destroyed.before["profile_name"] == "3g.20gb"
    assert [row["gi_id"] for row in destroyed.before["mig_instances"]] == [2, 3, 4]
    assert [row["gi_id"] for row in destroyed.after["mig_instances"]] == [3, 4]
    assert (created.actor, created.after["gi_id"], created.after["ci_id"]) == (admin, 2, 0)
    assert created.message == "created 3g.20gb as GPU instance 2 / compute instance 0"
    assert [row["gi_id"] for row in created.after["mig_instances"]] == [2, 3, 4]
    assert audit_rows("gpu.mig_changed") == []  # one row per change: not discovery's too


def test_a_change_nvml_refuses_is_reported_and_only_the_scan_is_applied(node, admin):
    gpu = node.gpu(0)
    with pytest.raises(MigChangeRefused) as caught:
        create_mig_instance(gpu, "3g.20gb", actor=admin)
    assert caught.value.code == "no_room"
    assert caught.value.message == (
        "no room for 3g.20gb on GPU 0: NVML_ERROR_INSUFFICIENT_RESOURCES"
    )
    with pytest.raises(MigChangeRefused, match=r"^unknown profile 9g\.99gb; GPU 0 offers: 1g"):
        create_mig_instance(gpu, "9g.99gb", actor=admin)
    assert mig_layout(gpu) == INITIAL_GPU0
    assert audit_rows("gpu.mig_instance_created", "gpu.mig_changed") == []


def test_a_node_that_does_not_answer_times_out_and_nothing_is_written(node, admin):
    node.broker.answer = False
    gpu = node.gpu(0)
    with pytest.raises(AgentTimedOut) as caught:
        destroy_mig_instance(gpu, 2, actor=admin)
    assert str(caught.value) == (
        f"node {node.hostname} did not answer within 30 s; nothing was recorded "
        "(should its agent still make the change, its next scan will show it)"
    )
    assert node.broker.revoked == 1
    assert mig_layout(gpu) == INITIAL_GPU0
    assert audit_rows("gpu.mig_instance_destroyed", "gpu.mig_changed") == []


def make_busy(node: SimNode) -> None:
    faults.start_process(node.state_dir, node.hostname, 0, 4242, used_mib=512, gpu_instance=2)
    live.publish(node.hostname, scan(node_backend()))


def make_unreachable(node: SimNode) -> None:
    Node.objects.filter(hostname=node.hostname).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=31)
    )


def drop_samples(node: SimNode) -> None:
    live.client().delete(live.KEY_PREFIX + node.hostname)


def mark_missing(node: SimNode) -> None:
    Gpu.objects.filter(node__hostname=node.hostname, index=0).update(missing_since=timezone.now())


REFUSALS: list[tuple[str, int, Callable[[SimNode], None], str]] = [
    ("mig_disabled", 2, lambda node: None, "MIG is not enabled on GPU 2 of {host}"),
    ("busy", 0, make_busy, "GPU 0 of {host} is busy: 1 process(es) running on it"),
    (
        "node_unreachable",
        0,
        make_unreachable,
        "node {host} is unreachable: no heartbeat in the last 30 s",
    ),
    (
        "no_live_sample",
        0,
        drop_samples,
        "no live sample of GPU 0 of {host}: cannot tell whether it runs work",
    ),
    ("gpu_missing", 0, mark_missing, "GPU 0 of {host} is missing from its node's scans"),
]


@pytest.mark.parametrize(
    ("code", "gpu_index", "setup", "message"), REFUSALS, ids=[case[0] for case in REFUSALS]
)
def test_refusals_happen_before_anything_is_sent(node, admin, code, gpu_index, setup, message):
    setup(node)
    gpu = node.gpu(gpu_index)
    before = (mig_layout(gpu), AuditEvent.objects.count())
    for change in (
        lambda: create_mig_instance(gpu, "1g.5gb", actor=admin),
        lambda: destroy_mig_instance(gpu, 2, actor=admin),
    ):
        with pytest.raises(MigChangeRefused) as caught:
            change()
        assert (caught.value.code, str(caught.value)) == (code, message.format(host=node.hostname))
    assert node.broker.sent == []
    assert (mig_layout(gpu), AuditEvent.objects.count()) == before


def test_destroying_a_gpu_instance_the_catalog_lacks_is_refused(node, admin):
    with pytest.raises(MigChangeRefused, match=r"^GPU 0 of mig-\w+ has no GPU instance 9$"):
        destroy_mig_instance(node.gpu(0), 9, actor=admin)
    assert node.broker.sent == []


def test_a_registered_mig_change_veto_refuses_mig_changes(node, admin, monkeypatch):
    def veto(gpu: Gpu, actor_name: str | None) -> str | None:
        return f"GPU {gpu.index} has an active allocation" if gpu.index == 0 else None

    # Asked of this test alone: scheduling's own veto is not called here.
    monkeypatch.setattr(registry.mig_change_vetoes, "answers", (veto,))
    with pytest.raises(MigChangeRefused, match="^GPU 0 has an active allocation$"):
        create_mig_instance(node.gpu(0), "1g.5gb", actor=admin)
    assert node.broker.sent == []
    assert len(destroy_mig_instance(node.gpu(1), 7, actor=admin)) == 6  # other GPUs still can


def test_the_node_task_returns_the_error_and_a_fresh_scan(node):
    outcome = tasks.mig_destroy(0, 9)
    assert outcome["error"] == {
        "message": "GPU 0 has no GPU instance 9",
        "code": "no_such_instance",
    }
    assert len(outcome["scan"]["gpus"]) == 8


# --------------------------------------------------------------------------- a real agent


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_agent_destroys_and_creates_a_gpu_instance(gpuadmin_env, tmp_path):
    hostname = f"it-mig-{uuid.uuid4().hex[:6]}"
    admin = get_user_model().objects.create_user("it-mig-admin", password="x", is_staff=True)
    # The central worker registers the node from the agent's own scan and heartbeats.
    with worker_and_agent(gpuadmin_env, hostname, ("--sim", "dgx-a100-40gb"), 8, tmp_path):
        wait_for(lambda: len(live.latest([hostname])[hostname]) == 8, 30, "live samples")
        gpu = Gpu.objects.get(node__hostname=hostname, index=0)
        assert mig_layout(gpu) == INITIAL_GPU0

        after_destroy = destroy_mig_instance(gpu, 2, actor=admin)
        assert [row.gi_id for row in after_destroy] == [3, 4]
        assert mig_layout(gpu) == INITIAL_GPU0[1:]

        after_create = create_mig_instance(gpu, "3g.20gb", actor=admin)
        assert [(r.gi_id, r.ci_id, r.profile_name, r.placement_start) for r in after_create] == (
            INITIAL_GPU0
        )

    created_uuid = next(row.uuid for row in after_create if row.gi_id == 2)
    assert created_uuid and created_uuid.startswith("MIG-")
    destroyed, created = audit_rows("gpu.mig_instance_destroyed", "gpu.mig_instance_created")
    assert (destroyed.event_type, destroyed.actor, destroyed.target_id) == (
        "gpu.mig_instance_destroyed",
        admin,
        gpu.uuid,
    )
    assert (created.event_type, created.actor, created.after["gi_id"]) == (
        "gpu.mig_instance_created",
        admin,
        2,
    )
    assert [row["uuid"] for row in created.after["mig_instances"]][0] == created_uuid
    # Scoped to this GPU: agents of other tests may still have scans queued on the broker.
    changed = [row.target_id for row in audit_rows("gpu.mig_changed") if row.target_id == gpu.uuid]
    assert changed == []  # the rows above describe them, not discovery's too
