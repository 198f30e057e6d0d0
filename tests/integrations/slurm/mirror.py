"""Slurm clusters' answers built by hand (``ClusterState``, as the slurmrestd client returns
them), on catalogued simulated nodes whose device minor numbers differ from NVML's indexes; a
stand-in for the client (``slurmrestd``, a fixture)."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User

from integrations.slurm import services
from integrations.slurm.models import SlurmCluster
from integrations.slurm.rest.model import ClusterState, SlurmJob, SlurmNode, SlurmPartition
from inventory.models import Gpu, Node
from tests.scheduling.conftest import add_sim_node

SUBMITTED = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)
STARTED = datetime(2026, 12, 6, 8, 5, tzinfo=UTC)


def add_reversed_node(hostname: str) -> Node:
    """A simulated 8-GPU node whose GPU ``i`` is ``/dev/nvidia<7-i>`` (a machine whose PCI
    order differs from its device order)."""
    node = add_sim_node(hostname)
    for gpu in Gpu.objects.filter(node=node):
        Gpu.objects.filter(pk=gpu.pk).update(minor_number=7 - gpu.index)
    return node


def register(admin: User, name: str = "hpc") -> SlurmCluster:
    return services.save_cluster(
        SlurmCluster(
            name=name, url="http://slurm.example:6820", user_name="gpuadmin", token="jwt-secret"
        ),
        actor=admin,
    )


def node(name: str, *states: str, reason: str = "", used: tuple[int, ...] = ()) -> SlurmNode:
    return SlurmNode(
        name=name,
        states=states or ("IDLE",),
        reason=reason,
        reason_set_by="root" if reason else "",
        partitions=("gpu",),
        cpus=128,
        real_memory_mib=1_000_000,
        gpus=8,
        gpus_used=used,
    )


def job(job_id: int, gpus: dict[str, tuple[int, ...]] | None = None, **fields: object) -> SlurmJob:
    running = gpus is not None
    values: dict = {
        "name": f"train-{job_id}",
        "user": "alice",
        "state": "RUNNING" if running else "PENDING",
        "reason": "" if running else "Resources",
        "partition": "gpu",
        "nodes": tuple(gpus or ()),
        "gpus": gpus or {},
        "gpus_requested": sum(len(held) for held in (gpus or {}).values()) or 2,
        "cpus": 16,
        "submit_time": SUBMITTED,
        "start_time": STARTED if running else None,
        "time_limit_min": 60,
        **fields,
    }
    return SlurmJob(job_id=job_id, **values)


def answer(nodes: list[SlurmNode], jobs: list[SlurmJob]) -> ClusterState:
    return ClusterState(
        version="v0.0.38",
        nodes=tuple(nodes),
        partitions=(SlurmPartition(name="gpu", nodes=tuple(n.name for n in nodes)),),
        jobs=tuple(jobs),
    )


class FakeRest:
    """Stands in for ``integrations.slurm.rest.client`` (the real one talks to slurmrestd, and
    has its own tests against a real Slurm): its ``SlurmRestClient`` calls ``operations`` by
    name and records each call as (address, user, token, operation, arguments)."""

    def __init__(self) -> None:
        self.operations: dict[str, Callable[..., Any]] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.module = types.ModuleType("integrations.slurm.rest.client")
        fake = self

        class SlurmRestError(Exception):
            pass

        class SlurmRestClient:
            def __init__(self, address: str, *, user: str = "", token: str = "") -> None:
                self.signed = (address, user, token)

            def __getattr__(self, name: str) -> Callable[..., Any]:
                def call(*arguments: Any) -> Any:
                    fake.calls.append((*self.signed, name, arguments))
                    return fake.operations[name](*arguments)

                return call

        self.error = SlurmRestError
        self.module.SlurmRestError = SlurmRestError  # type: ignore[attr-defined]
        self.module.SlurmRestClient = SlurmRestClient  # type: ignore[attr-defined]


@pytest.fixture
def slurmrestd(monkeypatch: pytest.MonkeyPatch) -> FakeRest:
    fake = FakeRest()
    monkeypatch.setitem(sys.modules, "integrations.slurm.rest.client", fake.module)
    return fake
