"""The mirror against a real Slurm 22.05 (conftest.py's cluster: one node ``localhost`` with 8
GPUs declared as GRES on /dev/nvidia0-7 placeholders), catalogued as a simulated 8-GPU node
whose device minor numbers run backwards (GPU ``i`` is /dev/nvidia<7-i>): a job holding 2 GPUs
lands on the catalogued GPUs of those minor numbers, a drained node is one health event, a
refused token is the cluster's state, and a drain 22.05 cannot do is refused and audited. Both
authentications: JWT over TCP, local on the socket."""

from __future__ import annotations

import re

import pytest

from gpuadmin.audit.models import AuditEvent
from health.choices import EventKind
from health.models import HealthEvent
from integrations.slurm import services
from integrations.slurm.models import AuthKind, PollState, SlurmCluster, SlurmJob, SlurmNode
from inventory.models import Gpu
from tests.integrations.slurm import test_live
from tests.integrations.slurm.mirror import add_reversed_node
from tests.integrations.slurm.test_live import scontrol

two_gpu_job = test_live.two_gpu_job  # a fixture: ``sbatch --gres=gpu:2``, running

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

NODE = "localhost"  # bench/slurm.py's only node


@pytest.fixture(params=[AuthKind.JWT, AuthKind.LOCAL])
def registered(request, admin_user, slurm_cluster) -> SlurmCluster:
    add_reversed_node(NODE)
    if request.param == AuthKind.JWT:
        cluster = SlurmCluster(
            name="bench-jwt",
            url=f"http://127.0.0.1:{slurm_cluster.rest_port}",
            user_name="nobody",
            token=slurm_cluster.token(),
        )
    else:
        cluster = SlurmCluster(
            name="bench-local", unix_socket=slurm_cluster.socket, auth=AuthKind.LOCAL
        )
    return services.save_cluster(cluster, actor=admin_user)


def test_a_slurm_job_holding_two_gpus_is_on_the_right_catalogued_gpus(
    registered, slurm_cluster, two_gpu_job
):
    detail = scontrol(slurm_cluster, "show", "job", "-d", str(two_gpu_job))
    held = re.search(r"GRES=gpu:2\(IDX:(\d+)-(\d+)\)", detail)
    assert held is not None, detail
    minors = list(range(int(held[1]), int(held[2]) + 1))
    assert services.poll(registered) == PollState.OK
    job = SlurmJob.objects.get(cluster=registered, job_id=two_gpu_job)
    assert (job.state, job.nodes) == ("RUNNING", [NODE])
    rows = job.gpus.select_related("gpu__node").order_by("minor_number")
    assert [row.minor_number for row in rows] == minors
    expected = Gpu.objects.filter(node__hostname=NODE, minor_number__in=minors)
    assert {row.gpu for row in rows} == set(expected)
    assert {row.gpu.index for row in rows} == {7 - minor for minor in minors}


def test_a_node_slurm_drains_is_one_health_event(registered, slurm_cluster):
    reason = "GPU 3 fell off the bus"
    scontrol(slurm_cluster, "update", f"nodename={NODE}", "state=drain", f"reason={reason}")
    try:
        for _ in range(2):
            assert services.poll(registered) == PollState.OK
    finally:
        scontrol(slurm_cluster, "update", f"nodename={NODE}", "state=resume")
    [event] = HealthEvent.objects.filter(node__hostname=NODE)
    assert event.kind == EventKind.SLURM_DRAIN
    assert reason in event.message and "set by root" in event.message
    assert services.poll(registered) == PollState.OK
    assert HealthEvent.objects.filter(node__hostname=NODE).count() == 1


def test_a_refused_token_and_an_absent_server_are_the_clusters_state(admin_user, slurm_cluster):
    cluster = services.save_cluster(
        SlurmCluster(
            name="bad-token",
            url=f"http://127.0.0.1:{slurm_cluster.rest_port}",
            user_name="nobody",
            token="not-a-token",
        ),
        actor=admin_user,
    )
    assert services.poll(cluster) == PollState.REFUSED
    assert "token" in cluster.last_error
    SlurmCluster.objects.filter(pk=cluster.pk).update(url="", unix_socket="/nonexistent.sock")
    cluster.refresh_from_db()
    cluster.auth = AuthKind.LOCAL
    assert services.poll(cluster) == PollState.UNREACHABLE
    assert "cannot be reached" in cluster.last_error


def test_slurm_22_05_cannot_drain_and_the_audit_log_says_so(registered):
    """Its slurmrestd (v0.0.38) has no node update: the request is refused, audited with the
    client's sentence, and the node is left as it was."""
    services.poll(registered)
    row = SlurmNode.objects.get(cluster=registered, name=NODE)
    SlurmCluster.objects.filter(pk=registered.pk).update(drain_fenced=True)
    assert services.drain_node(row.pk, "XID 79 on GPU 3") is False
    audited = AuditEvent.objects.get(event_type="slurm.node_drain_requested")
    assert audited.after["drained"] is False
    assert "cannot update nodes" in audited.message
    services.poll(registered)
    row.refresh_from_db()
    assert "DRAIN" not in row.states
