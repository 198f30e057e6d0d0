"""Concurrent reservations on real PostgreSQL connections (one per thread, all released at
once by a barrier): the exclusion constraint lets exactly one of the overlapping requests
for a GPU win, every loser gets a clean ``ReservationConflict`` (no row of it is left), and
no two holds of one GPU overlap, checked in SQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from inventory.models import Gpu
from scheduling.allocations import services as allocation_services
from scheduling.jobs import submission
from scheduling.models import Quota, Reservation, ReservationGpu, ReservationState
from scheduling.reservations import services as reservations
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db(transaction=True)


def overlapping_holds() -> list[tuple]:
    """Pairs of holds of one GPU whose windows overlap."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT a.gpu_id, a.reservation_id, b.reservation_id
            FROM scheduling_reservationgpu a
            JOIN scheduling_reservationgpu b ON a.gpu_id = b.gpu_id AND a.id < b.id
            WHERE a.during && b.during
            """
        )
        return cursor.fetchall()


def at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run each call in its own thread (its own database connection), all started together;
    what each returned or raised."""
    results: list[Any] = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return results


@pytest.fixture
def people(broker, django_user_model) -> list[Any]:
    add_sim_node("dgx-01")
    add_sim_node("dgx-02")
    return [django_user_model.objects.create_user(f"user{i}") for i in range(16)]


def start_at(hours: int) -> datetime:
    return timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=hours)


def test_one_of_each_set_of_overlapping_requests_for_named_gpus_wins(people):
    """16 requests for the same two GPUs in 4 windows (4 identical requests per window,
    windows back to back): exactly one per window wins."""
    gpus = list(Gpu.objects.filter(node__hostname="dgx-01", index__in=[0, 1]))
    windows = [(start_at(2 + 2 * w), start_at(4 + 2 * w)) for w in range(4)]
    calls = [
        lambda user=user, window=windows[i % 4]: reservations.request(user, 2, *window, gpus=gpus)
        for i, user in enumerate(people)
    ]
    results = at_once(calls)
    won = [r for r in results if isinstance(r, Reservation)]
    lost = [r for r in results if not isinstance(r, Reservation)]
    assert sorted((r.start, r.end) for r in won) == windows
    assert len(lost) == 12
    assert all(isinstance(exc, reservations.ReservationConflict) for exc in lost), lost
    assert all(" are already reserved in " in str(exc) for exc in lost), lost
    assert Reservation.objects.count() == 4  # a refused request leaves nothing behind
    assert set(Reservation.objects.values_list("state", flat=True)) == {ReservationState.APPROVED}
    assert ReservationGpu.objects.count() == 8
    assert overlapping_holds() == []


def test_requests_racing_for_any_gpus_share_the_fleet_and_the_rest_are_refused(people):
    """12 requests for 4 GPUs each in one window on a 16-GPU fleet: the losers of each race
    for a GPU retry on the GPUs still free; exactly 4 are granted, on disjoint GPUs."""
    window = (start_at(1), start_at(3))
    calls = [lambda user=user: reservations.request(user, 4, *window) for user in people[:12]]
    results = at_once(calls)
    won = [r for r in results if isinstance(r, Reservation)]
    lost = [r for r in results if not isinstance(r, Reservation)]
    assert len(won) == 4
    assert all(isinstance(exc, reservations.ReservationConflict) for exc in lost), lost
    assert ReservationGpu.objects.count() == 16
    assert ReservationGpu.objects.values("gpu_id").distinct().count() == 16
    assert overlapping_holds() == []


def test_staggered_overlapping_windows_never_double_book(people):
    """Windows [i, i+3) h for 16 requests of all 16 GPUs: whoever wins, no GPU is held twice
    at any moment, and every request either holds 16 GPUs or left nothing."""
    calls = [
        lambda user=user, i=i: reservations.request(user, 16, start_at(1 + i), start_at(4 + i))
        for i, user in enumerate(people)
    ]
    results = at_once(calls)
    won = sorted((r for r in results if isinstance(r, Reservation)), key=lambda r: r.start)
    lost = [r for r in results if not isinstance(r, Reservation)]
    assert [e for e in lost if not isinstance(e, reservations.ReservationConflict)] == []
    # Each loser overlaps a winner (winners never roll back), and a winner overlaps at most
    # 5 of the windows: at least 4 win.
    assert len(won) >= 4
    for earlier, later in zip(won, won[1:], strict=False):
        assert later.start >= earlier.end
    assert ReservationGpu.objects.count() == 16 * len(won)
    assert overlapping_holds() == []


def jobs_running_into_holds() -> list[tuple]:
    """Active allocations whose job may still run at the start of a hold on its GPU (by its
    maximum runtime from now; none: for ever), of a reservation it does not run in."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT a.job_id, h.reservation_id
            FROM scheduling_allocation a
            JOIN scheduling_job j ON j.id = a.job_id
            JOIN scheduling_reservationgpu h ON h.gpu_id = a.gpu_id
            JOIN scheduling_reservation r ON r.id = h.reservation_id
            WHERE a.released_at IS NULL AND r.state = 'approved'
              AND j.reservation_id IS DISTINCT FROM r.id
              AND (j.max_runtime_s IS NULL
                   OR now() + make_interval(secs => j.max_runtime_s) > lower(h.during))
            """
        )
        return cursor.fetchall()


def test_approvals_racing_placements_never_book_a_gpu_under_a_job(people):
    """8 bookings of a named GPU and 8 jobs with no maximum runtime given that same GPU, at
    once, GPU by GPU: each GPU ends with a hold or a job, never both (the approval and the
    commit both lock the GPU's row and look again)."""

    gpus = list(Gpu.objects.filter(node__hostname="dgx-01").order_by("index"))
    jobs = [submission.submit_job(user, command=["true"]) for user in people[8:]]
    window = (start_at(1), start_at(2))
    calls: list[Callable[[], Any]] = []
    for gpu, user, job in zip(gpus, people[:8], jobs, strict=True):
        calls.append(lambda user=user, gpu=gpu: reservations.request(user, 1, *window, gpus=[gpu]))
        calls.append(
            lambda job=job, gpu=gpu: allocation_services.allocate(job, [gpu.pk], actor=job.owner)
        )
    results = at_once(calls)
    unexpected = [
        r
        for r in results
        if isinstance(r, Exception)
        and not isinstance(
            r, reservations.ReservationConflict | allocation_services.AllocationRefused
        )
    ]
    assert unexpected == []
    assert jobs_running_into_holds() == []
    # Each GPU went to one of the two: a hold, or a job.
    held = set(ReservationGpu.objects.values_list("gpu_id", flat=True))
    given = {gpu.pk for gpu in gpus if gpu.allocations.filter(released_at=None).exists()}
    assert held.isdisjoint(given) and held | given == {gpu.pk for gpu in gpus}


def test_one_holders_bookings_at_once_are_weighed_against_its_quota_one_by_one(people):
    """4 bookings of 4 GPUs by one user at once, in one window, against 4 GPUs at once: one
    is approved, the others wait for an admin (each saw the one before it)."""
    alice = people[0]
    Quota.objects.create(user=alice, max_gpus=4)
    window = (start_at(1), start_at(2))
    results = at_once([lambda: reservations.request(alice, 4, *window) for _ in range(4)])
    assert all(isinstance(r, Reservation) for r in results), results
    states = sorted(Reservation.objects.values_list("state", flat=True))
    assert states == [ReservationState.APPROVED] + [ReservationState.REQUESTED] * 3
