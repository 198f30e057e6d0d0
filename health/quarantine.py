"""Quarantine: a GPU fenced by a health policy, from the fault to its return to service.

Lifecycle (docs/operations/health.md, "The GPU state machine, quarantine and maintenance"):
``fence`` opens a ``Quarantine`` (FENCED, or HELD when the GPU flaps) and moves the GPU to the
policy's state; ``review`` (beat, every 10 s) moves it to PROBATION once the fault cleared
(and, when its policy asks for one, after a successful GPU reset: ``reset_ended``), back to
FENCED on a new fault, and RETURNED (the GPU available again) after the policy's clean period.
A person's own change of a fenced GPU (online, offline, drain: admin, API or page) releases
it: health never overrides it. The circuit breaker stops automatic fencing when too many GPUs
fall at once and waits for an admin's ``reset_breaker``. Every change is audited in its
transaction.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone
from redis.exceptions import RedisError

from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.services import record
from health.alerts import open_alert, resolve_alert
from health.choices import EventKind, QuarantineState, Severity
from health.models import BreakerTrip, HealthEvent, Quarantine, RecoveryPolicy
from health.signals import gpu_fenced
from inventory import live
from inventory.choices import GpuState
from inventory.live import LiveSample
from inventory.models import Gpu
from inventory.services import set_gpu_state

ACTOR = "health"
log = logging.getLogger("gpuadmin.health")
BREAKER_FINGERPRINT = "health:circuit-breaker"
# One fencing decision at a time, fleet-wide: the breaker counts the GPUs fenced so far.
FENCE_LOCK_ID = 0x67707561_66656E63  # "gpuafenc"
FLAP_WINDOW = timedelta(hours=24)
DEFAULT_PROBATION_S = 300  # a quarantine without a policy (deleted since)

Q = QuarantineState
OPEN_STATES = (Q.FENCED, Q.PROBATION, Q.HELD)
# How far out of service each fencing state takes a GPU: a fault that asks for more moves an
# already fenced GPU further, never back.
GRAVITY = {
    GpuState.AVAILABLE: 0,
    GpuState.DRAINING: 1,
    GpuState.DEGRADED: 2,
    GpuState.RESETTING: 3,
    GpuState.OFFLINE: 4,
}
# Faults that clear when the GPU answers NVML again (its latest live sample has no error).
ANSWERS_AGAIN = frozenset({EventKind.GPU_LOST, EventKind.QUERY_FAILING})
XID_FALLEN_OFF_BUS = 79


def flapping_fingerprint(gpu: Gpu) -> str:
    return f"health:flapping:{gpu.uuid}"


def breaker_open() -> BreakerTrip | None:
    """The circuit breaker's open trip (automatic fencing is off), if any."""
    return BreakerTrip.objects.filter(reset_at__isnull=True).first()


def breaker_limit(fleet: int) -> float:
    """How many GPUs may be fenced within the window before the breaker trips."""
    return max(settings.GPUADMIN_BREAKER_MIN_GPUS, settings.GPUADMIN_BREAKER_SHARE * fleet)


def fence(gpu: Gpu, *, event: HealthEvent, policy: RecoveryPolicy | None, to_state: str) -> bool:
    """Fence ``gpu`` for ``event``: open its quarantine and move it to ``to_state`` (through
    the state machine, as ``health``). ``False`` when it was not fenced anew: already fenced
    (a fault in probation sends it back to FENCED; a graver ``to_state`` moves it further),
    already as far out of service by someone else's decision, or the circuit breaker is open
    or trips now (a ``BreakerTrip`` and a critical alert; events keep being recorded)."""
    if to_state not in GRAVITY or to_state == GpuState.AVAILABLE:
        raise ValueError(f"{to_state!r} is not a state a GPU is fenced to")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [FENCE_LOCK_ID])
        locked = _lock_gpu(gpu.pk)
        quarantine = _open_quarantine(locked)
        if quarantine is not None:
            _fence_again(quarantine, locked, event, policy, to_state)
            return False
        if GRAVITY[GpuState(locked.state)] >= GRAVITY[GpuState(to_state)]:
            return False  # a person's (or the last policy's) decision already covers it
        if breaker_open() is not None or _trips_breaker(locked):
            return False
        now = timezone.now()
        recent = Quarantine.objects.filter(gpu=locked, opened_at__gte=now - FLAP_WINDOW).count()
        flapping = recent + 1 >= settings.GPUADMIN_FLAP_LIMIT
        why = event.summary(locked)
        set_gpu_state(locked, to_state, actor_name=ACTOR, reason=why)
        quarantine = Quarantine.objects.create(
            gpu=locked,
            state=Q.HELD if flapping else Q.FENCED,
            gpu_state=to_state,
            cause=event,
            policy=policy,
            reset_required=_reset_required(policy),
            opened_at=now,
            note=why,
        )
        _audit(quarantine, None, f"fenced ({to_state}): {why}")
        transaction.on_commit(functools.partial(_announce_fenced, locked.pk, why))
        if flapping:
            open_alert(
                fingerprint=flapping_fingerprint(locked),
                severity=Severity.CRITICAL,
                summary=(
                    f"GPU flapping: {_label(locked)} quarantined {recent + 1} times in 24 h; "
                    "held back until a person releases it"
                ),
                gpu=locked,
                event=event,
            )
    gpu.state = locked.state
    return True


def _announce_fenced(gpu_id: int, reason: str) -> None:
    """Tell the apps above (``gpu_fenced``); a receiver that fails is logged, never undoes the
    fence."""
    for receiver, result in gpu_fenced.send_robust(sender=Quarantine, gpu_id=gpu_id, reason=reason):
        if isinstance(result, Exception):
            log.error("%s failed on GPU %s fenced: %r", receiver, gpu_id, result)


def _lock_gpu(pk: int) -> Gpu:
    """The GPU under its row lock (not its node's: heartbeats write that), with its node."""
    return Gpu.objects.select_for_update(of=("self",)).select_related("node").get(pk=pk)


def _open_quarantine(gpu: Gpu) -> Quarantine | None:
    """The GPU's open quarantine (locked), unless a person has changed the GPU's state since
    it was fenced: then it is released now, and ``None``. Health's own changes made outside
    this module (a reset) are followed: a state it fences to is remembered, available
    closes the quarantine as returned."""
    quarantine = (
        Quarantine.objects.select_for_update(of=("self",))
        .filter(gpu=gpu, closed_at__isnull=True)
        .select_related("cause", "policy")
        .first()
    )
    if quarantine is None:
        return None
    quarantine.gpu = gpu
    if gpu.state == quarantine.gpu_state:
        return quarantine
    why = f"{_label(gpu)} was set to {gpu.state}" + (
        f" ({gpu.state_reason})" if gpu.state_reason else ""
    )
    if _last_changed_by(gpu) != ACTOR:
        _close(quarantine, Q.RELEASED, f"{why} by a person")
        return None
    # Health's own change made elsewhere (a reset's start and end, health.resets).
    if gpu.state == GpuState.AVAILABLE:
        _close(quarantine, Q.RETURNED, why)
        return None
    quarantine.gpu_state = gpu.state
    quarantine.save(update_fields=["gpu_state"])
    _audit(quarantine, quarantine.state, why)
    return quarantine


def _last_changed_by(gpu: Gpu) -> str | None:
    """Who made the GPU's latest state change (its audit row says)."""
    return (
        AuditEvent.objects.filter(
            event_type="gpu.state_changed", target_type="inventory.gpu", target_id=gpu.uuid
        )
        .order_by("-time", "-pk")  # the audit log's (target, time) index
        .values_list("actor_name", flat=True)
        .first()
    )


def _reset_required(policy: RecoveryPolicy | None) -> bool:
    return policy is not None and policy.reset_before_probation


def _fence_again(
    quarantine: Quarantine,
    gpu: Gpu,
    event: HealthEvent,
    policy: RecoveryPolicy | None,
    to_state: str,
) -> None:
    """A new fault on a fenced GPU: probation starts over, a graver state is applied, and a
    fault whose policy asks for a reset needs one after it (an earlier reset does not count)."""
    why = event.summary(gpu)
    if _reset_required(policy):
        quarantine.reset_required, quarantine.reset_at = True, None
        quarantine.save(update_fields=["reset_required", "reset_at"])
    if GRAVITY[GpuState(to_state)] > GRAVITY[GpuState(quarantine.gpu_state)]:
        set_gpu_state(gpu, to_state, actor_name=ACTOR, reason=why, expect={quarantine.gpu_state})
        quarantine.gpu_state = to_state
        quarantine.save(update_fields=["gpu_state"])
        _audit(quarantine, quarantine.state, f"moved to {to_state}: {why}")
    if quarantine.state == Q.PROBATION:
        _back_to_fenced(quarantine, f"a new fault during probation: {why}")


def release_overridden(gpu_ids: Iterable[int]) -> None:
    """Release the quarantines of these GPUs that a person has taken over (their state is
    no longer the one health fenced them to). Receives inventory's ``gpus_became_schedulable``
    and ``gpus_went_offline``, so an admin's online or offline releases at once (``review``
    catches any other change within a pass)."""
    fenced = Quarantine.objects.filter(gpu_id__in=gpu_ids, closed_at__isnull=True)
    for gpu_id in fenced.values_list("gpu_id", flat=True):
        with transaction.atomic():
            _open_quarantine(_lock_gpu(gpu_id))


def gpus_changed(sender: Any, *, gpu_ids: Iterable[int], **kwargs: Any) -> None:
    """Receiver of inventory's GPU signals: see ``release_overridden``."""
    release_overridden(gpu_ids)


def _trips_breaker(gpu: Gpu) -> bool:
    """Would fencing ``gpu`` make too many GPUs fenced within the window (since the last
    reset, if later: an admin's reset starts the count afresh)? Then trip."""
    since = timezone.now() - timedelta(seconds=settings.GPUADMIN_BREAKER_WINDOW_S)
    last_reset = BreakerTrip.objects.filter(reset_at__isnull=False).order_by("-reset_at").first()
    if last_reset is not None and last_reset.reset_at is not None:
        since = max(since, last_reset.reset_at)
    fenced = set(Quarantine.objects.filter(opened_at__gte=since).values_list("gpu_id", flat=True))
    falling = len(fenced | {gpu.pk})
    fleet = Gpu.objects.present().count()
    limit = breaker_limit(fleet)
    if falling <= limit:
        return False
    trip = BreakerTrip.objects.create(falling=falling, fleet=fleet)
    summary = (
        f"Circuit breaker tripped: {falling} GPUs fell within "
        f"{settings.GPUADMIN_BREAKER_WINDOW_S} s (limit {limit:g} of {fleet}); automatic "
        f"fencing is off until an admin resets it ({_label(gpu)} was not fenced)"
    )
    record(
        "health.breaker_tripped",
        actor_name=ACTOR,
        target=trip,
        after={"falling": falling, "fleet": fleet, "limit": limit},
        message=summary,
    )
    open_alert(
        fingerprint=BREAKER_FINGERPRINT,
        severity=Severity.CRITICAL,
        summary=summary,
        labels={"falling": falling, "fleet": fleet},
    )
    return True


def reset_breaker(actor: User, *, reason: str = "") -> bool:
    """An admin turns automatic fencing back on; ``False`` when the breaker was not open."""
    with transaction.atomic():
        trip = BreakerTrip.objects.select_for_update().filter(reset_at__isnull=True).first()
        if trip is None:
            return False
        trip.reset_at, trip.reset_by = timezone.now(), actor
        trip.save(update_fields=["reset_at", "reset_by"])
        record(
            "health.breaker_reset",
            actor=actor,
            target=trip,
            before={"open": True},
            after={"open": False},
            message="automatic fencing back on" + (f": {reason}" if reason else ""),
        )
        resolve_alert(BREAKER_FINGERPRINT)
    return True


def release(quarantine: Quarantine, *, actor: User, reason: str) -> bool:
    """A person releases a quarantine (a held, flapping GPU, or any other): the GPU returns
    to service if it is still as health left it. ``False`` when it was closed already."""
    with transaction.atomic():
        gpu = _lock_gpu(quarantine.gpu_id)
        locked = _open_quarantine(gpu)
        if locked is None or locked.pk != quarantine.pk:
            return False
        set_gpu_state(
            gpu,
            GpuState.AVAILABLE,
            actor=actor,
            reason=reason,
            expect={locked.gpu_state},
        )
        _close(locked, Q.RELEASED, f"released by {actor.get_username()}: {reason}", actor=actor)
    quarantine.refresh_from_db()
    return True


@dataclass
class Review:
    """What one ``review`` pass changed: quarantine ids per new state."""

    changed: dict[str, list[int]] = field(default_factory=dict)

    def add(self, state: str, quarantine: Quarantine) -> None:
        self.changed.setdefault(state, []).append(quarantine.pk)


def review(now: datetime | None = None) -> Review:
    """Move every open quarantine along (beat task ``health.review_quarantines``): released
    when a person changed its GPU; FENCED -> PROBATION once the fault cleared; PROBATION ->
    FENCED on a new fault (or the fault back), -> RETURNED after the clean period. HELD ones
    wait for a person."""
    now = now or timezone.now()
    open_ones = list(Quarantine.objects.filter(closed_at__isnull=True).select_related("gpu__node"))
    samples = _latest_samples(q.gpu.node.hostname for q in open_ones)
    result = Review()
    for candidate in open_ones:
        with transaction.atomic():
            gpu = _lock_gpu(candidate.gpu_id)
            quarantine = _open_quarantine(gpu)
            if quarantine is None or quarantine.pk != candidate.pk:
                candidate.refresh_from_db(fields=["state"])
                result.add(candidate.state, candidate)  # a person's, or health's elsewhere
                continue
            sample = samples.get(gpu.node.hostname, {}).get(gpu.uuid)
            moved = _step(quarantine, gpu, sample, now)
            if moved:
                result.add(moved, quarantine)
    return result


def _step(quarantine: Quarantine, gpu: Gpu, sample: LiveSample | None, now: datetime) -> str:
    """One quarantine's next state under review (``""``: unchanged)."""
    if quarantine.state == Q.FENCED:
        if not _fault_cleared(quarantine, gpu, sample):
            return ""
        probation = timedelta(seconds=_probation_s(quarantine))
        before = quarantine.state
        quarantine.state, quarantine.fault_cleared_at = Q.PROBATION, now
        quarantine.probation_until = now + probation
        quarantine.save(update_fields=["state", "fault_cleared_at", "probation_until"])
        _audit(
            quarantine,
            before,
            f"the fault cleared; probation until {quarantine.probation_until:%H:%M:%S}",
        )
        return Q.PROBATION
    if quarantine.state == Q.PROBATION:
        if _new_fault(quarantine) or not _fault_cleared(quarantine, gpu, sample):
            _back_to_fenced(quarantine, "the fault is back during probation")
            return Q.FENCED
        assert quarantine.probation_until is not None, "set with the PROBATION state"
        if now < quarantine.probation_until:
            return ""
        set_gpu_state(
            gpu,
            GpuState.AVAILABLE,
            actor_name=ACTOR,
            reason=f"probation passed ({_probation_s(quarantine)} s clean)",
            expect={quarantine.gpu_state},
        )
        _close(quarantine, Q.RETURNED, "probation passed: back in service")
        return Q.RETURNED
    return ""  # HELD: a person decides


def _fault_cleared(quarantine: Quarantine, gpu: Gpu, sample: LiveSample | None) -> bool:
    """Whether the quarantine's fault is gone, as its kind says: a lost or failing GPU
    answers NVML again; a hot one is below the threshold by the hysteresis; any other fault,
    once the GPU is not being reset (its reset completed). A live sample with an NVML error
    never clears anything."""
    if gpu.state == GpuState.RESETTING or _waits_for_reset(quarantine):
        return False
    if sample is not None and sample.get("error_message"):
        return False
    cause = quarantine.cause
    if cause.kind in ANSWERS_AGAIN or cause.xid == XID_FALLEN_OFF_BUS:
        return sample is not None and _sampled_after(sample, cause.occurred_at)
    if cause.kind == EventKind.THERMAL:
        threshold = _thermal_threshold(quarantine)
        if threshold is not None:
            temperature = None if sample is None else sample.get("temperature_c")
            cool = threshold - settings.GPUADMIN_THERMAL_HYSTERESIS_C
            return temperature is not None and temperature < cool
    return True


def _waits_for_reset(quarantine: Quarantine) -> bool:
    return quarantine.reset_required and quarantine.reset_at is None


def lock_for_reset(gpu_id: int) -> tuple[Gpu, Quarantine | None]:
    """The GPU under its row lock and its open quarantine, if any (``health.resets``: a reset
    ended; a quarantine follows health's own ``resetting``)."""
    gpu = _lock_gpu(gpu_id)
    return gpu, _open_quarantine(gpu)


def reset_ended(quarantine: Quarantine, *, to_state: str, error: str | None, why: str) -> None:
    """A reset of the quarantined GPU ended, leaving it in ``to_state`` (still out of service:
    ``health.resets.finish_reset`` never returns a quarantined GPU itself). A successful reset
    counts (``reset_at``): the next review starts probation. A failed one leaves it fenced."""
    quarantine.gpu_state = to_state
    fields = ["gpu_state"]
    if error is None:
        quarantine.reset_at = timezone.now()
        fields.append("reset_at")
    quarantine.save(update_fields=fields)
    _audit(quarantine, quarantine.state, why + ("; probation follows" if error is None else ""))


def waiting_for(quarantine: Quarantine) -> str:
    """What an open quarantine waits for, in a sentence (the GPU page and the API); "" once
    it is closed."""
    if quarantine.closed_at is not None:
        return ""
    if quarantine.state == Q.HELD:
        return "held back: waits for a person to release it"
    if quarantine.state == Q.PROBATION:
        assert quarantine.probation_until is not None, "set with the PROBATION state"
        until = timezone.localtime(quarantine.probation_until)
        return f"on probation until {until:%Y-%m-%d %H:%M:%S}"
    if quarantine.gpu.state == GpuState.RESETTING:
        return "waits for its GPU reset to end"
    if _waits_for_reset(quarantine):
        cause = quarantine.cause
        needs = (
            f"XID {cause.xid} needs a reset or node reboot"
            if cause.xid is not None
            else f"{cause.get_kind_display()}: a reset or node reboot is needed"
        )
        return f"waits for a GPU reset before probation: {needs} (or a person returns it)"
    return "waits for the fault to clear"


def _thermal_threshold(quarantine: Quarantine) -> float | None:
    if quarantine.policy is not None and quarantine.policy.threshold is not None:
        return quarantine.policy.threshold
    threshold = quarantine.cause.data.get("threshold_c")
    return float(threshold) if isinstance(threshold, int | float) else None


def _sampled_after(sample: LiveSample, moment: datetime) -> bool:
    sampled_at = sample.get("sampled_at")
    return isinstance(sampled_at, int | float) and sampled_at > moment.timestamp()


def _new_fault(quarantine: Quarantine) -> bool:
    """An event of the cause's kind (and XID) on the GPU since the fault cleared."""
    cause = quarantine.cause
    events = HealthEvent.objects.filter(
        gpu_id=quarantine.gpu_id, kind=cause.kind, received_at__gt=quarantine.fault_cleared_at
    )
    if cause.xid is not None:
        events = events.filter(xid=cause.xid)
    return events.exists()


def _probation_s(quarantine: Quarantine) -> int:
    return quarantine.policy.probation_s if quarantine.policy else DEFAULT_PROBATION_S


def _latest_samples(hostnames: Iterable[str]) -> dict[str, dict[str, LiveSample]]:
    """The live samples of these nodes; none when Redis cannot answer (faults that need a
    sample to clear then wait for the next pass)."""
    try:
        return live.latest(set(hostnames))
    except RedisError:
        return {}


def _back_to_fenced(quarantine: Quarantine, why: str) -> None:
    before = quarantine.state
    quarantine.state, quarantine.fault_cleared_at, quarantine.probation_until = Q.FENCED, None, None
    quarantine.save(update_fields=["state", "fault_cleared_at", "probation_until"])
    _audit(quarantine, before, why)


def _close(quarantine: Quarantine, state: str, why: str, *, actor: User | None = None) -> None:
    before = quarantine.state
    quarantine.state, quarantine.closed_at = state, timezone.now()
    quarantine.save(update_fields=["state", "closed_at"])
    _audit(quarantine, before, why, actor=actor)
    if before == Q.HELD:
        resolve_alert(flapping_fingerprint(quarantine.gpu))


def _audit(
    quarantine: Quarantine, before: str | None, why: str, *, actor: User | None = None
) -> None:
    """``gpu.quarantine_changed`` on the GPU (its page's history shows it)."""
    gpu = quarantine.gpu
    record(
        "gpu.quarantine_changed",
        actor=actor,
        actor_name=None if actor else ACTOR,
        target=gpu,
        target_id=gpu.uuid,
        before=None if before is None else {"quarantine": before},
        after={
            "quarantine": quarantine.state,
            "quarantine_id": quarantine.pk,
            "gpu_state": quarantine.gpu_state,
        },
        message=why,
    )


def _label(gpu: Gpu) -> str:
    return f"GPU {gpu.index} of {gpu.node.hostname}"
