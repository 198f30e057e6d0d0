"""Job events an agent cannot send while the broker is away are kept and resent in order
(tests/integration/test_faults.py stops Redis for real)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kombu.exceptions import OperationalError

from scheduling import agent
from scheduling.executor import FinalState, JobFinished, JobStarted


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A broker that refuses while ``down``; what it accepted, in order."""
    state: dict[str, Any] = {"down": True, "sent": []}

    def send(name: str, args: tuple[Any, ...] = ()) -> None:
        if state["down"]:
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        state["sent"].append(args[0]["event"])

    monkeypatch.setattr(agent, "send_as_node", send)
    monkeypatch.setattr(agent, "publish_sample", lambda hostname: None)
    monkeypatch.setattr(agent, "_start_resender", lambda: None)
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
    assert broker["sent"] == ["started", "finished"] and not agent._unsent
