"""slurmrestd's openapi/v0.0.38 (Slurm 22.05): states are strings (a node's flags apart in
``state_flags``), times are Unix seconds with 0 for "not set", and numbers that may be unset
are plain or null."""

from __future__ import annotations

from typing import Any

from integrations.slurm.rest import fields
from integrations.slurm.rest.model import SlurmJob, SlurmNode, SlurmPartition


def node(data: dict[str, Any]) -> SlurmNode:
    states = (data["state"].upper(), *(flag.upper() for flag in data.get("state_flags") or ()))
    return fields.node(data, states, fields.from_epoch(data.get("reason_changed_at")))


def partition(data: dict[str, Any]) -> SlurmPartition:
    return SlurmPartition(
        name=data["name"],
        nodes=fields.expand_hostlist(data.get("nodes") or ""),
        state=(data.get("state") or "UP").upper(),
        total_cpus=data.get("total_cpus") or 0,
        total_nodes=data.get("total_nodes") or 0,
    )


def number(value: int | None) -> int | None:
    """A plain number; null or a negative one (INFINITE) as None."""
    return value if isinstance(value, int) and value >= 0 else None


def job(data: dict[str, Any]) -> SlurmJob:
    return fields.job(data, data["job_state"].upper(), (), number)
