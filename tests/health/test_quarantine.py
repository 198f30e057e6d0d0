"""Quarantine (``health.quarantine``): fencing, the circuit breaker (a small fleet, where the
absolute minimum decides, and a big one, where the share does), probation and return, a new
fault during probation, flapping, and a person's decision that health never overrides.

The fleet is simulated nodes discovered through the real scanner; live samples go through
Redis as agents publish them (``inventory.live.publish``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from gpuadmin.celery import app
from health import quarantine, resets
from health.choices import AlertState, EventKind, QuarantineState, Severity
from health.models import Alert, BreakerTrip, HealthEvent, Quarantine, RecoveryPolicy
from inventory import live
from inventory.choices import GpuState
from inventory.models import Gpu
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.services import apply_discovery, record_heartbeat, set_gpu_state

pytestmark = pytest.mark.django_db

Q = QuarantineState


@dataclass
class Box:
    """A simulated 4-GPU node: its simulator, and its samples published to Redis."""

    hostname: str
    sim: SimulatedNvml

    def gpu(self, index: int) -> Gpu:
        return Gpu.objects.select_related("node").get(node__hostname=self.hostname, index=index)

    def publish(self) -> None:
        live.publish(self.hostname, scan(self.sim))


@pytest.fixture
def boxes(settings) -> Iterator[list[Box]]:
    """``boxes(n)``: n simulated nodes of 4 GPUs each, unique to this test (Redis is shared)."""
    settings.GPUADMIN_SAMPLE_STREAM = f"test:samples:{uuid.uuid4().hex}"
    made: list[Box] = []

    def make(count: int = 1) -> list[Box]:
        for _ in range(count):
            hostname = f"q-{uuid.uuid4().hex[:8]}"
            box = Box(hostname, SimulatedNvml.from_model("pcie-l40s-4x", node_name=hostname))
            apply_discovery(hostname, scan(box.sim))
            record_heartbeat(hostname)
            box.publish()
            made.append(box)
        return made[-count:]

    yield make
    client = live.client()
    client.delete(settings.GPUADMIN_SAMPLE_STREAM, *(live.KEY_PREFIX + b.hostname for b in made))


@pytest.fixture
def box(boxes) -> Box:
    return boxes(1)[0]


XID = 4242  # an XID no shipped policy names


def event(gpu: Gpu, kind: str = EventKind.XID, xid: int | None = XID, **fields) -> HealthEvent:
    return HealthEvent.objects.create(
        node=gpu.node,
        gpu=gpu,
        kind=kind,
        xid=xid,
        severity=Severity.CRITICAL,
        message=fields.pop("message", ""),
        occurred_at=fields.pop("occurred_at", timezone.now()),
        dedupe_key=uuid.uuid4().hex,
        **fields,
    )


@pytest.fixture
def policy() -> RecoveryPolicy:
    return RecoveryPolicy.objects.create(
        name="test XID", kind=EventKind.XID, xid=XID, probation_s=60
    )


def fence(gpu: Gpu, policy: RecoveryPolicy | None, to_state: str = GpuState.DEGRADED, **kw):
    return quarantine.fence(gpu, event=event(gpu, **kw), policy=policy, to_state=to_state)


def open_quarantine(gpu: Gpu) -> Quarantine:
    return Quarantine.objects.get(gpu=gpu, closed_at__isnull=True)


def quarantine_rows(gpu: Gpu) -> list[tuple[str | None, str, str]]:
    return [
        ((row.before or {}).get("quarantine"), row.after["quarantine"], row.actor_name)
        for row in AuditEvent.objects.filter(
            event_type="gpu.quarantine_changed", target_id=gpu.uuid
        ).order_by("pk")
    ]


# --------------------------------------------------------------------------- fence


def test_fence_opens_a_quarantine_and_takes_the_gpu_out_of_service(box, policy):
    gpu = box.gpu(1)
    assert fence(gpu, policy, message="Double Bit ECC Error") is True
    stored = box.gpu(1)
    assert stored.state == GpuState.DEGRADED
    assert stored.state_reason == (
        f"XID 4242 (not in NVIDIA's XID catalog) on GPU 1 of {box.hostname}: Double Bit ECC Error"
    )
    assert gpu.pk not in set(Gpu.objects.schedulable().values_list("pk", flat=True))
    opened = open_quarantine(gpu)
    assert (opened.state, opened.gpu_state, opened.policy) == (Q.FENCED, "degraded", policy)
    changed = AuditEvent.objects.get(event_type="gpu.state_changed", target_id=gpu.uuid)
    assert (changed.actor_name, changed.after) == ("health", {"state": "degraded"})
    assert quarantine_rows(gpu) == [(None, "fenced", "health")]


def test_a_fenced_gpu_is_fenced_once_and_only_ever_further(box, policy):
    gpu = box.gpu(1)
    assert fence(gpu, policy) is True
    assert fence(gpu, policy, to_state=GpuState.DRAINING) is False  # milder: nothing moves
    assert box.gpu(1).state == GpuState.DEGRADED
    assert fence(gpu, policy, to_state=GpuState.OFFLINE, xid=79) is False  # graver: it goes
    assert box.gpu(1).state == GpuState.OFFLINE
    assert Quarantine.objects.filter(gpu=gpu).count() == 1
    assert open_quarantine(gpu).gpu_state == GpuState.OFFLINE


def test_the_database_keeps_one_open_quarantine_per_gpu(box, policy):
    from django.db import IntegrityError, transaction

    gpu = box.gpu(0)
    fence(gpu, policy)
    with pytest.raises(IntegrityError), transaction.atomic():
        Quarantine.objects.create(gpu=gpu, cause=event(gpu))


def test_a_gpu_a_person_took_out_of_service_is_left_alone(box, policy, admin_user):
    gpu = box.gpu(2)
    set_gpu_state(gpu, GpuState.OFFLINE, actor=admin_user, reason="RMA")
    assert fence(gpu, policy) is False
    assert not Quarantine.objects.exists()
    assert box.gpu(2).state_reason == "RMA"


# --------------------------------------------------------------------------- circuit breaker


def test_the_breaker_trips_on_a_small_fleet_at_the_absolute_minimum(box, policy, admin_user):
    """4 GPUs: the limit is max(3, 10% of 4) = 3, so the fourth falling GPU trips it."""
    gpus = [box.gpu(index) for index in range(4)]
    assert [fence(gpu, policy) for gpu in gpus[:3]] == [True, True, True]
    assert fence(gpus[3], policy) is False
    assert box.gpu(3).state == GpuState.AVAILABLE  # not fenced
    trip = quarantine.breaker_open()
    assert trip is not None and (trip.falling, trip.fleet) == (4, 4)
    alert = Alert.objects.get(fingerprint=quarantine.BREAKER_FINGERPRINT)
    assert (alert.state, alert.severity) == (AlertState.FIRING, Severity.CRITICAL)
    assert "4 GPUs fell within 300 s (limit 3 of 4)" in alert.summary
    assert AuditEvent.objects.filter(event_type="health.breaker_tripped").count() == 1
    # Open: no more automatic fencing; events are still recorded.
    assert fence(gpus[3], policy) is False
    assert HealthEvent.objects.filter(gpu=gpus[3]).count() == 2
    assert BreakerTrip.objects.count() == 1
    # An admin resets it: the count starts afresh, and fencing works again.
    assert quarantine.reset_breaker(admin_user, reason="rack fixed") is True
    assert quarantine.reset_breaker(admin_user) is False
    assert quarantine.breaker_open() is None
    assert Alert.objects.get(pk=alert.pk).state == AlertState.RESOLVED
    reset = AuditEvent.objects.get(event_type="health.breaker_reset")
    assert (reset.actor, reset.message) == (admin_user, "automatic fencing back on: rack fixed")
    assert fence(gpus[3], policy) is True


def test_the_breaker_follows_the_share_on_a_big_fleet(boxes, policy, settings):
    """48 GPUs at 10%: the limit is 4.8, above the minimum of 3; the fifth trips it."""
    fleet = boxes(12)
    gpus = [node.gpu(index) for node in fleet[:2] for index in range(4)]
    assert [fence(gpu, policy) for gpu in gpus[:5]] == [True, True, True, True, False]
    assert (quarantine.breaker_open().falling, quarantine.breaker_open().fleet) == (5, 48)
    assert Quarantine.objects.count() == 4


def test_fences_older_than_the_window_do_not_count(box, policy, settings):
    settings.GPUADMIN_BREAKER_MIN_GPUS = 1
    first, second = box.gpu(0), box.gpu(1)
    assert fence(first, policy) is True
    Quarantine.objects.update(opened_at=timezone.now() - timedelta(seconds=301))
    assert fence(second, policy) is True
    assert quarantine.breaker_open() is None


# --------------------------------------------------------------------------- probation


def test_probation_returns_the_gpu_after_a_clean_period(box, policy):
    gpu = box.gpu(1)
    fence(gpu, policy)
    now = timezone.now()
    assert quarantine.review(now).changed == {Q.PROBATION: [open_quarantine(gpu).pk]}
    on_probation = open_quarantine(gpu)
    assert on_probation.probation_until == now + timedelta(seconds=60)
    assert box.gpu(1).state == GpuState.DEGRADED  # still fenced while on probation
    assert quarantine.review(now + timedelta(seconds=59)).changed == {}
    assert quarantine.review(now + timedelta(seconds=61)).changed == {Q.RETURNED: [on_probation.pk]}
    assert box.gpu(1).state == GpuState.AVAILABLE
    assert gpu.pk in set(Gpu.objects.schedulable().values_list("pk", flat=True))
    assert Quarantine.objects.get(pk=on_probation.pk).closed_at is not None
    assert quarantine_rows(gpu) == [
        (None, "fenced", "health"),
        ("fenced", "probation", "health"),
        ("probation", "returned", "health"),
    ]
    back = AuditEvent.objects.filter(event_type="gpu.state_changed").latest("pk")
    assert (back.actor_name, back.after, back.message) == (
        "health",
        {"state": "available"},
        "probation passed (60 s clean)",
    )


def test_a_new_fault_during_probation_fences_again(box, policy):
    gpu = box.gpu(1)
    fence(gpu, policy)
    now = timezone.now()
    quarantine.review(now)
    event(gpu)  # the same XID again
    assert quarantine.review(now + timedelta(seconds=61)).changed == {
        Q.FENCED: [open_quarantine(gpu).pk]
    }
    assert box.gpu(1).state == GpuState.DEGRADED
    # A fault of another kind fences again at once (the policy engine calls fence()).
    later = timezone.now()
    quarantine.review(later)
    assert open_quarantine(gpu).state == Q.PROBATION
    assert fence(gpu, None, kind=EventKind.ECC_UNCORRECTED, xid=None) is False
    assert open_quarantine(gpu).state == Q.FENCED
    assert Quarantine.objects.filter(gpu=gpu).count() == 1


def test_a_reset_under_way_holds_probation_back(box, policy):
    gpu = box.gpu(0)
    fence(gpu, policy)
    set_gpu_state(gpu, GpuState.RESETTING, actor_name="health", reason="reset by policy")
    assert quarantine.review().changed == {}
    assert open_quarantine(gpu).gpu_state == GpuState.RESETTING  # followed, not released
    set_gpu_state(gpu, GpuState.DEGRADED, actor_name="health", reason="reset done")
    assert quarantine.review().changed == {Q.PROBATION: [open_quarantine(gpu).pk]}


def test_health_bringing_the_gpu_back_itself_closes_the_quarantine_as_returned(box, policy):
    gpu = box.gpu(0)
    fence(gpu, policy)
    set_gpu_state(gpu, GpuState.RESETTING, actor_name="health")
    set_gpu_state(gpu, GpuState.AVAILABLE, actor_name="health", reason="reset done")
    assert quarantine.review().changed == {Q.RETURNED: [Quarantine.objects.get().pk]}
    assert Quarantine.objects.get().state == Q.RETURNED


def test_a_lost_gpu_waits_until_it_answers_again(box):
    gpu = box.gpu(2)
    lost = RecoveryPolicy.objects.create(name="lost", kind=EventKind.GPU_LOST, probation_s=30)
    faults.fall_off_bus(box.sim, None, 2)
    box.publish()
    assert fence(gpu, lost, GpuState.OFFLINE, kind=EventKind.GPU_LOST, xid=None) is True
    assert quarantine.review().changed == {}  # its sample carries GPU_IS_LOST
    faults.clear(box.sim, None, 2)
    faults.fail_queries(box.sim, None, 2)  # back on the bus, but NVML still fails on it
    box.publish()
    assert quarantine.review().changed == {}
    faults.clear(box.sim, None, 2)
    box.publish()
    assert quarantine.review().changed == {Q.PROBATION: [open_quarantine(gpu).pk]}


def test_a_gpu_off_the_bus_waits_for_a_reset_or_a_person_past_its_probation(
    box, admin_user, admin_client
):
    """The shipped XID 79 policy: the GPU answers NVML again, yet stays out of service past
    its probation; a reset that succeeds starts probation, a person may return it at once."""
    fallen = RecoveryPolicy.objects.get(kind=EventKind.XID, xid=79, enabled=True)
    before = timezone.now() - timedelta(seconds=5)
    gpus = [box.gpu(2), box.gpu(3)]
    for gpu in gpus:
        assert fence(gpu, fallen, GpuState.OFFLINE, xid=79, occurred_at=before) is True
    box.publish()  # back on the bus: its samples carry no error
    now = timezone.now()
    for moment in (now, now + timedelta(seconds=fallen.probation_s + 60)):
        assert quarantine.review(moment).changed == {}
    assert [box.gpu(gpu.index).state for gpu in gpus] == [GpuState.OFFLINE] * 2
    waits = (
        "waits for a GPU reset before probation: XID 79 needs a reset or node reboot "
        "(or a person returns it)"
    )
    assert quarantine.waiting_for(open_quarantine(gpus[0])) == waits
    page = admin_client.get(f"/gpus/{gpus[0].uuid}/").content.decode()
    assert f'<p class="quarantine-waits" data-waiting-for>W{waits[1:]}.</p>' in page
    # A reset through its agent (health's own) that succeeds starts probation.
    resets.start_reset(gpus[0], reason="reset by policy")
    assert quarantine.waiting_for(open_quarantine(gpus[0])) == "waits for its GPU reset to end"
    assert resets.finish_reset(box.hostname, gpus[0].uuid, None, None)
    assert box.gpu(2).state == GpuState.DEGRADED  # still out of service
    moved = quarantine.review(now)
    assert moved.changed == {Q.PROBATION: [open_quarantine(gpus[0]).pk]}
    later = now + timedelta(seconds=fallen.probation_s + 1)
    assert quarantine.review(later).changed == {Q.RETURNED: moved.changed[Q.PROBATION]}
    assert box.gpu(2).state == GpuState.AVAILABLE
    assert quarantine_rows(gpus[0]) == [
        (None, "fenced", "health"),
        ("fenced", "fenced", "health"),  # followed to resetting
        ("fenced", "fenced", "health"),  # the reset done
        ("fenced", "probation", "health"),
        ("probation", "returned", "health"),
    ]
    # A person returns the other by hand (after a node reboot).
    assert quarantine.release(open_quarantine(gpus[1]), actor=admin_user, reason="rebooted")
    assert box.gpu(3).state == GpuState.AVAILABLE


def test_a_hot_gpu_waits_until_it_is_cooler_by_the_hysteresis(box, settings):
    settings.GPUADMIN_THERMAL_HYSTERESIS_C = 5
    thermal = RecoveryPolicy.objects.create(
        name="hot", kind=EventKind.THERMAL, threshold=85, probation_s=30
    )
    gpu = box.gpu(3)
    faults.set_temperature(box.sim, None, 3, 92)
    box.publish()
    assert fence(gpu, thermal, GpuState.DRAINING, kind=EventKind.THERMAL, xid=None) is True
    for celsius, state in ((84, Q.FENCED), (80, Q.FENCED), (79, Q.PROBATION), (81, Q.FENCED)):
        faults.set_temperature(box.sim, None, 3, celsius)
        box.publish()
        quarantine.review()
        assert open_quarantine(gpu).state == state, celsius


# --------------------------------------------------------------------------- flapping


def test_a_flapping_gpu_is_held_for_a_person(box, policy, admin_user, settings):
    settings.GPUADMIN_FLAP_LIMIT = 3
    gpu = box.gpu(1)
    for _ in range(2):
        fence(gpu, policy)
        now = timezone.now()
        quarantine.review(now)
        quarantine.review(now + timedelta(seconds=61))
        assert box.gpu(1).state == GpuState.AVAILABLE
    fence(gpu, policy)
    held = open_quarantine(gpu)
    assert held.state == Q.HELD
    alert = Alert.objects.get(fingerprint=quarantine.flapping_fingerprint(gpu))
    assert alert.summary.startswith(f"GPU flapping: GPU 1 of {box.hostname} quarantined 3 times")
    assert alert.state == AlertState.FIRING
    assert quarantine.review(timezone.now() + timedelta(days=2)).changed == {}
    assert box.gpu(1).state == GpuState.DEGRADED
    # A person releases it: back in service, the alert resolved.
    assert quarantine.release(held, actor=admin_user, reason="reseated") is True
    assert (held.state, box.gpu(1).state) == (Q.RELEASED, GpuState.AVAILABLE)
    assert Alert.objects.get(pk=alert.pk).state == AlertState.RESOLVED
    assert quarantine.release(held, actor=admin_user, reason="again") is False
    released = AuditEvent.objects.filter(event_type="gpu.quarantine_changed").latest("pk")
    assert (released.actor, released.message) == (admin_user, "released by admin: reseated")


# --------------------------------------------------------------------------- people decide


def test_an_admins_online_or_offline_releases_the_quarantine_at_once(
    box, policy, admin_user, django_capture_on_commit_callbacks
):
    first, second = box.gpu(0), box.gpu(1)
    fence(first, policy)
    fence(second, policy)
    with django_capture_on_commit_callbacks(execute=True):
        set_gpu_state(first, GpuState.AVAILABLE, actor=admin_user, reason="checked")
        set_gpu_state(second, GpuState.OFFLINE, actor=admin_user, reason="RMA")
    assert set(Quarantine.objects.values_list("state", flat=True)) == {Q.RELEASED}
    release = AuditEvent.objects.filter(event_type="gpu.quarantine_changed").latest("pk")
    assert release.message == f"GPU 1 of {box.hostname} was set to offline (RMA) by a person"
    assert box.gpu(1).state == GpuState.OFFLINE  # and it stays so


def test_review_never_overrides_a_persons_later_decision(box, policy, admin_user):
    """The admin drains the GPU during probation (no signal for a drain): the next review
    releases the quarantine and leaves the GPU draining, never available."""
    gpu = box.gpu(1)
    fence(gpu, policy)
    now = timezone.now()
    quarantine.review(now)
    set_gpu_state(gpu, GpuState.DRAINING, actor=admin_user, reason="keep it out")
    assert quarantine.review(now + timedelta(seconds=61)).changed == {
        Q.RELEASED: [Quarantine.objects.get().pk]
    }
    assert box.gpu(1).state == GpuState.DRAINING
    assert Quarantine.objects.get().state == Q.RELEASED


def test_expect_refuses_the_return_when_the_gpu_moved_under_the_lock(box, policy, admin_user):
    """The last line of defence: ``set_gpu_state(..., expect={fenced state})``."""
    from inventory.services import IllegalGpuTransition

    gpu = box.gpu(1)
    fence(gpu, policy)
    set_gpu_state(gpu, GpuState.OFFLINE, actor=admin_user)
    with pytest.raises(IllegalGpuTransition):
        set_gpu_state(
            gpu, GpuState.AVAILABLE, actor_name="health", expect={open_quarantine(gpu).gpu_state}
        )


def test_the_review_runs_every_ten_seconds_on_beat(settings):
    from health import tasks  # noqa: F401 - registers them, as the worker's autodiscovery does

    entry = settings.CELERY_BEAT_SCHEDULE["health-review-quarantines"]
    assert (entry["task"], entry["schedule"]) == ("health.review_quarantines", 10.0)
    assert "health.review_quarantines" in app.tasks
