"""A GPU health fences on a node a Slurm cluster runs: with the cluster's ``drain_fenced``,
gpuadmin asks Slurm to drain the node (``slurm.drain_node``, audited); without it, nothing."""

from __future__ import annotations

import pytest

from gpuadmin.audit.models import AuditEvent
from integrations.slurm import services, tasks
from integrations.slurm.models import SlurmCluster, SlurmNode
from inventory.models import Gpu
from tests.health.test_quarantine import fence
from tests.integrations.slurm.mirror import add_reversed_node, answer, node, register

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(admin_user) -> SlurmCluster:
    add_reversed_node("gpu01")
    cluster = register(admin_user)
    services.sync(cluster, answer([node("gpu01", "ALLOCATED")], []))
    return cluster


def test_a_fenced_gpu_drains_its_node_in_slurm_when_the_cluster_allows_it(
    cluster, broker, slurmrestd, django_capture_on_commit_callbacks
):
    SlurmCluster.objects.filter(pk=cluster.pk).update(drain_fenced=True)
    gpu = Gpu.objects.get(node__hostname="gpu01", index=3)
    with django_capture_on_commit_callbacks(execute=True):
        assert fence(gpu, None)
    [(name, (row_id, reason), queue)] = broker.sent
    assert (name, row_id) == ("slurm.drain_node", SlurmNode.objects.get(name="gpu01").pk)
    slurmrestd.operations["drain_node"] = lambda name, reason: None
    assert tasks.drain_node(row_id, reason) is True
    [(_, _, token, operation, (name, said))] = slurmrestd.calls
    assert (token, operation, name) == ("jwt-secret", "drain_node", "gpu01")
    assert said.startswith("gpuadmin: XID 4242") and "GPU 3 of gpu01" in said
    row = AuditEvent.objects.get(event_type="slurm.node_drain_requested")
    assert (row.actor_name, row.after["drained"], row.object_repr) == ("health", True, "hpc/gpu01")


def test_without_drain_fenced_or_on_a_drained_node_nothing_is_asked(
    cluster, broker, django_capture_on_commit_callbacks
):
    gpus = Gpu.objects.filter(node__hostname="gpu01").order_by("index")
    with django_capture_on_commit_callbacks(execute=True):
        assert fence(gpus[0], None)
    SlurmCluster.objects.filter(pk=cluster.pk).update(drain_fenced=True)
    services.sync(cluster, answer([node("gpu01", "ALLOCATED", "DRAIN", reason="fan")], []))
    with django_capture_on_commit_callbacks(execute=True):
        assert fence(gpus[1], None)
    assert broker.sent == []


def test_a_drain_slurm_refuses_is_audited_with_its_error(cluster, slurmrestd):
    SlurmCluster.objects.filter(pk=cluster.pk).update(drain_fenced=True)

    def refused(name: str, reason: str) -> None:
        raise slurmrestd.error("HTTP 403: Forbidden")

    slurmrestd.operations["drain_node"] = refused
    assert services.drain_node(SlurmNode.objects.get(name="gpu01").pk, "XID 79") is False
    row = AuditEvent.objects.get(event_type="slurm.node_drain_requested")
    assert (row.after["drained"], row.message) == (False, "HTTP 403: Forbidden")
