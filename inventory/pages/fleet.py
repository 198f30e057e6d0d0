"""The fleet dashboard's data: GPU rows joined with their live sample and the job on each
GPU (``inventory.occupancy``), node cards, the summary bar, and the nodes a filtered view shows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Prefetch, QuerySet
from django.utils import timezone

from inventory.choices import NodeState
from inventory.models import Gpu, Node
from inventory.occupancy import Occupancy, Occupant
from inventory.pages.common import MIB_PER_GIB, badge_colour
from inventory.usability import Reason, Unusable, why_unusable


class Status(StrEnum):
    """Where a GPU stands right now, for the summary bar and the row colour: free is exactly
    "usable now (``usability.why_unusable``) and held by no job"."""

    FREE = "free"
    BUSY = "busy"
    DRAINING = "draining"
    MIG = "mig"  # in MIG mode: not free as a whole GPU
    DEGRADED = "degraded"
    OFFLINE = "offline"


# The page's status of an unusable GPU, by reason (work on it, if any, makes it busy first).
_STATUS_OF = {
    Reason.OFFLINE: Status.OFFLINE,
    Reason.UNREACHABLE: Status.OFFLINE,
    Reason.MISSING: Status.DEGRADED,
    Reason.ERROR: Status.DEGRADED,
    Reason.DRAINING: Status.DRAINING,
    Reason.MIG: Status.MIG,
    Reason.FOREIGN_PROCESS: Status.BUSY,
}


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


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
        count = _number(self.sample.get("processes")) if self.sample else None
        return None if count is None else int(count)

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
            sample=self.sample,
            allocated=self.occupant is not None,
        )

    @property
    def status(self) -> Status:
        """Offline or degraded when ``unusable`` says so; else busy while a job holds it or a
        process runs; else draining, MIG or free as ``unusable`` says."""
        why = self.unusable
        status = Status.FREE if why is None else _STATUS_OF[why.code]
        if status in (Status.FREE, Status.DRAINING, Status.MIG) and (
            self.processes or self.occupant
        ):
            return Status.BUSY
        return status

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


@dataclasses.dataclass
class Summary:
    """How many GPUs have each status, counted on first use (the seed's device list never
    asks, so it never reads the GPUs' occupants)."""

    rows: list[GpuRow]

    @property
    def total(self) -> int:
        return len(self.rows)

    @functools.cached_property
    def counts(self) -> dict[Status, int]:
        counted = Counter(row.status for row in self.rows)
        return {status: counted[status] for status in Status}


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
    return result, Summary([row for node in result for row in node.gpus])


def nodes_in_view(gpus: QuerySet[Gpu], *, filtered: bool) -> QuerySet[Node]:
    """The dashboard's nodes, each with its GPUs in view (``gpus``: what the GPU FilterSet
    kept) prefetched, missing GPUs last, and ``has_mig`` (a present MIG-capable GPU, so a MIG
    page worth a link); with ``filtered``, only the nodes that keep a GPU. Two queries."""
    nodes = Node.objects.annotate(
        has_mig=Exists(Gpu.objects.present().filter(node=OuterRef("pk"), mig_capable=True))
    )
    if filtered:
        nodes = nodes.filter(Exists(gpus.filter(node=OuterRef("pk"))))
    shown = gpus.select_related("pool").annotate(mig_count=Count("mig_instances"))
    return nodes.prefetch_related(
        Prefetch("gpus", queryset=shown.order_by(F("missing_since").asc(nulls_first=True), "index"))
    )
