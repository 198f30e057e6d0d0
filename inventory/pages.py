"""What the inventory pages show, apart from HTTP: GPU rows joined with their live sample (and
the job on each GPU, from an occupant source an app above inventory registers), the fleet
summary, dashboard filters, MIG slice layouts with profile availability, and the
``nvidia-smi topo -m`` matrix.

The views in ``inventory.views`` only fetch rows, call these functions and render.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Prefetch, Q, QuerySet
from django.utils import timezone

from inventory.choices import BADGE_COLOURS, GpuState, NodeState
from inventory.models import Gpu, GpuLink, MigInstance, Node, Pool
from inventory.nvml import mig_catalog

MIB_PER_GIB = 1024


class Status(StrEnum):
    """Where a GPU stands right now, for the summary bar and the row colour."""

    FREE = "free"
    BUSY = "busy"
    DRAINING = "draining"
    DEGRADED = "degraded"
    OFFLINE = "offline"


def badge_colour(state: str) -> str:
    return BADGE_COLOURS.get(state, "grey")


def short_gpu_name(name: str) -> str:
    """``NVIDIA A100-SXM4-40GB`` -> ``A100-SXM4-40GB``."""
    return name.removeprefix("NVIDIA ").strip()


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclasses.dataclass(frozen=True)
class Occupant:
    """Who holds a GPU: the job it is allocated to and that job's user."""

    job_id: int
    job_url: str
    user: str


# gpu ids -> {gpu id: its occupant}, for the GPUs that have one, in one query.
OccupantSource = Callable[[Collection[int]], Mapping[int, Occupant]]
_occupant_sources: list[OccupantSource] = []


def register_occupant_source(source: OccupantSource) -> None:
    """Let an app above inventory name the job on each GPU (scheduling: its allocations);
    inventory itself knows nothing of jobs."""
    if source not in _occupant_sources:
        _occupant_sources.append(source)


class Occupancy:
    """The occupants of a page's GPUs, read on first use, in one query per registered source
    for all of them (pages that never name occupants, like the seed API, pay nothing)."""

    def __init__(self, gpu_ids: Collection[int]) -> None:
        self._gpu_ids = gpu_ids
        self._found: dict[int, Occupant] | None = None

    def get(self, gpu_id: int) -> Occupant | None:
        if self._found is None:
            self._found = {}
            for source in _occupant_sources:
                self._found.update(source(self._gpu_ids))
        return self._found.get(gpu_id)


@dataclasses.dataclass
class GpuRow:
    """One GPU with its latest live sample (``None`` when its agent published none) and the
    job that holds it, if any."""

    gpu: Gpu
    reachable: bool
    sample: Mapping[str, Any] | None
    node_state: str = NodeState.ONLINE
    occupancy: Occupancy | None = None

    @property
    def occupant(self) -> Occupant | None:
        return self.occupancy.get(self.gpu.pk) if self.occupancy else None

    @property
    def utilization_pct(self) -> float | None:
        return _number(self.sample.get("utilization_gpu_pct")) if self.sample else None

    @property
    def memory_used_mib(self) -> float | None:
        return _number(self.sample.get("memory_used_mib")) if self.sample else None

    @property
    def memory_total_mib(self) -> float:
        total = _number(self.sample.get("memory_total_mib")) if self.sample else None
        return total or self.gpu.memory_total_mib

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
    def temperature_c(self) -> float | None:
        return _number(self.sample.get("temperature_c")) if self.sample else None

    @property
    def power_w(self) -> float | None:
        return _number(self.sample.get("power_w")) if self.sample else None

    @property
    def processes(self) -> int | None:
        """How many processes the live sample lists (the dashboard names the ``occupant``
        instead when a job holds the GPU; the count stays for work started by hand)."""
        return _number(self.sample.get("processes")) if self.sample else None

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
        return (self.sample or {}).get("error_message") or self.gpu.error_message

    @property
    def status(self) -> Status:
        """First match wins: offline (state offline or node unreachable), degraded (an error
        or missing from the last scan), busy (a process runs), draining, free."""
        gpu = self.gpu
        if not self.reachable or GpuState.OFFLINE in (gpu.state, self.node_state):
            return Status.OFFLINE
        if self.error or gpu.is_missing:
            return Status.DEGRADED
        if self.processes:
            return Status.BUSY
        if GpuState.DRAINING in (gpu.state, self.node_state):
            return Status.DRAINING
        return Status.FREE

    @property
    def is_available(self) -> bool:
        """Free, and its live sample confirms that no process runs on it."""
        return self.status is Status.FREE and self.processes == 0


@dataclasses.dataclass
class NodeRows:
    node: Node
    reachable: bool
    gpus: list[GpuRow]

    @property
    def state_colour(self) -> str:
        return badge_colour(self.node.state)


@dataclasses.dataclass
class Summary:
    total: int
    counts: dict[Status, int]

    @classmethod
    def of(cls, rows: Iterable[GpuRow]) -> Summary:
        counted = Counter(row.status for row in rows)
        return cls(
            total=sum(counted.values()), counts={status: counted[status] for status in Status}
        )


def fleet_rows(
    nodes: Iterable[Node],
    samples: Mapping[str, Mapping[str, Mapping[str, Any]]],
    now: datetime | None = None,
) -> tuple[list[NodeRows], Summary]:
    """Join nodes (with their ``gpus`` prefetched) to the live samples of ``live.latest`` and
    to the GPUs' occupants (read when first named, for all of them)."""
    now = now or timezone.now()
    nodes = list(nodes)
    occupancy = Occupancy([gpu.pk for node in nodes for gpu in node.gpus.all()])
    result = []
    for node in nodes:
        reachable = node.is_reachable(now)
        node_samples = samples.get(node.hostname, {})
        gpus = [
            GpuRow(gpu, reachable, node_samples.get(gpu.uuid), node.state, occupancy)
            for gpu in node.gpus.all()
        ]
        result.append(NodeRows(node, reachable, gpus))
    return result, Summary.of(row for node in result for row in node.gpus)


# ------------------------------------------------------------------------------------ filters


@dataclasses.dataclass(frozen=True)
class FleetFilters:
    """The dashboard's GET filters; every field empty means "any"."""

    node: str = ""
    model: str = ""
    state: str = ""
    pool: str = ""

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> FleetFilters:
        return cls(**{field.name: query.get(field.name, "").strip() for field in _FIELDS})

    @property
    def active(self) -> bool:
        return any(getattr(self, field.name) for field in _FIELDS)

    def gpus(self) -> QuerySet[Gpu]:
        gpus = Gpu.objects.all()
        if self.model:
            gpus = gpus.filter(name=self.model)
        if self.state:
            gpus = gpus.filter(state=self.state)
        if self.pool:
            # A GPU without a pool of its own belongs to its node's pool.
            gpus = gpus.filter(
                Q(pool__name=self.pool) | Q(pool__isnull=True, node__pool__name=self.pool)
            )
        return gpus

    def nodes(self) -> QuerySet[Node]:
        """Nodes in view, each with its GPUs in view prefetched (two queries in all)."""
        nodes = Node.objects.all()
        if self.node:
            nodes = nodes.filter(hostname=self.node)
        gpus = self.gpus()
        if self.model or self.state or self.pool:
            nodes = nodes.filter(Exists(gpus.filter(node=OuterRef("pk"))))
        shown = gpus.select_related("pool").annotate(mig_count=Count("mig_instances"))
        return nodes.prefetch_related(
            Prefetch(
                "gpus", queryset=shown.order_by(F("missing_since").asc(nulls_first=True), "index")
            )
        )


_FIELDS = dataclasses.fields(FleetFilters)


@dataclasses.dataclass
class FilterField:
    name: str
    label: str
    value: str
    choices: list[tuple[str, str]]


def filter_fields(filters: FleetFilters) -> list[FilterField]:
    """The dashboard's filter selects (one query per filter, whatever the fleet size)."""
    choices = {
        "node": [(name, name) for name in Node.objects.values_list("hostname", flat=True)],
        "model": [
            (name, short_gpu_name(name))
            for name in Gpu.objects.order_by("name").values_list("name", flat=True).distinct()
        ],
        "state": list(GpuState.choices),
        "pool": [(name, name) for name in Pool.objects.values_list("name", flat=True)],
    }
    return [
        FilterField(field.name, field.name.capitalize(), getattr(filters, field.name), options)
        for field, options in zip(_FIELDS, choices.values(), strict=True)
    ]


# ---------------------------------------------------------------------------------------- MIG


@dataclasses.dataclass
class GpuInstanceCard:
    """A MIG GPU instance drawn on the memory slices, with its compute instances."""

    gi_id: int
    profile_name: str
    placement_start: int
    placement_size: int
    memory_mib: int
    compute_slices: int
    compute_instances: list[MigInstance]

    @property
    def memory_gib(self) -> str:
        return f"{self.memory_mib / MIB_PER_GIB:.1f}"

    @property
    def grid_column(self) -> str:
        return f"{self.placement_start + 1} / span {self.placement_size}"


@dataclasses.dataclass
class ProfileFit:
    """How many more instances of one profile fit next to the current ones, and where."""

    name: str
    memory_mib: int
    compute_slices: int
    memory_slices: int
    fits: int
    starts: list[int]


@dataclasses.dataclass
class MigLayout:
    gpu: Gpu
    memory_slices: int
    compute_slices: int
    cards: list[GpuInstanceCard]
    free_slices: list[int]
    fits: list[ProfileFit]
    known_table: bool
    create_form: Any = None  # set by the MIG page for admins

    @property
    def compute_used(self) -> int:
        return sum(card.compute_slices for card in self.cards)

    @property
    def slice_indexes(self) -> range:
        return range(self.memory_slices)

    @property
    def compute_bar(self) -> list[bool]:
        """One flag per compute slice: ``True`` where an instance uses it."""
        used = min(self.compute_used, self.compute_slices)
        return [True] * used + [False] * (self.compute_slices - used)


def _compute_slices(profile_name: str, table_profiles: Mapping[str, Mapping[str, Any]]) -> int:
    if profile_name in table_profiles:
        return int(table_profiles[profile_name]["compute_slices"])
    found = re.match(r"(\d+)g\.", profile_name)
    return int(found.group(1)) if found else 0


def mig_layout(gpu: Gpu, instances: Iterable[MigInstance]) -> MigLayout:
    """The GPU's instances on its slices, and what its profile table still lets fit."""
    table = mig_catalog.table_for_gpu(gpu.name)
    profiles = {p["name"]: p for p in table["gpu_instance_profiles"]} if table else {}
    memory_total = table["memory_slices"] if table else 8
    compute_total = table["compute_slices"] if table else 7
    by_gi: dict[int, list[MigInstance]] = {}
    for instance in instances:
        by_gi.setdefault(instance.gi_id, []).append(instance)
    cards = [
        GpuInstanceCard(
            gi_id=gi_id,
            profile_name=rows[0].profile_name,
            placement_start=rows[0].placement_start,
            placement_size=rows[0].placement_size,
            memory_mib=rows[0].memory_mib,
            compute_slices=_compute_slices(rows[0].profile_name, profiles),
            compute_instances=sorted(rows, key=lambda row: row.ci_id),
        )
        for gi_id, rows in by_gi.items()
    ]
    cards.sort(key=lambda card: card.placement_start)
    taken = {
        index
        for card in cards
        for index in range(card.placement_start, card.placement_start + card.placement_size)
    }
    fits = [
        _profile_fit(profile, taken, cards, compute_total, table["max_mig_devices"])
        for profile in (table["gpu_instance_profiles"] if table else [])
    ]
    return MigLayout(
        gpu=gpu,
        memory_slices=memory_total,
        compute_slices=compute_total,
        cards=cards,
        free_slices=[index for index in range(memory_total) if index not in taken],
        fits=fits,
        known_table=table is not None,
    )


def _profile_fit(
    profile: Mapping[str, Any],
    taken: set[int],
    cards: list[GpuInstanceCard],
    compute_total: int,
    max_devices: int,
) -> ProfileFit:
    size = profile["memory_slices"]
    # Same-size intervals: taking the earliest free placement first maximizes the count.
    starts: list[int] = []
    used = set(taken)
    for start in sorted(profile["placements"]):
        span = set(range(start, start + size))
        if not span & used:
            starts.append(start)
            used |= span
    compute_left = compute_total - sum(card.compute_slices for card in cards)
    same_profile = sum(1 for card in cards if card.profile_name == profile["name"])
    fits = min(
        len(starts),
        profile["instances"] - same_profile,
        compute_left // profile["compute_slices"],
        max_devices - len(cards),
    )
    fits = max(fits, 0)
    return ProfileFit(
        name=profile["name"],
        memory_mib=profile["memory_mib"],
        compute_slices=profile["compute_slices"],
        memory_slices=size,
        fits=fits,
        starts=starts[:fits],
    )


def mig_gpus(node: Node) -> QuerySet[Gpu]:
    """The node's present MIG-capable GPUs with their instances (two queries)."""
    return (
        node.gpus.present()
        .filter(mig_capable=True)
        .prefetch_related("mig_instances")
        .order_by("index")
    )


# ----------------------------------------------------------------------------------- topology

# NVLink bandwidth per link and direction, by GPU architecture (NVLink 3 on A100, NVLink 4 on
# H100: both 25 GB/s per direction per link). Other GPUs: the link count only.
NVLINK_GBPS_PER_LINK = {"Ampere": 25, "Hopper": 25}

LINK_CLASSES = [
    ("nv", "NV#", "Bonded set of # NVLinks (through NVSwitch on DGX)"),
    ("pix", "PIX", "At most a single PCIe bridge"),
    ("pxb", "PXB", "Multiple PCIe bridges, no PCIe host bridge"),
    ("phb", "PHB", "PCIe and a PCIe host bridge (the CPU)"),
    ("node", "NODE", "PCIe and the interconnect between host bridges of one NUMA node"),
    ("sys", "SYS", "PCIe and the SMP interconnect between NUMA nodes (QPI/UPI, Infinity Fabric)"),
]
_DESCRIPTIONS = {label: text for _, label, text in LINK_CLASSES}


@dataclasses.dataclass
class TopologyCell:
    label: str
    css: str
    title: str
    highlighted: bool = False  # both GPUs of the pair are highlighted


@dataclasses.dataclass
class TopologyRow:
    gpu: Gpu
    cells: list[TopologyCell]
    highlighted: bool = False


def link_cell(gpu_a: Gpu, gpu_b: Gpu, link: GpuLink | None) -> TopologyCell:
    if gpu_a.pk == gpu_b.pk:
        return TopologyCell("X", "self", f"GPU{gpu_a.index}")
    pair = f"GPU{gpu_a.index} \u2194 GPU{gpu_b.index}"
    if link is None:
        return TopologyCell("?", "none", f"{pair}: not reported")
    if link.link_type.startswith("NV"):
        per_link = NVLINK_GBPS_PER_LINK.get(gpu_a.architecture)
        title = f"{pair}: {link.link_type}, {link.nvlink_count} NVLinks"
        if per_link:
            one_way = link.nvlink_count * per_link
            title += (
                f" \u00d7 {per_link} GB/s = {one_way} GB/s per direction "
                f"({2 * one_way} GB/s both ways)"
            )
        return TopologyCell(link.link_type, "nv", title)
    description = _DESCRIPTIONS.get(link.link_type, "")
    return TopologyCell(
        link.link_type, link.link_type.lower(), f"{pair}: {link.link_type}. {description}"
    )


def topology_rows(
    gpus: list[Gpu], links: Iterable[GpuLink], highlight: Collection[int] = ()
) -> list[TopologyRow]:
    """The ``topo -m`` matrix for ``gpus`` (in index order), from the node's link rows; the
    GPUs whose pk is in ``highlight`` (e.g. a job's) and the links between them are marked."""
    by_pair = {frozenset((link.gpu_a_id, link.gpu_b_id)): link for link in links}
    rows = []
    for gpu in gpus:
        cells = [
            link_cell(gpu, other, by_pair.get(frozenset((gpu.pk, other.pk)))) for other in gpus
        ]
        if gpu.pk in highlight:
            for cell, other in zip(cells, gpus, strict=True):
                cell.highlighted = other.pk in highlight
        rows.append(TopologyRow(gpu=gpu, cells=cells, highlighted=gpu.pk in highlight))
    return rows


@dataclasses.dataclass
class TopologyMatrix:
    """A node's ``topo -m`` matrix as data (the API's shape), GPUs in index order."""

    node: str
    gpus: list[int]
    matrix: list[list[str | None]]
    nvlink_counts: list[list[int]]
    numa_nodes: list[int | None]
    cpu_affinity: list[str]


def topology_matrix(node: Node) -> TopologyMatrix:
    gpus = list(node.gpus.present().order_by("index"))
    by_pair = {frozenset((link.gpu_a_id, link.gpu_b_id)): link for link in node.links.all()}

    def link(a: Gpu, b: Gpu) -> GpuLink | None:
        return by_pair.get(frozenset((a.pk, b.pk)))

    return TopologyMatrix(
        node=node.hostname,
        gpus=[gpu.index for gpu in gpus],
        matrix=[
            ["X" if a.pk == b.pk else getattr(link(a, b), "link_type", None) for b in gpus]
            for a in gpus
        ],
        nvlink_counts=[[getattr(link(a, b), "nvlink_count", 0) for b in gpus] for a in gpus],
        numa_nodes=[gpu.numa_node for gpu in gpus],
        cpu_affinity=[gpu.cpu_affinity for gpu in gpus],
    )
