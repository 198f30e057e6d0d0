"""Quotas and the placement loop's policy inputs: each pool's policy, each quota with what its
holder uses now, and fair-share usage (decayed GPU-seconds), each read from the allocations in
one statement, whatever the history (and one more per ``registry.gpu_use`` answer: each
"query" count below is with the Ray integration's one).

A user holds ``("user", "<id>")`` and a project ``("project", "<name>")``, as in
``placement.QuotaLimit``. What counts against a quota and how usage decays:
docs/users/policies.md, "Quotas" and "Fair share". Besides the allocations, the GPUs that the
apps above report through ``gpuadmin.registry.gpu_use`` (jobs on external Ray clusters) count
the same way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils import timezone

from gpuadmin import registry
from gpuadmin.access.models import Role
from gpuadmin.access.services import role_of
from gpuadmin.audit.services import changed_values, record
from gpuadmin.refusals import FieldRefusal
from gpuadmin.text import unstorable
from inventory.models import Pool
from scheduling import placement
from scheduling.allocations.accounting import gpu_share
from scheduling.loop import dispatch
from scheduling.models import (
    Job,
    PolicyName,
    PoolPolicy,
    Quota,
    QuotaPeriod,
    Reservation,
    ReservationState,
)
from scheduling.placement import fairshare
from scheduling.placement.quotas import QuotaBook

HolderKind = Literal["user", "project"]
Holder = tuple[HolderKind, str]
UsageKey = tuple[str | None, tuple[str, str]]  # (pool, holder), as the engine keys usage

# Names the GPUs in no pool in URLs, where a pool's name goes (no pool name: not a slug).
NO_POOL = "~"
# Usage older than this many half-lives is left out of fair share (2^-10: under 0.1 %).
FAIRSHARE_HORIZON_HALF_LIVES = 10
PERIOD_WORDS: dict[str, str] = {
    QuotaPeriod.DAY: "today",
    QuotaPeriod.WEEK: "this week",
    QuotaPeriod.MONTH: "this month",
}
# What a quota may say (the API's and the admin's bounds; the database takes any non-negative).
QUOTA_LIMITS: dict[str, tuple[int, int]] = {
    "max_gpus": (0, 100_000),
    "gpu_hours": (0, 100_000_000),
    "fairshare_weight": (1, 1_000_000),
}
QUOTA_FIELDS = ("max_gpus", "gpu_hours", "period", "fairshare_weight")
PROJECT_CHARS = 100  # Quota.project's and Job.project's max_length


class QuotaInvalid(FieldRefusal):
    """A quota that cannot be saved, naming the field and why."""


# --------------------------------------------------------------------------- policies


def policy_of(pool: Pool | None) -> PoolPolicy:
    """The pool's policy row, or its defaults where it has none (nothing is written)."""
    return PoolPolicy.objects.filter(pool=pool).first() or PoolPolicy(pool=pool)


def config_of(row: PoolPolicy) -> placement.PoolConfig:
    """A policy row as the engine reads it (no LAS thresholds: the engine's defaults)."""
    thresholds = tuple(float(t) for t in row.las_thresholds_gpu_s)
    config = placement.PoolConfig(
        policy=row.policy,  # type: ignore[arg-type]  # PolicyName's values are PolicyName's
        backfill=row.backfill,
        aging_interval_s=float(row.aging_interval_s),
        fairshare_half_life_s=float(row.fairshare_half_life_s),
        fairshare_weight=float(row.fairshare_weight),
        allow_borrowing=row.allow_borrowing,
        preemption=row.preemption,
        preempt_exempt_s=float(row.preempt_exempt_s),
        las_min_run_s=float(row.las_min_run_s),
        dynamic_mig=row.dynamic_mig,
        qssf_points_per_halving=float(row.qssf_points_per_halving),
        prediction_trust_intervals=float(row.prediction_trust_intervals),
    )
    return replace(config, las_thresholds_gpu_s=thresholds) if thresholds else config


def every_policy() -> list[PoolPolicy]:
    """The policy of the GPUs in no pool, then each pool's by name (defaults where a pool has
    no row; two queries)."""
    rows = {row.pool_id: row for row in PoolPolicy.objects.select_related("pool")}
    pools = [None, *Pool.objects.order_by("name")]
    return [rows.get(pool.pk if pool else None) or PoolPolicy(pool=pool) for pool in pools]


def pool_named(key: str) -> Pool | None:
    """The pool a URL names (``NO_POOL``: None); ``Http404`` otherwise, which pages and the
    API (DRF's handler) both answer as a 404."""
    if key == NO_POOL:
        return None
    pool = Pool.objects.filter(name=key).first()
    if pool is None:
        raise Http404(f"No pool {key}.")
    return pool


def pool_key(pool: Pool | None) -> str:
    """What names ``pool`` in a URL."""
    return pool.name if pool is not None else NO_POOL


def pool_configs() -> dict[str | None, placement.PoolConfig]:
    """Every policy row by pool name (None: the GPUs in no pool); one query. A pool without a
    row is left out: the engine gives it ``PoolConfig()``, the same defaults."""
    rows = PoolPolicy.objects.select_related("pool")
    return {row.pool.name if row.pool else None: config_of(row) for row in rows}


# --------------------------------------------------------------------------- periods


def period_starts(now: datetime) -> dict[str, datetime]:
    """When the current day, week (Monday) and month began, at local midnight."""
    midnight = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    return {
        QuotaPeriod.DAY: midnight,
        # Aware arithmetic in one zone is wall-clock time: Monday's midnight, DST or not.
        QuotaPeriod.WEEK: midnight - timedelta(days=midnight.weekday()),
        QuotaPeriod.MONTH: midnight.replace(day=1),
    }


# --------------------------------------------------------------------------- usage


# Per job pool, owner, project and kind of share: GPUs held now and seconds inside each period
# (allocations active now or released since the earliest period start). Borrowed work counts
# in neither: a quota counts the work it admitted, as the engine's QuotaBook does.
HELD_SQL = """
    SELECT p.name, j.owner_id, j.project, a.kind, a.mps_percent,
           COALESCE(mi.profile_name, NULLIF(j.mig_profile, '')), g.name,
           COUNT(*) FILTER (WHERE a.released_at IS NULL),
           SUM(GREATEST(EXTRACT(EPOCH FROM LEAST(COALESCE(a.released_at, %(now)s), %(now)s)
                                          - GREATEST(a.allocated_at, %(day)s)), 0)),
           SUM(GREATEST(EXTRACT(EPOCH FROM LEAST(COALESCE(a.released_at, %(now)s), %(now)s)
                                          - GREATEST(a.allocated_at, %(week)s)), 0)),
           SUM(GREATEST(EXTRACT(EPOCH FROM LEAST(COALESCE(a.released_at, %(now)s), %(now)s)
                                          - GREATEST(a.allocated_at, %(month)s)), 0))
    FROM scheduling_allocation a
    JOIN scheduling_job j ON j.id = a.job_id
    JOIN inventory_gpu g ON g.id = a.gpu_id
    LEFT JOIN inventory_pool p ON p.id = j.pool_id
    LEFT JOIN inventory_miginstance mi ON mi.id = a.mig_instance_id
    WHERE NOT a.borrowed AND (a.released_at IS NULL OR a.released_at > %(since)s) {holders}
    GROUP BY 1, 2, 3, 4, 5, 6, 7
"""
# Only the allocations of these owners and projects.
HOLDERS_SQL = "AND (j.owner_id = ANY(%(users)s) OR j.project = ANY(%(projects)s))"


@dataclass
class Held:
    """What one holder uses in one pool: GPUs now, GPU-seconds in each period."""

    gpus: float = 0.0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(QuotaPeriod, 0.0))

    def add(self, share: float, gpus: int, seconds: Mapping[str, float]) -> None:
        self.gpus += share * gpus
        for period, value in seconds.items():
            self.seconds[period] += share * value

    def hours(self, period: str) -> float:
        return self.seconds[period] / 3600


def holders_of(owner_id: int, project: str) -> list[Holder]:
    """Whose quotas a job counts against: its owner's, and its project's when it has one."""
    return [("user", str(owner_id)), *((("project", project),) if project else ())]


def external_use(since: datetime, now: datetime) -> list[registry.GpuUse]:
    """The GPUs held outside gpuadmin's allocations at some time in [since, now], as the apps
    above report them (``registry.gpu_use``: the Ray integration's jobs)."""
    return [use for answer in registry.gpu_use.answers for use in answer(since, now)]


def _seconds_since(use: registry.GpuUse, start: datetime, now: datetime) -> float:
    """How long ``use`` held its GPUs between ``start`` and ``now``."""
    end = min(use.end or now, now)
    return max((end - max(use.start, start)).total_seconds(), 0.0)


def _held(now: datetime, holders: Iterable[Holder] | None = None) -> dict[UsageKey, Held]:
    """``Held`` by (pool name, holder): everyone's, or only ``holders``' (one statement, and
    ``external_use``'s)."""
    starts = period_starts(now)
    params: dict[str, Any] = {
        "now": now,
        "since": min(starts.values()),
        **{str(period): start for period, start in starts.items()},
    }
    where = ""
    if holders is not None:
        holders = set(holders)
        where = HOLDERS_SQL
        params["users"] = [int(name) for kind, name in holders if kind == "user"]
        params["projects"] = [name for kind, name in holders if kind == "project"]
    with connection.cursor() as cursor:
        cursor.execute(HELD_SQL.format(holders=where), params)
        rows = cursor.fetchall()
    held: dict[UsageKey, Held] = defaultdict(Held)
    for pool, owner_id, project, kind, mps_percent, profile, gpu_name, gpus, *seconds in rows:
        share = gpu_share(kind, gpu_name, profile, mps_percent)
        spans = dict(zip(starts, map(float, seconds), strict=True))
        for holder in holders_of(owner_id, project):
            held[pool, holder].add(share, gpus, spans)
    for use in external_use(params["since"], now):
        spans = {period: _seconds_since(use, start, now) for period, start in starts.items()}
        for holder in holders_of(use.owner_id, use.project):
            if holders is None or holder in holders:
                held[use.pool, holder].add(use.gpus, 1 if use.end is None else 0, spans)
    return held


def holder_of(quota: Quota) -> Holder:
    return ("project", quota.project) if quota.project else ("user", str(quota.user_id))


def _limit(quota: Quota, held: Mapping[UsageKey, Held]) -> placement.QuotaLimit:
    pool = quota.pool.name if quota.pool else None
    use = held.get((pool, holder_of(quota))) or Held()
    return placement.QuotaLimit(
        pool=pool,
        holder=holder_of(quota),
        max_gpus=None if quota.max_gpus is None else float(quota.max_gpus),
        gpu_hours=None if quota.gpu_hours is None else float(quota.gpu_hours),
        gpus_in_use=use.gpus,
        gpu_hours_used=use.hours(quota.period),
        name=quota.user.get_username() if quota.user else quota.project,
        period=quota.period,  # type: ignore[arg-type]  # QuotaPeriod's values are the Literal's
        fairshare_weight=float(quota.fairshare_weight),
    )


def quota_limits(now: datetime) -> tuple[placement.QuotaLimit, ...]:
    """Every quota with what its holder uses now and this period (three queries)."""
    quotas = list(Quota.objects.select_related("pool", "user"))
    held = _held(now) if quotas else {}
    return tuple(_limit(quota, held) for quota in quotas)


def limits_of(quotas: Iterable[Quota], now: datetime) -> dict[int, placement.QuotaLimit]:
    """These quotas (their pool and user loaded) with their use, by quota id (two queries)."""
    quotas = list(quotas)
    held = _held(now, map(holder_of, quotas)) if quotas else {}
    return {quota.pk: _limit(quota, held) for quota in quotas}


# Decayed GPU-seconds per job pool, owner, project and kind of share: the integral of
# share * 2^(-(now - t) / h) over each allocation's time, in closed form,
# h / ln 2 * (2^(-(now - end) / h) - 2^(-(now - start) / h)), with h the pool's half-life.
# Only allocations that ended within the horizon are read (an index range on released_at).
FAIRSHARE_SQL = """
    WITH life(pool, h) AS (SELECT * FROM unnest(%(pools)s::text[], %(lives)s::float8[])),
    span AS (
        SELECT p.name AS pool, j.owner_id, j.project, a.kind, a.mps_percent,
               COALESCE(mi.profile_name, NULLIF(j.mig_profile, '')) AS profile,
               g.name AS gpu_name, COALESCE(life.h, %(default)s) AS h,
               GREATEST(EXTRACT(EPOCH FROM %(now)s - COALESCE(a.released_at, %(now)s)), 0)
                   AS age_end,
               LEAST(EXTRACT(EPOCH FROM %(now)s - a.allocated_at),
                     %(horizon)s * COALESCE(life.h, %(default)s)) AS age_start
        FROM scheduling_allocation a
        JOIN scheduling_job j ON j.id = a.job_id
        JOIN inventory_gpu g ON g.id = a.gpu_id
        LEFT JOIN inventory_pool p ON p.id = j.pool_id
        LEFT JOIN inventory_miginstance mi ON mi.id = a.mig_instance_id
        LEFT JOIN life ON life.pool IS NOT DISTINCT FROM p.name
        WHERE (a.released_at IS NULL OR a.released_at > %(since)s)
          AND a.allocated_at < %(now)s
    )
    SELECT pool, owner_id, project, kind, mps_percent, profile, gpu_name,
           SUM(h / ln(2) * (power(2::float8, -age_end / h) - power(2::float8, -age_start / h)))
    FROM span
    WHERE age_start > age_end
    GROUP BY 1, 2, 3, 4, 5, 6, 7
"""


def fairshare_usage(
    now: datetime, configs: Mapping[str | None, placement.PoolConfig]
) -> dict[UsageKey, float]:
    """Decayed GPU-seconds by (pool name, holder), with each pool's half-life (two queries:
    the allocations', ``external_use``'s)."""
    default = placement.PoolConfig().fairshare_half_life_s
    lives = [config.fairshare_half_life_s for config in configs.values()]
    longest = max([default, *lives])
    params: dict[str, Any] = {
        "now": now,
        "pools": list(configs),
        "lives": lives,
        "default": default,
        "horizon": FAIRSHARE_HORIZON_HALF_LIVES,
        "since": now - timedelta(seconds=FAIRSHARE_HORIZON_HALF_LIVES * longest),
    }
    with connection.cursor() as cursor:
        cursor.execute(FAIRSHARE_SQL, params)
        rows = cursor.fetchall()
    usage: dict[UsageKey, float] = defaultdict(float)
    for pool, owner_id, project, kind, mps_percent, profile, gpu_name, decayed in rows:
        share = gpu_share(kind, gpu_name, profile, mps_percent)
        for holder in holders_of(owner_id, project):
            usage[pool, holder] += share * float(decayed)
    for use in external_use(params["since"], now):
        config = configs.get(use.pool)
        h = config.fairshare_half_life_s if config is not None else default
        # FAIRSHARE_SQL's integral, for one span.
        age_end = max((now - (use.end or now)).total_seconds(), 0.0)
        age_start = min((now - use.start).total_seconds(), FAIRSHARE_HORIZON_HALF_LIVES * h)
        if age_start <= age_end:
            continue
        decayed = h / math.log(2) * (2 ** (-age_end / h) - 2 ** (-age_start / h))
        for holder in holders_of(use.owner_id, use.project):
            usage[use.pool, holder] += use.gpus * decayed
    return dict(usage)


# --------------------------------------------------------------------------- users


def _number(value: float) -> str:
    """6, 0.43, 112: no trailing zeros, two decimals at most."""
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def pool_label(pool: str | None) -> str:
    """``pool a100``, or ``no pool`` for the GPUs in none."""
    return f"pool {pool}" if pool is not None else "no pool"


@dataclass(frozen=True, slots=True)
class QuotaUse:
    """One quota a user sees, with what its holder uses now and this period."""

    quota_id: int
    limit: placement.QuotaLimit
    mine: bool  # the user's own quota (else one of their projects')

    @property
    def who(self) -> str:
        """``you``, ``project <name>`` or ``user <name>``."""
        return "you" if self.mine else f"{self.limit.holder[0]} {self.limit.name}"

    @property
    def period_words(self) -> str:
        """``today``, ``this week`` or ``this month``."""
        return PERIOD_WORDS[self.limit.period]

    @property
    def hours_share(self) -> float | None:
        """The part of this period's GPU-hours used (None without a GPU-hour limit)."""
        budget = self.limit.gpu_hours
        return None if not budget else self.limit.gpu_hours_used / budget

    @property
    def over(self) -> bool:
        """At or over a limit: new work waits (or borrows idle GPUs where the pool allows)."""
        limit = self.limit
        return (limit.max_gpus is not None and limit.gpus_in_use >= limit.max_gpus) or (
            limit.gpu_hours is not None and limit.gpu_hours_used >= limit.gpu_hours
        )

    @property
    def text(self) -> str:
        """ "you use 6 of 8 GPUs in pool a100; 112 of 500 GPU-hours this month"."""
        limit = self.limit
        verb = "use" if self.mine else "uses"
        gpus = _number(limit.gpus_in_use)
        if limit.max_gpus is not None:
            gpus = f"{gpus} of {_number(limit.max_gpus)}"
        hours = _number(limit.gpu_hours_used)
        if limit.gpu_hours is not None:
            hours = f"{hours} of {_number(limit.gpu_hours)}"
        return (
            f"{self.who} {verb} {gpus} GPUs in {pool_label(limit.pool)}; "
            f"{hours} GPU-hours {self.period_words}"
        )


def own_quotas(user: User) -> QuerySet[Quota]:
    """The quotas of ``user`` and of the projects they have submitted jobs to."""
    projects = Job.objects.filter(owner=user).exclude(project="").values("project")
    return Quota.objects.filter(Q(user=user) | Q(project__in=projects))


def visible_quotas(user: User | AnonymousUser) -> QuerySet[Quota]:
    """Users read their own quotas and their projects'; viewers, operators and admins
    everyone's (the rule of ``queries.visible_jobs``)."""
    rows = Quota.objects.all() if role_of(user) != Role.USER else own_quotas(user)  # type: ignore[arg-type]
    return rows.select_related("pool", "user")


def usage_summary(user: User, now: datetime | None = None) -> list[QuotaUse]:
    """The quotas of ``user`` and of their projects, each with its use (three queries)."""
    quotas = list(own_quotas(user).select_related("pool", "user"))
    limits = limits_of(quotas, now or timezone.now())
    return [QuotaUse(quota.pk, limits[quota.pk], mine=not quota.project) for quota in quotas]


def budgets(viewer: User, now: datetime | None = None) -> list[QuotaUse]:
    """The quotas with GPU-hours per period that ``viewer`` may read (``visible_quotas``),
    each with what its holder used in its current period, the fullest first (three queries)."""
    quotas = list(visible_quotas(viewer).exclude(gpu_hours=None))
    limits = limits_of(quotas, now or timezone.now())
    uses = [
        QuotaUse(quota.pk, limits[quota.pk], mine=quota.user_id == viewer.pk) for quota in quotas
    ]
    return sorted(uses, key=lambda use: -(use.hours_share or 0.0))


def quota_allows(
    user: User,
    project: str,
    pool: Pool | None,
    gpu_count: int,
    start: datetime,
    end: datetime,
    *,
    now: datetime | None = None,
) -> str | None:
    """Whether a booking of ``gpu_count`` GPUs for [start, end) fits the quotas of ``user`` and
    ``project`` in ``pool``: None when it does, else why not (a sentence). Each holder's
    approved reservations count with it, so that bookings split in parts fit as the whole
    would: the most GPUs they hold at once inside the window against the GPUs at once, and
    the GPU-hours they still hold from now against the GPU-hours left this period (four
    queries)."""
    now = now or timezone.now()
    holders = Q(user=user) | (Q(project=project) if project else Q(pk__in=[]))
    quotas = list(Quota.objects.filter(holders, pool=pool).select_related("pool", "user"))
    limits = limits_of(quotas, now)
    booked = list(
        Reservation.objects.filter(
            Q(owner=user) | (Q(project=project) if project else Q(pk__in=[])),
            pool=pool,
            state=ReservationState.APPROVED,
            end__gt=now,
        ).values_list("owner_id", "project", "gpu_count", "start", "end")
    )
    hours = (end - start).total_seconds() / 3600
    for quota in quotas:
        limit = limits[quota.pk]
        who = f"project {quota.project}" if quota.project else f"user {user.get_username()}"
        where = f"in {pool_label(limit.pool)}"
        theirs = [
            row[2:]
            for row in booked
            if (row[1] == quota.project if quota.project else row[0] == quota.user_id)
        ]
        booked_gpus, booked_hours = _booked(theirs, start, end, now)
        if limit.max_gpus is not None and booked_gpus + gpu_count > limit.max_gpus:
            beside = f" beside {booked_gpus} it has reserved then" if booked_gpus else ""
            return (
                f"{who} may use {_number(limit.max_gpus)} GPUs at once {where}; "
                f"this asks for {gpu_count}{beside}"
            )
        asked = gpu_count * hours
        if (
            limit.gpu_hours is not None
            and limit.gpu_hours_used + booked_hours + asked > limit.gpu_hours
        ):
            left = limit.gpu_hours_left or 0.0
            beside = f" beside {_number(booked_hours)} reserved" if booked_hours else ""
            return (
                f"{who} has {_number(left)} of {_number(limit.gpu_hours)} GPU-hours left "
                f"{PERIOD_WORDS[quota.period]} {where}; this needs {_number(asked)}{beside}"
            )
    return None


def quota_refusal(
    user: User, project: str, pool: Pool | None, gpus: float, *, now: datetime | None = None
) -> str | None:
    """Whether work of ``gpus`` whole-GPU equivalents that starts now, for an unknown time,
    fits the quotas of ``user`` and ``project`` in ``pool``: the placement loop's rule
    (``QuotaBook.refusal``) over what they hold now and used this period. None when it fits,
    else why not (a sentence). For work gpuadmin does not place itself (a job on an external
    Ray cluster), decided when it is submitted; the caller holds ``lock_holders`` (three
    queries)."""
    holders = Q(user=user) | (Q(project=project) if project else Q(pk__in=[]))
    quotas = list(Quota.objects.filter(holders, pool=pool).select_related("pool", "user"))
    if not quotas:
        return None
    limits = limits_of(quotas, now or timezone.now())
    book = QuotaBook(limits.values())
    return book.refusal_for(pool.name if pool else None, str(user.pk), project, gpus)


# pg_advisory_xact_lock(class, key): a quota holder's bookings decided one at a time, the
# user's (key: its id), then the project's (key: hashtext of its name), always in that order.
_USER_LOCK, _PROJECT_LOCK = 0x51554F55, 0x51554F50  # "QUOU", "QUOP"


def lock_holders(user: User, project: str) -> None:
    """Until the caller's transaction ends, no other booking of ``user`` or ``project`` is
    weighed against their quotas (``quota_allows``): two at once would each miss the other."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_USER_LOCK, user.pk])
        if project:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_PROJECT_LOCK, project]
            )


def _booked(
    rows: Iterable[tuple[int, datetime, datetime]], start: datetime, end: datetime, now: datetime
) -> tuple[int, float]:
    """Of approved reservations (GPU count, start, end): the most GPUs they hold at once inside
    [start, end), and the GPU-hours they hold from ``now`` on."""
    hours = 0.0
    changes: list[tuple[datetime, int]] = []
    for count, begins, ends in rows:
        hours += count * (ends - max(begins, now)).total_seconds() / 3600
        if begins < end and ends > start:
            changes += [(max(begins, start), count), (min(ends, end), -count)]
    most = held = 0
    for _moment, change in sorted(changes):  # at one moment, what ends before what starts
        held += change
        most = max(most, held)
    return most, hours


# --------------------------------------------------------------------------- quota services


def facts(quota: Quota) -> dict[str, Any]:
    """A quota as its audit rows show it."""
    return {
        "pool": quota.pool.name if quota.pool else None,
        "user": quota.user.get_username() if quota.user else None,
        "project": quota.project,
        **{name: getattr(quota, name) for name in QUOTA_FIELDS},
    }


def check_quota(quota: Quota) -> None:
    """``QuotaInvalid`` naming the first field that cannot be saved."""
    for name, message in quota_problems(quota):
        raise QuotaInvalid(name, message)


def quota_problems(quota: Quota, *, holder_known: bool = True) -> Iterator[tuple[str, str]]:
    """Each (field, message) that keeps ``quota`` from being saved, in ``check_quota``'s
    order: the holder, the period, the weight, the limits, and (when ``holder_known``: its
    pool, user and project are the ones asked for) a second quota of its holder there."""
    if quota.user_id is None and not quota.project:
        yield "user", "give a user or a project"
    if quota.user_id is not None and quota.project:
        yield "project", "give a user or a project, not both"
    if problem := unstorable(quota.project):
        yield "project", problem
    elif len(quota.project) > PROJECT_CHARS:
        yield "project", f"at most {PROJECT_CHARS} characters"
    if quota.period not in QuotaPeriod.values:
        yield "period", f"one of {', '.join(QuotaPeriod.values)}"
    if quota.fairshare_weight is None:
        yield "fairshare_weight", "a number of shares (1 or more)"
    for name, (low, high) in QUOTA_LIMITS.items():
        value = getattr(quota, name)
        if value is None:
            continue  # no limit
        try:
            MinValueValidator(low)(value)
            MaxValueValidator(high)(value)
        except ValidationError as exc:
            yield name, exc.messages[0]
    if not holder_known or unstorable(quota.project):
        return
    taken = Quota.objects.filter(pool=quota.pool, user=quota.user, project=quota.project)
    if taken.exclude(pk=quota.pk).exists():
        yield _holder_field(quota), f"already has a quota {_where(quota)}"


def _holder_field(quota: Quota) -> str:
    return "project" if quota.project else "user"


def _where(quota: Quota) -> str:
    return f"in {pool_label(quota.pool.name if quota.pool else None)}"


def _saved(quota: Quota) -> Quota:
    check_quota(quota)
    try:
        with transaction.atomic():
            quota.save()
    except IntegrityError:  # a concurrent save of the same holder and pool
        raise QuotaInvalid(_holder_field(quota), f"already has a quota {_where(quota)}") from None
    return quota


def create_quota(*, actor: User, **fields: Any) -> Quota:
    """A new quota (``pool``, ``user`` or ``project``, limits), audited ``quota.created``;
    ``QuotaInvalid`` names a field that cannot be saved. The loop is woken."""
    with transaction.atomic():
        quota = _saved(Quota(**fields))
        record("quota.created", actor=actor, target=quota, after=facts(quota))
        transaction.on_commit(dispatch.wake)
    return quota


def update_quota(quota: Quota, *, actor: User, **fields: Any) -> Quota:
    """Change a quota's limits or holder (audited ``quota.changed`` with the fields that
    changed, before and after; nothing written when none did)."""
    with transaction.atomic():
        locked = Quota.objects.select_for_update(of=("self",)).select_related("pool", "user")
        before = facts(locked.get(pk=quota.pk))
        for name, value in fields.items():
            setattr(quota, name, value)
        old, new = changed_values(before, facts(quota))
        if new:
            _saved(quota)
            record("quota.changed", actor=actor, target=quota, before=old, after=new)
            transaction.on_commit(dispatch.wake)
    return quota


def delete_quota(quota: Quota, *, actor: User) -> None:
    """Remove a quota (audited ``quota.deleted`` with what it said); its holder is then
    unlimited there."""
    with transaction.atomic():
        record("quota.deleted", actor=actor, target=quota, before=facts(quota))
        quota.delete()
        transaction.on_commit(dispatch.wake)


# --------------------------------------------------------------------------- the fair-share page


@dataclass(frozen=True, slots=True)
class StandingRow:
    """A user's or project's row on the fair-share page: its name, its standing (the engine's
    ``FairShareTable.standing``) and its position among the pool's holders of its kind."""

    name: str
    standing: fairshare.Standing
    position: int
    mine: bool

    @property
    def usage_gpu_h(self) -> float:
        return self.standing.usage_gpu_s / 3600


@dataclass(frozen=True, slots=True)
class FairShareBoard:
    """One pool's fair share as the engine computes it, and the viewer's place in it."""

    pool: Pool | None
    config: placement.PoolConfig
    users: list[StandingRow]
    projects: list[StandingRow]
    # Why the viewer's jobs get their fair-share points: without a project, and with each of
    # their projects that has a standing in the pool.
    explanations: list[fairshare.FairShareExplanation]

    @property
    def policy_label(self) -> str:
        return str(PolicyName(self.config.policy).label)

    @property
    def mine(self) -> StandingRow | None:
        return next((row for row in self.users if row.mine), None)


def _ranked(
    standings: Iterable[fairshare.Standing], names: Mapping[str, str], mine: set[str]
) -> list[StandingRow]:
    """Highest factor first (the most points), then by name; ``names`` for user ids."""
    named = sorted(
        ((names.get(row.holder[1], row.holder[1]), row) for row in standings),
        key=lambda pair: (-pair[1].factor, pair[0]),
    )
    return [
        StandingRow(name, row, position, row.holder[1] in mine)
        for position, (name, row) in enumerate(named, start=1)
    ]


def fairshare_board(pool: Pool | None, viewer: User, now: datetime | None = None) -> FairShareBoard:
    """Everyone's standing in ``pool`` from the loop's own inputs (``pool_configs``,
    ``fairshare_usage``, the quotas' weights) through the engine's ``FairShareTable``, and the
    viewer's explanation (six queries)."""
    now = now or timezone.now()
    name = pool.name if pool is not None else None
    configs = pool_configs()
    config = configs.get(name) or placement.PoolConfig()
    usage = fairshare_usage(now, configs)
    quotas = Quota.objects.filter(pool=pool).select_related("pool", "user")
    weights = [_limit(quota, {}) for quota in quotas]  # the weights; the use is not read here
    table = fairshare.FairShareTable(name, usage, weights)
    holders = {holder for key, holder in usage if key == name} | {q.holder for q in weights}
    users = [int(holder[1]) for holder in holders if holder[0] == "user"]
    names = {
        str(pk): username
        for pk, username in User.objects.filter(pk__in=users).values_list("pk", "username")
    }
    projects = {holder[1] for holder in holders if holder[0] == "project"}
    mine = set(
        Job.objects.filter(owner=viewer, project__in=projects)
        .order_by()
        .values_list("project", flat=True)
        .distinct()
    )
    me = str(viewer.pk)
    return FairShareBoard(
        pool=pool,
        config=config,
        users=_ranked((table.standing(h) for h in holders if h[0] == "user"), names, {me}),
        projects=_ranked((table.standing(h) for h in holders if h[0] == "project"), {}, mine),
        explanations=[
            table.explain(me, project, weight=config.fairshare_weight)
            for project in ["", *sorted(mine)]
        ],
    )
