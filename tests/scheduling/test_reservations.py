"""Reservations: requests checked against the fleet, auto-approval within quota, GPUs chosen
and held (the database refusing overlaps), the decisions, the windows the loop reads, and the
sweep that ends, expires and releases unused reservations (reported by an alert)."""

from __future__ import annotations

from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from health.choices import AlertState
from health.models import Alert
from inventory.models import Gpu, Node, Pool
from scheduling import placement
from scheduling.allocations import services as allocation_services
from scheduling.jobs import submission
from scheduling.loop import passes as loop
from scheduling.loop import snapshot as loop_snapshot
from scheduling.models import (
    Job,
    JobState,
    PoolPolicy,
    Quota,
    Reservation,
    ReservationGpu,
    ReservationState,
)
from scheduling.reservations import services as reservations
from scheduling.reservations.services import ReservationConflict, ReservationInvalid
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


@pytest.fixture
def fleet(broker) -> list[Node]:
    return [add_sim_node("dgx-01"), add_sim_node("dgx-02")]


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_user("root", is_staff=True)


def soon(hours: float = 1) -> datetime:
    return timezone.now().replace(microsecond=0) + timedelta(hours=hours)


def held(reservation: Reservation) -> list[str]:
    """``host:index`` of the GPUs the reservation holds."""
    holds = ReservationGpu.objects.filter(reservation=reservation).select_related("gpu__node")
    return sorted(f"{h.gpu.node.hostname}:{h.gpu.index}" for h in holds)


def events(reservation: Reservation) -> list[str]:
    return list(
        AuditEvent.objects.filter(
            target_type="scheduling.reservation", target_id=str(reservation.pk)
        )
        .order_by("pk")
        .values_list("event_type", flat=True)
    )


def shift(reservation: Reservation, back: timedelta) -> None:
    """Move the reservation's window (and its holds) ``back`` in time: as if it started
    earlier, without waiting."""
    Reservation.objects.filter(pk=reservation.pk).update(
        start=F("start") - back, end=F("end") - back
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE scheduling_reservationgpu SET during = tstzrange(lower(during) - %s, "
            "upper(during) - %s, '[)') WHERE reservation_id = %s",
            [back, back, reservation.pk],
        )
    reservation.refresh_from_db()


# --------------------------------------------------------------------------- requests


def test_a_request_within_quota_is_approved_on_one_node_and_numa_node(fleet, alice):
    reservation = reservations.request(alice, 4, soon(1), soon(5))
    assert reservation.state == ReservationState.APPROVED
    assert reservation.message == "approved automatically: within quota"
    assert held(reservation) == ["dgx-01:0", "dgx-01:1", "dgx-01:2", "dgx-01:3"]
    assert events(reservation) == ["reservation.requested", "reservation.approved"]
    approved = AuditEvent.objects.get(event_type="reservation.approved")
    assert (approved.actor_name, len(approved.after["gpus"])) == ("alice", 4)


def test_gpus_are_picked_on_the_fullest_node_in_one_numa_node(fleet, alice):
    """A DGX A100 pairs its GPUs per NUMA node (0-1, 2-3, ...): with GPU 0 taken, two GPUs go
    to one NUMA node of dgx-01 (the node with fewer free GPUs), not GPUs 1 and 2."""
    first = Gpu.objects.get(node__hostname="dgx-01", index=0)
    reservations.request(alice, 1, soon(1), soon(5), gpus=[first])
    reservation = reservations.request(alice, 2, soon(1), soon(5))
    assert held(reservation) == ["dgx-01:2", "dgx-01:3"]
    gpus = Gpu.objects.filter(reservation_holds__reservation=reservation)
    assert len({gpu.numa_node for gpu in gpus}) == 1


def test_a_pool_without_auto_approval_waits_for_an_admin_who_approves(fleet, alice, root):
    pool = Pool.objects.create(name="research")
    Node.objects.filter(hostname="dgx-02").update(pool=pool)
    PoolPolicy.objects.create(pool=pool, reservation_auto_approve=False)
    reservation = reservations.request(alice, 2, soon(1), soon(2), pool=pool)
    assert reservation.state == ReservationState.REQUESTED
    assert reservation.message == (
        "waiting for an admin: reservations in pool research need an admin's approval"
    )
    assert held(reservation) == []
    reservations.approve(reservation, root)
    assert (reservation.state, reservation.decided_by) == (ReservationState.APPROVED, root)
    assert held(reservation) == ["dgx-02:0", "dgx-02:1"]  # the pool's node
    assert events(reservation) == ["reservation.requested", "reservation.approved"]


def test_over_quota_waits_for_an_admin_saying_why(fleet, alice):
    Quota.objects.create(user=alice, max_gpus=2)
    reservation = reservations.request(alice, 4, soon(1), soon(2))
    assert reservation.state == ReservationState.REQUESTED
    assert reservation.message.startswith("waiting for an admin: user alice may use 2 GPUs")


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"end": soon(0.5)}, "end", "must be after the start"),
        ({"start": soon(-1)}, "start", "is in the past"),
        ({"start": soon(24 * 400), "end": soon(24 * 401)}, "start", "at most 365 days ahead"),
        ({"end": soon(24 * 40)}, "end", "a reservation lasts at most 31 days"),
        ({"gpu_count": 17}, "gpu_count", "17 GPUs, but the GPUs in no pool has 16 GPUs"),
        (
            {"gpu_model": "Tesla T4"},
            "gpu_model",
            "no reservable GPU of model 'Tesla T4' in the GPUs in no pool; there are: NVIDIA A100",
        ),
        ({"note": "a\x00b"}, "note", "Null characters are not allowed."),
    ],
)
def test_a_request_that_can_never_be_granted_names_the_field(fleet, alice, change, field, message):
    asked = {"gpu_count": 1, "start": soon(1), "end": soon(2), **change}
    with pytest.raises(ReservationInvalid) as refused:
        reservations.request(alice, **asked)
    assert refused.value.field == field
    assert refused.value.message.startswith(message)
    assert not Reservation.objects.exists()


def test_a_node_without_reservable_gpus_is_named(fleet, alice):
    research = Pool.objects.create(name="research")
    Gpu.objects.filter(node=fleet[1]).update(pool=research)
    asked = {"gpu_count": 1, "start": soon(1), "end": soon(2), "node": fleet[1]}
    with pytest.raises(ReservationInvalid) as refused:
        reservations.request(alice, **asked)
    assert (refused.value.field, refused.value.message) == (
        "node",
        "dgx-02 has no reservable GPU in the GPUs in no pool",
    )
    with pytest.raises(ReservationInvalid) as refused:
        reservations.request(alice, **asked, pool=research, gpu_model="Tesla T4")
    assert refused.value.field == "gpu_model"
    assert refused.value.message.startswith(
        "no reservable GPU of model 'Tesla T4' in pool research on dgx-02; there are: NVIDIA A100"
    )
    assert not Reservation.objects.exists()


def test_named_gpus_must_be_in_the_pool_and_counted(fleet, alice):
    pool = Pool.objects.create(name="research")
    inside = Gpu.objects.get(node__hostname="dgx-01", index=0)
    outside = Gpu.objects.get(node__hostname="dgx-02", index=0)
    Gpu.objects.filter(pk=inside.pk).update(pool=pool)
    with pytest.raises(ReservationInvalid) as refused:
        reservations.request(alice, 2, soon(1), soon(2), pool=pool, gpus=[inside, outside])
    assert (refused.value.field, refused.value.message) == (
        "gpus",
        f"not reservable in pool research: {outside.uuid}",
    )
    with pytest.raises(ReservationInvalid) as refused:
        reservations.request(alice, 2, soon(1), soon(2), pool=pool, gpus=[inside])
    assert refused.value.field == "gpu_count"
    reservation = reservations.request(alice, 1, soon(1), soon(2), pool=pool, gpus=[inside])
    assert held(reservation) == ["dgx-01:0"]


def test_overlapping_windows_get_other_gpus_until_none_is_free(fleet, alice):
    first = reservations.request(alice, 8, soon(1), soon(3))
    second = reservations.request(alice, 8, soon(2), soon(4))
    assert {h.split(":")[0] for h in held(first)} != {h.split(":")[0] for h in held(second)}
    with pytest.raises(ReservationConflict) as refused:
        reservations.request(alice, 1, soon(2.5), soon(5))
    assert str(refused.value).startswith("no 1 free GPU in the GPUs in no pool for ")
    assert str(refused.value).endswith(": 0 free")
    assert Reservation.objects.count() == 2  # the refused request left nothing
    after = reservations.request(alice, 16, soon(4), soon(5))  # [4, 5) touches [2, 4) only
    assert after.state == ReservationState.APPROVED


def test_named_gpus_already_reserved_are_refused(fleet, alice):
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=3)
    reservations.request(alice, 1, soon(1), soon(2), gpus=[gpu])
    with pytest.raises(ReservationConflict, match=f"{gpu.uuid} is already reserved"):
        reservations.request(alice, 1, soon(1.5), soon(3), gpus=[gpu])


def test_a_hold_lost_to_a_race_is_tried_again_on_other_gpus(fleet, alice, monkeypatch):
    """Another approval takes the chosen GPUs between the choice and the insert: the
    constraint refuses them and the next choice holds others."""
    rival = reservations.request(alice, 4, soon(10), soon(11))
    real = reservations.choose_gpus
    calls = []

    def stale_choice(reservation: Reservation) -> list[Gpu]:
        calls.append(reservation.pk)
        if len(calls) == 1:  # as read before the rival's holds were committed
            return list(Gpu.objects.filter(reservation_holds__reservation=rival))
        return real(reservation)

    monkeypatch.setattr(reservations, "choose_gpus", stale_choice)
    reservation = reservations.request(alice, 4, soon(10), soon(12))
    assert len(calls) == 2
    assert set(held(reservation)).isdisjoint(held(rival))


def running_on(owner, gpus: list[Gpu], max_runtime_s: int | None) -> Job:
    """A job holding ``gpus`` that started now, with that maximum runtime."""
    job = submission.submit_job(
        owner, command=["sleep", "1"], gpu_count=len(gpus), max_runtime_s=max_runtime_s
    )
    allocation_services.allocate(job, [gpu.pk for gpu in gpus], actor=owner)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, started_at=timezone.now())
    job.refresh_from_db()
    return job


def test_gpus_that_work_may_still_hold_at_the_start_are_not_chosen(fleet, alice):
    """As Slurm refuses busy nodes: a job with no maximum runtime, or one running past the
    window's start, keeps its GPUs out of the choice; one sure to end before it does not."""
    dgx01 = list(Gpu.objects.filter(node__hostname="dgx-01").order_by("index"))
    forever = running_on(alice, dgx01[:4], None)
    long = running_on(alice, dgx01[4:6], 4 * 3600)
    running_on(alice, dgx01[6:], 1800)  # gone in half an hour
    reservation = reservations.request(alice, 2, soon(1), soon(2))
    assert held(reservation) == ["dgx-01:6", "dgx-01:7"]
    with pytest.raises(ReservationConflict) as refused:
        reservations.request(alice, 2, soon(1), soon(2), gpus=[dgx01[0], dgx01[4]])
    assert str(refused.value) == (
        f"in use at the start of the window: {dgx01[0].uuid} by job {forever.pk}, which has "
        f"no maximum runtime; {dgx01[4].uuid} by job {long.pk} until "
        f"{reservations.moment_text(long.started_at + timedelta(hours=4))}"
    )
    later = reservations.request(alice, 2, soon(5), soon(6), gpus=dgx01[4:6])
    assert held(later) == ["dgx-01:4", "dgx-01:5"]  # after the long job's maximum runtime
    assert Reservation.objects.count() == 2


def test_named_gpus_no_longer_reservable_at_approval_are_refused(fleet, alice, root):
    PoolPolicy.objects.create(pool=None, reservation_auto_approve=False)
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=0)
    reservation = reservations.request(alice, 1, soon(1), soon(2), gpus=[gpu])
    Gpu.objects.filter(pk=gpu.pk).update(mps_shared=True)  # after the request
    with pytest.raises(ReservationConflict, match=f"{gpu.uuid} no longer reservable"):
        reservations.approve(reservation, root)
    reservation.refresh_from_db()
    assert (reservation.state, held(reservation)) == (ReservationState.REQUESTED, [])


def test_a_placement_committed_after_an_approval_meets_its_holds(fleet, alice):
    """The loop read the fleet, then a reservation took the GPUs it chose: the commit, which
    reads the windows with the GPU rows locked, refuses the placement."""
    job = submission.submit_job(alice, command=["true"], gpu_count=8)
    read = loop_snapshot.read_pass_input()
    result = placement.plan(read.snapshot)
    [decision] = result.placements
    [(_host, gpu_ids)] = decision.by_node
    reservations.request(alice, 8, soon(0.5), soon(2), gpus=Gpu.objects.filter(pk__in=gpu_ids))
    assert loop.commit_placements(result.placements, read.slots) == ([], 1)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_a_manual_allocation_keeps_to_the_reservations_the_pool_and_the_share(fleet, alice, root):
    """The rules the engine places by hold for an operator's allocation too."""
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=0)
    reservations.request(alice, 1, soon(0.5), soon(2), gpus=[gpu])
    job = submission.submit_job(alice, command=["true"], max_runtime_s=7200)
    with pytest.raises(allocation_services.AllocationRefused, match="held by a reservation"):
        allocation_services.allocate(job, [gpu.pk], actor=root, manual=True)
    other = Gpu.objects.get(node__hostname="dgx-02", index=0)
    Gpu.objects.filter(pk=other.pk).update(pool=Pool.objects.create(name="research"))
    with pytest.raises(allocation_services.AllocationRefused, match="outside the job's pool"):
        allocation_services.allocate(job, [other.pk], actor=root, manual=True)
    mig_job = submission.submit_job(alice, command=["true"], mig_profile="1g.10gb")
    spare = Gpu.objects.get(node__hostname="dgx-02", index=1)
    with pytest.raises(
        allocation_services.AllocationRefused, match="asks for a MIG device, not whole"
    ):
        allocation_services.allocate(mig_job, [spare.pk], actor=root, manual=True)
    short = submission.submit_job(alice, command=["true"], max_runtime_s=600)
    allocation_services.allocate(short, [gpu.pk], actor=root, manual=True)  # gone before the window
    assert short.state == JobState.SCHEDULED


def test_pick_gpus_prefers_one_node_then_one_numa_node_then_the_fullest_node():
    def gpu(host: str, index: int, numa: int | None) -> SimpleNamespace:
        return SimpleNamespace(node=SimpleNamespace(hostname=host), index=index, numa_node=numa)

    a = [gpu("a", i, i // 4) for i in range(8)]  # two NUMA nodes of 4
    b = [gpu("b", i, None) for i in (1, 2, 5)]  # NUMA unknown, 3 free
    c = [gpu("c", i, 0) for i in (0, 6)]
    picked = reservations.pick_gpus
    assert [(g.node.hostname, g.index) for g in picked([*b, *a, *c], 3)] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
    ]
    assert [(g.node.hostname, g.index) for g in picked([*b, *c], 2)] == [("c", 0), ("c", 6)]
    assert [(g.node.hostname, g.index) for g in picked([*b, *c], 3)] == [
        ("b", 1),
        ("b", 2),
        ("b", 5),
    ]
    assert [(g.node.hostname, g.index) for g in picked([*b, *c], 4)] == [
        ("b", 1),
        ("b", 2),
        ("b", 5),
        ("c", 0),
    ]


# --------------------------------------------------------------------------- decisions


def test_reject_cancel_and_the_states_that_refuse_them(fleet, alice, root):
    PoolPolicy.objects.create(pool=None, reservation_auto_approve=False)
    waiting = reservations.request(alice, 1, soon(1), soon(2))
    reservations.reject(waiting, root, "not this week")
    assert (waiting.state, waiting.message) == (ReservationState.REJECTED, "not this week")
    with pytest.raises(ReservationConflict, match="is rejected: it cannot be approved"):
        reservations.approve(waiting, root)
    with pytest.raises(ReservationConflict, match="is rejected: it cannot be canceled"):
        reservations.cancel(waiting, alice)
    assert events(waiting) == ["reservation.requested", "reservation.rejected"]


@pytest.mark.parametrize(
    ("action", "state"),
    [
        ("reject_reservations", ReservationState.REJECTED),
        ("cancel_reservations", ReservationState.CANCELED),
    ],
)
def test_the_admins_reason_actions_decide_each_and_name_the_refused(
    fleet, alice, root, admin_client, action, state
):
    PoolPolicy.objects.create(pool=None, reservation_auto_approve=False)
    waiting = reservations.request(alice, 1, soon(1), soon(2))
    decided = reservations.request(alice, 1, soon(3), soon(4))
    reservations.reject(decided, root)
    form = {"action": action, "_selected_action": [waiting.pk, decided.pk]}

    response = admin_client.post(
        "/admin/scheduling/reservation/", {**form, "apply": "1", "reason": "maintenance"}
    )

    assert response.status_code == 302
    waiting.refresh_from_db()
    assert (waiting.state, waiting.message) == (state, "maintenance")
    said = [str(m) for m in admin_client.get("/admin/scheduling/reservation/").context["messages"]]
    assert said[0].endswith(": 1 done.")
    assert f"reservation {decided.pk} is rejected: it cannot be" in said[1]


def test_canceling_before_the_start_frees_the_gpus(fleet, alice):
    reservation = reservations.request(alice, 16, soon(1), soon(2))
    reservations.cancel(reservation, alice)
    assert (reservation.state, reservation.message) == (
        ReservationState.CANCELED,
        "canceled by alice",
    )
    assert held(reservation) == []
    assert reservations.request(alice, 16, soon(1), soon(2)).state == ReservationState.APPROVED
    assert events(reservation)[-1] == "reservation.canceled"


def test_a_started_reservation_is_released_not_canceled(fleet, alice):
    reservation = reservations.request(alice, 16, soon(0), soon(4))
    shift(reservation, HOUR)
    with pytest.raises(ReservationConflict, match="release it instead"):
        reservations.cancel(reservation, alice)
    reservations.release(reservation, actor=alice)
    assert reservation.state == ReservationState.RELEASED
    hold = ReservationGpu.objects.filter(reservation=reservation).first()
    assert hold.during.upper == reservation.released_at
    # The rest of the window is free for others.
    assert reservations.request(alice, 16, soon(0.01), soon(3)).state == ReservationState.APPROVED
    assert events(reservation)[-1] == "reservation.released"


def test_release_refuses_a_reservation_not_running(fleet, alice):
    reservation = reservations.request(alice, 1, soon(1), soon(2))
    with pytest.raises(ReservationConflict, match="is not running now: cancel it instead"):
        reservations.release(reservation, actor=alice)


def test_the_admins_release_action_releases_the_running_and_names_the_others(
    fleet, alice, admin_client
):
    running = reservations.request(alice, 2, soon(0), soon(4))
    shift(running, HOUR)
    later = reservations.request(alice, 1, soon(1), soon(2))
    form = {"action": "release_reservations", "_selected_action": [running.pk, later.pk]}

    response = admin_client.post(
        "/admin/scheduling/reservation/", {**form, "apply": "1", "reason": "node maintenance"}
    )

    assert response.status_code == 302
    running.refresh_from_db()
    assert (running.state, running.message) == (ReservationState.RELEASED, "node maintenance")
    later.refresh_from_db()
    assert later.state == ReservationState.APPROVED
    said = [str(m) for m in admin_client.get("/admin/scheduling/reservation/").context["messages"]]
    assert said[0].endswith(": 1 done.")
    assert f"reservation {later.pk} is not running now: cancel it instead" in said[1]
    assert events(running)[-1] == "reservation.released"


# --------------------------------------------------------------------------- the loop


def test_reservation_windows_are_the_approved_ones_not_over(fleet, alice, root):
    now = timezone.now()
    approved = reservations.request(alice, 2, soon(1), soon(2))
    reservations.cancel(reservations.request(alice, 1, soon(1), soon(2)), alice)
    over = reservations.request(alice, 1, soon(0), soon(1))
    shift(over, 2 * HOUR)
    (window,) = allocation_services.reservation_windows(now)
    assert window.id == approved.pk
    assert window.owner == str(alice.pk)
    assert window.gpu_ids == tuple(
        sorted(ReservationGpu.objects.filter(reservation=approved).values_list("gpu_id", flat=True))
    )
    assert (window.start, window.end) == (approved.start.timestamp(), approved.end.timestamp())


# --------------------------------------------------------------------------- the sweep


def test_the_sweep_ends_finished_and_expires_undecided_reservations(fleet, alice):
    finished = reservations.request(alice, 1, soon(0), soon(1))
    PoolPolicy.objects.create(pool=None, reservation_auto_approve=False)
    undecided = reservations.request(alice, 1, soon(0), soon(1))
    shift(finished, 2 * HOUR)
    shift(undecided, 2 * HOUR)
    done = reservations.sweep()
    assert (done.ended, done.expired) == ([finished.pk], [undecided.pk])
    finished.refresh_from_db()
    undecided.refresh_from_db()
    assert finished.state == ReservationState.ENDED
    assert (undecided.state, undecided.message) == (
        ReservationState.REJECTED,
        "nobody decided before its window ended",
    )
    assert AuditEvent.objects.get(event_type="reservation.ended").actor_name == "reservations"
    assert reservations.sweep().ended == []


def test_an_unused_reservation_is_released_after_the_grace_and_reported(fleet, alice):
    reservation = reservations.request(alice, 2, soon(0), soon(3))
    shift(reservation, timedelta(minutes=10))
    assert reservations.sweep().released == []  # inside the 15 minutes' grace
    shift(reservation, timedelta(minutes=10))
    assert reservations.sweep().released == [reservation.pk]
    reservation.refresh_from_db()
    assert reservation.state == ReservationState.RELEASED
    assert reservation.message == (
        "released unused: no job of it ran in the 15 minutes after its start"
    )
    alert = Alert.objects.get(fingerprint=f"reservation-unused:{reservation.pk}")
    assert alert.state == AlertState.FIRING
    assert alert.summary.startswith(
        f"Reservation {reservation.pk} of alice released unused: dgx-01 GPUs 0-1 free until "
    )
    assert alert.node.hostname == "dgx-01"
    assert events(reservation)[-1] == "reservation.released"
    # The alert resolves once the window would have ended.
    shift(reservation, 3 * HOUR)
    assert reservations.sweep().alerts_resolved == 1
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED


def test_a_reservation_a_job_ran_on_is_kept_and_its_first_use_noted(fleet, alice):
    reservation = reservations.request(alice, 1, soon(0), soon(3))
    shift(reservation, timedelta(minutes=30))
    started = reservation.start + timedelta(minutes=5)
    Job.objects.create(
        owner=alice,
        command=["true"],
        reservation=reservation,
        state=JobState.COMPLETED,
        scheduled_at=started,
        started_at=started,
    )
    assert reservations.sweep().released == []
    reservation.refresh_from_db()
    assert (reservation.state, reservation.first_used_at) == (ReservationState.APPROVED, started)


def test_a_pool_grace_of_its_own(fleet, alice):
    PoolPolicy.objects.create(pool=None, reservation_release_after_s=3600)
    reservation = reservations.request(alice, 1, soon(0), soon(3))
    shift(reservation, timedelta(minutes=30))
    assert reservations.sweep().released == []
    shift(reservation, timedelta(minutes=31))
    assert reservations.sweep().released == [reservation.pk]


# --------------------------------------------------------------------------- its jobs


def naming(reservation: Reservation, state: str = JobState.QUEUED) -> Job:
    return Job.objects.create(
        owner=reservation.owner,
        command=["train"],
        reservation=reservation,
        state=state,
        max_runtime_s=600,
    )


def job_events(job: Job) -> list[tuple[str, str, str]]:
    rows = AuditEvent.objects.filter(target_type="scheduling.job", target_id=str(job.pk))
    return list(rows.order_by("pk").values_list("event_type", "actor_name", "message"))


@pytest.mark.parametrize("how", ["cancel", "reject", "release", "sweep-end", "sweep-expire"])
def test_the_jobs_waiting_for_a_reservation_that_ends_leave_the_queue(fleet, alice, root, how):
    """However a reservation ends, its waiting jobs are canceled with the reason (audited,
    in the same transaction); its running and finished jobs are left alone."""
    if how in ("reject", "sweep-expire"):
        PoolPolicy.objects.create(pool=None, reservation_auto_approve=False)
    started = how in ("release", "sweep-end", "sweep-expire")
    reservation = reservations.request(alice, 2, soon(0 if started else 1), soon(2))
    queued, held_back = naming(reservation), naming(reservation, JobState.PENDING)
    running, done = naming(reservation, JobState.RUNNING), naming(reservation, JobState.COMPLETED)
    other = reservations.request(alice, 1, soon(0 if started else 1), soon(2))
    bystander = naming(other)
    if how == "cancel":
        reservations.cancel(reservation, alice)
    elif how == "reject":
        reservations.reject(reservation, root)
    elif how == "release":
        shift(reservation, HOUR / 2)
        reservations.release(reservation, actor=alice)
    else:
        shift(reservation, 3 * HOUR)
        reservations.sweep()
    reservation.refresh_from_db()
    word = reservation.state
    assert word in {"canceled", "rejected", "released", "ended"}

    for job in (queued, held_back):
        before = job.state
        job.refresh_from_db()
        message = f"reservation {reservation.pk} {word}: nothing is left of its window to run in"
        assert (job.state, job.message) == (JobState.CANCELED, message)
        actor = {"cancel": "alice", "reject": "root", "release": "alice"}.get(how, "reservations")
        assert job_events(job)[-1] == ("job.canceled", actor, message)
        mine = AuditEvent.objects.filter(target_type="scheduling.job", target_id=str(job.pk))
        assert mine.last().before == {"state": before}
    for job, state in ((running, JobState.RUNNING), (done, JobState.COMPLETED)):
        job.refresh_from_db()
        assert job.state == state
    bystander.refresh_from_db()
    assert bystander.state == JobState.QUEUED


def test_an_approval_leaves_the_jobs_queued(fleet, alice, root):
    PoolPolicy.objects.create(pool=None, reservation_auto_approve=False)
    reservation = reservations.request(alice, 1, soon(1), soon(2))
    job = naming(reservation)
    reservations.approve(reservation, root)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_work_in_its_owners_reservation_is_not_borrowed_and_counts_in_the_quota(
    fleet, alice, django_capture_on_commit_callbacks
):
    """Alice at her quota (1 GPU, held outside her reservation): her job in her running
    reservation is placed on it, not borrowed (so never reclaimed as borrowed), and its
    allocation counts as her use."""
    from scheduling.policies.quotas import limits_of

    reservation = reservations.request(alice, 1, soon(0), soon(2))
    outside = Gpu.objects.schedulable().exclude(reservation_holds__reservation=reservation)[0]
    elsewhere = Job.objects.create(owner=alice, command=["train"], state=JobState.QUEUED)
    allocation_services.allocate(elsewhere, [outside.pk], actor=alice)
    quota = Quota.objects.create(user=alice, max_gpus=1)
    inside = naming(reservation)
    with django_capture_on_commit_callbacks(execute=True):
        loop.run_pass()
    inside.refresh_from_db()
    assert inside.state == JobState.SCHEDULED
    assert not inside.borrowed
    assert "borrowed" not in inside.placement["explanation"]
    [allocation] = inside.allocations.all()
    assert not allocation.borrowed
    assert held(reservation) == [f"{allocation.gpu.node.hostname}:{allocation.gpu.index}"]
    assert limits_of([quota], timezone.now())[quota.pk].gpus_in_use == 2
