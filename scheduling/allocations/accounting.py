"""Accounting: GPU-hours per user, project and pool, allocated against used.

``roll_up(day)`` writes one ``UsageDay`` row per (pool, user, project) that held GPUs that day,
from the allocations overlapping the day and the GPUs' one-minute telemetry rollups
(``health_gpurollup``): allocated GPU-seconds (an MPS share and a MIG device count as their
fraction of a GPU, ``gpu_share``), used GPU-seconds (weighted by the GPU's utilization),
idle-held GPU-seconds (minutes under the idle-held alert rule's utilization threshold), MIG
slice-seconds and energy (NVML's energy counter, as the rollups' per-minute deltas), and the
CPU time of the jobs that ended that day (their runs', read from their cgroups, counted whole
on the day it ended as sacct's TotalCPU is). A day is
recomputed whole each time (idempotent); beat recomputes today and yesterday
(``scheduling.account_usage``).

MIG devices report no utilization and no energy of their own, so their used and idle time and
energy are not counted (the page says so); an MPS share is credited its fraction of the GPU's.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import date, datetime, time, timedelta
from typing import Any, Literal

from django.db import connection, transaction
from django.db.models import F, QuerySet, Sum
from django.utils import timezone

from gpuadmin import dates
from gpuadmin.refusals import FieldRefusal
from gpuadmin.spreadsheets import inert
from health.choices import RuleKind
from health.models import AlertRule
from inventory.nvml.mig_catalog import compute_share, table_for_gpu
from scheduling.models import AllocationKind, Job, UsageDay

Group = Literal["user", "project", "pool"]
GROUPS: tuple[Group, ...] = ("user", "project", "pool")
# Used when no idle-held rule is configured: the shipped rule's threshold.
DEFAULT_IDLE_UTILIZATION_PCT = 5.0
SECONDS_PER_MINUTE = 60  # one telemetry rollup row covers one minute


def gpu_share(kind: str, gpu_name: str, mig_profile: str | None, mps_percent: int | None) -> float:
    """How much of a GPU one allocation holds: 1 for a whole GPU, the MPS share's percent, or
    the MIG device's compute slices out of the GPU's (``mig_catalog.compute_share``)."""
    if kind == AllocationKind.MPS:
        return (mps_percent or 0) / 100
    if kind == AllocationKind.MIG and mig_profile:
        return compute_share(mig_profile, gpu_name) or 1.0
    return 1.0


def idle_utilization_pct() -> float:
    """The idle-held alert rule's utilization threshold (the one definition of "idle")."""
    rule = AlertRule.objects.filter(kind=RuleKind.IDLE_HELD, enabled=True).order_by("pk").first()
    if rule is None or rule.threshold is None:
        return DEFAULT_IDLE_UTILIZATION_PCT
    return rule.threshold


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = timezone.make_aware(datetime.combine(day, time.min))
    return start, timezone.make_aware(datetime.combine(day + timedelta(days=1), time.min))


# Per allocation overlapping [start, end): its seconds inside, and from the GPU's rollups in
# that span its utilization-weighted seconds, idle minutes and energy (whole GPUs and MPS only).
ALLOCATION_SPANS_SQL = """
    SELECT a.kind, a.mps_percent, mi.profile_name, g.name, j.owner_id, j.project, j.pool_id,
           EXTRACT(EPOCH FROM LEAST(COALESCE(a.released_at, %(now)s), %(end)s)
                              - GREATEST(a.allocated_at, %(start)s)) AS seconds,
           r.used_s, r.idle_s, r.energy_mj
    FROM scheduling_allocation a
    JOIN scheduling_job j ON j.id = a.job_id
    JOIN inventory_gpu g ON g.id = a.gpu_id
    LEFT JOIN inventory_miginstance mi ON mi.id = a.mig_instance_id
    LEFT JOIN LATERAL (
        SELECT SUM(COALESCE(ru.utilization_avg, 0) / 100.0) * %(minute)s AS used_s,
               COUNT(*) FILTER (WHERE ru.utilization_avg < %(idle)s) * %(minute)s AS idle_s,
               SUM(ru.energy_mj) AS energy_mj
        FROM health_gpurollup ru
        WHERE ru.gpu_id = a.gpu_id
          AND ru.minute >= GREATEST(a.allocated_at, %(start)s)
          AND ru.minute < LEAST(COALESCE(a.released_at, %(now)s), %(end)s)
    ) r ON a.kind <> 'mig'
    WHERE a.allocated_at < %(end)s AND COALESCE(a.released_at, %(now)s) > %(start)s
"""


def roll_up(day: date, now: datetime | None = None) -> int:
    """Recompute ``day``'s ``UsageDay`` rows (three statements and a bulk insert); their count."""
    now = now or timezone.now()
    start, end = day_bounds(day)
    until = min(end, now)
    params: dict[str, datetime | float] = {
        "start": start,
        "end": until,
        "now": now,
        "idle": idle_utilization_pct(),
        "minute": SECONDS_PER_MINUTE,
    }
    totals: dict[tuple[int | None, int, str], UsageDay] = {}
    with connection.cursor() as cursor:
        cursor.execute(ALLOCATION_SPANS_SQL, params)
        spans = cursor.fetchall()
    for span in spans:
        kind, mps_percent, profile, gpu_name, user_id, project, pool_id, seconds = span[:8]
        used_s, idle_s, energy_mj = span[8:]
        seconds = max(float(seconds), 0.0)
        share = gpu_share(kind, gpu_name, profile, mps_percent)
        row = totals.get((pool_id, user_id, project))
        if row is None:
            row = totals[pool_id, user_id, project] = UsageDay(
                day=day, pool_id=pool_id, user_id=user_id, project=project
            )
        row.allocated_gpu_s += seconds * share
        if kind == AllocationKind.MIG:
            table = table_for_gpu(gpu_name)
            slices = round(share * table.compute_slices) if table is not None else 1
            row.mig_slice_s += seconds * slices
            continue
        if kind == AllocationKind.MPS:
            row.mps_gpu_s += seconds * share
        row.used_gpu_s += float(used_s or 0) * share
        row.idle_held_gpu_s += float(idle_s or 0) * share
        row.energy_j += float(energy_mj or 0) / 1000 * share
    ended = (
        Job.objects.filter(finished_at__gte=start, finished_at__lt=until)
        .exclude(cpu_seconds=None)
        .values_list("pool_id", "owner_id", "project")
        .annotate(cpu_s=Sum("cpu_seconds"))
        .order_by()
    )
    for pool_id, user_id, project, cpu_s in ended:
        row = totals.get((pool_id, user_id, project))
        if row is None:
            row = totals[pool_id, user_id, project] = UsageDay(
                day=day, pool_id=pool_id, user_id=user_id, project=project
            )
        row.cpu_s = cpu_s
    with transaction.atomic():
        UsageDay.objects.filter(day=day).delete()
        UsageDay.objects.bulk_create(totals.values())
    return len(totals)


def roll_up_recent(now: datetime | None = None) -> int:
    """Today's rows and yesterday's (allocations that ended after midnight change both)."""
    now = now or timezone.now()
    today = timezone.localdate(now)
    return roll_up(today - timedelta(days=1), now) + roll_up(today, now)


# --------------------------------------------------------------------------- reading


# The longest period one page, CSV or API answer covers.
MAX_PERIOD_DAYS = 366


class PeriodInvalid(FieldRefusal):
    """A period that cannot be read; ``field`` names what to change."""


@dataclass(frozen=True, slots=True)
class Period:
    """The days [start, end] and how their use is grouped."""

    start: date
    end: date
    group: Group


def period(
    start: date | None = None, end: date | None = None, group: Group | None = None
) -> Period:
    """The period asked for: by default this month so far, per user (the page's, the CSV's
    and the API's rule); ``PeriodInvalid`` when it runs backwards, is too long or lies
    outside ``gpuadmin.dates``' range."""
    end = end or timezone.localdate()
    start = start or end.replace(day=1)
    for name, day in (("end", end), ("start", start)):  # the end decides the default start
        if not dates.in_range(day):
            raise PeriodInvalid(name, dates.OUT_OF_RANGE)
    if start > end:
        raise PeriodInvalid("start", "must not be after the end")
    if (end - start).days >= MAX_PERIOD_DAYS:
        raise PeriodInvalid("start", f"a period of at most {MAX_PERIOD_DAYS} days")
    return Period(start, end, group or "user")


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One user's, project's or pool's use over a period, in hours (energy in kWh)."""

    name: str
    allocated_h: float
    used_h: float
    idle_held_h: float
    mig_slice_h: float
    mps_gpu_h: float
    energy_kwh: float
    cpu_h: float

    @classmethod
    def of(cls, name: str, seconds: Mapping[str, Any]) -> UsageRow:
        """From a ``UsageDay``'s fields or their sums (GPU-seconds, joules)."""
        return cls(
            name=name,
            allocated_h=seconds["allocated_gpu_s"] / 3600,
            used_h=seconds["used_gpu_s"] / 3600,
            idle_held_h=seconds["idle_held_gpu_s"] / 3600,
            mig_slice_h=seconds["mig_slice_s"] / 3600,
            mps_gpu_h=seconds["mps_gpu_s"] / 3600,
            energy_kwh=seconds["energy_j"] / 3.6e6,
            cpu_h=seconds["cpu_s"] / 3600,
        )

    @property
    def used_share(self) -> float | None:
        """Used over allocated (None when nothing was allocated)."""
        return self.used_h / self.allocated_h if self.allocated_h else None


SUMMED = ("allocated_gpu_s", "used_gpu_s", "idle_held_gpu_s", "mig_slice_s", "mps_gpu_s")
GROUP_FIELD = {"user": "user__username", "project": "project", "pool": "pool__name"}
NO_NAME = {"user": "", "project": "(no project)", "pool": "(no pool)"}


def _period(start: date, end: date) -> QuerySet[UsageDay]:
    return UsageDay.objects.filter(day__gte=start, day__lte=end)


def usage(start: date, end: date, group: Group) -> list[UsageRow]:
    """Per user, project or pool over the days [start, end], most allocated first (one query)."""
    rows = (
        _period(start, end)
        .values(name=F(GROUP_FIELD[group]))
        .annotate(**{name: Sum(name) for name in (*SUMMED, "energy_j", "cpu_s")})
        .order_by("-allocated_gpu_s", "name")
    )
    return [UsageRow.of(row["name"] or NO_NAME[group], row) for row in rows]


@dataclass(frozen=True, slots=True)
class DayTotal:
    day: date
    allocated_h: float
    used_h: float


def daily(start: date, end: date) -> list[DayTotal]:
    """Allocated and used GPU-hours per day over [start, end], every day listed (one query)."""
    found = {
        row["day"]: row
        for row in _period(start, end)
        .values("day")
        .annotate(allocated=Sum("allocated_gpu_s"), used=Sum("used_gpu_s"))
        .order_by("day")
    }
    days = (start + timedelta(days=n) for n in range((end - start).days + 1))
    return [
        DayTotal(
            day,
            (found[day]["allocated"] if day in found else 0) / 3600,
            (found[day]["used"] if day in found else 0) / 3600,
        )
        for day in days
    ]


CSV_HEADER = (
    "day",
    "pool",
    "user",
    "project",
    "allocated_gpu_hours",
    "used_gpu_hours",
    "idle_held_gpu_hours",
    "mig_slice_hours",
    "mps_gpu_hours",
    "energy_kwh",
    "cpu_hours",
)


def csv_text(start: date, end: date) -> str:
    """Every ``UsageDay`` row of the period as CSV (hours, kWh), one row per day and holder;
    names a spreadsheet would run as a formula quoted (``gpuadmin.spreadsheets``)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_HEADER)
    rows = (
        _period(start, end)
        .select_related("pool", "user")
        .order_by("day", "pool__name", "user__username", "project")
    )
    for row in rows:
        writer.writerow(
            (
                row.day.isoformat(),
                inert(row.pool.name) if row.pool else "",
                inert(row.user.get_username()),
                inert(row.project),
                *(f"{getattr(row, name) / 3600:.4f}" for name in SUMMED),
                f"{row.energy_j / 3.6e6:.4f}",
                f"{row.cpu_s / 3600:.4f}",
            )
        )
    return out.getvalue()


def totals(rows: Iterable[UsageRow]) -> UsageRow:
    """The sum of ``rows`` (the table's last line)."""
    sums: dict[str, float] = defaultdict(float)
    for row in rows:
        for field in fields(UsageRow)[1:]:
            sums[field.name] += getattr(row, field.name)
    return UsageRow(name="Total", **{f.name: sums[f.name] for f in fields(UsageRow)[1:]})
