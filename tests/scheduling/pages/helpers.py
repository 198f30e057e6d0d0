"""A simulated fleet, people of each role, placed jobs and a broker whose node agents answer
the log tail, shared by the scheduling page tests and the browser tests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import EagerResult
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser

from gpuadmin.access.models import Membership, Role
from inventory.models import Node
from scheduling.jobs import shape, submission
from scheduling.loop import passes as loop
from scheduling.models import Job
from tests.inventory.pages import add_node, unique_host
from tests.scheduling.conftest import RecordingBroker, add_sim_node

LOG_TEXT = "epoch 1 loss 0.93\nepoch 2 loss 0.71\n"


def add_fleet(count: int = 1, model: str = "dgx-a100-80gb", *, live: bool = False) -> list[Node]:
    """``count`` discovered, heartbeating simulated nodes (``live``: with live samples in
    Redis, for the dashboard); the submission checks see them at once (``submit_job`` caches
    the fleet's shape for a few seconds)."""
    hosts = [unique_host() for _ in range(count)]
    for host in hosts:
        if live:
            add_node(host, model)
        else:
            add_sim_node(host, model)
    shape.FleetShape.forget()
    return list(Node.objects.filter(hostname__in=hosts).order_by("hostname"))


def person(username: str, role: str = Role.USER) -> AbstractBaseUser:
    user = get_user_model().objects.create_user(username, password="pw-" + username)
    if role != Role.USER:
        Membership.objects.create(user=user, role=role)
    return user


def submit(owner: AbstractBaseUser, **fields: Any) -> Job:
    return submission.submit_job(owner, command=fields.pop("command", ["sleep", "60"]), **fields)


def place(*jobs: Job) -> None:
    """One placement pass; ``jobs`` are refreshed from the database."""
    loop.run_pass()
    for job in jobs:
        job.refresh_from_db()


@dataclass
class AgentBroker(RecordingBroker):
    """Records what is sent; node agents answer ``scheduling.tail_log`` with ``LOG_TEXT``, or
    never (``silent``)."""

    silent: bool = False

    def send_task(self, name: str, args: tuple = (), queue: str | None = None, **_: Any) -> Any:
        super().send_task(name, args, queue)
        if self.silent:
            return Unanswered()
        if name == "scheduling.tail_log":
            return EagerResult(uuid.uuid4().hex, {"text": LOG_TEXT, "exists": True}, "SUCCESS")
        return None


class Unanswered:
    def get(self, timeout: float, **_: Any) -> Any:
        raise CeleryTimeoutError("The operation timed out.")

    def revoke(self) -> None:
        """Nothing to take back."""
