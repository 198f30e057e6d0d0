"""MIG re-layout: an admin's request to give one GPU a new MIG layout, carried out step by step.

Each step (draining, applying, verifying, done; failed rolls the GPU back) is a state of a
``MigRelayout`` with a deadline, audited ``mig_relayout.<state>`` and driven by ``advance_open``
(beat, and the agents' job reports while a GPU drains). Layouts are lists of
``{"profile": "3g.20gb", "start": 4}``, checked by ``inventory.nvml.mig_fit``. See
docs/users/sharing.md, "MIG re-layout".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from functools import partial
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuadmin.audit.services import record
from gpuadmin.leases import services as leases
from gpuadmin.refusals import FieldRefusal
from inventory.choices import GpuState
from inventory.models import Gpu, MigInstance
from inventory.nvml import mig_catalog
from inventory.nvml.mig_fit import Placed, free_starts, remaining_capacity
from inventory.services import (
    MIG_TASK_TIMEOUT_S,
    AgentTimedOut,
    DiscoveryFailed,
    IllegalGpuTransition,
    MigChangeRefused,
    create_mig_instance,
    destroy_mig_instance,
    discover_node,
    set_gpu_state,
)
from scheduling.jobs import control
from scheduling.models import RELAYOUT_OPEN_STATES, Allocation, MigRelayout, RelayoutState

log = logging.getLogger("gpuadmin.mig")

R = RelayoutState
ACTOR = "mig-relayout"
BALANCED = "balanced"
CUSTOM = "custom"
LAYOUT_CHARS = 200  # a custom layout as typed (8 items of "3g.20gb@4, " fit five times)
# Compute slices of the instances of the balanced layout (3g + 2g + 1g + 1g on an A100).
BALANCED_SLICES = (3, 2, 1, 1)
# Per instance: the agent's answer and its fresh scan; VERIFYING: a node scan.
APPLY_STEP_S = 2 * MIG_TASK_TIMEOUT_S
VERIFY_S = 60.0
# Refusals that a later try may not meet (the drained jobs' processes still going away).
_TRANSIENT = frozenset({"busy", "no_live_sample", "node_unreachable"})
# One advance of a re-layout at a time: a lease (``gpuadmin.leases``) per re-layout, as long as
# its longest step (an apply and a roll-back of the largest layouts, 7 instances each), so that
# it outlives a step and a dead worker's advance is taken over after at most that. Each of the
# step's commits is fenced by it (``leases.fenced``): an advance that lost it, its worker
# stalled past the lease's time, commits nothing more.
_LEASE_S = APPLY_STEP_S * 14 + VERIFY_S

# A transaction that commits only while this advance holds the re-layout's lease.
Fence = Callable[[], AbstractContextManager[object]]

Layout = list[dict[str, Any]]


class RelayoutRefused(FieldRefusal):
    """A re-layout that cannot be asked for; ``field`` names the input at fault."""


# --------------------------------------------------------------------------- layouts


def smallest_profile(table: mig_catalog.MigTable) -> mig_catalog.MigProfile:
    return min(
        (p for p in table.profiles if p.memory_slices),
        key=lambda p: (p.compute_slices, p.memory_mib),
    )


def layout_names(table: mig_catalog.MigTable) -> tuple[str, ...]:
    """The named layouts of a GPU model: ``all-<smallest profile>`` and ``balanced``."""
    return (f"all-{smallest_profile(table).name}", BALANCED)


def named_layout(table: mig_catalog.MigTable, name: str) -> Layout:
    """``all-<profile>``: as many instances of that profile as fit; ``balanced``: one each of
    3, 2, 1 and 1 compute slices (the least memory of each), placed by the rules."""
    if name.startswith("all-"):
        try:
            profile = table.by_name(name.removeprefix("all-"))
        except ValueError:
            raise RelayoutRefused(
                "layout_name", f"{table.gpu_name} has no profile {name[4:]!r}"
            ) from None
        placed: list[Placed] = []
        while remaining_capacity(table, placed, profile) and free_starts(placed, profile):
            placed.append(
                Placed(profile.id, free_starts(placed, profile)[0], profile.memory_slices)
            )
        return [{"profile": profile.name, "start": gi.start} for gi in placed]
    if name == BALANCED:
        wanted = []
        for slices in BALANCED_SLICES:
            same = [p for p in table.profiles if p.compute_slices == slices and p.memory_slices]
            if same:
                wanted.append({"profile": min(same, key=lambda p: p.memory_mib).name})
        return fit(table, wanted)
    names = ", ".join(layout_names(table))
    raise RelayoutRefused("layout_name", f"no layout {name!r}: {names} or {CUSTOM}")


def fit(table: mig_catalog.MigTable, wanted: Sequence[dict[str, Any]]) -> Layout:
    """The layout ``wanted`` (profiles, each with a ``start`` or none: the first that lets
    every instance fit) placed by NVML's rules; ``RelayoutRefused`` naming ``layout`` when it
    cannot be."""
    items: list[tuple[mig_catalog.MigProfile, int | None]] = []
    for n, item in enumerate(wanted):
        if not isinstance(item, dict) or not isinstance(item.get("profile"), str):
            raise RelayoutRefused("layout", f'item {n + 1}: give {{"profile": ..., "start": ...}}')
        try:
            profile = table.by_name(item["profile"])
        except ValueError:
            known = ", ".join(p.name for p in table.profiles if p.memory_slices)
            raise RelayoutRefused(
                "layout", f"item {n + 1}: no profile {item['profile']!r} ({known})"
            ) from None
        start = item.get("start")
        if start is not None and (not isinstance(start, int) or start not in profile.placements):
            starts = ", ".join(map(str, profile.placements))
            raise RelayoutRefused(
                "layout", f"item {n + 1}: {profile.name} starts at {starts}, not {start!r}"
            )
        items.append((profile, start))
    placed = _search(table, items, [])
    if placed is None:
        raise RelayoutRefused("layout", f"these instances do not fit together on {table.gpu_name}")
    return [
        {"profile": profile.name, "start": gi.start}
        for (profile, _), gi in zip(items, placed, strict=True)
    ]


def _search(
    table: mig_catalog.MigTable,
    items: list[tuple[mig_catalog.MigProfile, int | None]],
    placed: list[Placed],
) -> list[Placed] | None:
    """Backtracking over the free starts (at most 7 instances of at most 8 starts)."""
    if len(placed) == len(items):
        return placed
    profile, start = items[len(placed)]
    if not remaining_capacity(table, placed, profile):
        return None
    for candidate in free_starts(placed, profile):
        if start is not None and candidate != start:
            continue
        found = _search(
            table, items, [*placed, Placed(profile.id, candidate, profile.memory_slices)]
        )
        if found is not None:
            return found
    return None


def parse_layout(text: str) -> Layout:
    """A custom layout as people type it: ``3g.20gb@4, 2g.10gb, 1g.5gb@6`` (a profile, and
    ``@start`` where it must sit). ``RelayoutRefused`` naming ``layout``."""
    items: Layout = []
    for word in text.replace(",", " ").split():
        profile, _, start = word.partition("@")
        # A GPU has a handful of slices: a start of more digits is a typo (and int() of
        # thousands of digits raises).
        if start and not (start.isascii() and start.isdecimal() and len(start) <= 2):
            raise RelayoutRefused("layout", f"{word!r}: the start after @ is a slice number")
        items.append({"profile": profile, **({"start": int(start)} if start else {})})
    return items


def asked_layout(name: str, text: str) -> Layout | None:
    """The layout a request types (``parse_layout``) when it names ``custom``; a named layout
    leaves the text alone, as every form and the API read it."""
    return parse_layout(text) if name == CUSTOM else None


def current_layout(gpu: Gpu) -> Layout:
    """The GPU's GPU instances as a layout, by start."""
    rows = (
        MigInstance.objects.filter(gpu=gpu)
        .order_by("placement_start")
        .values_list("profile_name", "placement_start")
        .distinct()
    )
    return [{"profile": profile, "start": start} for profile, start in rows]


def _key(layout: Layout) -> list[tuple[str, int]]:
    return sorted((item["profile"], item["start"]) for item in layout)


# --------------------------------------------------------------------------- the workflow


def request(
    gpu: Gpu,
    layout_name: str,
    *,
    actor: User,
    layout: Sequence[dict[str, Any]] | None = None,
    preempt: bool = False,
) -> MigRelayout:
    """Ask for ``layout_name`` (a named layout, or ``custom`` with ``layout``) on ``gpu``: the
    GPU starts draining now (its jobs preempted at once with ``preempt``). ``RelayoutRefused``
    naming the field for a GPU not in MIG mode or not available, a layout that does not fit,
    or a node that already has one under way."""
    gpu = Gpu.objects.select_related("node").get(pk=gpu.pk)
    table = mig_catalog.table_for_gpu(gpu.name)
    if not gpu.mig_enabled or table is None or gpu.is_missing:
        raise RelayoutRefused("gpu", f"GPU {gpu.index} of {gpu.node.hostname} is not in MIG mode")
    if layout_name == CUSTOM:
        target = fit(table, layout or [])
        if not target:
            raise RelayoutRefused("layout", "a custom layout names at least one instance")
    else:
        target = named_layout(table, layout_name)
    label = f"GPU {gpu.index} of {gpu.node.hostname}"
    reason = f"MIG re-layout to {layout_name}"
    try:
        with transaction.atomic():
            relayout = MigRelayout.objects.create(
                gpu=gpu,
                node=gpu.node,
                layout_name=layout_name,
                layout=target,
                previous_layout=current_layout(gpu),
                preempt=preempt,
                requested_by=actor,
                step_deadline=timezone.now()
                + timedelta(seconds=settings.GPUADMIN_MIG_RELAYOUT_DRAIN_S),
            )
            set_gpu_state(
                gpu, GpuState.DRAINING, actor=actor, reason=reason, expect=[GpuState.AVAILABLE]
            )
            _audit(relayout, None, actor=actor, message=f"{label}: {reason}")
    except IntegrityError:
        open_one = MigRelayout.objects.filter(node=gpu.node, state__in=RELAYOUT_OPEN_STATES).first()
        which = f"GPU {open_one.gpu.index}" if open_one else "another GPU"
        raise RelayoutRefused(
            "gpu", f"node {gpu.node.hostname} has a MIG re-layout under way ({which})"
        ) from None
    except IllegalGpuTransition as exc:
        raise RelayoutRefused("gpu", str(exc)) from None
    if preempt:
        control.stop_jobs_on_gpus(
            [gpu.pk],
            requeue=True,
            reason=f"preempted: {label} gets a new MIG layout",
            actor_name=ACTOR,
        )
    return relayout


def cancel(relayout: MigRelayout, *, actor: User) -> MigRelayout:
    """Cancel a re-layout that is still draining: the GPU is available again."""
    with _claimed(relayout.pk) as claimed:
        if claimed is None or claimed[0].state != R.DRAINING:
            raise RelayoutRefused("state", "only a re-layout still draining can be canceled")
        relayout, fence = claimed
        _finish(relayout, fence, R.CANCELED, f"canceled by {actor.get_username()}", actor=actor)
        return relayout


def nudge() -> None:
    """A job ended somewhere: a GPU that drains for a re-layout may be free now."""
    if MigRelayout.objects.filter(state=R.DRAINING).exists():
        current_app.send_task("scheduling.advance_relayouts")


def advance_open() -> list[int]:
    """One step of every open re-layout whose step is due (beat; the agents' job reports);
    the ids of those that moved."""
    moved = []
    for pk in MigRelayout.objects.filter(state__in=RELAYOUT_OPEN_STATES).values_list(
        "pk", flat=True
    ):
        before = MigRelayout.objects.values_list("state", flat=True).get(pk=pk)
        if advance(pk).state != before:
            moved.append(pk)
    return moved


def advance(pk: int) -> MigRelayout:
    """Take the next step of a re-layout if it can be taken now (another worker taking it
    meanwhile, or taking it over from this one, stalled past its lease, is left to it)."""
    with _claimed(pk) as claimed:
        if claimed is None:
            return MigRelayout.objects.get(pk=pk)
        relayout, fence = claimed
        gpu_state = relayout.gpu.state
        try:
            if relayout.state in (R.DRAINING, R.APPLYING) and gpu_state != GpuState.DRAINING:
                # Health fenced it or an admin took it offline meanwhile: its hardware is not
                # this workflow's to change any more (a rollback would change it too).
                why = f"the GPU left draining (it is {gpu_state}): nothing more applied"
                _fail(relayout, fence, why, roll_back=False)
            elif relayout.state == R.DRAINING:
                _drain(relayout, fence)
            elif relayout.state == R.APPLYING:
                _apply_step(relayout, fence)
            elif relayout.state == R.VERIFYING:
                _verify(relayout, fence)
        except leases.LeaseLost:
            log.warning("MIG re-layout %d: its lease was taken over, nothing committed", pk)
            return MigRelayout.objects.get(pk=pk)
        return relayout


def _drain(relayout: MigRelayout, fence: Fence) -> None:
    if Allocation.objects.active().filter(gpu_id=relayout.gpu_id).exists():
        if _late(relayout):
            _fail(relayout, fence, "its jobs did not end before the drain deadline")
        return
    steps = len(relayout.layout) + len(relayout.previous_layout)
    _enter(relayout, fence, R.APPLYING, APPLY_STEP_S * steps)


def _apply_step(relayout: MigRelayout, fence: Fence) -> None:
    try:
        _apply(relayout.gpu, relayout.layout)
    except MigChangeRefused as exc:
        if exc.code in _TRANSIENT and not _late(relayout):
            return  # e.g. a drained job's processes still going away: try again
        _fail(relayout, fence, f"the agent refused: {exc.message}")
        return
    except AgentTimedOut as exc:
        _fail(relayout, fence, str(exc))
        return
    _enter(relayout, fence, R.VERIFYING, VERIFY_S)


def _verify(relayout: MigRelayout, fence: Fence) -> None:
    gpu = relayout.gpu
    try:
        discover_node(gpu.node, actor_name=ACTOR)
    except DiscoveryFailed as exc:
        if _late(relayout):
            _fail(relayout, fence, f"the re-scan failed: {exc}")
        return
    found = current_layout(gpu)
    if _key(found) != _key(relayout.layout):
        shows = f"the re-scan shows {_describe(found)}, not {_describe(relayout.layout)}"
        _fail(relayout, fence, shows)
        return
    _finish(relayout, fence, R.DONE, f"{_describe(found)} verified by a re-scan")


def _apply(gpu: Gpu, target: Layout) -> None:
    """Destroy the GPU instances ``target`` does not keep, then create those it lacks."""
    keep = set(_key(target))
    current = list(
        MigInstance.objects.filter(gpu=gpu)
        .values_list("gi_id", "profile_name", "placement_start")
        .distinct()
    )
    for gi_id, profile, start in current:
        if (profile, start) not in keep:
            destroy_mig_instance(gpu, gi_id, actor_name=ACTOR)
    have = set(_key(current_layout(gpu)))
    for item in target:
        if (item["profile"], item["start"]) not in have:
            create_mig_instance(
                gpu, item["profile"], placement_start=item["start"], actor_name=ACTOR
            )


def _fail(relayout: MigRelayout, fence: Fence, why: str, *, roll_back: bool = True) -> None:
    """Roll the GPU back to its previous layout (as far as its agent allows; not when the GPU
    is no longer the workflow's, ``roll_back`` False: the message says what it was left with)
    and return it."""
    message = f"{relayout.get_state_display().lower()}: {why}"
    if not roll_back:
        message += f", its layout is {_describe(current_layout(relayout.gpu))}"
    elif relayout.state != R.DRAINING and _key(current_layout(relayout.gpu)) != _key(
        relayout.previous_layout
    ):
        try:
            _apply(relayout.gpu, relayout.previous_layout)
        except (MigChangeRefused, AgentTimedOut) as exc:
            left = _describe(current_layout(relayout.gpu))
            message += f"; the rollback failed too ({exc}): its layout is {left}"
        else:
            message += f"; rolled back to {_describe(relayout.previous_layout)}"
    _finish(relayout, fence, R.FAILED, message)


def _finish(
    relayout: MigRelayout, fence: Fence, state: str, message: str, *, actor: User | None = None
) -> None:
    """End the re-layout in ``state`` and give the GPU back (unless someone else changed its
    state meanwhile, e.g. an admin took it offline)."""
    gpu = relayout.gpu
    with fence(), transaction.atomic():
        try:
            set_gpu_state(
                gpu,
                GpuState.AVAILABLE,
                actor=actor,
                actor_name="" if actor else ACTOR,
                reason=f"MIG re-layout {state}",
                expect=[GpuState.DRAINING],
            )
        except IllegalGpuTransition as exc:
            message += f" (the GPU was left as it is: {exc})"
        _set_state(relayout, state, message=message, finished_at=timezone.now(), actor=actor)
    log.info("MIG re-layout %d of GPU %d: %s (%s)", relayout.pk, gpu.pk, state, message)


def _enter(relayout: MigRelayout, fence: Fence, state: str, seconds: float) -> None:
    with fence(), transaction.atomic():
        _set_state(relayout, state, step_deadline=timezone.now() + timedelta(seconds=seconds))


def _set_state(
    relayout: MigRelayout, state: str, *, actor: User | None = None, **fields: Any
) -> None:
    before = relayout.state
    relayout.state = state
    for name, value in fields.items():
        setattr(relayout, name, value)
    relayout.save(update_fields=["state", *fields])
    _audit(relayout, before, actor=actor, message=fields.get("message", ""))


def _audit(relayout: MigRelayout, before: str | None, *, actor: User | None, message: str) -> None:
    record(
        f"mig_relayout.{relayout.state}",
        actor=actor,
        actor_name=None if actor else ACTOR,
        target=relayout,
        before=None if before is None else {"state": before},
        after={
            "state": relayout.state,
            "gpu": relayout.gpu.uuid,
            "layout": relayout.layout,
            "previous_layout": relayout.previous_layout,
        },
        message=message,
    )


def _late(relayout: MigRelayout) -> bool:
    return relayout.step_deadline is not None and timezone.now() > relayout.step_deadline


def _describe(layout: Layout) -> str:
    return " + ".join(f"{item['profile']}@{item['start']}" for item in layout) or "no instances"


def lease_name(pk: int) -> str:
    """The lease of re-layout ``pk``'s advances."""
    return f"mig-relayout:{pk}"


@contextmanager
def _claimed(pk: int) -> Iterator[tuple[MigRelayout, Fence] | None]:
    """The re-layout, loaded, while this process holds its lease, and the fence of its
    commits; ``None`` when another holds the lease. A lease, not a transaction: the agent
    calls inside take seconds each and commit on their own (what the node did, whoever
    asked)."""
    held = leases.try_take(lease_name(pk), _LEASE_S)
    if held is None:
        yield None
        return
    with leases.holding(held):
        relayout = MigRelayout.objects.select_related("gpu__node").get(pk=pk)
        yield relayout, partial(leases.fenced, held)
