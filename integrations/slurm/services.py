"""Registering Slurm clusters and mirroring them: ``poll`` asks a cluster's slurmrestd (through
``integrations.slurm.rest.client``) and hands the answer to ``sync``, which writes the mirror in
one transaction.

What the audit log gets (``gpuadmin.audit``): a cluster registered, changed or deleted (the
admin who did it; its token only as "changed"), a cluster whose polls start or stop working,
and each Slurm node whose states change (``slurm.node_state_changed``, actor ``slurm-sync``).
Slurm's jobs are not audited: they come and go every poll, and Slurm's own accounting
(``sacct``) keeps their history; what gpuadmin does about them is: each catalogued GPU a Slurm
job starts or stops holding is ``gpu.held_outside_changed`` (``holders``).

A node that Slurm drains or marks down becomes one health event on the catalogued node
(``slurm_drain``, ``slurm_down``) per episode, handled by its recovery policy.
"""

from __future__ import annotations

import http.client
import importlib
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import User
from django.db import models, transaction
from django.utils import timezone

from gpuadmin.audit.services import audit_event, changed_values, record, record_all
from health import services as health
from health.choices import EventKind
from health.wire import HealthReport
from integrations.slurm import holders
from integrations.slurm.models import (
    OUT_OF_SERVICE,
    AuthKind,
    PollState,
    SlurmCluster,
    SlurmJob,
    SlurmJobGpu,
    SlurmNode,
    SlurmPartition,
)
from integrations.slurm.rest.model import ClusterState
from inventory.models import Gpu, Node

log = logging.getLogger("gpuadmin.slurm")
ACTOR = "slurm-sync"
HEALTH_ACTOR = "health"  # a drain asked because health fenced a GPU
DRAIN_TASK = "slurm.drain_node"
SLURM_REASON_CHARS = 200
# The cluster's fields the audit log records (its token only as changed or not).
CLUSTER_FIELDS = (
    "name",
    "url",
    "unix_socket",
    "auth",
    "user_name",
    "poll_interval_s",
    "drain_fenced",
)
EVENT_KINDS = {"DRAIN": EventKind.SLURM_DRAIN, "DOWN": EventKind.SLURM_DOWN}
NODE_FIELDS = (
    "reason",
    "reason_set_by",
    "reason_changed_at",
    "partitions",
    "cpus",
    "alloc_cpus",
    "real_memory_mib",
    "alloc_memory_mib",
    "gpus",
    "gpus_used",
)
PARTITION_FIELDS = ("state", "nodes", "total_cpus", "total_nodes")
JOB_FIELDS = (
    "name",
    "user",
    "account",
    "state",
    "state_flags",
    "reason",
    "partition",
    "nodes",
    "gpus_requested",
    "cpus",
    "array_job_id",
    "array_task_id",
    "submit_time",
    "start_time",
    "end_time",
    "time_limit_min",
)


class Unreachable(Exception):
    """slurmrestd did not answer (connection refused, timeout, no such host or socket)."""


class Refused(Exception):
    """slurmrestd answered no: authentication refused, or an answer gpuadmin cannot read."""


# --- clusters


def _cluster_fields(cluster: SlurmCluster, token_changed: bool = False) -> dict[str, Any]:
    fields = {name: getattr(cluster, name) for name in CLUSTER_FIELDS}
    return {**fields, "token": "changed"} if token_changed else fields


def save_cluster(cluster: SlurmCluster, *, actor: User) -> SlurmCluster:
    """Register a cluster or change one (audited ``slurm.cluster_registered`` or
    ``slurm.cluster_changed``, before and after; the token only as "changed")."""
    with transaction.atomic():
        old = SlurmCluster.objects.select_for_update().filter(pk=cluster.pk).first()
        cluster.full_clean()
        cluster.save()
        if old is None:
            record(
                "slurm.cluster_registered",
                actor=actor,
                target=cluster,
                after=_cluster_fields(cluster, token_changed=bool(cluster.token)),
            )
        else:
            before, after = changed_values(
                _cluster_fields(old), _cluster_fields(cluster, cluster.token != old.token)
            )
            if after:
                record(
                    "slurm.cluster_changed",
                    actor=actor,
                    target=cluster,
                    before=before,
                    after=after,
                )
    return cluster


def delete_cluster(cluster: SlurmCluster, *, actor: User) -> None:
    """Forget a cluster and its mirror (audited ``slurm.cluster_deleted``); the GPUs its jobs
    held are gpuadmin's to give again."""
    with transaction.atomic():
        record(
            "slurm.cluster_deleted", actor=actor, target=cluster, before=_cluster_fields(cluster)
        )
        holders.mark_held(holders.held_gpus(cluster), {}, actor_name=ACTOR)
        cluster.delete()


# --- polling


def ask_slurmrestd(cluster: SlurmCluster, operation: str, *arguments: Any) -> Any:
    """Call ``operation`` (``read_cluster``, ``drain_node``) of the cluster's slurmrestd client
    (``integrations.slurm.rest.client.SlurmRestClient``, on its address, with its token for
    JWT authentication). Its one error becomes ``Unreachable`` when no answer came (the
    connection's own error is its cause), ``Refused`` otherwise. The client is loaded here, on
    first use, so the pages, the API and the tests that feed ``sync`` a ``ClusterState`` of
    their own never load it."""
    rest = importlib.import_module("integrations.slurm.rest.client")
    token = cluster.token if cluster.auth == AuthKind.JWT else ""
    client = rest.SlurmRestClient(cluster.address, user=cluster.user_name, token=token)
    try:
        return getattr(client, operation)(*arguments)
    except rest.SlurmRestError as error:
        no_answer = isinstance(error.__cause__, OSError | http.client.HTTPException)
        raise (Unreachable if no_answer else Refused)(str(error)) from error


def read_cluster(cluster: SlurmCluster) -> ClusterState:
    """What the cluster's slurmrestd says now (``ask_slurmrestd``)."""
    answer: ClusterState = ask_slurmrestd(cluster, "read_cluster")
    return answer


def poll(cluster: SlurmCluster) -> PollState:
    """Read the cluster and mirror it; a cluster that does not answer, or refuses, keeps its
    last mirror and says so in its ``state`` and ``last_error`` (audited when that changes)."""
    try:
        state = read_cluster(cluster)
    except Unreachable as error:
        return _poll_failed(cluster, PollState.UNREACHABLE, str(error))
    except Refused as error:
        return _poll_failed(cluster, PollState.REFUSED, str(error))
    sync(cluster, state)
    return PollState.OK


def poll_due(now: datetime | None = None) -> list[str]:
    """Poll every cluster whose interval has passed since its last poll; their names."""
    now = now or timezone.now()
    polled = []
    for cluster in SlurmCluster.objects.order_by("name"):
        last = cluster.last_polled_at
        if last is None or (now - last).total_seconds() >= cluster.poll_interval_s:
            poll(cluster)
            polled.append(cluster.name)
    return polled


# --- draining the Slurm nodes of GPUs health fenced


def drain_for_fenced_gpu(sender: type, *, gpu_id: int, reason: str, **kwargs: Any) -> None:
    """``health.signals.gpu_fenced`` receiver: for each cluster that lets gpuadmin drain
    (``drain_fenced``) and runs the GPU's node, not drained or down there yet, send
    ``slurm.drain_node`` to the central worker (never slurmrestd's answer inside health's
    work)."""
    rows = SlurmNode.objects.filter(node__gpus=gpu_id, cluster__drain_fenced=True)
    for row_id, states in rows.values_list("pk", "states"):
        if not set(OUT_OF_SERVICE) & set(states):
            current_app.send_task(
                DRAIN_TASK, args=(row_id, reason), queue=settings.GPUADMIN_CENTRAL_QUEUE
            )


def drain_node(slurm_node_id: int, reason: str) -> bool:
    """Ask the node's cluster to drain it (the client's ``drain_node(name, reason)``) with
    health's reason, audited ``slurm.node_drain_requested`` whether Slurm took it or not (its
    error in the message); whether it did. A node gone from the mirror, or its cluster's
    ``drain_fenced`` turned off meanwhile, is left alone."""
    row = SlurmNode.objects.select_related("cluster").filter(pk=slurm_node_id).first()
    if row is None or not row.cluster.drain_fenced:
        return False
    said = f"gpuadmin: {reason}"[:SLURM_REASON_CHARS]
    try:
        ask_slurmrestd(row.cluster, "drain_node", row.name, said)
        error = ""
    except (Unreachable, Refused) as refusal:
        error = str(refusal)
        log.warning("Slurm cluster %s did not drain %s: %s", row.cluster.name, row.name, error)
    with transaction.atomic():
        record(
            "slurm.node_drain_requested",
            actor_name=HEALTH_ACTOR,
            target=row,
            after={"reason": said, "drained": not error},
            message=error,
        )
    return not error


def _poll_failed(cluster: SlurmCluster, state: PollState, error: str) -> PollState:
    log.warning("Slurm cluster %s: %s: %s", cluster.name, state.label.lower(), error)
    with transaction.atomic():
        locked = SlurmCluster.objects.select_for_update().get(pk=cluster.pk)
        _set_poll_state(cluster, locked, state, error, timezone.now())
    return state


def _set_poll_state(
    cluster: SlurmCluster,
    locked: SlurmCluster,
    state: str,
    error: str,
    now: datetime,
    **more: Any,
) -> None:
    """Record how the poll went on the cluster's row (``locked``: it, read under its lock in
    this transaction), with ``more`` of its fields, in one update; audited when its state
    changes."""
    changes: dict[str, Any] = {"state": state, "last_error": error, "last_polled_at": now, **more}
    if state == PollState.OK:
        changes["last_ok_at"] = now
    SlurmCluster.objects.filter(pk=cluster.pk).update(**changes)
    if locked.state != state:
        record(
            "slurm.cluster_state_changed",
            actor_name=ACTOR,
            target=locked,
            before={"state": locked.state},
            after={"state": state},
            message=error,
        )
    for name, value in changes.items():
        setattr(cluster, name, value)


# --- the mirror


def sync(cluster: SlurmCluster, answer: ClusterState) -> None:
    """Mirror one poll's answer in one transaction: nodes, partitions and jobs upserted, those
    that left Slurm's answer deleted, each job's GPUs mapped onto the catalog, the catalogued
    GPUs its running jobs hold marked held (``holders.mark_held``: gpuadmin places no job on
    them; those released are schedulable again); then each node newly drained or down becomes
    a health event on its catalogued node."""
    now = timezone.now()
    with transaction.atomic():
        # One sync of a cluster at a time (beat's ticks may overlap on two workers); its row,
        # read under that lock, is written once, at the end.
        locked = SlurmCluster.objects.select_for_update().get(pk=cluster.pk)
        # The catalog is read once, for the names of the answer's nodes and of its jobs' GPUs.
        catalog = catalogued_nodes(
            {node.name for node in answer.nodes}
            | {name for job in answer.jobs for name in job.gpus}
        )
        held_before = holders.held_gpus(cluster)
        nodes = _sync_nodes(cluster, answer, catalog, now)
        _sync_partitions(cluster, answer)
        _sync_jobs(cluster, answer, catalog, now)
        holders.mark_held(held_before, holders.held_gpus(cluster), actor_name=ACTOR)
        _set_poll_state(cluster, locked, PollState.OK, "", now, api_version=answer.version)
    _report_out_of_service(cluster, nodes)


def catalogued_nodes(names: Iterable[str]) -> dict[str, Node]:
    """The catalogued node of each Slurm node name: the node of that hostname, else the one
    node whose hostname's first label it is (Slurm names nodes ``gpu01``, the catalog may know
    ``gpu01.cluster.example``)."""
    wanted = set(names)
    found: dict[str, Node] = {}
    short: dict[str, list[Node]] = {}
    for node in Node.objects.only("pk", "hostname"):
        if node.hostname in wanted:
            found[node.hostname] = node
        else:
            short.setdefault(node.hostname.split(".", 1)[0], []).append(node)
    for name in wanted - found.keys():
        candidates = short.get(name, [])
        if len(candidates) == 1:
            found[name] = candidates[0]
    return found


def _copy(read: object, row: models.Model, fields: Iterable[str]) -> None:
    """``fields`` of a ``rest.model`` dataclass onto its row (tuples as the lists arrays hold)."""
    for name in fields:
        value = getattr(read, name)
        setattr(row, name, list(value) if isinstance(value, tuple) else value)


def _sync_nodes(
    cluster: SlurmCluster, answer: ClusterState, catalog: Mapping[str, Node], now: datetime
) -> list[SlurmNode]:
    """Upsert the answer's nodes (two statements and the reading ones, however many), delete
    the others; each existing node whose states changed is audited."""
    existing = {row.name: row for row in SlurmNode.objects.filter(cluster=cluster)}
    changed = []
    rows = []
    for read in answer.nodes:
        row = existing.pop(read.name, None) or SlurmNode(cluster=cluster, name=read.name)
        states = list(read.states)
        if row.pk is None or row.states != states:
            if row.pk is not None:
                changed.append(
                    audit_event(
                        "slurm.node_state_changed",
                        actor_name=ACTOR,
                        target=row,
                        before={"states": row.states},
                        after={"states": states, "reason": read.reason},
                        message=read.reason,
                    )
                )
            row.state_changed_at = now
        row.states = states
        row.node = catalog.get(read.name)
        _copy(read, row, NODE_FIELDS)
        row.last_seen_at = now
        rows.append(row)
    SlurmNode.objects.filter(pk__in=[row.pk for row in existing.values()]).delete()
    SlurmNode.objects.bulk_update(
        [row for row in rows if row.pk is not None],
        ["states", "state_changed_at", "node", *NODE_FIELDS, "last_seen_at"],
    )
    SlurmNode.objects.bulk_create([row for row in rows if row.pk is None])
    if changed:
        record_all(changed)
    return rows


def _sync_partitions(cluster: SlurmCluster, answer: ClusterState) -> None:
    """Upsert the answer's partitions in two statements (bulk update and create), as its nodes
    are, and delete the others."""
    existing = {row.name: row for row in SlurmPartition.objects.filter(cluster=cluster)}
    rows = []
    for read in answer.partitions:
        row = existing.pop(read.name, None) or SlurmPartition(cluster=cluster, name=read.name)
        _copy(read, row, PARTITION_FIELDS)
        rows.append(row)
    SlurmPartition.objects.filter(pk__in=[row.pk for row in existing.values()]).delete()
    SlurmPartition.objects.bulk_update(
        [row for row in rows if row.pk is not None], PARTITION_FIELDS
    )
    SlurmPartition.objects.bulk_create([row for row in rows if row.pk is None])


def _sync_jobs(
    cluster: SlurmCluster, answer: ClusterState, catalog: Mapping[str, Node], now: datetime
) -> None:
    SlurmJob.objects.filter(cluster=cluster).exclude(
        job_id__in=[read.job_id for read in answer.jobs]
    ).delete()
    existing = {row.job_id: row for row in SlurmJob.objects.filter(cluster=cluster)}
    rows = []
    for read in answer.jobs:
        row = existing.get(read.job_id) or SlurmJob(cluster=cluster, job_id=read.job_id)
        _copy(read, row, JOB_FIELDS)
        row.last_seen_at = now
        rows.append(row)
    SlurmJob.objects.bulk_update(
        [row for row in rows if row.pk is not None], [*JOB_FIELDS, "last_seen_at"]
    )
    SlurmJob.objects.bulk_create([row for row in rows if row.pk is None])
    held = {read.job_id: read.gpus for read in answer.jobs}
    _sync_job_gpus(cluster, {row.pk: held[row.job_id] for row in rows}, catalog)


def _sync_job_gpus(
    cluster: SlurmCluster,
    held: Mapping[int, Mapping[str, Iterable[int]]],
    catalog: Mapping[str, Node],
) -> None:
    """Each job's GPUs as rows, Slurm's index on a node read as the device's minor number and
    matched to the catalogued GPU of that node and minor number (not NVML's index)."""
    names = {name for gpus in held.values() for name in gpus}
    holding = [catalog[name] for name in names if name in catalog]
    by_minor = {
        (gpu.node_id, gpu.minor_number): gpu
        for gpu in Gpu.objects.present().filter(node__in=holding, minor_number__isnull=False)
    }
    SlurmJobGpu.objects.filter(job__cluster=cluster).delete()
    rows = []
    for job_pk, gpus in held.items():
        for name, minors in gpus.items():
            node = catalog.get(name)
            for minor in sorted(set(minors)):
                gpu = by_minor.get((node.pk, minor)) if node else None
                rows.append(SlurmJobGpu(job_id=job_pk, node_name=name, minor_number=minor, gpu=gpu))
    SlurmJobGpu.objects.bulk_create(rows)


def _report_out_of_service(cluster: SlurmCluster, nodes: Iterable[SlurmNode]) -> None:
    """A health event for each catalogued node Slurm drains or holds down: one per episode
    (its key holds Slurm's time for the reason, else when gpuadmin saw the state change), so
    the same drain read every poll stores one event."""
    for row in nodes:
        state = row.out_of_service
        if state is None or row.node is None:
            continue
        since = row.reason_changed_at or row.state_changed_at or row.last_seen_at
        kind = EVENT_KINDS[state]
        who = f" (set by {row.reason_set_by})" if row.reason_set_by else ""
        report = HealthReport(
            kind=kind,
            key=f"{kind}:{cluster.name}:{since.isoformat()}",
            occurred_at=since.timestamp(),
            message=f"Slurm cluster {cluster.name}: {row.reason or 'no reason given'}{who}",
            data={
                "cluster": cluster.name,
                "slurm_node": row.name,
                "states": row.states,
                "reason": row.reason,
                "reason_set_by": row.reason_set_by,
            },
        )
        health.receive_reports(row.node.hostname, [report])
