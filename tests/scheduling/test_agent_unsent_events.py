"""Job events an agent cannot send while the broker is away are kept and resent in order
(tests/integration/test_faults.py stops Redis for real)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from kombu.exceptions import OperationalError

from scheduling.agent import jobs as agent
from scheduling.agent.wire import FinalState, JobFinished, JobStarted

start_sender = agent._start_sender


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A broker that refuses while ``down``; what it accepted, in order."""
    state: dict[str, Any] = {"down": True, "sent": []}

    def send(name: str, args: tuple[Any, ...] = ()) -> None:
        if state["down"]:
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        assert name == "scheduling.job_events"
        state["sent"].append([event["event"] for event in args[0]])

    monkeypatch.setattr(agent, "send_as_node", send)
    monkeypatch.setattr(agent, "publish_sample", lambda hostname: None)
    monkeypatch.setattr(agent, "_start_sender", lambda: None)  # the tests send
    monkeypatch.setattr(agent, "_unsent", type(agent._unsent)())
    return state


def test_events_refused_by_the_broker_are_resent_in_order(broker):
    now = datetime.now(UTC)
    agent.report(JobStarted("7.1", 123, now))
    agent.report(JobFinished("7.1", FinalState.COMPLETED, 0, now, ""))
    assert broker["sent"] == [] and len(agent._unsent) == 2

    assert agent.send_unsent() is False  # still down: kept
    broker["down"] = False
    assert agent.send_unsent() is True
    assert broker["sent"] == [["started", "finished"]] and not agent._unsent  # one message


def test_a_start_waits_for_the_events_after_it_and_an_end_goes_at_once(broker, monkeypatch):
    """The sender thread holds a start back (``START_LINGER_S``, a minute here) for the
    events that follow it, and sends as soon as an end is queued: the starts of jobs placed
    together and the end of a job that ends at once go in one message."""
    broker["down"] = False
    monkeypatch.setattr(agent, "START_LINGER_S", 60.0)
    monkeypatch.setattr(agent, "_start_sender", start_sender)  # the fixture's is a no-op
    now = datetime.now(UTC)
    agent.report(JobStarted("7.1", 1, now))
    agent.report(JobStarted("8.1", 2, now))
    agent.report(JobFinished("7.1", FinalState.COMPLETED, 0, now, ""))
    deadline = time.monotonic() + 30
    while not broker["sent"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert broker["sent"] == [["started", "started", "finished"]] and not agent._unsent
