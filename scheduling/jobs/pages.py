"""What the scheduling pages show, apart from HTTP: the queue's sections, a job's
timeline, allocations, placement and topology, its log tail through the node agent, and the
job on each GPU for the fleet dashboard.

The views in ``scheduling.jobs.views`` only fetch the job, call these functions and render.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import BooleanField, ExpressionWrapper, F, Prefetch, Q, QuerySet
from django.urls import reverse

from gpuadmin.access.models import Role
from gpuadmin.access.services import can_act_on, can_read_private, private_to, role_of
from gpuadmin.audit.models import AuditEvent
from gpuadmin.registry import Occupant
from inventory.models import Gpu, GpuLink, Node
from inventory.pages.common import short_gpu_name, url_format
from inventory.pages.topology import TopologyRow, topology_rows
from inventory.units import duration_text, memory_text
from scheduling.jobs import dependencies, queries, ray
from scheduling.jobs.slurm import (
    array_label,
    compact_indexes,
    cpu_time_text,
    host_request_text,
    peak_memory_text,
)
from scheduling.models import (
    HOLDING_STATES,
    TERMINAL_STATES,
    Allocation,
    Job,
    JobState,
    Topology,
)
from scheduling.placement import TopologyClass
from scheduling.placement.text import indexes_phrase, plural

STATE_COLOURS: dict[str, str] = {
    JobState.PENDING: "grey",
    JobState.QUEUED: "amber",
    JobState.SCHEDULED: "blue",
    JobState.RUNNING: "blue",
    JobState.COMPLETED: "green",
    JobState.FAILED: "red",
    JobState.CANCELED: "grey",
    JobState.PREEMPTED: "amber",
}

# Rows per queue section: the page is polled every 2 s, so it never lists a whole backlog.
SECTION_LIMIT = 200
FINISHED_LIMIT = 20
LOG_LINES = 200

TOPOLOGY_CLASS_TEXT: dict[str, str] = {
    TopologyClass.SINGLE: "a single GPU",
    TopologyClass.NVLINK: "one NVLink/NVSwitch domain",
    TopologyClass.NUMA: "one NUMA node",
    TopologyClass.SOCKET: "one CPU socket",
    TopologyClass.NODE: "one node, across sockets",
    TopologyClass.MULTI_NODE: "several nodes",
}


def gpu_occupants(gpu_ids: Collection[int]) -> list[Occupant]:
    """The job and user of each active allocation of ``gpu_ids`` (a whole GPU, a MIG device, an
    MPS share): scheduling's answer to ``gpuadmin.registry.gpu_occupants`` (the fleet
    dashboard, ``?free=``, the MIG layouts).

    One query reads every active allocation (at most one per GPU of the fleet) and the ids are
    picked here: for a page of 1,024 GPUs that is quicker than building and sending an ``IN``
    list of their ids, even when no GPU is allocated.
    """
    wanted = set(gpu_ids)
    url = url_format("scheduling:job-detail")
    stopping = ExpressionWrapper(Q(job__ending__isnull=False), BooleanField())
    return [
        Occupant(
            job_id, url.format(job_id), username, gpu_id, name, mig_instance_id, stopping=ending
        )
        for gpu_id, job_id, username, name, mig_instance_id, ending in Allocation.objects.active()
        .values_list(
            "gpu_id", "job_id", "job__owner__username", "job__name", "mig_instance_id", stopping
        )
        .iterator()
        if gpu_id in wanted
    ]


def state_colour(state: str) -> str:
    return STATE_COLOURS.get(state, "grey")


def sharing_text(job: Job) -> str:
    """``MIG device 1g.10gb``, ``MPS share: 25 % of the SMs, 8000 MiB``, or empty for whole
    GPUs."""
    if job.mig_profile:
        return f"MIG device {job.mig_profile}"
    if job.mps_percent is not None:
        memory = f", {memory_text(job.mps_memory_mib)}" if job.mps_memory_mib is not None else ""
        return f"MPS share: {job.mps_percent} % of the SMs{memory}"
    return ""


def resources_text(job: Job) -> str:
    """``8 GPUs × 2 nodes · A100-SXM4-80GB · ≥ 40 GiB · one NVLink/NVSwitch domain``, or
    ``MIG device 1g.10gb``."""
    parts = [sharing_text(job) or plural(job.gpu_count, "GPU")]
    if job.node_count > 1:
        parts[0] += f" × {job.node_count} nodes"
    if job.gpu_model:
        parts.append(short_gpu_name(job.gpu_model))
    if job.min_gpu_memory_mib:
        parts.append(f"≥ {memory_text(job.min_gpu_memory_mib)}")
    if job.topology != Topology.ANY:
        parts.append(Topology(job.topology).label)
    return " · ".join(parts)


def waiting_text(job: Job) -> str:
    """Why a waiting job is not running, in one sentence."""
    if job.state == JobState.PENDING:
        return "Held: not in the queue yet."
    return job.pending_reason or "Waiting for the next placement pass."


@dataclasses.dataclass(frozen=True)
class GpuRef:
    hostname: str
    index: int
    url: str  # its GPU page


@dataclasses.dataclass
class JobView:
    """What every view of a job shows about it."""

    job: Job

    @property
    def state_colour(self) -> str:
        return state_colour(self.job.state)

    @property
    def resources(self) -> str:
        return resources_text(self.job)

    @property
    def host(self) -> str:
        """``16 CPUs, 64 GiB RAM per node``, or empty."""
        return host_request_text(self.job.cpus, self.job.host_memory_mib)

    @property
    def usage(self) -> str:
        """What its runs used, as sacct's TotalCPU and MaxRSS: ``CPU time 00:01:23, peak
        memory 64 MiB``; empty when its node did not measure it."""
        parts = []
        if self.job.cpu_seconds is not None:
            parts.append(f"CPU time {cpu_time_text(self.job.cpu_seconds)}")
        if self.job.max_memory_bytes is not None:
            parts.append(f"peak memory {peak_memory_text(self.job.max_memory_bytes)}")
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class ArrayTasks:
    """The waiting tasks of a job array, as one queue row: ``5_[0-999%50]``, as Slurm's."""

    array_id: int
    indexes: str  # compacted: 0-3,7,9-12
    count: int
    max_running: int | None
    url: str  # the queue of its tasks alone

    @property
    def label(self) -> str:
        return array_label(self.array_id, self.indexes, self.max_running)


@dataclasses.dataclass
class JobRow(JobView):
    """A job as the queue lists it; for an array's waiting tasks, the first in queue order
    stands for them all (``array_tasks``)."""

    url: str  # its page; empty when the viewer may not read it
    gpus: list[GpuRef]  # the GPUs it holds now (running jobs only)
    array_tasks: ArrayTasks | None = None

    @property
    def waiting(self) -> str:
        return waiting_text(self.job)

    @property
    def by_node(self) -> list[tuple[str, list[GpuRef]]]:
        nodes: dict[str, list[GpuRef]] = defaultdict(list)
        for gpu in self.gpus:
            nodes[gpu.hostname].append(gpu)
        return list(nodes.items())


@dataclasses.dataclass
class Section:
    rows: list[JobRow]
    more: bool  # more jobs than the section lists


@dataclasses.dataclass
class Queue:
    waiting: Section
    running: Section
    finished: Section


def gpu_ref(allocation: Allocation, url: str) -> GpuRef:
    return GpuRef(allocation.node.hostname, allocation.gpu.index, url.format(allocation.gpu.uuid))


def _section(jobs: QuerySet[Job], limit: int, user: User) -> Section:
    """Up to ``limit`` rows; a job links to its page when ``user`` may read it (the rule of
    ``queries.visible_jobs``: a user reads only their own jobs)."""
    reads_all = role_of(user) != Role.USER
    job_url, gpu_url = url_format("scheduling:job-detail"), url_format("inventory:gpu-detail")
    found = list(jobs[: limit + 1])
    rows = [
        JobRow(
            job,
            job_url.format(job.pk) if reads_all or job.owner_id == user.pk else "",
            [gpu_ref(a, gpu_url) for a in getattr(job, "active_allocations", ())],
        )
        for job in found[:limit]
    ]
    return Section(rows, more=len(found) > limit)


def _first_tasks(waiting: QuerySet[Job]) -> QuerySet[Job]:
    """Of ``waiting`` jobs, those in no array and each array's first task in queue order."""
    first = (
        waiting.filter(array__isnull=False)
        .order_by("array_id", *queries.QUEUE_ORDER)
        .distinct("array_id")
        .values("pk")
    )
    return waiting.filter(Q(array__isnull=True) | Q(pk__in=first))


def _collapse_arrays(section: Section, waiting: QuerySet[Job]) -> None:
    """Give the rows standing for arrays their waiting tasks, those not made jobs yet with
    them (one query for all of them)."""
    rows = {row.job.array_id: row for row in section.rows if row.job.array_id is not None}
    if not rows:
        return
    tasks = (
        waiting.filter(array_id__in=rows)
        .order_by()
        .values("array_id")
        .annotate(indexes=ArrayAgg("array_index", order_by="array_index"))
    )
    queue_url = reverse("scheduling:queue")
    for found in tasks:
        row = rows[found["array_id"]]
        assert row.job.array is not None
        every = queries.standing_for(row.job.array, queries.WAITING_STATES, found["indexes"])
        row.array_tasks = ArrayTasks(
            found["array_id"],
            compact_indexes(every),
            len(every),
            row.job.array.max_running,
            f"{queue_url}?array={row.job.array_id}",
        )


def queue(jobs: QuerySet[Job], user: User, *, collapse_arrays: bool = True) -> Queue:
    """Of ``jobs`` (the ``JobFilterSet``'s), waiting jobs in queue order, jobs holding GPUs
    with them, and the latest finished jobs (three queries, a fourth for the GPUs when jobs
    hold some, a fifth for the waiting tasks of arrays). With ``collapse_arrays`` one row
    stands for the waiting tasks of each array, as ``squeue`` shows ``5_[0-999%50]``."""
    holding = queries.holding(jobs).prefetch_related(
        Prefetch(
            "allocations",
            queryset=Allocation.objects.active()
            .select_related("gpu", "node")
            .order_by("node__hostname", "gpu__index"),
            to_attr="active_allocations",
        )
    )
    waiting_jobs = queries.waiting(jobs).select_related("array")
    if collapse_arrays:
        waiting = _section(_first_tasks(waiting_jobs), SECTION_LIMIT, user)
        _collapse_arrays(waiting, waiting_jobs)
    else:
        waiting = _section(waiting_jobs, SECTION_LIMIT, user)
    finished = jobs.filter(state__in=TERMINAL_STATES).order_by(
        F("finished_at").desc(nulls_last=True), "-pk"
    )
    return Queue(
        waiting=waiting,
        running=_section(holding, SECTION_LIMIT, user),
        finished=_section(finished, FINISHED_LIMIT, user),
    )


# ---------------------------------------------------------------------------------- job page


@dataclasses.dataclass
class PlacementWhy:
    """Why the placement loop chose a job's GPUs (``Job.placement``)."""

    topology_class: str
    numa_nodes: list[int]
    score: list[int]
    explanation: str

    @classmethod
    def of(cls, placement: Mapping[str, Any] | None) -> PlacementWhy | None:
        if not placement:
            return None
        return cls(
            topology_class=placement.get("topology_class", ""),
            numa_nodes=list(placement.get("numa_nodes", [])),
            score=list(placement.get("score", [])),
            explanation=placement.get("explanation", ""),
        )

    @property
    def topology_text(self) -> str:
        return TOPOLOGY_CLASS_TEXT.get(self.topology_class, self.topology_class)

    @property
    def score_parts(self) -> list[tuple[str, int]]:
        """The score's terms (what the choice minimised, ``placement.Placement.score``)."""
        names = ("topology rank", "free GPUs left", "sockets", "NUMA nodes")
        return list(zip(names, self.score, strict=False))


@dataclasses.dataclass
class NodeTopology:
    """One node a job runs on: its ``topo -m`` matrix with the job's GPUs highlighted."""

    node: Node
    rows: list[TopologyRow]

    @property
    def job_gpus(self) -> str:
        """``GPUs 0-3``."""
        indexes = [row.gpu.index for row in self.rows if row.highlighted]
        return indexes_phrase(indexes) if indexes else "none present"


@dataclasses.dataclass
class TimelineEntry:
    time: datetime
    actor: str
    title: str
    change: str = ""  # "queued → scheduled"
    message: str = ""
    gpus: list[GpuRef] = dataclasses.field(default_factory=list)


def _title(event_type: str) -> str:
    return event_type.split(".", 1)[-1].replace("_", " ").capitalize()


def timeline(job: Job, allocations: Iterable[Allocation]) -> list[TimelineEntry]:
    """The job's audit log, oldest first (one query): its own events, and the allocations of
    its GPUs, each run of consecutive ``allocation.created`` rows as one entry."""
    by_pk = {str(a.pk): a for a in allocations}
    gpu_url = url_format("inventory:gpu-detail")
    allocation_type = Allocation._meta.label_lower  # what audit.record() writes
    events = AuditEvent.objects.filter(
        Q(target_type=Job._meta.label_lower, target_id=str(job.pk))
        | Q(target_type=allocation_type, target_id__in=list(by_pk))
    ).order_by("time", "pk")
    entries: list[TimelineEntry] = []
    for event in events:
        if event.target_type == allocation_type:
            gpu = gpu_ref(by_pk[event.target_id], gpu_url)
            last = entries[-1] if entries else None
            if last is not None and last.gpus and last.actor == event.actor_name:
                last.gpus.append(gpu)
                continue
            entries.append(
                TimelineEntry(event.time, event.actor_name, "GPUs allocated", gpus=[gpu])
            )
            continue
        before, after = event.before or {}, event.after or {}
        change = (
            f"{before['state']} → {after['state']}"
            if "state" in before and "state" in after
            else ""
        )
        entries.append(
            TimelineEntry(
                event.time, event.actor_name, _title(event.event_type), change, event.message
            )
        )
    return entries


def job_allocations(job: Job) -> list[Allocation]:
    """All the job's allocations, latest attempt first (one query)."""
    return list(
        job.allocations.select_related("gpu", "node").order_by(
            "-attempt", "node__hostname", "gpu__index"
        )
    )


def node_topologies(job: Job, allocations: Iterable[Allocation]) -> list[NodeTopology]:
    """The topology matrix of every node of the job's latest attempt, with its GPUs
    highlighted (two queries, whatever the number of nodes)."""
    latest = [a for a in allocations if a.attempt == job.attempt]
    if not latest:
        return []
    nodes = {a.node_id: a.node for a in latest}
    picked = {a.gpu_id for a in latest}
    gpus: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in Gpu.objects.present().filter(node_id__in=nodes).order_by("index"):
        gpus[gpu.node_id].append(gpu)
    links: dict[int, list[GpuLink]] = defaultdict(list)
    for link in GpuLink.objects.filter(node_id__in=nodes):
        links[link.node_id].append(link)
    return [
        NodeTopology(node, topology_rows(gpus[pk], links[pk], picked))
        for pk, node in sorted(nodes.items(), key=lambda item: item[1].hostname)
    ]


@dataclasses.dataclass(frozen=True)
class DependencyRow:
    """One job the job waits for (``--dependency``), and whether that holds."""

    kind: str
    job_id: int
    state: str
    url: str

    @property
    def status(self) -> str:
        held = dependencies.outcome(self.kind, self.state)
        return "pending" if held is None else "holds" if held else "never holds"


def job_dependencies(job: Job) -> list[DependencyRow]:
    """The jobs ``job`` waits for, in the order given (one query)."""
    url = url_format("scheduling:job-detail")
    return [
        DependencyRow(kind, on_id, state, url.format(on_id))
        for kind, on_id, state in job.dependencies.order_by("pk").values_list(
            "kind", "on_id", "on__state"
        )
    ]


@dataclasses.dataclass
class JobPage(JobView):
    """Everything the job page shows; the live status panel needs only the job."""

    can_cancel: bool = False
    can_release: bool = False  # held (pending): the owner, operators and admins let it in
    can_cancel_array: bool = False  # an array's tasks share its owner: the job's rule
    private_to: str = ""  # who reads its command and log, when the viewer may not; else ""
    allocations: list[Allocation] = dataclasses.field(default_factory=list)
    attempts: list[queries.Attempt] | None = None  # its runs; None: read when first asked
    timeline: list[TimelineEntry] = dataclasses.field(default_factory=list)
    topologies: list[NodeTopology] = dataclasses.field(default_factory=list)
    dependencies: list[DependencyRow] = dataclasses.field(default_factory=list)

    @property
    def sharing(self) -> str:
        return sharing_text(self.job)

    @property
    def ray_dashboard(self) -> str | None:
        return ray.dashboard_url(self.job, self.allocations)

    @property
    def ray_token(self) -> str | None:
        return ray.shown_token(self.job, private=bool(self.private_to))

    @property
    def array_url(self) -> str:
        """The queue of its array's tasks; empty when it is in no array."""
        if self.job.array_id is None:
            return ""
        return f"{reverse('scheduling:queue')}?array={self.job.array_id}"

    @property
    def is_waiting(self) -> bool:
        return self.job.state in queries.WAITING_STATES

    @property
    def waiting(self) -> str:
        return waiting_text(self.job)

    @property
    def is_live(self) -> bool:
        """The page refreshes its status while the job can still change."""
        return not self.job.is_terminal

    @property
    def runs(self) -> list[queries.Attempt]:
        """Its attempts, oldest first (the live status panel reads them from the audit log
        alone: one query, and its GPUs are not shown)."""
        if self.attempts is None:
            self.attempts = queries.job_attempts(self.job, self.allocations)
        return self.attempts

    @property
    def current_attempt(self) -> queries.Attempt | None:
        """The run its state is about; None for a job waiting (again, once requeued)."""
        return next((attempt for attempt in self.runs if attempt.current), None)

    @property
    def earlier_attempts(self) -> bool:
        return any(not attempt.current for attempt in self.runs)

    @property
    def placement(self) -> PlacementWhy | None:
        """Why its current run's GPUs were chosen (a requeued job's last placement is not)."""
        return PlacementWhy.of(self.job.placement) if self.current_attempt else None

    @property
    def max_runtime(self) -> str:
        return duration_text(self.job.max_runtime_s)

    @property
    def estimated_duration(self) -> str:
        return duration_text(self.job.estimated_duration_s)

    @property
    def env_keys(self) -> list[str]:
        """The names of the job's environment variables (their values may be secrets)."""
        return sorted(self.job.env)

    @property
    def attempt(self) -> str:
        """``3 (1 preempted; up to 2 retries after failures)``: preempted attempts do not
        count against its retries (``services`` re-queues a failure while fewer than
        ``max_retries`` earlier attempts failed)."""
        job = self.job
        started = str(job.attempt) if job.attempt else "none started yet"
        preempted = f"{job.preemptions} preempted; " if job.preemptions else ""
        if job.max_retries == 0:
            retries = "no retry after a failure"
        elif job.max_retries == 1:
            retries = "up to 1 retry after a failure"
        else:
            retries = f"up to {job.max_retries} retries after failures"
        return f"{started} ({preempted}{retries})"


def job_page(job: Job, user: User) -> JobPage:
    """The job page's content (seven queries, whatever the job's size)."""
    allocations = job_allocations(job)
    attempts = queries.job_attempts(job, allocations)
    current = any(attempt.current for attempt in attempts)
    return JobPage(
        job,
        can_cancel=not job.is_terminal and can_act_on(user, job),
        can_release=job.state == JobState.PENDING and can_act_on(user, job),
        can_cancel_array=job.array_id is not None and can_act_on(user, job),
        private_to="" if can_read_private(user, job) else private_to(),
        allocations=allocations,
        attempts=attempts,
        timeline=timeline(job, allocations),
        topologies=node_topologies(job, allocations) if current else [],
        dependencies=job_dependencies(job),
    )


# ---------------------------------------------------------------------------------- log tail


@dataclasses.dataclass
class LogTail:
    """The last lines of a job's log on one of its nodes, or why there are none; ``live`` while
    the job holds its GPUs (the log grows: the page polls it)."""

    job: Job
    live: bool
    hostname: str = ""
    hostnames: list[str] = dataclasses.field(default_factory=list)
    text: str = ""
    note: str = ""


def log_tail(job: Job, hostname: str = "") -> LogTail:
    """The last ``LOG_LINES`` lines of the job's latest attempt on ``hostname`` (default: its
    first node), read through that node's agent; why not, when it cannot be read."""
    tail = LogTail(job, live=job.state in HOLDING_STATES)
    try:
        log = queries.job_log(job, lines=LOG_LINES, hostname=hostname or None)
    except queries.NoLog as exc:
        tail.note = f"No log: {exc}."
        return tail
    except queries.LogUnavailable as exc:
        tail.note = f"The log cannot be read now: {exc}."
        return tail
    tail.hostname, tail.hostnames, tail.text = log.node, log.nodes, log.text
    if not log.exists:
        tail.note = f"No log on {log.node} yet."
    return tail
