"""The placement pass a wake asks for never holds a central worker process on another pass
(``loop.run_woken_pass``): it leaves the wake to the pass in progress, which asks for the next
pass once done, behind the reports queued meanwhile."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from inventory import live
from scheduling import dispatch, loop, tasks
from tests.scheduling.conftest import RecordingBroker

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_wake_asked_for() -> Iterator[None]:
    live.client().delete(dispatch.wake_key())
    yield
    live.client().delete(dispatch.wake_key())


@pytest.fixture
def other_worker() -> Iterator[BaseDatabaseWrapper]:
    """Another worker's database session."""
    other = connections.create_connection("default")
    yield other
    other.close()


def try_pass_lock(session: BaseDatabaseWrapper) -> bool:
    with session.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [loop.PASS_LOCK_ID])
        [(got,)] = cursor.fetchall()
    return bool(got)


def test_a_pass_asked_for_while_another_runs_returns_at_once(
    other_worker: BaseDatabaseWrapper, broker: RecordingBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes: list[int] = []
    real_pass = loop.run_pass

    def run_pass() -> loop.PassSummary:
        passes.append(1)
        return real_pass()

    monkeypatch.setattr(loop, "run_pass", run_pass)
    assert try_pass_lock(other_worker)  # its pass runs
    with connection.cursor() as cursor:  # waiting on the lock would fail instead of hang
        cursor.execute("SET lock_timeout = '2s'")
    dispatch.wake()

    tasks.placement_pass()

    assert passes == []
    assert live.client().get(dispatch.wake_key()) == dispatch.DEFERRED  # left to that pass


@pytest.mark.parametrize(
    ("during_the_pass", "asks_again"),
    [
        ("nothing", False),
        ("a wake whose pass is still queued", False),
        ("a wake whose pass found this one running", True),
    ],
)
def test_a_pass_asks_for_the_next_when_a_wake_was_left_to_it(
    other_worker: BaseDatabaseWrapper,
    broker: RecordingBroker,
    monkeypatch: pytest.MonkeyPatch,
    during_the_pass: str,
    asks_again: bool,
) -> None:
    def run_pass() -> None:
        live.client().delete(dispatch.wake_key())  # as each pass begins
        if during_the_pass != "nothing":
            dispatch.wake()  # a job ends
        if during_the_pass == "a wake whose pass found this one running":
            dispatch.defer_wake()

    monkeypatch.setattr(loop, "run_pass", run_pass)

    tasks.placement_pass()

    # The wake's own pass, when a job ended, and the pass asked for again.
    wakes = 0 if during_the_pass == "nothing" else 1
    assert len(broker.named("scheduling.placement_pass")) == wakes + asks_again
    assert try_pass_lock(other_worker)  # released
