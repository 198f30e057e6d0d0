"""Reservation windows: nobody runs into one; inside it, only its holder's jobs."""

from __future__ import annotations

from scheduling.placement import JobRequest, PoolConfig, QuotaLimit, Reason, ReservationWindow
from scheduling.placement.reservations import ReservationBook
from tests.scheduling.placement.builders import NOW, Fleet, job, pending, placed

HOUR = 3600.0


def reserved_fleet(start: float, end: float) -> tuple[Fleet, ReservationWindow]:
    """dgx-01 (reserved by alice for [start, end)) and dgx-02, busy for two hours."""
    fleet = Fleet()
    gpus = fleet.dgx("dgx-01")
    fleet.dgx("dgx-02", busy=range(8), busy_until=NOW + 2 * HOUR)
    window = ReservationWindow(5, "alice", tuple(gpu.id for gpu in gpus), start, end)
    return fleet, window


def test_a_job_sure_to_end_before_the_window_may_use_its_gpus() -> None:
    fleet, window = reserved_fleet(NOW + HOUR, NOW + 3 * HOUR)

    result = fleet.plan(
        job(1, gpus=4, max_runtime_s=HOUR),
        job(2, gpus=4, max_runtime_s=HOUR + 1, estimated_duration_s=60),
        job(3, gpus=4),
        reservations=(window,),
    )

    assert placed(result, 1).nodes == ("dgx-01",)
    for job_id, why in (
        (2, "by its maximum runtime it would still run then"),
        (3, "without a maximum runtime it might still run then"),
    ):
        waiting = pending(result, job_id)
        assert waiting.reason == Reason.RESERVATION
        assert waiting.message == (
            f"reservation 5 holds the GPUs it fits on from 2023-11-14 23:13 UTC, and {why}"
        )


def test_inside_the_window_only_the_holders_jobs_naming_it_run_on_its_gpus() -> None:
    fleet, window = reserved_fleet(NOW - HOUR, NOW + 2 * HOUR)

    result = fleet.plan(
        job(1, gpus=8, max_runtime_s=60),
        job(2, gpus=4, reservation=5, max_runtime_s=HOUR),
        reservations=(window,),
    )

    assert [p.job_id for p in result.placements] == [2]
    assert placed(result, 2).nodes == ("dgx-01",)
    assert pending(result, 1).reason == Reason.RESOURCES_BUSY
    assert pending(result, 1).message == (
        "needs 8 free GPUs on one node; none is free; reservation 5 holds 8 more GPUs until "
        "2023-11-15 00:13 UTC"
    )
    h100 = "NVIDIA H100 80GB HBM3"
    fleet.dgx("dgx-03", h100, busy=range(8), busy_until=NOW + 2 * HOUR)
    other = fleet.plan(job(3, gpus=8, gpu_model=h100), reservations=(window,))
    assert pending(other, 3).reason == Reason.RESOURCES_BUSY
    assert "reservation" not in pending(other, 3).message  # its A100s could never take it


def test_a_job_naming_a_window_waits_for_it_and_must_end_inside_it() -> None:
    later, _ = reserved_fleet(NOW + HOUR, NOW + 3 * HOUR)
    now, window = reserved_fleet(NOW - HOUR, NOW + HOUR)
    running = ReservationWindow(5, "alice", window.gpu_ids, NOW - HOUR, NOW + HOUR)
    upcoming = ReservationWindow(5, "alice", window.gpu_ids, NOW + HOUR, NOW + 3 * HOUR)

    def waits(fleet: Fleet, request: JobRequest, span: ReservationWindow) -> tuple:
        waiting = pending(fleet.plan(request, reservations=(span,)), request.id)
        return waiting.reason, waiting.message, waiting.estimated_start

    assert waits(later, job(1, reservation=5, max_runtime_s=60), upcoming) == (
        Reason.RESERVATION,
        "reservation 5 starts at 2023-11-14 23:13 UTC",
        NOW + HOUR,
    )
    assert waits(now, job(2, reservation=5, max_runtime_s=2 * HOUR), running)[:2] == (
        Reason.RESERVATION,
        "its maximum runtime runs past the end of reservation 5 at 2023-11-14 23:13 UTC",
    )
    assert waits(now, job(3, reservation=5), running)[1] == (
        "needs a maximum runtime to run in reservation 5 (it ends at 2023-11-14 23:13 UTC)"
    )
    assert waits(now, job(4, reservation=5, owner="bob", max_runtime_s=60), running)[1] == (
        "reservation 5 belongs to another user"
    )
    assert waits(now, job(5, reservation=6, max_runtime_s=60), running)[1] == (
        "reservation 6 is not approved, or has ended"
    )


def test_the_rule_one_gpu_at_a_time() -> None:
    window = ReservationWindow(5, "alice", (1, 2), NOW + HOUR, NOW + 2 * HOUR)
    book = ReservationBook([window], NOW)

    assert book.closed(1, job(1))
    assert not book.closed(1, job(2, max_runtime_s=HOUR))
    assert not book.closed(3, job(3))
    assert book.closed(1, job(4, reservation=5, max_runtime_s=60))  # not started yet
    inside = ReservationBook([window], NOW + HOUR)
    assert not inside.closed(1, job(4, reservation=5, max_runtime_s=60))
    assert inside.closed(3, job(4, reservation=5, max_runtime_s=60))
    assert inside.closed(2, job(5, max_runtime_s=60))


def test_work_in_its_owners_reservation_is_neither_over_quota_nor_borrowed() -> None:
    """Alice uses all 4 GPUs of her quota; her job in her own reservation runs on the
    reservation, which the quota admitted when it was approved: not borrowed, not labelled
    so, and counted against her quota for the rest of the pass."""
    fleet, window = reserved_fleet(NOW - HOUR, NOW + 2 * HOUR)
    fleet.dgx("dgx-03")
    at_quota = QuotaLimit(None, ("user", "alice"), max_gpus=4, gpus_in_use=4)

    result = fleet.plan(
        job(1, gpus=4, reservation=5, max_runtime_s=HOUR),
        job(2, gpus=4),
        quotas=(at_quota,),
        reservations=(window,),
        pools={None: PoolConfig(policy="fcfs")},
    )

    inside = placed(result, 1)
    assert inside.nodes == ("dgx-01",)
    assert not inside.borrowed
    assert "borrowed" not in inside.explanation
    # With the 4 in the reservation: her next job is over quota and borrows idle GPUs.
    outside = placed(result, 2)
    assert outside.borrowed
    assert outside.explanation.endswith("borrowed, preemptible: user alice uses 8 of 4 GPUs")
