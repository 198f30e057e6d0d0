"""Ray applications on gpuadmin's GPUs (``Job.ray``): the job's nodes run a Ray cluster of its
own (a head on the first, by hostname; a worker on each other), its command is the entrypoint,
run on the head once every node has joined (``scheduling.agent.ray_launch``), and everything
Ray started ends with the job. Placement, quotas, fair share, reservations, preemption,
accounting and audit treat it as any gang job. This module decides what is Ray's own: which
submissions may ask for it, the head's ports in each attempt, the cluster's token, and the
dashboard the job's page links to (what a submission may ask of Ray: ``submission``). It
imports no job service: dispatch uses it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction

from inventory.models import Node
from scheduling.agent.wire import RayPart
from scheduling.jobs.models import HOLDING_STATES, Job, JobState

if TYPE_CHECKING:
    from scheduling.allocations.models import Allocation

#: Each head listens on three ports from its first: GCS, dashboard, client server.
PORTS_PER_HEAD = 3


def head_of(hostnames: Iterable[str]) -> str:
    """The node of a Ray application's nodes that runs its head: the first by hostname (rank
    0 in dispatch's order). The one rule for the cluster dispatch starts and the dashboard the
    pages link to."""
    return min(hostnames)


def cluster_parts(job: Job, hostnames: Iterable[str]) -> dict[str, RayPart]:
    """Each node's part of the job's Ray cluster in its current attempt, by hostname (the
    head's on ``head_of``), its head's port chosen (``head_port``)."""
    nodes = {node.hostname: node for node in Node.objects.filter(hostname__in=set(hostnames))}
    head = nodes[head_of(nodes)]
    port = head_port(job, head)
    return {
        hostname: RayPart(
            head_address=head.reached_at,
            port=port,
            node_address=node.reached_at,
            nodes=len(nodes),
            head=node == head,
        )
        for hostname, node in nodes.items()
    }


def head_port(job: Job, head: Node) -> int:
    """Choose, store and return the GCS port of the job's head in its current attempt: the
    first of ``head``'s ``GPUADMIN_RAY_HEADS_PER_NODE`` slots that no other Ray application
    holding GPUs there has (the node's row locked while choosing, so two dispatches never
    choose one port). ``ValueError`` when all are taken."""
    first, slots = settings.GPUADMIN_RAY_HEAD_PORT, settings.GPUADMIN_RAY_HEADS_PER_NODE
    with transaction.atomic():
        Node.objects.select_for_update().filter(pk=head.pk).exists()
        taken = set(
            Job.objects.filter(
                ray=True,
                state__in=HOLDING_STATES,
                allocations__node=head,
                allocations__released_at__isnull=True,
            )
            .exclude(pk=job.pk)
            .values_list("ray_port", flat=True)
        )
        free = (first + PORTS_PER_HEAD * slot for slot in range(slots))
        port = next((port for port in free if port not in taken), None)
        if port is None:
            raise ValueError(
                f"{head.hostname} holds {slots} Ray heads already (GPUADMIN_RAY_HEADS_PER_NODE)"
            )
        Job.objects.filter(pk=job.pk, attempt=job.attempt).update(ray_port=port)
    job.ray_port = port
    return port


def token(job: Job) -> str:
    """The authentication token of the job's Ray cluster in its current attempt
    (``RAY_AUTH_TOKEN``): derived from the server's secret, so it is stored nowhere and a new
    attempt has a new one."""
    message = f"gpuadmin-ray:{job.pk}:{job.attempt}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def shown_token(job: Job, *, private: bool) -> str | None:
    """The token as the job's page and API show it: while the job holds GPUs, to those who
    read its private data (``private``: the viewer may not); else None."""
    if not job.ray or job.state not in HOLDING_STATES or private:
        return None
    return token(job)


def environment(job: Job) -> dict[str, str]:
    """What every process of the job's Ray cluster is given: Ray's token authentication."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token(job)}


def dashboard_url(job: Job, allocations: Iterable[Allocation]) -> str | None:
    """The Ray dashboard of a running Ray application (its head's node, by its address);
    None for another job. ``allocations``: the job's, with their nodes (a list's prefetched
    ones: no query per job); the released ones are left out."""
    if not job.ray or job.ray_port is None or job.state != JobState.RUNNING:
        return None
    nodes = {a.node.hostname: a.node for a in allocations if a.released_at is None}
    if not nodes:
        return None
    return f"http://{nodes[head_of(nodes)].reached_at}:{job.ray_port + 1}/"
