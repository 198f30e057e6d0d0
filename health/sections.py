"""The health part of the GPU and node pages (``gpuadmin.registry.page_sections``):
the open quarantine, the health events (XID, ECC, remapped rows, thermal...) newest first with
what the policy did, and a 30-day trend (events per day, XID / memory / other). Three queries."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time, timedelta

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncDate
from django.http import HttpRequest
from django.utils import timezone

from gpuadmin.registry import Section
from health import quarantine, xids
from health.choices import EventKind
from health.models import HealthEvent, Quarantine
from inventory.models import Gpu, Node

ORDER = 30  # after the charts
EVENT_HISTORY = 50
TREND_DAYS = 30
# The trend's categories: XIDs, the memory's own errors, and the rest.
MEMORY_KINDS = frozenset(
    {
        EventKind.ECC_CORRECTED,
        EventKind.ECC_UNCORRECTED,
        EventKind.RETIRED_PAGES,
        EventKind.REMAP_PENDING,
        EventKind.REMAP_FAILURE,
    }
)


@dataclasses.dataclass(frozen=True)
class TrendDay:
    day: date
    xid: int
    memory: int
    other: int

    @property
    def total(self) -> int:
        return self.xid + self.memory + self.other


@dataclasses.dataclass(frozen=True)
class Trend:
    days: list[TrendDay]

    @property
    def peak(self) -> int:
        return max((day.total for day in self.days), default=0)

    @property
    def total(self) -> int:
        return sum(day.total for day in self.days)

    @property
    def xid(self) -> int:
        return sum(day.xid for day in self.days)

    @property
    def memory(self) -> int:
        return sum(day.memory for day in self.days)

    def bars(self) -> list[tuple[TrendDay, int, int, int]]:
        """Each day with its XID, memory and other heights in percent of the peak day."""
        peak = self.peak or 1
        return [
            (day, 100 * day.xid // peak, 100 * day.memory // peak, 100 * day.other // peak)
            for day in self.days
        ]


@dataclasses.dataclass(frozen=True)
class EventRow:
    event: HealthEvent
    xid_info: xids.XidInfo | None

    @property
    def what(self) -> str:
        """``XID 79 (GPU has fallen off the bus)``, ``XID 999``, ``Retired pages``."""
        if self.xid_info is not None:
            return self.xid_info.title
        xid = self.event.xid
        return f"XID {xid}" if xid is not None else self.event.get_kind_display()


def event_trend(events: QuerySet[HealthEvent], today: date, days: int = TREND_DAYS) -> Trend:
    """Events per day (in the current time zone) over the ``days`` up to ``today``, split
    XID / memory / other, in one query."""
    first = today - timedelta(days=days - 1)
    start = timezone.make_aware(datetime.combine(first, time.min))
    counted: dict[date, dict[str, int]] = {}
    rows = (
        events.filter(occurred_at__gte=start)
        .annotate(day=TruncDate("occurred_at", tzinfo=timezone.get_current_timezone()))
        .values_list("day", "kind")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for day, kind, n in rows:
        category = "xid" if kind == EventKind.XID else "memory" if kind in MEMORY_KINDS else "other"
        per_day = counted.setdefault(day, {"xid": 0, "memory": 0, "other": 0})
        per_day[category] += n
    return Trend(
        [
            TrendDay(day, **counted.get(day, {"xid": 0, "memory": 0, "other": 0}))
            for day in (first + timedelta(days=offset) for offset in range(days))
        ]
    )


def event_rows(events: Iterable[HealthEvent]) -> list[EventRow]:
    """Each event with the XID catalog's entry of its XID (``None``: not an XID, or unknown)."""
    return [
        EventRow(event, xids.lookup(event.xid) if event.xid is not None else None)
        for event in events
    ]


def health_section(page: str, obj: Gpu | Node | None, request: HttpRequest) -> Section | None:
    """Answer of ``gpuadmin.registry.page_sections``: the GPU's or the node's health."""
    if page == "gpu" and isinstance(obj, Gpu):
        events = HealthEvent.objects.filter(gpu=obj)
        quarantines: Sequence[Quarantine] = list(
            Quarantine.objects.filter(gpu=obj, closed_at__isnull=True).select_related(
                "cause", "policy"
            )
        )
        for held in quarantines:
            held.gpu = obj  # what it waits for reads the GPU's state
    elif page == "node" and isinstance(obj, Node):
        events = HealthEvent.objects.filter(node=obj)
        quarantines = []  # each GPU's page shows its own
    else:
        return None
    today = timezone.localdate()
    context = {
        "page": page,
        "events": event_rows(events.select_related("gpu", "policy")[:EVENT_HISTORY]),
        "limit": EVENT_HISTORY,
        "trend": event_trend(events, today),
        "trend_days": TREND_DAYS,
        "quarantine": quarantines[0] if quarantines else None,
        "waiting_for": quarantine.waiting_for(quarantines[0]) if quarantines else "",
    }
    return Section("health/partials/health_events.html", context, ORDER)
