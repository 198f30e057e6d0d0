"""The placement loop: snapshot -> engine -> one transaction per decision.

Woken on commit by submit/cancel/finish and other state changes (``dispatch.wake``, coalesced
through a Redis key so a burst of submissions wakes it once), and by beat as a backstop. One
pass runs at a time: a PostgreSQL advisory lock serialises passes across workers. The engine
(``scheduling.placement``) is pure; this module turns the database into its ``Snapshot`` and
its decisions back into allocations (``services.allocate``, which the database can refuse).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from redis.exceptions import RedisError

from inventory import live
from inventory.models import Gpu, GpuLink, Node
from inventory.querysets import heartbeat_cutoff
from inventory.usability import why_unusable
from scheduling import placement, services
from scheduling.dispatch import send_to_agents, wake, wake_key
from scheduling.models import HOLDING_STATES, Allocation, Job, JobState, SchedulerSettings

log = logging.getLogger("gpuadmin.placement")


# Any 64-bit number unique to this lock within the database.
PASS_LOCK_ID = 0x67707561_646D696E  # "gpuadmin"
# A job SCHEDULED on a node whose agent has been silent this long is given back to the queue.
SCHEDULED_LOST_AFTER_S = 120


@dataclass
class PassSummary:
    placed: int = 0
    refused: int = 0
    waiting: int = 0
    requeued: int = 0
    skipped: str = ""
    duration_ms: float = 0.0
    dispatched: list[int] = field(default_factory=list)
    # Milliseconds per phase: snapshot, plan, commit (placements and dispatch), save_pending.
    phase_ms: dict[str, float] = field(default_factory=dict)
    pending_saved: int = 0  # waiting jobs whose stored reason, position, ... changed


@contextmanager
def pass_lock() -> Iterator[None]:
    """Hold the placement loop's advisory lock (waits for a pass on another worker)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [PASS_LOCK_ID])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [PASS_LOCK_ID])


def run_pass() -> PassSummary:
    """One placement pass; every decision commits (or is refused) on its own."""
    started = time.perf_counter()
    with pass_lock():
        with suppress(RedisError):
            live.client().delete(wake_key())  # wakes from now on ask for a new pass
        summary = PassSummary()
        config = SchedulerSettings.load()
        summary.requeued = requeue_lost_scheduled_jobs()
        if not config.enabled:
            summary.skipped = "the scheduler is stopped"
        else:
            clock = _PhaseClock(summary.phase_ms)
            snapshot, gpu_rows = take_snapshot()
            clock.lap("snapshot")
            result = placement.plan(snapshot, _policy(config))
            clock.lap("plan")
            for decision in result.placements:
                if commit_placement(decision, gpu_rows):
                    summary.placed += 1
                    summary.dispatched.append(decision.job_id)
                else:
                    summary.refused += 1
            clock.lap("commit")
            summary.pending_saved = save_pending(result.pending)
            clock.lap("save_pending")
            summary.waiting = len(result.pending)
    summary.duration_ms = (time.perf_counter() - started) * 1000
    if summary.refused:
        wake()  # refused decisions are retried by the next pass
    changed = summary.placed or summary.refused or summary.requeued or summary.pending_saved
    log.log(
        logging.INFO if changed else logging.DEBUG,  # beat's idle backstop passes are quiet
        "placement pass: %d placed, %d refused, %d waiting, %d re-queued in %.0f ms%s",
        summary.placed,
        summary.refused,
        summary.waiting,
        summary.requeued,
        summary.duration_ms,
        f" ({summary.skipped})" if summary.skipped else "",
    )
    return summary


class _PhaseClock:
    """Writes the milliseconds since the previous lap into ``phases`` under each lap's name."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = (now - self.last) * 1000
        self.last = now


def _policy(config: SchedulerSettings) -> placement.Policy:
    if config.policy == "priority":
        return placement.PriorityWithAging(aging_interval_s=config.aging_interval_s)
    return placement.POLICIES[config.policy]()


# --------------------------------------------------------------------------- snapshot


class NodeRow(NamedTuple):
    """What a pass reads of a node (plain rows: a pass reads thousands of them)."""

    pk: int
    hostname: str
    state: placement.NodeState  # the column's choices (inventory.choices.NodeState)
    last_heartbeat_at: datetime | None


class GpuRow(NamedTuple):
    """What a pass reads of a GPU."""

    pk: int
    node_id: int
    uuid: str
    # Shadows tuple.index on purpose (the column's name): legal at runtime, refused by mypy.
    index: int  # type: ignore[assignment]
    name: str
    memory_total_mib: int
    numa_node: int | None
    socket: int | None
    state: str
    error_message: str
    mig_enabled: bool


def take_snapshot(
    now: datetime | None = None,
) -> tuple[placement.Snapshot, dict[int, placement.GpuSlot]]:
    """The engine's view of the fleet and the queue, read in a handful of queries as plain
    rows, and its GPU slots by id."""
    now = now or timezone.now()
    cutoff = heartbeat_cutoff(now)
    nodes = [
        NodeRow._make(row)
        for row in Node.objects.order_by("hostname").values_list(*NodeRow._fields)
    ]
    node_infos = tuple(
        placement.NodeInfo(
            hostname=node.hostname,
            state=node.state,
            reachable=bool(node.last_heartbeat_at and node.last_heartbeat_at >= cutoff),
        )
        for node in nodes
    )
    by_pk = {node.pk: node for node in nodes}
    reachable = {info.hostname for info in node_infos if info.reachable}
    gpus = [
        GpuRow._make(row)
        for row in Gpu.objects.present().order_by("node_id", "index").values_list(*GpuRow._fields)
    ]
    allocated = dict(Allocation.objects.active().values_list("gpu_id", "job_id"))
    domains = nvlink_domains(gpus, by_pk)
    samples = live.latest(sorted(reachable))
    slots = []
    for gpu in gpus:
        node = by_pk[gpu.node_id]
        sample = samples.get(node.hostname, {}).get(gpu.uuid)
        slots.append(
            placement.GpuSlot(
                id=gpu.pk,
                uuid=gpu.uuid,
                node=node.hostname,
                index=gpu.index,
                model=gpu.name,
                memory_total_mib=gpu.memory_total_mib or 0,
                memory_free_mib=_free_mib(gpu, sample),
                numa_node=gpu.numa_node,
                socket=gpu.socket,
                nvlink_domain=domains.get(gpu.pk),
                unavailable=_unavailable(gpu, node, node.hostname in reachable, sample, allocated),
                allocated_to=allocated.get(gpu.pk),
            )
        )
    held: dict[int, list[int]] = defaultdict(list)
    for gpu_id, job_id in allocated.items():
        held[job_id].append(gpu_id)
    running = []
    holding = Job.objects.filter(state__in=HOLDING_STATES).values_list(
        "pk", "started_at", "scheduled_at", "estimated_duration_s", "max_runtime_s"
    )
    for pk, started_at, scheduled_at, estimated_s, max_runtime_s in holding:
        start = started_at or scheduled_at
        running.append(
            placement.RunningJob(
                id=pk,
                gpu_ids=tuple(held[pk]),
                started_at=(start or now).timestamp(),
                expected_end=_expected_end(start, estimated_s or max_runtime_s),
            )
        )
    queue = tuple(
        placement.JobRequest(
            id=job.pk,
            owner=str(job.owner_id),
            priority=job.priority,
            submitted_at=job.submitted_at.timestamp(),
            gpus_per_node=job.gpu_count,
            node_count=job.node_count,
            min_memory_mib=job.min_gpu_memory_mib,
            gpu_model=job.gpu_model or None,
            topology=job.topology,
            estimated_duration_s=job.estimated_duration_s,
            max_runtime_s=job.max_runtime_s,
            preemptible=job.preemptible,
        )
        for job in Job.objects.filter(state=JobState.QUEUED).values_list(
            "pk", *QUEUE_FIELDS, named=True
        )
    )
    snapshot = placement.Snapshot(
        now=now.timestamp(),
        nodes=node_infos,
        gpus=tuple(slots),
        running=tuple(running),
        queue=queue,
    )
    return snapshot, {slot.id: slot for slot in slots}


QUEUE_FIELDS = (
    "owner_id",
    "priority",
    "submitted_at",
    "gpu_count",
    "node_count",
    "min_gpu_memory_mib",
    "gpu_model",
    "topology",
    "estimated_duration_s",
    "max_runtime_s",
    "preemptible",
)


def nvlink_domains(gpus: list[GpuRow], nodes: dict[int, NodeRow]) -> dict[int, str]:
    """GPU pk -> its NVLink domain: GPUs of one node in which every pair is joined by NVLink
    (all of them behind NVSwitch on a DGX A100/H100, a quad of a DGX-1's hybrid cube mesh, a
    bridged pair), named after the node and its lowest GPU index. GPUs without NVLink have none.

    A mesh without NVSwitch is connected without every pair being linked (a DGX-1's GPU 0 and
    GPU 5 are SYS apart), so domains are cliques, grown in index order: a DGX-1 splits into
    GPUs 0-3 and 4-7, both fully linked."""
    peers: dict[int, set[int]] = defaultdict(set)
    # Unordered: the model's ordering joins both GPUs and sorts tens of thousands of links.
    links = GpuLink.objects.filter(link_type__startswith="NV").order_by()
    for a, b in links.values_list("gpu_a_id", "gpu_b_id"):
        peers[a].add(b)
        peers[b].add(a)
    cliques: dict[int, list[list[GpuRow]]] = defaultdict(list)
    for gpu in sorted(gpus, key=lambda gpu: (gpu.node_id, gpu.index)):
        linked = peers.get(gpu.pk)
        if not linked:
            continue
        node_cliques = cliques[gpu.node_id]
        clique = next((c for c in node_cliques if all(m.pk in linked for m in c)), None)
        if clique is None:
            node_cliques.append([gpu])
        else:
            clique.append(gpu)
    domains: dict[int, str] = {}
    for node_id, node_cliques in cliques.items():
        for clique in node_cliques:
            name = f"{nodes[node_id].hostname}/nvlink-gpu{clique[0].index}"
            domains.update((gpu.pk, name) for gpu in clique)
    return domains


def _free_mib(gpu: GpuRow, sample: dict | None) -> int:
    total = gpu.memory_total_mib or 0
    if not sample or sample.get("memory_used_mib") is None:
        return total
    return max(total - int(sample["memory_used_mib"]), 0)


def _unavailable(
    gpu: GpuRow, node: NodeRow, reachable: bool, sample: dict | None, allocated: dict[int, int]
) -> str | None:
    """Why the GPU cannot be given now, as the one rule's machine code (the snapshot holds
    present GPUs only), or None."""
    why = why_unusable(
        node_state=node.state,
        reachable=reachable,
        gpu_state=gpu.state,
        missing=False,
        error_message=gpu.error_message,
        mig_enabled=gpu.mig_enabled,
        sample=sample,
        allocated=gpu.pk in allocated,
    )
    return None if why is None else str(why.code)


def _expected_end(start: datetime | None, runtime_s: int | None) -> float | None:
    if start is None or runtime_s is None:
        return None
    return start.timestamp() + runtime_s


# --------------------------------------------------------------------------- decisions


def commit_placement(decision: placement.Placement, slots: dict[int, placement.GpuSlot]) -> bool:
    """Allocate the decision's GPUs and mark the job SCHEDULED in one transaction; on commit,
    send it to its nodes' agents. ``False`` when the database (or a newer state) refused it."""
    # The owner and their Unix account go into the spec sent to the agents: no lazy reads.
    job = (
        Job.objects.select_related("owner__unix_account")
        .filter(pk=decision.job_id, state=JobState.QUEUED)
        .first()
    )
    if job is None:
        return False
    why = {
        "topology_class": str(decision.topology_class),
        "numa_nodes": list(decision.numa_nodes),
        "score": list(decision.score),
        "explanation": decision.explanation,
        "nodes": {hostname: [slots[pk].index for pk in ids] for hostname, ids in decision.by_node},
    }
    try:
        allocations = services.allocate(  # its own transaction
            job, decision.gpu_ids, actor_name=services.LOOP_ACTOR, placement=why
        )
    except services.AllocationRefused as exc:
        log.info("placement of job %d refused: %s", job.pk, exc)
        return False
    # allocate() has committed, so this runs now (or when a transaction the caller holds
    # commits); its rows carry their GPU and node, and the job its new attempt: no re-read.
    transaction.on_commit(lambda: send_to_agents(job, allocations))
    return True


def save_pending(pending: tuple[placement.Pending, ...]) -> int:
    """Store each waiting job's reason, position, estimated start and what-if in one
    statement that writes only rows whose values changed (a pass re-explains thousands of
    jobs; most keep their reason). These are not state changes, so they are not audited. The
    number of rows written."""
    if not pending:
        return 0
    columns: tuple[list, ...] = ([], [], [], [], [], [])
    for p in pending:
        start = None
        if p.estimated_start is not None:
            start = datetime.fromtimestamp(round(p.estimated_start), tz=UTC)
        row = (p.job_id, str(p.reason), p.message, p.position, start, p.what_if or "")
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    with connection.cursor() as cursor:
        cursor.execute(SAVE_PENDING_SQL, [*columns, JobState.QUEUED])
        return cursor.rowcount


SAVE_PENDING_SQL = """
    UPDATE scheduling_job AS job
    SET pending_code = new.code, pending_reason = new.reason, queue_position = new.position,
        estimated_start_at = new.start, what_if = new.what_if
    FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::integer[], %s::timestamptz[],
                %s::text[]) AS new (id, code, reason, position, start, what_if)
    WHERE job.id = new.id AND job.state = %s
      AND (job.pending_code, job.pending_reason, job.queue_position, job.estimated_start_at,
           job.what_if) IS DISTINCT FROM (new.code, new.reason, new.position, new.start,
                                          new.what_if)
"""


def requeue_lost_scheduled_jobs() -> int:
    """Jobs SCHEDULED on a node whose agent went silent before starting them go back to the
    queue (their GPUs are released). Running jobs stay: the agent reports them when it is
    back (its executor re-adopts or reports them lost)."""
    now = timezone.now()
    silent = Q(allocations__node__last_heartbeat_at__isnull=True) | Q(
        allocations__node__last_heartbeat_at__lt=heartbeat_cutoff(now)
    )
    stale = (
        Job.objects.filter(
            state=JobState.SCHEDULED,
            scheduled_at__lt=now - timedelta(seconds=SCHEDULED_LOST_AFTER_S),
            allocations__released_at__isnull=True,
        )
        .filter(silent)
        .distinct()
    )
    count = 0
    for job in stale:
        try:
            services.transition(
                job,
                JobState.QUEUED,
                actor_name=services.LOOP_ACTOR,
                expect=[JobState.SCHEDULED],
                message="its node's agent went silent before starting it",
            )
            count += 1
        except services.IllegalTransition:
            continue
    return count
