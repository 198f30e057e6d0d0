"""Beat in one place at a time (``gpuadmin.leases.beat``): of two beats only the holder of the
beat lease sends; the standby takes over once the leader's lease expires, and never sends a
task again for a period the old leader sent it for; a leader that lost its lease sends
nothing. What is sent is read back from the central queue in Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import current_app, schedules
from celery.beat import ScheduleEntry
from django.db import connection
from django.utils import timezone

from gpuadmin.leases import beat
from gpuadmin.leases.models import BeatPeriod, Lease
from tests.conftest import drain_central_queue

pytestmark = pytest.mark.django_db

TASK = "scheduling.sweep_reservations"
# One period for the whole test: a long interval, whose periods start years apart.
ENTRY = ScheduleEntry(
    name="probe", task=TASK, schedule=schedules.schedule(timedelta(days=3650)), app=current_app
)


@pytest.fixture
def beats(tmp_path: Path) -> Iterator[tuple[beat.LeaderScheduler, beat.LeaderScheduler]]:
    drain_central_queue()
    made = tuple(
        beat.LeaderScheduler(app=current_app, schedule_filename=str(tmp_path / name))
        for name in ("first", "second")
    )
    yield made  # type: ignore[misc]
    for scheduler in made:
        scheduler.close()
    drain_central_queue()


def keep_lease(scheduler: beat.LeaderScheduler) -> None:
    """The scheduler's next tick renews or tries to take the lease (not ``renew_s`` later)."""
    scheduler.next_renewal = 0
    scheduler.tick()


def sent() -> int:
    return drain_central_queue()[TASK]


def test_only_the_leader_sends_and_each_period_once(beats) -> None:
    leader, standby = beats
    keep_lease(leader)
    keep_lease(standby)
    assert leader.held is not None and standby.held is None

    for scheduler in (leader, standby, leader):
        scheduler.apply_entry(ENTRY)
    assert sent() == 1  # the leader's first; its second was for the same period

    BeatPeriod.objects.filter(task=ENTRY.name).update(
        period_start=timezone.now() - timedelta(days=3650)
    )  # the next period
    leader.apply_entry(ENTRY)
    assert sent() == 1


def test_the_standby_takes_over_and_never_resends_the_old_leaders_period(beats) -> None:
    leader, standby = beats
    keep_lease(leader)
    leader.apply_entry(ENTRY)
    assert sent() == 1
    # The leader stalls: it renews nothing and its lease expires.
    Lease.objects.filter(name=beat.LEASE_NAME).update(expires_at=timezone.now())
    keep_lease(standby)
    assert standby.held is not None

    standby.apply_entry(ENTRY)  # the period the old leader sent it for
    leader.apply_entry(ENTRY)  # the old leader wakes: its lease is lost
    assert sent() == 0
    assert leader.held is None
    keep_lease(leader)
    assert leader.held is None  # the standby holds it now

    standby.close()  # gives the lease back: the other takes it at its next try
    keep_lease(leader)
    assert leader.held is not None


def test_a_sigterm_in_the_middle_of_a_statement_leaves_the_lease_to_expire(beats) -> None:
    """Celery's SIGTERM handler closes the scheduler wherever the signal landed; a give-back on
    a connection still waiting on a claim's statement or commit would wait on it forever (a
    beat stuck in its shutdown). The statement runs in another thread here."""
    leader, _ = beats
    keep_lease(leader)
    raw = connection.connection
    statement = threading.Thread(target=raw.execute, args=("SELECT pg_sleep(2)",))
    statement.start()
    while not beat.connection_busy():
        time.sleep(0.01)
    started = time.monotonic()
    leader.close()
    took = time.monotonic() - started
    statement.join()
    assert took < 1, f"close() waited {took:.1f} s on the connection"
    assert leader.held is None
    assert Lease.objects.get(name=beat.LEASE_NAME).expires_at > timezone.now()  # not given back
