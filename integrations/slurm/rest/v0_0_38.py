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


def job(data: dict[str, Any]) -> SlurmJob:
    nodes = fields.expand_hostlist(data.get("nodes") or "")
    gpus = fields.gpus_by_node(nodes, data.get("gres_detail") or [])
    node_count = data.get("node_count") or len(nodes) or 1
    time_limit = data.get("time_limit")
    return SlurmJob(
        job_id=data["job_id"],
        name=data.get("name") or "",
        user=data.get("user_name") or "",
        state=data["job_state"].upper(),
        reason=fields.reason(data.get("state_reason")),
        partition=data.get("partition") or "",
        account=data.get("account") or "",
        nodes=nodes,
        gpus=gpus,
        gpus_requested=fields.gpus_requested(data, node_count, data.get("tasks") or 1, gpus),
        cpus=data.get("cpus") or 0,
        array_job_id=data.get("array_job_id") or None,
        array_task_id=data.get("array_task_id"),
        submit_time=fields.from_epoch(data.get("submit_time")),
        start_time=fields.from_epoch(data.get("start_time")),
        end_time=fields.from_epoch(data.get("end_time")),
        # null or a negative count (INFINITE) is no limit
        time_limit_min=time_limit if isinstance(time_limit, int) and time_limit >= 0 else None,
    )
