"""The fleet dashboard's data: GPU rows joined with their live sample and the job on each
GPU (``inventory.occupancy``), node cards, the summary bar, and the nodes a filtered view shows.

The per-GPU rows of the node cards are written here as HTML (``static_rows_html``,
``live_rows_html``) rather than by the template engine, whose cost per row would take the
2 s poll over its budget at 500 nodes x 8 GPUs; f-strings cost a small fraction of it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from html import escape
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, QuerySet
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from gpuadmin.registry import Occupant
from inventory import live, units
from inventory.choices import GpuState, NodeState
from inventory.live import LiveSample, MigDeviceSample
from inventory.models import Gpu, Node
from inventory.nvml.scanner import THERMAL_REASONS
from inventory.occupancy import Occupancy
from inventory.pages.common import badge_colour, url_format
from inventory.units import MIB_PER_GIB
from inventory.usability import Reason, Unusable, why_unusable


class Status(StrEnum):
    """Where a GPU stands right now, at a glance: the summary bar's tiles and the row colour.
    Free is exactly "usable now (``usability.why_unusable``) and held by no job"; the rest
    say why not, the gravest last."""

    FREE = "free"
    BUSY = "busy"  # a job holds it: gpuadmin's, or a Slurm job
    DRAINING = "draining"
    MIG = "mig"  # in MIG mode: not free as a whole GPU
    MPS = "mps"  # shared through MPS: not free as a whole GPU
    FOREIGN = "foreign"  # processes run on it that no allocation accounts for
    RESETTING = "resetting"
    DEGRADED = "degraded"  # fenced by a health policy, or NVML fails on it
    MISSING = "missing"  # the last scan of its node did not see it
    OFFLINE = "offline"  # the GPU or its node, its node's agent unreachable, or no confinement


# What each status means, for the dashboard's legend.
STATUS_MEANINGS = {
    Status.FREE: "usable now, held by no job",
    Status.BUSY: "a job holds it (gpuadmin's, or a Slurm job)",
    Status.DRAINING: "no new work; running work finishes",
    Status.MIG: "in MIG mode: only its slices can be given",
    Status.MPS: "shared through MPS: only shares of it can be given",
    Status.FOREIGN: "processes that no allocation accounts for (started outside the scheduler)",
    Status.RESETTING: "a GPU reset is under way",
    Status.DEGRADED: "fenced by a health policy, or NVML fails on it",
    Status.MISSING: "the last scan of its node did not see it",
    Status.OFFLINE: "taken offline, or its node is offline or unreachable",
}

# The page's status of an unusable GPU, by reason (work on it, if any, makes it busy first).
_STATUS_OF = {
    Reason.OFFLINE: Status.OFFLINE,
    Reason.UNREACHABLE: Status.OFFLINE,
    Reason.MISSING: Status.MISSING,
    Reason.ERROR: Status.DEGRADED,
    Reason.RESETTING: Status.RESETTING,
    Reason.DEGRADED: Status.DEGRADED,
    Reason.DRAINING: Status.DRAINING,
    Reason.UNCONFINED: Status.OFFLINE,  # out of service until an admin allows unconfined jobs
    Reason.HELD_OUTSIDE: Status.BUSY,
    Reason.MIG: Status.MIG,
    Reason.MPS: Status.MPS,
    Reason.FOREIGN_PROCESS: Status.FOREIGN,
}

# Clock-event reasons of a GPU slowed down by heat (``throttle_reasons`` of a live sample).


def _number(value: Any) -> float | None:
    return value if type(value) in (int, float) else None  # not bool, not a string


# The counters of a live sample shown on the GPU page: (label, sample fields).
HEALTH_COUNTERS = (
    ("ECC errors, volatile (corrected / uncorrected)", ("ecc_corrected", "ecc_uncorrected")),
    (
        "ECC errors, aggregate (corrected / uncorrected)",
        ("ecc_corrected_total", "ecc_uncorrected_total"),
    ),
    (
        "Retired pages (single-bit / double-bit / pending)",
        ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"),
    ),
    (
        "Remapped rows (correctable / uncorrectable / pending / failure)",
        (
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "remapped_rows_pending",
            "remapped_rows_failure",
        ),
    ),
    ("NVLink errors (CRC, replay, recovery)", ("nvlink_errors",)),
)


@dataclasses.dataclass(frozen=True)
class ProcessRow:
    """A process the live sample lists on a GPU; ``occupant``: the job holding the GPU, whose
    process it is (``None``: no allocation accounts for it, a foreign process)."""

    pid: int
    used_memory_mib: float | None
    occupant: Occupant | None

    @property
    def foreign(self) -> bool:
        return self.occupant is None


@dataclasses.dataclass(slots=True)
class DashboardGpu:
    """What the dashboard reads of a GPU (``DASHBOARD_GPU_FIELDS``), read as plain values:
    a model instance per GPU would cost each poll more than the rest of its reads."""

    pk: int
    uuid: str
    node_id: int
    state: str
    state_reason: str
    index: int
    name: str
    memory_total_mib: int
    mig_enabled: bool
    mps_shared: bool
    error_message: str
    missing_since: datetime | None
    held_outside: str
    mig_count: int = 0

    @property
    def is_missing(self) -> bool:
        return self.missing_since is not None


@dataclasses.dataclass
class GpuRow:
    """One GPU with its latest live sample (``None`` when its agent published none) and the
    job that holds it, if any. The sample's numbers are read once, on creation; the status
    on first use (the dashboard reads each several times, for 4,000 GPUs every 2 s)."""

    gpu: Gpu | DashboardGpu
    reachable: bool
    sample: LiveSample | None
    node_state: str = NodeState.ONLINE
    occupancy: Occupancy | None = None
    refuses_unconfined: bool = False  # its node's (``Node.refuses_unconfined``)
    utilization_pct: float | None = dataclasses.field(init=False)
    memory_used_mib: float | None = dataclasses.field(init=False)
    memory_total_mib: float = dataclasses.field(init=False)
    temperature_c: float | None = dataclasses.field(init=False)
    power_w: float | None = dataclasses.field(init=False)
    processes: int | None = dataclasses.field(init=False)
    """How many processes the live sample lists (the dashboard names the ``occupant``
    instead when a job holds the GPU; the count stays for work started by hand)."""
    hot: bool = dataclasses.field(init=False)
    """Slowed down by heat now (a thermal clock event in the live sample)."""
    _status: Status | None = dataclasses.field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        sample: Mapping[str, Any] = self.sample or {}  # read defensively: _number
        get = sample.get
        self.utilization_pct = _number(get("utilization_gpu_pct"))
        self.memory_used_mib = _number(get("memory_used_mib"))
        self.memory_total_mib = _number(get("memory_total_mib")) or self.gpu.memory_total_mib
        self.temperature_c = _number(get("temperature_c"))
        self.power_w = _number(get("power_w"))
        count = _number(get("processes"))
        self.processes = None if count is None else int(count)
        reasons = get("throttle_reasons")
        self.hot = bool(reasons and THERMAL_REASONS.intersection(reasons))

    @property
    def occupant(self) -> Occupant | None:
        return self.occupancy.get(self.gpu.pk) if self.occupancy else None

    @property
    def memory_free_mib(self) -> float | None:
        used = self.memory_used_mib
        return None if used is None else max(self.memory_total_mib - used, 0)

    @property
    def memory_text(self) -> str:
        """``30.1/40`` GiB, the total alone when nothing is sampled."""
        total = f"{self.memory_total_mib / MIB_PER_GIB:.0f}"
        used = self.memory_used_mib
        return total if used is None else f"{used / MIB_PER_GIB:.1f}/{total}"

    @property
    def memory_pct(self) -> float | None:
        used, total = self.memory_used_mib, self.memory_total_mib
        return None if used is None or not total else 100 * used / total

    @property
    def sampled_at(self) -> datetime | None:
        at = _number(self.sample.get("sampled_at")) if self.sample else None
        return (
            None if at is None else datetime.fromtimestamp(at, tz=timezone.get_current_timezone())
        )

    @property
    def utilization_text(self) -> str:
        if self.error:
            return "ERR"
        util = self.utilization_pct
        if util is not None:
            return f"{util:.0f}%"
        return "MIG" if self.sample and self.gpu.mig_enabled else "\u2013"

    @property
    def temperature_text(self) -> str:
        value = self.temperature_c
        return "\u2013" if value is None else f"{value:.0f}"

    @property
    def power_text(self) -> str:
        value = self.power_w
        return "\u2013" if value is None else f"{value:.0f}"

    @property
    def processes_text(self) -> str:
        value = self.processes
        return "\u2013" if value is None else str(value)

    @property
    def state_colour(self) -> str:
        return badge_colour(self.gpu.state)

    @property
    def error(self) -> str:
        """The live sample's error, else the one discovery recorded."""
        error = self.sample.get("error_message") if self.sample else None
        return error or self.gpu.error_message

    @property
    def unusable(self) -> Unusable | None:
        """Why it cannot take a whole-GPU job now (the one rule), or ``None``."""
        gpu = self.gpu
        return why_unusable(
            node_state=self.node_state,
            reachable=self.reachable,
            gpu_state=gpu.state,
            missing=gpu.is_missing,
            error_message=gpu.error_message,
            mig_enabled=gpu.mig_enabled,
            mps_shared=gpu.mps_shared,
            held_outside=gpu.held_outside,
            refuses_unconfined=self.refuses_unconfined,
            sample=self.sample,
            allocated=self.occupant is not None,
        )

    @property
    def status(self) -> Status:
        """As ``unusable`` says; a GPU free, in MIG mode or shared through MPS is busy while
        a job holds it (a draining one stays draining: its job finishes there), and each is
        foreign while processes run on it that no job accounts for."""
        if self._status is None:
            why = self.unusable
            status = Status.FREE if why is None else _STATUS_OF[why.code]
            if status in (Status.FREE, Status.DRAINING, Status.MIG, Status.MPS):
                if self.occupant:
                    if status is not Status.DRAINING:  # its job finishes there: draining
                        status = Status.BUSY
                elif self.processes:
                    status = Status.FOREIGN
            self._status = status
        return self._status

    @property
    def utilization_measurable(self) -> bool:
        """NVML reports no utilization for a GPU in MIG mode: "not measurable", never 0%."""
        return not self.gpu.mig_enabled

    @property
    def mig_devices(self) -> list[MigDeviceSample]:
        """The MIG devices of the live sample with their memory (MIG mode only)."""
        return list(self.sample.get("mig") or []) if self.sample else []

    @property
    def gpu_processes(self) -> list[ProcessRow]:
        """The processes of the live sample (``pids``), each foreign unless a job holds the
        GPU (then they are that job's)."""
        pids = self.sample.get("pids") if self.sample else None
        occupant = self.occupant
        return [ProcessRow(int(pid), _number(used), occupant) for pid, used in (pids or [])]

    @property
    def health_counters(self) -> list[tuple[str, str]]:
        """The live sample's ECC, retired-page, remapped-row and NVLink error counters that
        the GPU reports, as (label, value) in words."""
        return [(label, text) for label, _, text in self.health_counter_values]

    @property
    def health_counter_values(self) -> list[tuple[str, dict[str, Any], str]]:
        """``health_counters`` with their values by sample field: (label, values, text)."""
        sample: Mapping[str, Any] = self.sample or {}  # HEALTH_COUNTERS name the fields
        found = []
        for label, names in HEALTH_COUNTERS:
            values = {name: sample.get(name) for name in names}
            if any(value is not None for value in values.values()):
                text = " / ".join(_DASH if v is None else str(v) for v in values.values())
                found.append((label, values, text))
        return found

    @property
    def device_error(self) -> str:
        """Why NVML could not be queried for it now (the seed's ``error_message``): the
        error of its live sample or of the last scan, or that no recent sample came."""
        if self.error:
            return self.error
        if self.sample is None or not self.reachable:
            return "no live sample: its node's agent has not reported lately"
        return ""


@dataclasses.dataclass
class NodeRows:
    node: Node
    reachable: bool
    gpus: list[GpuRow]

    @property
    def state_colour(self) -> str:
        return badge_colour(self.node.state)

    @property
    def url(self) -> str:
        return _node_url("inventory:node-detail").format(self.node.hostname)

    @property
    def topology_url(self) -> str:
        return _node_url("inventory:node-topology").format(self.node.hostname)

    @property
    def mig_url(self) -> str:
        return _node_url("inventory:node-mig").format(self.node.hostname)

    @property
    def host_text(self) -> str:
        """``CPUs 256 (8 reserved), memory 1007.5 GiB (16 GiB reserved)``; a figure its agent has
        not reported is "not reported"."""
        node = self.node
        cpus = _with_reserved(node.cpu_count, node.cpus_reserved, str)
        memory = _with_reserved(node.memory_total_mib, node.memory_reserved_mib, units.memory_text)
        return f"CPUs {cpus}, memory {memory}"

    @property
    def static_rows_html(self) -> SafeString:
        return static_rows_html(self.gpus)

    @property
    def live_rows_html(self) -> SafeString:
        return live_rows_html(self)

    @property
    def summary(self) -> Summary:
        """The summary bar's counts of this node's GPUs alone."""
        return Summary(self.gpus)


def _with_reserved(total: int | None, reserved: int, text: Callable[[int], str]) -> str:
    shown = "not reported" if total is None else text(total)
    return f"{shown} ({text(reserved)} reserved)" if reserved else shown


@dataclasses.dataclass
class Summary:
    """How many GPUs have each status, counted on first use (the seed's device list never
    asks, so it never reads the GPUs' occupants), and how many run hot."""

    rows: list[GpuRow]

    @property
    def total(self) -> int:
        return len(self.rows)

    @functools.cached_property
    def counts(self) -> dict[Status, int]:
        counted = Counter(row.status for row in self.rows)
        return {status: counted[status] for status in Status}

    @functools.cached_property
    def hot(self) -> int:
        return sum(row.hot for row in self.rows)


def fleet_rows(
    nodes: Iterable[Node],
    samples: Mapping[str, Mapping[str, LiveSample]],
    now: datetime | None = None,
) -> tuple[list[NodeRows], Summary]:
    """Join nodes (with their ``gpus`` prefetched) to the live samples of ``live.latest`` and
    to the GPUs' occupants (read when first named, for all of them)."""
    return node_rows([(node, list(node.gpus.all())) for node in nodes], samples, now)


def node_rows(
    nodes: Iterable[tuple[Node, Sequence[Gpu | DashboardGpu]]],
    samples: Mapping[str, Mapping[str, LiveSample]],
    now: datetime | None = None,
) -> tuple[list[NodeRows], Summary]:
    """``fleet_rows`` for nodes given with their GPUs (``dashboard_nodes``)."""
    now = now or timezone.now()
    nodes = list(nodes)
    occupancy = Occupancy([gpu.pk for _, gpus in nodes for gpu in gpus])
    result = []
    for node, gpus in nodes:
        reachable = node.is_reachable(now)
        node_samples = samples.get(node.hostname, {})
        refuses = node.refuses_unconfined
        rows = [
            GpuRow(gpu, reachable, node_samples.get(gpu.uuid), node.state, occupancy, refuses)
            for gpu in gpus
        ]
        result.append(NodeRows(node, reachable, rows))
    return result, Summary([row for node in result for row in node.gpus])


def fleet_view(
    gpus: QuerySet[Gpu], *, filtered: bool, live_only: bool = False
) -> tuple[list[NodeRows], Summary]:
    """The fleet page's node cards and summary bar (and ``gpuadmin status``'s, through
    ``/api/v1/fleet/``): ``dashboard_nodes`` joined to their live samples. Three queries and
    one round trip to Redis (the occupants: one more query, on first use)."""
    nodes = dashboard_nodes(gpus, filtered=filtered, live_only=live_only)
    return node_rows(nodes, live.latest(node.hostname for node, _ in nodes))


def gpu_rows(gpus: Iterable[Gpu]) -> dict[int, GpuRow]:
    """Each GPU (its ``node`` selected) as the fleet page's row, by primary key: the live
    values of ``/api/v1/gpus/``. One round trip to Redis (the occupants: one query, on first
    use)."""
    by_node: dict[int, tuple[Node, list[Gpu]]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node_id, (gpu.node, []))[1].append(gpu)
    samples = live.latest(node.hostname for node, _ in by_node.values())
    cards, _ = node_rows(by_node.values(), samples)
    return {row.gpu.pk: row for card in cards for row in card.gpus}


# The GPU fields the dashboard reads, in ``DashboardGpu``'s order.
DASHBOARD_GPU_FIELDS = (
    "pk",
    "uuid",
    "node_id",
    "state",
    "state_reason",
    "index",
    "name",
    "memory_total_mib",
    "mig_enabled",
    "mps_shared",
    "error_message",
    "missing_since",
    "held_outside",
)
# What the 2 s poll reads of a node (the full page reads every field).
# What the live rows read of a node: the one rule's node facts (``Node.refuses_unconfined``).
_LIVE_NODE_FIELDS = (
    "hostname",
    "state",
    "last_heartbeat_at",
    "nvml_backend",
    "isolation",
    "allow_unconfined",
)


def has_mig() -> Exists:
    """A node's annotation: it has a present MIG-capable GPU (a MIG page worth a link)."""
    return Exists(Gpu.objects.present().filter(node=OuterRef("pk"), mig_capable=True))


def dashboard_gpus(gpus: QuerySet[Gpu]) -> dict[int, list[DashboardGpu]]:
    """``gpus`` as ``DashboardGpu`` values by node id, missing GPUs last, with their
    ``mig_count`` (the live rows' state cell shows it). One query."""
    ordered = gpus.order_by("node_id", F("missing_since").asc(nulls_first=True), "index")
    ordered = ordered.annotate(mig_count=Count("mig_instances"))
    by_node: dict[int, list[DashboardGpu]] = {}
    for values in ordered.values_list(*DASHBOARD_GPU_FIELDS, "mig_count"):
        by_node.setdefault(values[2], []).append(DashboardGpu(*values))
    return by_node


def dashboard_nodes(
    gpus: QuerySet[Gpu], *, filtered: bool, live_only: bool = False
) -> list[tuple[Node, list[DashboardGpu]]]:
    """The dashboard's nodes, each with its GPUs in view (``gpus``: what the GPU FilterSet
    kept); with ``filtered``, only the nodes that keep a GPU. The full page's nodes have
    ``has_mig``; ``live_only`` (the poll) reads only the node fields the live rows show. Two
    queries."""
    nodes = Node.objects.all()
    if live_only:
        nodes = nodes.only(*_LIVE_NODE_FIELDS)
    else:
        nodes = nodes.annotate(has_mig=has_mig())
    if filtered:
        nodes = nodes.filter(Exists(gpus.filter(node=OuterRef("pk"))))
    by_node = dashboard_gpus(gpus)
    return [(node, by_node.get(node.pk, [])) for node in nodes]


# --------------------------------------------------------------------------- rows as HTML

_DASH = "\u2013"
_STATE_LABELS = dict(GpuState.choices)


@functools.cache
def _gpu_url() -> str:
    return url_format("inventory:gpu-detail")


@functools.cache
def _node_url(viewname: str) -> str:
    return url_format(viewname)


def static_rows_html(rows: Iterable[GpuRow]) -> SafeString:
    """A node card's static table body: each GPU's link (with its missing badge) and model;
    its state is a live column (``_state_cell``)."""
    url = _gpu_url()
    parts = []
    for row in rows:
        gpu = row.gpu
        missing = (
            f' <span class="badge badge-red" title="Missing since '
            f'{gpu.missing_since:%Y-%m-%d %H:%M}">missing</span>'
            if gpu.missing_since
            else ""
        )
        parts.append(
            f'<tr class="gpu-row" data-uuid="{escape(gpu.uuid)}">'
            f'<td><a href="{url.format(escape(gpu.uuid))}">GPU{gpu.index}</a>{missing}</td>'
            f'<td class="muted">{escape(gpu.name.replace("NVIDIA ", ""))}</td></tr>\n'
        )
    if not parts:
        parts.append('<tr><td colspan="2" class="empty">No GPUs.</td></tr>\n')
    return mark_safe("".join(parts))  # every value above is escaped


def _state_cell(row: GpuRow) -> str:
    """The GPU's catalog state (its reason in the tooltip) and MIG badges: a live column, so
    that a GPU drained or fenced reads so without a reload (``mig_count``: annotated by
    ``dashboard_gpus``)."""
    gpu = row.gpu
    reason = f' title="{escape(gpu.state_reason)}"' if gpu.state_reason else ""
    mig_count = getattr(gpu, "mig_count", 0)
    mig = (
        f' <span class="badge badge-blue" title="{mig_count} MIG instances">MIG {mig_count}</span>'
        if gpu.mig_enabled
        else ""
    )
    return (
        f'<td><span class="badge badge-{row.state_colour}"{reason}>'
        f"{_STATE_LABELS.get(gpu.state, gpu.state)}</span>{mig}</td>"
    )


def _live_row_html(row: GpuRow) -> str:
    status = row.status
    marks = ""
    if row.error:
        marks += f' <span class="badge badge-red" title="{escape(row.error)}">error</span>'
    if row.hot:
        marks += ' <span class="badge badge-amber" title="Slowed down by heat">hot</span>'
    pct = row.memory_pct
    memory = f' style="--m:{pct:.0f}%"' if pct is not None else ""
    occupant = row.occupant
    work = (
        f'<a href="{escape(occupant.job_url)}">{escape(occupant.short_label)}</a> '
        f"{escape(occupant.user)}"
        if occupant
        else row.processes_text
    )
    return (
        f'<tr class="s-{status}"><td>{status}{marks}</td>{_state_cell(row)}'
        f"<td>{row.utilization_text}</td>"
        f"<td{memory}>{row.memory_text}</td><td>{row.temperature_text}</td>"
        f"<td>{row.power_text}</td><td>{work}</td></tr>\n"
    )


def live_rows_html(card: NodeRows, *, oob: bool = False) -> SafeString:
    """A node card's live table body, refreshed by the dashboard's 2 s poll (``oob``: marked
    for its out-of-band swap; never on a page, whose own poll would lose the rows to it):
    each GPU's status (with error and hot marks), state, utilization, memory, temperature,
    power, and the job holding it (else how many processes run on it)."""
    unreachable = "" if card.reachable else " unreachable"
    swap = ' hx-swap-oob="true"' if oob else ""
    rows = "".join(_live_row_html(row) for row in card.gpus) or (
        '<tr><td colspan="7" class="empty">&nbsp;</td></tr>\n'
    )
    return mark_safe(  # every value in the rows is escaped
        f'<tbody id="live-{card.node.pk}" class="live{unreachable}"{swap}>\n{rows}</tbody>'
    )


def poll_rows_html(cards: Iterable[NodeRows]) -> SafeString:
    """The dashboard poll's out-of-band swaps: every card's live rows, as the page has them,
    each in a template element so that the HTML parser keeps the tbody outside a table."""
    return mark_safe(
        "".join(f"<template>{live_rows_html(card, oob=True)}</template>" for card in cards)
    )
