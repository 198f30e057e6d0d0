"""The placement pass a wake asks for never holds a central worker process on another pass
(``scheduling.loop.passes.run_woken_pass``): it leaves the wake to the pass in progress, which
asks for the next pass once done, behind the reports queued meanwhile. A wake while a woken pass
runs sends no task at all: it is left to that pass the same way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from gpuadmin.leases import services as leases
from inventory import live
from scheduling import tasks
from scheduling.loop import dispatch
from scheduling.loop import passes as loop
from tests.conftest import forget_wakes
from tests.scheduling.conftest import RecordingBroker

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_wake_asked_for() -> Iterator[None]:
    forget_wakes()
    yield
    forget_wakes()


@pytest.fixture
def other_worker() -> Iterator[BaseDatabaseWrapper]:
    """Another worker's database session (its own transactions, committed): the lease it
    takes is gone afterwards."""
    other = connections.create_connection("default")
    yield other
    with other.cursor() as cursor:
        cursor.execute("DELETE FROM leases_lease WHERE name = %s", [loop.lease_name()])
    other.close()


def take_pass_lease(session: BaseDatabaseWrapper) -> None:
    """``session`` holds the loop's lease, as a worker whose pass runs."""
    with session.cursor() as cursor:
        cursor.execute(
            "INSERT INTO leases_lease (name, holder, token, expires_at) "
            "VALUES (%s, 'another worker', 1, now() + interval '1 minute')",
            [loop.lease_name()],
        )


def test_a_pass_asked_for_while_another_runs_returns_at_once(
    other_worker: BaseDatabaseWrapper, broker: RecordingBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes: list[int] = []
    real_pass = loop.run_pass

    def run_pass() -> loop.PassSummary:
        passes.append(1)
        return real_pass()

    monkeypatch.setattr(loop, "run_pass", run_pass)
    take_pass_lease(other_worker)  # its pass runs
    with connection.cursor() as cursor:  # waiting on the lease's row would fail, not hang
        cursor.execute("SET lock_timeout = '2s'")
    dispatch.wake()

    tasks.placement_pass()

    assert passes == []
    assert live.client().get(dispatch.wake_key()) == dispatch.DEFERRED  # left to that pass
    # For as long as that pass's lease: should its worker die, wakes send tasks again then.
    assert 0 < live.client().ttl(dispatch.wake_key()) <= settings.GPUADMIN_LEASE_TTL_S


@pytest.mark.parametrize(
    ("during_the_pass", "sent_meanwhile", "asks_again"),
    [
        ("nothing", 0, False),
        # Left to the pass: no task of its own, which would find the pass running.
        ("a wake", 0, True),
        # Once the running mark is gone (expired: a pass over a minute), a wake sends its task.
        ("a wake whose pass is still queued", 1, False),
        ("a wake whose pass found this one running", 1, True),
    ],
)
def test_a_pass_asks_for_the_next_when_a_wake_was_left_to_it(
    broker: RecordingBroker,
    monkeypatch: pytest.MonkeyPatch,
    during_the_pass: str,
    sent_meanwhile: int,
    asks_again: bool,
) -> None:
    sent_during_the_pass: list[int] = []

    def run_pass() -> None:
        live.client().delete(dispatch.wake_key())  # as each pass begins
        if during_the_pass.startswith("a wake whose"):
            live.client().delete(dispatch.running_key())
        if during_the_pass != "nothing":
            dispatch.wake()  # a job ends
        if during_the_pass == "a wake whose pass found this one running":
            dispatch.defer_wake()
        sent_during_the_pass.append(len(broker.named("scheduling.placement_pass")))

    monkeypatch.setattr(loop, "run_pass", run_pass)

    tasks.placement_pass()

    assert sent_during_the_pass == [sent_meanwhile]
    # The wake's own pass, if it sent one, and the pass asked for again, after this one.
    assert len(broker.named("scheduling.placement_pass")) == sent_meanwhile + asks_again
    assert leases.try_take(loop.lease_name(), 1) is not None  # given back
    assert not live.client().exists(dispatch.running_key())


def test_a_wake_after_a_pass_asks_for_one_at_once(
    broker: RecordingBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "run_pass", lambda: None)
    tasks.placement_pass()

    dispatch.wake()
    dispatch.wake()  # coalesced: its pass is still to come

    assert len(broker.named("scheduling.placement_pass")) == 1
