"""Fixtures of the scheduling page tests: people of each role and a broker whose agents
answer."""

from __future__ import annotations

import pytest

from gpuadmin.access.models import Role
from gpuadmin.celery import app
from tests.scheduling.pages.helpers import AgentBroker, person


@pytest.fixture
def agents(monkeypatch) -> AgentBroker:
    broker = AgentBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    return broker


@pytest.fixture
def alice(db):
    return person("alice")


@pytest.fixture
def bob(db):
    return person("bob")


@pytest.fixture
def viewer(db):
    return person("vera", Role.VIEWER)


@pytest.fixture
def operator(db):
    return person("otto", Role.OPERATOR)
