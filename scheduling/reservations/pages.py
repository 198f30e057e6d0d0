"""What the reservation pages show, apart from HTTP: the rows of the reservations list (with
what the viewer may do to each), and a week calendar of GPUs.

The calendar is a table of one-hour slots (7 days x 24 columns) with a row per GPU for its
reservations and one for the jobs on it now, up to their expected end: a bar is a cell
spanning its slots (``colspan``), so it needs no inline style (the CSP allows none).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta

from django.contrib.auth.models import User
from django.db.models import Prefetch, QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from gpuadmin import dates
from gpuadmin.access.services import can_act_on, is_admin
from inventory.models import Gpu
from scheduling.models import Allocation, Reservation, ReservationGpu, expected_end
from scheduling.models import ReservationState as S
from scheduling.placement.text import indexes_phrase
from scheduling.reservations.services import held_in, window_text

SLOT = timedelta(hours=1)
SLOTS_PER_DAY = 24
# A bar of fewer slots is too narrow for its label at any screen width: it shows its short
# label in a chip that may reach past its hours (its full text is the chip's tooltip).
COMPACT_SLOTS = 6
DAYS = 7
LIST_LIMIT = 200

STATE_COLOURS: dict[str, str] = {
    S.REQUESTED: "amber",
    S.APPROVED: "blue",
    S.REJECTED: "red",
    S.CANCELED: "grey",
    S.RELEASED: "grey",
    S.ENDED: "green",
}


# --------------------------------------------------------------------------- the list


@dataclass(frozen=True)
class Row:
    """A reservation as the list shows it, with the actions the viewer may take."""

    reservation: Reservation
    colour: str
    gpus: list[tuple[str, str]]  # (node, "GPUs 0-3") of the GPUs it holds
    can_cancel: bool
    can_release: bool
    can_decide: bool


def with_details(reservations: QuerySet[Reservation]) -> QuerySet[Reservation]:
    holds = ReservationGpu.objects.select_related("gpu__node").order_by(
        "gpu__node__hostname", "gpu__index"
    )
    return reservations.select_related("owner", "pool", "node", "decided_by").prefetch_related(
        Prefetch("holds", queryset=holds)
    )


def rows(reservations: Iterable[Reservation], user: User, now: datetime) -> list[Row]:
    admin = is_admin(user)
    found = []
    for reservation in reservations:
        by_node: dict[str, list[int]] = defaultdict(list)
        for hold in reservation.holds.all():
            by_node[hold.gpu.node.hostname].append(hold.gpu.index)
        acts = can_act_on(user, reservation)
        requested = reservation.state == S.REQUESTED
        approved = reservation.state == S.APPROVED
        found.append(
            Row(
                reservation=reservation,
                colour=STATE_COLOURS.get(reservation.state, "grey"),
                gpus=[(host, indexes_phrase(indexes)) for host, indexes in by_node.items()],
                can_cancel=acts and (requested or (approved and reservation.start > now)),
                can_release=acts and approved and reservation.start <= now < reservation.end,
                can_decide=admin and requested,
            )
        )
    return found


# --------------------------------------------------------------------------- the calendar


@dataclass(frozen=True)
class Bar:
    """Something on one GPU from ``start`` to ``end``."""

    start: datetime
    end: datetime
    kind: str  # CSS: reserved, mine, released, job, job-open
    label: str
    title: str
    url: str = ""
    short_label: str = ""  # a short bar's label (its owner); the label when empty


@dataclass(frozen=True)
class Cell:
    """A run of ``span`` slots of one lane: a bar, or free time (``kind`` "free")."""

    span: int
    kind: str = "free"
    label: str = ""
    title: str = ""
    url: str = ""
    short_label: str = ""

    @property
    def compact(self) -> bool:
        """Whether it is a bar too short for its label (``COMPACT_SLOTS``)."""
        return self.kind != "free" and self.span < COMPACT_SLOTS

    @property
    def text(self) -> str:
        """What its chip reads: the short label of a compact bar, else the label."""
        return (self.short_label or self.label) if self.compact else self.label


def wall(moment: datetime) -> datetime:
    """``moment`` as the site's clock reads it (naive): the calendar's slots are clock hours,
    so that a day the clock changes keeps its 24 columns and every later bar its hour."""
    return timezone.localtime(moment).replace(tzinfo=None)


def lane(bars: Iterable[Bar], start: datetime, slots: int) -> list[Cell]:
    """The cells of ``slots`` slots from ``start``, by the clock (``wall``): each bar over the
    slots it touches (at least one), free runs between them. A bar that starts inside an
    earlier one starts after it (a GPU's MPS shares overlap); one left without a slot is
    dropped."""
    cells: list[Cell] = []
    at = 0
    origin = wall(start)
    for bar in sorted(bars, key=lambda bar: (bar.start, bar.end)):
        first = max(math.floor((wall(bar.start) - origin) / SLOT), at, 0)
        last = min(max(math.ceil((wall(bar.end) - origin) / SLOT), first + 1), slots)
        if first >= last:
            continue
        if first > at:
            cells.append(Cell(first - at))
        cells.append(Cell(last - first, bar.kind, bar.label, bar.title, bar.url, bar.short_label))
        at = last
    if at < slots:
        cells.append(Cell(slots - at))
    return cells


@dataclass(frozen=True)
class GpuLane:
    gpu: Gpu
    url: str
    reserved: list[Cell]
    jobs: list[Cell]


@dataclass(frozen=True)
class Day:
    day: date
    today: bool


@dataclass(frozen=True)
class Week:
    start: datetime
    days: list[Day]
    lanes: list[GpuLane]
    previous: date
    next: date
    pending: list[Reservation] = field(default_factory=list)
    slots: range = range(DAYS * SLOTS_PER_DAY)

    @property
    def end(self) -> datetime:
        return week_start(timezone.localdate(self.start) + timedelta(days=DAYS))


def week_start(day: date) -> datetime:
    """Midnight (the site's time zone) of the Monday of ``day``'s week."""
    monday = day - timedelta(days=day.weekday())
    return timezone.make_aware(datetime.combine(monday, time()))


def parse_day(value: str | None, now: datetime) -> date:
    """``?week=2025-03-04`` (any day of the week in ``gpuadmin.dates``' range), else today."""
    today = timezone.localdate(now)
    try:
        day = date.fromisoformat(value) if value else today
    except ValueError:
        return today
    return day if dates.in_range(day) else today


def week(gpus: Sequence[Gpu], day: date, user: User, now: datetime) -> Week:
    """The week of ``day`` for ``gpus`` (nodes loaded): their reservations that overlap it
    and the jobs on them now (two queries), and the requests waiting for an admin that ask
    for these GPUs' node."""
    start = week_start(day)
    end = week_start(timezone.localdate(start) + timedelta(days=DAYS))  # 167-169 hours later
    slots = DAYS * SLOTS_PER_DAY
    reserved: dict[int, list[Bar]] = defaultdict(list)
    holds = (
        held_in(start, end)
        .filter(gpu__in=gpus)
        .select_related("reservation__owner")
        .order_by("during")
    )
    list_url = reverse("reservations:list")
    for hold in holds:
        reservation = hold.reservation
        owner = reservation.owner.get_username()
        kind = "mine" if reservation.owner_id == user.pk else "reserved"
        if reservation.state == S.RELEASED:
            kind = "released"
        query = urlencode({"owner": owner, "since": reservation.start.isoformat()})
        reserved[hold.gpu_id].append(
            Bar(
                start=hold.during.lower,
                end=hold.during.upper,
                kind=kind,
                label=f"#{reservation.pk} {owner}",
                title=f"Reservation {reservation.pk} of {owner} ({reservation.state}): "
                f"{window_text(reservation.start, reservation.end)}",
                url=f"{list_url}?{query}#reservation-{reservation.pk}",
                short_label=owner,
            )
        )
    jobs: dict[int, list[Bar]] = defaultdict(list)
    allocations = (
        Allocation.objects.active().filter(gpu__in=gpus).select_related("job__owner").order_by("pk")
    )
    for allocation in allocations:
        job = allocation.job
        began = job.started_at or allocation.allocated_at
        job = allocation.job
        ends = expected_end(
            job.started_at or allocation.allocated_at, job.estimated_duration_s, job.max_runtime_s
        )
        owner = job.owner.get_username()
        jobs[allocation.gpu_id].append(
            Bar(
                start=began,
                end=max(ends, now) if ends else end,
                kind="job" if ends else "job-open",
                label=f"job {job.pk} {owner}",
                title=f"Job {job.pk} of {owner} since {began:%Y-%m-%d %H:%M}, "
                + (f"expected to end {ends:%Y-%m-%d %H:%M}" if ends else "no end estimate"),
                url=reverse("scheduling:job-detail", args=[job.pk]),
                short_label=owner,
            )
        )
    lanes = [
        GpuLane(
            gpu=gpu,
            url=reverse("reservations:gpu-calendar", args=[gpu.uuid]) + f"?week={day}",
            reserved=lane(reserved[gpu.pk], start, slots),
            jobs=lane(jobs[gpu.pk], start, slots),
        )
        for gpu in gpus
    ]
    nodes = {gpu.node_id for gpu in gpus}
    pending = list(
        Reservation.objects.filter(state=S.REQUESTED, node__in=nodes, start__lt=end, end__gt=start)
        .select_related("owner")
        .order_by("start", "pk")
    )
    today = timezone.localdate(now)
    return Week(
        start=start,
        days=[Day(d, d == today) for d in (start.date() + timedelta(days=i) for i in range(DAYS))],
        lanes=lanes,
        previous=start.date() - timedelta(days=DAYS),
        next=start.date() + timedelta(days=DAYS),
        pending=pending,
    )
