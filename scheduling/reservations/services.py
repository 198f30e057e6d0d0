"""Reservations: N GPUs booked for [start, end), from the request to their end; the one place a
reservation changes (each change audited in its transaction).

``sweep`` (beat, ``scheduling.sweep_reservations``) ends, expires and releases them. How a
request is approved, how GPUs are held and what ending one does to its waiting jobs:
docs/users/reservations.md.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NoReturn

from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Min, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone
from psycopg.types.range import Range

from gpuadmin.audit.services import audit_event, record, record_all
from gpuadmin.refusals import FieldRefusal
from gpuadmin.text import unstorable
from health.alerts import open_alert, resolve_alert
from health.choices import AlertState, Severity
from health.models import Alert
from inventory.choices import GpuState, NodeState
from inventory.models import Gpu, Node, Pool
from inventory.querysets import GpuQuerySet, pool_is
from inventory.services import resolve_gpu_model
from scheduling.jobs import control
from scheduling.models import (
    HOLDING_STATES,
    Allocation,
    Job,
    JobState,
    PoolPolicy,
    Reservation,
    ReservationGpu,
)
from scheduling.models import ReservationState as S
from scheduling.placement.text import indexes_phrase, listing, plural
from scheduling.policies import quotas

log = logging.getLogger("gpuadmin.reservations")

ACTOR = "reservations"  # the sweep's changes
# A start a little in the past is "now" (a form filled in a minute ago); longer windows and
# bookings further ahead are typos or hoarding.
START_SLACK = timedelta(minutes=5)
MAX_LENGTH = timedelta(days=31)
MAX_AHEAD = timedelta(days=365)
MAX_GPUS = 4096  # GPUs one reservation books (its count, and GPUs named)
# Approvals that lose a race for a GPU try again with the GPUs still free this many times.
HOLD_ATTEMPTS = 5
UNUSED_ALERT = "reservation-unused:"  # + the reservation's id
REASON_CHARS = 2000  # a rejection's, a cancellation's or a release's reason

TRANSITIONS: dict[str, frozenset[str]] = {
    S.REQUESTED: frozenset({S.APPROVED, S.REJECTED, S.CANCELED}),
    S.APPROVED: frozenset({S.CANCELED, S.RELEASED, S.ENDED}),
}


class ReservationInvalid(FieldRefusal):
    """A request that can never be granted, naming the field and why (a 400)."""


class ReservationConflict(ValueError):
    """The reservation's state does not allow it, or no GPUs are free for its window (a 409);
    nothing was written."""


# --------------------------------------------------------------------------- the GPUs


# The advisory-lock namespace of reservation holds (with a GPU id as the second key).
HOLD_LOCK_NAMESPACE = 0x72657376  # "resv"


def hold_locks(gpu_ids: list[int]) -> None:
    """Take the transaction's per-GPU hold locks, in GPU id order. Two requests inserting
    overlapping holds at once would each wait for the other inside the exclusion constraint's
    check (a deadlock, seen under load, where a unique index would just wait); with the locks
    the second waits for the first's commit and then meets its holds: a clean conflict."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, id) FROM unnest(%s::integer[]) AS id ORDER BY id",
            [HOLD_LOCK_NAMESPACE, sorted(gpu_ids)],
        )


def reservable_gpus(
    pool: Pool | None, gpu_model: str = "", node: Node | None = None
) -> GpuQuerySet:
    """Whole GPUs that could be held for a window: present, neither in MIG mode nor shared by
    MPS, and not out of service (offline, or on an offline node). A draining or fenced GPU
    may be back by the window's start, so it counts."""
    gpus = (
        Gpu.objects.present()
        .filter(
            pool_is() if pool is None else pool_is(pk=pool.pk), mig_enabled=False, mps_shared=False
        )
        .exclude(state=GpuState.OFFLINE)
        .exclude(node__state=NodeState.OFFLINE)
    )
    if gpu_model:
        gpus = gpus.filter(name=gpu_model)
    if node is not None:
        gpus = gpus.filter(node=node)
    return gpus


def where_text(pool: Pool | None, gpu_model: str = "", node: Node | None = None) -> str:
    """``pool research``, ``the GPUs in no pool``, with `` of model X`` and `` on dgx-01``."""
    text = f"pool {pool.name}" if pool is not None else "the GPUs in no pool"
    if gpu_model:
        text += f" of model {gpu_model}"
    if node is not None:
        text += f" on {node.hostname}"
    return text


def moment_text(moment: datetime) -> str:
    """``2025-03-04 09:00`` in the site's time zone."""
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M}"


def window_text(start: datetime, end: datetime) -> str:
    return f"{moment_text(start)} to {moment_text(end)}"


def pick_gpus(free: Sequence[Gpu], count: int) -> list[Gpu]:
    """``count`` of the ``free`` GPUs (nodes loaded), deterministically: on one node when one
    holds them, preferring a node where one NUMA node holds them, then the node with the
    fewest free GPUs (whole nodes stay free for large bookings), then the hostname; else
    across the fewest nodes, largest first. Inside a node: the tightest NUMA node that holds
    them, else the lowest indexes. Fewer than ``count`` free: all of them."""
    by_node: dict[str, list[Gpu]] = defaultdict(list)
    for gpu in sorted(free, key=lambda gpu: (gpu.node.hostname, gpu.index)):
        by_node[gpu.node.hostname].append(gpu)
    fitting = [gpus for gpus in by_node.values() if len(gpus) >= count]
    if fitting:
        best = min(
            fitting,
            key=lambda gpus: (_numa_fit(gpus, count) is None, len(gpus), gpus[0].node.hostname),
        )
        return _numa_fit(best, count) or best[:count]
    chosen: list[Gpu] = []
    for gpus in sorted(by_node.values(), key=lambda gpus: (-len(gpus), gpus[0].node.hostname)):
        chosen += gpus[: count - len(chosen)]
        if len(chosen) == count:
            break
    return chosen


def _numa_fit(gpus: list[Gpu], count: int) -> list[Gpu] | None:
    """The lowest ``count`` GPUs of the NUMA node of ``gpus`` with the fewest that still hold
    ``count``, the lowest GPU index on ties (None when none does, or NUMA nodes are
    unknown)."""
    by_numa: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in gpus:
        if gpu.numa_node is not None:
            by_numa[gpu.numa_node].append(gpu)
    holding = [group for numa, group in sorted(by_numa.items()) if len(group) >= count]
    if not holding:
        return None
    return min(holding, key=lambda group: (len(group), group[0].index))[:count]


def window(start: datetime, end: datetime) -> Range[datetime]:
    """[start, end) as PostgreSQL's ``tstzrange``."""
    return Range(start, end, "[)")


def held_in(start: datetime, end: datetime) -> QuerySet[ReservationGpu]:
    """The holds of any GPU that overlap [start, end)."""
    return ReservationGpu.objects.filter(during__overlap=window(start, end))


def held_at(start: datetime, gpu_ids: Collection[int] | None = None) -> dict[int, str]:
    """The GPUs (of ``gpu_ids``, or all) that running or placed work may still hold at
    ``start``, by the rule the engine applies before placing a job in front of a window: its
    maximum runtime from its start (from now when it has not started), for ever without one.
    Each GPU's id with what holds it (``job 12 until 2025-03-04 09:00``)."""
    allocations = Allocation.objects.active()
    if gpu_ids is not None:
        allocations = allocations.filter(gpu_id__in=list(gpu_ids))
    now = timezone.now()
    held: dict[int, str] = {}
    rows = allocations.values_list("gpu_id", "job_id", "job__started_at", "job__max_runtime_s")
    for gpu_id, job_id, started_at, max_runtime_s in rows:
        if max_runtime_s is None:
            held[gpu_id] = f"job {job_id}, which has no maximum runtime"
            continue
        end = (started_at or now) + timedelta(seconds=max_runtime_s)
        if end > start:
            held[gpu_id] = f"job {job_id} until {moment_text(end)}"
    return held


def choose_gpus(reservation: Reservation) -> list[Gpu]:
    """GPUs free for the reservation's whole window: the ones it names, else ``pick_gpus``
    among the reservable GPUs of its pool, model and node; none held by another reservation
    in the window, nor by work that may still run at its start (``held_at``).
    ``ReservationConflict`` saying what is missing when there are not enough."""
    taken = held_in(reservation.start, reservation.end).values("gpu_id")
    named = list(reservation.requested_gpus.select_related("node").order_by("pk"))
    window = window_text(reservation.start, reservation.end)
    candidates = reservable_gpus(reservation.pool, reservation.gpu_model, reservation.node)
    where = where_text(reservation.pool, reservation.gpu_model, reservation.node)
    if named:
        _check_named(named, taken, candidates, where, window, reservation.start)
        return named
    working = held_at(reservation.start)
    free = list(candidates.exclude(pk__in=taken).exclude(pk__in=working).select_related("node"))
    if len(free) < reservation.gpu_count:
        raise ReservationConflict(
            f"no {plural(reservation.gpu_count, 'free GPU')} in {where} for {window}: "
            f"{len(free)} free"
        )
    return pick_gpus(free, reservation.gpu_count)


def _check_named(
    named: list[Gpu],
    taken: QuerySet[ReservationGpu, Any],
    candidates: GpuQuerySet,
    where: str,
    window: str,
    start: datetime,
) -> None:
    """``ReservationConflict`` naming the GPUs a request named that cannot be held now: no
    longer reservable there (made MIG or MPS, taken offline, moved since the request), held
    by another reservation in the window, or by work that may still run at its start."""
    reservable = set(
        candidates.filter(pk__in=[gpu.pk for gpu in named]).values_list("pk", flat=True)
    )
    gone = [gpu.uuid for gpu in named if gpu.pk not in reservable]
    if gone:
        raise ReservationConflict(f"{listing(gone)} no longer reservable in {where}")
    reserved = set(Gpu.objects.filter(pk__in=taken).values_list("pk", flat=True))
    clashing = [gpu.uuid for gpu in named if gpu.pk in reserved]
    if clashing:
        raise ReservationConflict(
            f"{listing(clashing)} {'is' if len(clashing) == 1 else 'are'} already reserved "
            f"in {window}"
        )
    working = held_at(start, [gpu.pk for gpu in named])
    if working:
        raise ReservationConflict(
            "in use at the start of the window: "
            + "; ".join(f"{gpu.uuid} by {working[gpu.pk]}" for gpu in named if gpu.pk in working)
        )


def _hold(reservation: Reservation) -> list[Gpu]:
    """Hold GPUs for the reservation (inside the caller's transaction): the constraint refuses
    a GPU another reservation took meanwhile, and a GPU given to work meanwhile is seen once
    its row is locked; the GPUs still free are tried again."""
    for _attempt in range(HOLD_ATTEMPTS):
        gpus = choose_gpus(reservation)
        ids = [gpu.pk for gpu in gpus]
        # The GPU rows locked, as a placement's commit locks them: work placed meanwhile is
        # committed and seen here, and a placement after this sees the holds.
        list(Gpu.objects.select_for_update(of=("self",)).filter(pk__in=ids).order_by("pk"))
        if held_at(reservation.start, ids):
            continue  # placed meanwhile: the next choice leaves those GPUs out
        try:
            with transaction.atomic():  # a savepoint: a lost race leaves the caller usable
                hold_locks(ids)
                ReservationGpu.objects.bulk_create(
                    ReservationGpu(
                        reservation=reservation,
                        gpu=gpu,
                        during=window(reservation.start, reservation.end),
                    )
                    for gpu in gpus
                )
        except IntegrityError:
            # The rival's holds are committed now (the constraint waited for them): the next
            # choice sees them, and picks others or says which GPUs are taken.
            continue
        return gpus
    raise ReservationConflict(
        f"the GPUs for {window_text(reservation.start, reservation.end)} were reserved by "
        "others meanwhile; try another window"
    )


# --------------------------------------------------------------------------- requests


def check_text(field: str, value: str) -> None:
    """``ReservationInvalid`` for text PostgreSQL cannot store (NUL, lone surrogates)."""
    if problem := unstorable(value):
        raise ReservationInvalid(field, problem)


def check_reason(reason: str) -> None:
    """A rejection's, a cancellation's or a release's reason: storable, ``REASON_CHARS`` at
    most (``ReservationInvalid`` naming ``reason``; never cut short)."""
    check_text("reason", reason)
    if len(reason) > REASON_CHARS:
        raise ReservationInvalid("reason", f"at most {REASON_CHARS} characters")


def check_window(start: datetime, end: datetime, now: datetime) -> None:
    if end <= start:
        raise ReservationInvalid("end", "must be after the start")
    if start < now - START_SLACK:
        raise ReservationInvalid("start", "is in the past")
    if start > now + MAX_AHEAD:
        raise ReservationInvalid("start", f"at most {MAX_AHEAD.days} days ahead")
    if end - start > MAX_LENGTH:
        raise ReservationInvalid("end", f"a reservation lasts at most {MAX_LENGTH.days} days")


def _facts(reservation: Reservation, gpus: Iterable[Gpu] = ()) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "state": reservation.state,
        "gpu_count": reservation.gpu_count,
        "start": reservation.start,
        "end": reservation.end,
        "pool": reservation.pool.name if reservation.pool else None,
    }
    uuids = [gpu.uuid for gpu in gpus]
    if uuids:
        facts["gpus"] = uuids
    return facts


def _refuse_filter(pool: Pool | None, gpu_model: str, node: Node | None) -> NoReturn:
    """``ReservationInvalid`` naming the filter (``node`` or ``gpu_model``) that leaves no
    reservable GPU, with what there is instead."""
    if node is not None and not reservable_gpus(pool, node=node).exists():
        raise ReservationInvalid(
            "node", f"{node.hostname} has no reservable GPU in {where_text(pool)}"
        )
    models = reservable_gpus(pool, node=node).values_list("name", flat=True).distinct()
    raise ReservationInvalid(
        "gpu_model",
        f"no reservable GPU of model {gpu_model!r} in {where_text(pool, node=node)}; "
        f"there are: {', '.join(sorted(models)) or 'none'}",
    )


def request(
    owner: User,
    gpu_count: int | None,
    start: datetime,
    end: datetime,
    *,
    pool: Pool | None = None,
    gpu_model: str = "",
    node: Node | None = None,
    gpus: Sequence[Gpu] = (),
    project: str = "",
    note: str = "",
) -> Reservation:
    """Book ``gpu_count`` GPUs (of ``gpu_model``, on ``node``, or exactly ``gpus``; None: as
    many as ``gpus`` names, else 1) of ``pool`` for [start, end), audited
    ``reservation.requested``. Approved at once (and audited so)
    when the pool auto-approves and it is within the owner's quota: then ``ReservationConflict``
    when the GPUs are not free, and nothing is written. Otherwise it waits for an admin.
    ``ReservationInvalid`` names the field of a request that can never be granted."""
    now = timezone.now()
    for name, value in (("project", project), ("note", note), ("gpu_model", gpu_model)):
        check_text(name, value)
    gpu_model = resolve_gpu_model(gpu_model, refusal=ReservationInvalid)
    check_window(start, end, now)
    named = sorted(set(gpus), key=lambda gpu: gpu.pk)
    if gpu_count is None:
        gpu_count = len(named) or 1
    if gpu_count < 1:
        raise ReservationInvalid("gpu_count", "at least 1")
    if named and gpu_count != len(named):
        raise ReservationInvalid(
            "gpu_count", f"{plural(len(named), 'GPU')} named, but gpu_count is {gpu_count}"
        )
    candidates = reservable_gpus(pool, gpu_model, node)
    where = where_text(pool, gpu_model, node)
    if named:
        inside = set(
            candidates.filter(pk__in=[gpu.pk for gpu in named]).values_list("pk", flat=True)
        )
        outside = [gpu.uuid for gpu in named if gpu.pk not in inside]
        if outside:
            raise ReservationInvalid("gpus", f"not reservable in {where}: {listing(outside)}")
    else:
        available = candidates.count()
        if not available and (gpu_model or node is not None):
            _refuse_filter(pool, gpu_model, node)
        if gpu_count > available:
            raise ReservationInvalid(
                "gpu_count",
                f"{plural(gpu_count, 'GPU')}, but {where} has {plural(available, 'GPU')}",
            )
    policy = quotas.policy_of(pool)
    with transaction.atomic():
        if policy.reservation_auto_approve:
            # Requests of one holder decided one at a time: each counts the others' holds.
            quotas.lock_holders(owner, project)
            over = quotas.quota_allows(owner, project, pool, gpu_count, start, end)
        else:
            over = f"reservations in {where_text(pool)} need an admin's approval"
        reservation = Reservation.objects.create(
            owner=owner,
            project=project,
            pool=pool,
            gpu_count=gpu_count,
            gpu_model=gpu_model,
            node=node,
            start=start,
            end=end,
            note=note,
            message=f"waiting for an admin: {over}" if over else "",
        )
        if named:
            reservation.requested_gpus.set(named)
        record("reservation.requested", actor=owner, target=reservation, after=_facts(reservation))
        if over is None:
            _approve(reservation, actor=owner, message="approved automatically: within quota")
    log.info("reservation %d requested by %s: %s", reservation.pk, owner, reservation.state)
    return reservation


# --------------------------------------------------------------------------- decisions


def _locked(reservation: Reservation, to: str) -> Reservation:
    """The reservation under its row lock, when it may go to ``to``; ``ReservationConflict``
    otherwise."""
    locked = Reservation.objects.select_for_update().get(pk=reservation.pk)
    if to not in TRANSITIONS.get(locked.state, frozenset()):
        raise ReservationConflict(f"reservation {locked.pk} is {locked.state}: it cannot be {to}")
    return locked


def _approve(
    locked: Reservation, *, actor: User, message: str, decided_by: User | None = None
) -> None:
    gpus = _hold(locked)
    before = {"state": locked.state}
    locked.state = S.APPROVED
    locked.decided_by = decided_by
    locked.message = message
    locked.save(update_fields=["state", "decided_by", "message"])
    record(
        "reservation.approved",
        actor=actor,
        target=locked,
        before=before,
        after=_facts(locked, gpus),
        message=message,
    )


def approve(reservation: Reservation, actor: User) -> Reservation:
    """An admin approves a requested reservation: GPUs are chosen and held for its window.
    ``ReservationConflict`` when it is not requested, its window is over, or the GPUs are not
    free (nothing is written)."""
    with transaction.atomic():
        locked = _locked(reservation, S.APPROVED)
        if locked.end <= timezone.now():
            raise ReservationConflict(f"reservation {locked.pk}'s window is over")
        _approve(
            locked, actor=actor, message=f"approved by {actor.get_username()}", decided_by=actor
        )
    reservation.refresh_from_db()
    return reservation


def _change(
    reservation: Reservation,
    to: str,
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    message: str,
    **fields: Any,
) -> Reservation:
    """Move the locked reservation to ``to`` with ``fields`` and audit ``reservation.<to>``
    (inside the caller's transaction)."""
    before = {"state": reservation.state}
    reservation.state = to
    reservation.message = message
    for name, value in fields.items():
        setattr(reservation, name, value)
    reservation.save(update_fields=["state", "message", *fields])
    record(
        f"reservation.{to}",
        actor=actor,
        actor_name=actor_name,
        target=reservation,
        before=before,
        after={"state": to},
        message=message,
    )
    _cancel_waiting_jobs([reservation.pk], to, actor=actor, actor_name=actor_name)
    return reservation


def _cancel_waiting_jobs(
    ids: Sequence[int], to: str, *, actor: User | None = None, actor_name: str | None = None
) -> list[int]:
    """Reservations ``ids`` just went to ``to``: if that ends them (anything but approved),
    the jobs still waiting to run in them never will, and are canceled (audited, like a
    dependency never satisfied: ``control.cancel_waiting``) with a message such as
    "reservation 12 released: nothing is left of its window to run in". The ids canceled."""
    if to in (S.REQUESTED, S.APPROVED):
        return []
    waiting = Job.objects.filter(
        reservation_id__in=ids, state__in=(JobState.PENDING, JobState.QUEUED)
    ).values_list("pk", "reservation_id")
    messages = {
        pk: f"reservation {reservation} {to}: nothing is left of its window to run in"
        for pk, reservation in waiting
    }
    if not messages:
        return []
    if actor is None and actor_name is None:
        actor_name = ACTOR
    return control.cancel_waiting(messages, actor=actor, actor_name=actor_name)


def reject(reservation: Reservation, actor: User, reason: str = "") -> Reservation:
    """An admin turns a requested reservation down (with ``reason`` as its message)."""
    check_reason(reason)
    with transaction.atomic():
        locked = _locked(reservation, S.REJECTED)
        _change(
            locked,
            S.REJECTED,
            actor=actor,
            message=reason or f"rejected by {actor.get_username()}",
            decided_by=actor,
        )
    reservation.refresh_from_db()
    return reservation


def cancel(reservation: Reservation, actor: User, reason: str = "") -> Reservation:
    """Withdraw a requested reservation, or an approved one before its start (its GPUs are
    free for that window again). One that started is released instead."""
    check_reason(reason)
    with transaction.atomic():
        locked = _locked(reservation, S.CANCELED)
        if locked.state == S.APPROVED and locked.start <= timezone.now():
            raise ReservationConflict(
                f"reservation {locked.pk} started at {moment_text(locked.start)}: release it "
                "instead"
            )
        locked.holds.all().delete()
        _change(
            locked, S.CANCELED, actor=actor, message=reason or f"canceled by {actor.get_username()}"
        )
    reservation.refresh_from_db()
    return reservation


def release(
    reservation: Reservation,
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    reason: str = "",
) -> Reservation:
    """Give a running reservation's GPUs back now: its holds end now, so the window's rest is
    free for others. ``ReservationConflict`` before its start (cancel it) or after its end."""
    check_reason(reason)
    with transaction.atomic():
        locked = _locked(reservation, S.RELEASED)
        now = timezone.now()
        if not locked.start <= now < locked.end:
            raise ReservationConflict(
                f"reservation {locked.pk} is not running now"
                + (": cancel it instead" if now < locked.start else "")
            )
        locked.holds.update(during=window(locked.start, now))
        who = actor.get_username() if actor else actor_name
        _change(
            locked,
            S.RELEASED,
            actor=actor,
            actor_name=actor_name,
            message=reason or f"released by {who}",
            released_at=now,
        )
    reservation.refresh_from_db()
    return reservation


# --------------------------------------------------------------------------- the loop


# --------------------------------------------------------------------------- the sweep


@dataclass
class Sweep:
    """What one ``sweep`` changed: reservation ids."""

    ended: list[int] = field(default_factory=list)
    expired: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    alerts_resolved: int = 0


def sweep(now: datetime | None = None) -> Sweep:
    """End approved reservations whose window is over, reject requested ones nobody decided
    before their end, note when each running one was first used, release the ones no job used
    within their pool's ``reservation_release_after_s`` of their start (each reported by an
    alert that resolves when the window would have ended), all audited."""
    now = now or timezone.now()
    done = Sweep()
    done.ended = _close(S.APPROVED, S.ENDED, now, "its window ended")
    done.expired = _close(S.REQUESTED, S.REJECTED, now, "nobody decided before its window ended")
    _note_first_use(now)
    done.released = _release_unused(now)
    done.alerts_resolved = _resolve_unused_alerts(now)
    return done


def _close(state: str, to: str, now: datetime, message: str) -> list[int]:
    """Every reservation in ``state`` whose end passed goes to ``to``, in one transaction."""
    with transaction.atomic():
        rows = list(
            Reservation.objects.select_for_update(skip_locked=True)
            .filter(state=state, end__lte=now)
            .order_by("pk")
        )
        if not rows:
            return []
        Reservation.objects.filter(pk__in=[row.pk for row in rows]).update(
            state=to, message=message
        )
        record_all(
            [
                audit_event(
                    f"reservation.{to}",
                    actor_name=ACTOR,
                    target=row,
                    before={"state": state},
                    after={"state": to},
                    message=message,
                )
                for row in rows
            ]
        )
        _cancel_waiting_jobs([row.pk for row in rows], to, actor_name=ACTOR)
    return [row.pk for row in rows]


def _note_first_use(now: datetime) -> None:
    """``first_used_at`` of running reservations: the earliest start (or placement) in the
    window of a job that names it. A fact, not a state change: not audited."""
    used = (
        Reservation.objects.filter(state=S.APPROVED, first_used_at__isnull=True, start__lte=now)
        .annotate(
            used_at=Min(
                Coalesce("jobs__started_at", "jobs__scheduled_at"),
                filter=Q(jobs__scheduled_at__gte=F("start")) | Q(jobs__state__in=HOLDING_STATES),
            )
        )
        .filter(used_at__isnull=False)
        .values_list("pk", "used_at")
    )
    for pk, used_at in used:
        Reservation.objects.filter(pk=pk, first_used_at__isnull=True).update(first_used_at=used_at)


def _release_unused(now: datetime) -> list[int]:
    graces: dict[int | None, int] = dict(
        PoolPolicy.objects.values_list("pool_id", "reservation_release_after_s")
    )
    default = PoolPolicy._meta.get_field("reservation_release_after_s").get_default()
    candidates = Reservation.objects.filter(
        state=S.APPROVED, first_used_at__isnull=True, start__lte=now, end__gt=now
    ).select_related("owner")
    released = []
    for reservation in candidates:
        grace = timedelta(seconds=graces.get(reservation.pool_id, default))
        if reservation.start + grace > now:
            continue
        minutes = int(grace.total_seconds() // 60)
        reason = f"released unused: no job of it ran in the {minutes} minutes after its start"
        with transaction.atomic():
            try:
                release(reservation, actor_name=ACTOR, reason=reason)
            except ReservationConflict:
                continue  # changed meanwhile (canceled, released by hand)
            _report_unused(reservation)
        released.append(reservation.pk)
    return released


def _report_unused(reservation: Reservation) -> None:
    gpus = list(
        Gpu.objects.filter(reservation_holds__reservation=reservation)
        .select_related("node")
        .order_by("node__hostname", "index")
    )
    by_node: dict[str, list[int]] = defaultdict(list)
    for gpu in gpus:
        by_node[gpu.node.hostname].append(gpu.index)
    where = "; ".join(f"{host} {indexes_phrase(indexes)}" for host, indexes in by_node.items())
    open_alert(
        fingerprint=f"{UNUSED_ALERT}{reservation.pk}",
        severity=Severity.INFO,
        summary=(
            f"Reservation {reservation.pk} of {reservation.owner.get_username()} released "
            f"unused: {where} free until {moment_text(reservation.end)}"
        ),
        node=gpus[0].node if len(by_node) == 1 else None,
        labels={"reservation": reservation.pk, "owner": reservation.owner.get_username()},
    )


def _resolve_unused_alerts(now: datetime) -> int:
    """Resolve the unused-reservation alerts whose window is over."""
    firing = Alert.objects.filter(
        state=AlertState.FIRING, fingerprint__startswith=UNUSED_ALERT
    ).values_list("fingerprint", flat=True)
    ids = {int(fingerprint.removeprefix(UNUSED_ALERT)): fingerprint for fingerprint in firing}
    over = Reservation.objects.filter(pk__in=ids, end__lte=now).values_list("pk", flat=True)
    return sum(resolve_alert(ids[pk]) for pk in over)
