"""slurmrestd's openapi/v0.0.40 (Slurm 23.11), and the versions after it that changed nothing
gpuadmin reads (``versions.PARSERS``): states are lists (``["MIXED", "DRAIN"]``), numbers that
may be unset or infinite are ``{"set", "infinite", "number"}`` objects, and a partition's
fields are grouped (``nodes.configured``, ``cpus.total``, ``partition.state``)."""

from __future__ import annotations

from typing import Any

from integrations.slurm.rest import fields
from integrations.slurm.rest.model import SlurmJob, SlurmNode, SlurmPartition


def number(value: dict[str, Any] | int | None) -> int | None:
    """A ``{"set", "infinite", "number"}`` object's number: None when unset or infinite (a
    plain number, which some fields keep, as it is)."""
    if value is None or isinstance(value, int):
        return value
    if not value.get("set") or value.get("infinite"):
        return None
    return int(value["number"])


def node(data: dict[str, Any]) -> SlurmNode:
    states = fields.names(data["state"], "state")
    return fields.node(data, states, fields.from_epoch(number(data.get("reason_changed_at"))))


def partition(data: dict[str, Any]) -> SlurmPartition:
    nodes = data.get("nodes") or {}
    states = fields.names((data.get("partition") or {}).get("state") or ["UP"], "partition.state")
    return SlurmPartition(
        name=data["name"],
        nodes=fields.expand_hostlist(nodes.get("configured") or ""),
        state=states[0],
        total_cpus=(data.get("cpus") or {}).get("total") or 0,
        total_nodes=nodes.get("total") or 0,
    )


def job(data: dict[str, Any]) -> SlurmJob:
    state, flags = fields.split_job_states(fields.names(data["job_state"], "job_state"))
    return fields.job(data, state, flags, number)


def drain(reason: str) -> dict[str, Any]:
    """``POST /slurm/v0.0.40/node/{name}``'s body (``update_node_msg``) that drains a node."""
    return {"state": ["DRAIN"], "reason": reason}
