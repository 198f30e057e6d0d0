"""People with each role, API clients signed in as them, a fleet of two DGX A100 80GB, and a
broker whose node agent answers ``scheduling.tail_log`` in this process."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import EagerResult
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from rest_framework.test import APIClient

from gpuadmin.access.models import Membership, Role
from gpuadmin.audit.models import AuditEvent
from gpuadmin.celery import app
from inventory.models import Node
from scheduling import tasks
from scheduling.agent import jobs as agent
from scheduling.jobs import arrays, submission
from scheduling.models import Job, JobArray
from tests.scheduling.conftest import RecordingBroker, add_sim_node


@pytest.fixture
def fleet(db, broker) -> list[Node]:
    return [add_sim_node("dgx-01"), add_sim_node("dgx-02")]


@pytest.fixture
def make_user(django_user_model) -> Callable[..., AbstractBaseUser]:
    def make(username: str, role: str = Role.USER) -> AbstractBaseUser:
        if role == Role.ADMIN:
            return django_user_model.objects.create_user(username, is_staff=True)
        user = django_user_model.objects.create_user(username)
        if role != Role.USER:
            Membership.objects.create(user=user, role=role)
        return user

    return make


@pytest.fixture
def api_as(make_user) -> Callable[..., APIClient]:
    """``api_as(username, role)`` -> a client signed in (session) as a new person, who is its
    ``user``."""

    def make(username: str, role: str = Role.USER) -> APIClient:
        client = APIClient()
        client.user = make_user(username, role)
        client.force_login(client.user)
        return client

    return make


def submit(owner: AbstractBaseUser, **fields: Any) -> Job:
    return submission.submit_job(owner, command=fields.pop("command", ["sleep", "60"]), **fields)


def split_all(array: JobArray) -> list[int]:
    """Every task of ``array`` made a job at once (a placement pass makes as many as the array
    may use now: ``arrays.split_due``); its jobs' ids in index order."""
    with transaction.atomic():
        locked = JobArray.objects.select_for_update().select_related("owner").get(pk=array.pk)
        arrays.split(locked, locked.unsplit)
    return list(array.tasks.order_by("array_index").values_list("pk", flat=True))


def events(target_type: str = "scheduling.job", target_id: Any = None) -> list[str]:
    """Audit event types, oldest first (of one target when ``target_id`` is given)."""
    rows = AuditEvent.objects.filter(target_type=target_type).order_by("pk")
    if target_id is not None:
        rows = rows.filter(target_id=str(target_id))
    return list(rows.values_list("event_type", flat=True))


@dataclass
class AgentBroker(RecordingBroker):
    """Records every task; runs ``scheduling.tail_log`` in this process (the agent's
    executor over ``GPUADMIN_DATA_DIR``), or never answers it when ``answer`` is off."""

    answer: bool = True

    def send_task(self, name: str, args: tuple = (), queue: str | None = None, **_: Any) -> Any:
        super().send_task(name, args, queue)
        if name != "scheduling.tail_log":
            return None
        if not self.answer:
            return Silent()
        return EagerResult(uuid.uuid4().hex, tasks.tail_log(*args), "SUCCESS")


class Silent:
    def get(self, timeout: float, **_: Any) -> Any:
        raise CeleryTimeoutError("The operation timed out.")

    def revoke(self) -> None:
        pass


@pytest.fixture
def agent_broker(monkeypatch, settings, tmp_path) -> AgentBroker:
    settings.GPUADMIN_DATA_DIR = tmp_path
    settings.GPUADMIN_NODE_NAME = "dgx-01"
    monkeypatch.setattr(agent, "_executor", None)  # this test's executor, over tmp_path
    broker = AgentBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    return broker


def write_log(job: Job, text: str) -> None:
    path = agent.agent_dir("dgx-01") / "logs" / f"{job.pk}.{job.attempt}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
