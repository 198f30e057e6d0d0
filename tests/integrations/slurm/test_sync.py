"""Mirroring a Slurm cluster (``integrations.slurm.services``): a poll's answer, built by hand,
written in one transaction; Slurm's GPU indexes read as minor numbers; drains and downs as
health events, one per episode; polls that fail as the cluster's state; what the audit log
keeps."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from health.choices import EventKind
from health.models import HealthEvent
from integrations.slurm import services, tasks
from integrations.slurm.models import PollState, SlurmCluster, SlurmJob, SlurmNode, SlurmPartition
from integrations.slurm.rest import model
from inventory.models import Gpu
from inventory.signals import gpus_became_schedulable
from tests.integrations.slurm.mirror import add_reversed_node, answer, job, node, register
from tests.scheduling.conftest import broker  # noqa: F401  (a fixture: the loop's wakes)

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(admin_user) -> SlurmCluster:
    add_reversed_node("gpu01")
    add_reversed_node("gpu02")
    return register(admin_user)


def test_a_jobs_gpus_are_the_catalogued_gpus_of_those_minor_numbers(cluster):
    """Slurm's ``gpu:2(IDX:0-1)`` names /dev/nvidia0 and /dev/nvidia1: NVML's GPUs 7 and 6 on
    these nodes. An index the catalog has no GPU for stays, as a number."""
    services.sync(
        cluster,
        answer(
            [node("gpu01", "MIXED", used=(0, 1)), node("gpu02"), node("login01")],
            [job(11, {"gpu01": (0, 1)}), job(12, {"login01": (0,)}), job(13)],
        ),
    )
    held = SlurmJob.objects.get(cluster=cluster, job_id=11).gpus.select_related("gpu__node")
    assert [(row.minor_number, row.gpu.node.hostname, row.gpu.index) for row in held] == [
        (0, "gpu01", 7),
        (1, "gpu01", 6),
    ]
    [unmatched] = SlurmJob.objects.get(cluster=cluster, job_id=12).gpus.all()
    assert (unmatched.node_name, unmatched.minor_number, unmatched.gpu) == ("login01", 0, None)
    nodes = {row.name: row for row in SlurmNode.objects.filter(cluster=cluster)}
    assert nodes["gpu01"].node.hostname == "gpu01"
    assert nodes["login01"].node is None
    assert nodes["gpu01"].states == ["MIXED"] and nodes["gpu01"].gpus_used == [0, 1]
    assert SlurmPartition.objects.get(cluster=cluster).nodes == ["gpu01", "gpu02", "login01"]
    cluster.refresh_from_db()
    assert (cluster.state, cluster.api_version, cluster.last_error) == (PollState.OK, "v0.0.38", "")


def test_a_short_slurm_name_finds_the_catalogued_fully_qualified_host(admin_user):
    add_reversed_node("gpu03.hpc.example")
    cluster = register(admin_user)
    services.sync(cluster, answer([node("gpu03")], [job(1, {"gpu03": (2,)})]))
    [held] = SlurmJob.objects.get(job_id=1).gpus.select_related("gpu")
    assert (held.gpu.node.hostname, held.gpu.index) == ("gpu03.hpc.example", 5)


def test_a_job_that_leaves_slurms_answer_leaves_the_mirror(cluster):
    services.sync(cluster, answer([node("gpu01")], [job(21, {"gpu01": (0,)}), job(22)]))
    services.sync(cluster, answer([node("gpu01")], [job(22, {"gpu01": (3,)})]))
    assert list(SlurmJob.objects.values_list("job_id", "state")) == [(22, "RUNNING")]
    assert [row.gpu.index for row in SlurmJob.objects.get(job_id=22).gpus.all()] == [4]
    services.sync(cluster, answer([], []))
    assert not SlurmJob.objects.exists() and not SlurmNode.objects.exists()


def test_a_polls_partitions_cost_the_same_queries_however_many(cluster):
    """Partitions are upserted and deleted in bulk, as nodes and jobs are: a second poll of
    five partitions (four changed, one gone, one new) costs what one of two does."""

    def sync_counted(names: list[str], cpus: int = 8) -> int:
        read = answer([node("gpu01")], [])
        parts = tuple(model.SlurmPartition(name, ("gpu01",), total_cpus=cpus) for name in names)
        with CaptureQueriesContext(connection) as captured:
            services.sync(cluster, dataclasses.replace(read, partitions=parts))
        return len(captured)

    sync_counted(["a", "b"])
    two = sync_counted(["a", "c"], cpus=16)
    sync_counted(["a", "b", "c", "d", "e"])
    assert sync_counted(["a", "b", "c", "d", "f"], cpus=16) == two
    assert list(SlurmPartition.objects.values_list("name", "total_cpus")) == [
        (name, 16) for name in "abcdf"
    ]


def test_a_poll_reads_the_catalogs_nodes_once(cluster):
    """Slurm's nodes and its jobs' GPUs are matched to the catalog from one read of it."""
    with CaptureQueriesContext(connection) as captured:
        services.sync(cluster, answer([node("gpu01")], [job(31, {"gpu01": (0,)})]))
    node_reads = [query for query in captured if 'FROM "inventory_node"' in query["sql"]]
    assert len(node_reads) == 1
    [held] = SlurmJob.objects.get(job_id=31).gpus.select_related("gpu")
    assert held.gpu.index == 7


def test_a_drained_node_is_one_health_event_however_often_it_is_read(cluster):
    drained = node("gpu01", "IDLE", "DRAIN", reason="bad fan")
    for _ in range(3):
        services.sync(cluster, answer([drained, node("gpu02")], []))
    [event] = HealthEvent.objects.all()
    assert (event.node.hostname, event.kind, event.gpu) == ("gpu01", EventKind.SLURM_DRAIN, None)
    assert "bad fan" in event.message and event.data["data"]["cluster"] == "hpc"
    assert event.handled_at is not None  # handed to the recovery policies
    # Resumed, then down: a new episode, a new event.
    services.sync(cluster, answer([node("gpu01")], []))
    services.sync(cluster, answer([node("gpu01", "DOWN", reason="Not responding")], []))
    assert list(HealthEvent.objects.order_by("pk").values_list("kind", flat=True)) == [
        EventKind.SLURM_DRAIN,
        EventKind.SLURM_DOWN,
    ]


def test_the_audit_log_keeps_registration_and_node_transitions_not_every_poll(cluster):
    registered = AuditEvent.objects.get(event_type="slurm.cluster_registered")
    assert registered.after["token"] == "changed" and "jwt-secret" not in str(registered.after)
    for _ in range(3):
        services.sync(cluster, answer([node("gpu01")], [job(31, {"gpu01": (0,)})]))
    services.sync(cluster, answer([node("gpu01", "IDLE", "DRAIN", reason="fan")], []))
    slurm_rows = AuditEvent.objects.filter(event_type__startswith="slurm.").order_by("pk")
    assert [(row.event_type, row.actor_name) for row in slurm_rows] == [
        ("slurm.cluster_registered", "admin"),
        ("slurm.cluster_state_changed", "slurm-sync"),  # new -> ok
        ("slurm.node_state_changed", "slurm-sync"),  # IDLE -> IDLE+DRAIN
    ]
    assert slurm_rows.latest("pk").after["states"] == ["IDLE", "DRAIN"]


def test_a_cluster_that_does_not_answer_keeps_its_mirror_and_says_why(cluster, monkeypatch):
    services.sync(cluster, answer([node("gpu01")], [job(41)]))

    def refused_connection(cluster: SlurmCluster) -> None:
        raise services.Unreachable("[Errno 111] Connection refused")

    monkeypatch.setattr(services, "read_cluster", refused_connection)
    assert tasks.poll_clusters() == []  # polled now: its interval (30 s) has not passed
    SlurmCluster.objects.update(last_polled_at=timezone.now() - timedelta(seconds=30))
    assert tasks.poll_clusters() == ["hpc"]
    cluster.refresh_from_db()
    assert (cluster.state, cluster.last_error) == (
        PollState.UNREACHABLE,
        "[Errno 111] Connection refused",
    )
    assert SlurmJob.objects.filter(job_id=41).exists()
    changed = AuditEvent.objects.filter(event_type="slurm.cluster_state_changed").latest("pk")
    assert (changed.before, changed.after) == ({"state": "ok"}, {"state": "unreachable"})


def test_the_clients_errors_are_read_as_unreachable_or_refused(cluster, slurmrestd):
    """No answer (the client's error caused by the connection's) is unreachable; an answer
    that says no, or that cannot be read, is refused."""
    errors = iter(
        [
            (ConnectionRefusedError(111, "Connection refused"), "cannot be reached"),
            (TimeoutError("timed out"), "cannot be reached"),
            (None, "refused the token for GET /openapi/v3: HTTP 401"),
            (KeyError("nodes"), "answer is not v0.0.38's shape"),
        ]
    )

    def read_cluster() -> None:
        cause, text = next(errors)
        raise slurmrestd.error(f"slurmrestd at http://slurm.example:6820 {text}") from cause

    slurmrestd.operations["read_cluster"] = read_cluster
    seen = [services.poll(cluster) for _ in range(4)]
    assert seen == [PollState.UNREACHABLE] * 2 + [PollState.REFUSED] * 2
    assert slurmrestd.calls[0] == (
        "http://slurm.example:6820",
        "gpuadmin",
        "jwt-secret",
        "read_cluster",
        (),
    )
    cluster.refresh_from_db()
    assert cluster.last_error.endswith("answer is not v0.0.38's shape")


def test_a_polled_answer_is_mirrored(cluster, slurmrestd):
    slurmrestd.operations["read_cluster"] = lambda: answer([node("gpu01")], [job(51)])
    assert services.poll(cluster) == PollState.OK
    assert SlurmJob.objects.get(cluster=cluster).job_id == 51


def test_local_authentication_sends_no_token(admin_user, slurmrestd):
    cluster = services.save_cluster(
        SlurmCluster(name="local", unix_socket="/run/slurmrestd.sock", auth="local"),
        actor=admin_user,
    )
    slurmrestd.operations["read_cluster"] = lambda: answer([], [])
    services.poll(cluster)
    assert slurmrestd.calls == [("unix:/run/slurmrestd.sock", "", "", "read_cluster", ())]


def test_only_jobs_that_run_hold_their_gpus_and_deleting_the_cluster_frees_them(
    cluster,
    admin_user,
    broker,  # noqa: F811  (the loop's wakes go nowhere)
    django_capture_on_commit_callbacks,
):
    """A running, suspended or completing job holds its catalogued GPUs (not schedulable, the
    job named); a finished job Slurm still lists with its GPUs holds none; a job's end, or the
    cluster's deletion, gives them back and announces it once committed."""

    def holders() -> dict[int, str]:
        rows = Gpu.objects.exclude(held_outside="").values_list("index", "held_outside")
        return dict(rows.order_by("index"))

    services.sync(
        cluster,
        answer(
            [node("gpu01", "MIXED")],
            [
                job(31, {"gpu01": (0,)}),  # GPU 7
                job(32, {"gpu01": (1,)}, state="SUSPENDED"),  # GPU 6
                job(33, {"gpu01": (2,)}, state="CANCELLED", state_flags=("COMPLETING",)),
                job(34, {"gpu01": (3,)}, state="COMPLETED"),  # GPU 4: free
            ],
        ),
    )
    held = {7: "Slurm job 31 on hpc", 6: "Slurm job 32 on hpc", 5: "Slurm job 33 on hpc"}
    assert holders() == held
    assert not Gpu.objects.schedulable().filter(held_outside__gt="").exists()
    announced: list[list[int]] = []

    def receiver(sender: object, gpu_ids: list[int], **kwargs: object) -> None:
        announced.append(gpu_ids)

    gpus_became_schedulable.connect(receiver, dispatch_uid="test.slurm_released")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.sync(cluster, answer([node("gpu01", "MIXED")], [job(32, {"gpu01": (1,)})]))
        assert holders() == {6: "Slurm job 32 on hpc"}
        index = dict(Gpu.objects.filter(node__hostname="gpu01").values_list("pk", "index"))
        assert [sorted(index[pk] for pk in ids) for ids in announced] == [[5, 7]]
        with django_capture_on_commit_callbacks(execute=True):
            services.delete_cluster(cluster, actor=admin_user)
        assert holders() == {}
        assert [sorted(index[pk] for pk in ids) for ids in announced] == [[5, 7], [6]]
    finally:
        gpus_became_schedulable.disconnect(dispatch_uid="test.slurm_released")
    events = AuditEvent.objects.filter(event_type="gpu.held_outside_changed")
    assert events.count() == 6  # 3 held, 2 released, 1 released with the cluster
