"""What every slurmrestd version writes the same way: GRES strings (``gpu:a100:2(IDX:0-1)``),
Slurm host lists (``gpu[01-03,07]``), TRES GPU counts, job states, Unix times; and the GPUs
jobs hold, added to their nodes."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from integrations.slurm.rest.model import SlurmJob, SlurmNode

# Slurm's base job states (src/common/slurm_protocol_defs.c); any other name in a state list is
# a flag (COMPLETING, CONFIGURING, REQUEUED, ...).
JOB_BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)

# One GRES of a GRES string: name, then optional type and count, then an optional
# parenthesised detail (``IDX:0-1``, ``S:0-1``): ``gpu``, ``gpu:8``, ``gpu:a100:2(IDX:0,3)``.
_GRES = re.compile(r"(?P<name>[^:,()]+)(?::(?P<rest>[^,()]*))?(?:\((?P<detail>[^)]*)\))?")


class FieldError(ValueError):
    """A value slurmrestd gave that is not in the shape its version documents."""


def gres_entries(text: str) -> list[tuple[str, int, str]]:
    """Each GRES of ``text`` as (name, count, detail); a count-less GRES counts 1.
    ``gpu:a100:2(IDX:0-1),gpu:h100:0(IDX:)`` -> [("gpu", 2, "IDX:0-1"), ("gpu", 0, "IDX:")];
    an untyped GRES may read ``gpu:(null):2``."""
    entries = []
    position = 0
    text = text.strip().replace(":(null)", "")
    while position < len(text):
        match = _GRES.match(text, position)
        if match is None or match.end() == position:
            raise FieldError(f"unreadable GRES {text!r} at {position}")
        parts = (match["rest"] or "").split(":")
        count = parts[-1] if parts[-1].isdigit() else "1"
        entries.append((match["name"], int(count), match["detail"] or ""))
        position = match.end()
        if position < len(text):
            if text[position] != ",":
                raise FieldError(f"unreadable GRES {text!r} at {position}")
            position += 1
    return entries


def gpu_count(gres: str) -> int:
    """The GPUs a node's ``gres`` declares: ``gpu:a100:4,gpu:h100:4(S:0-1)`` -> 8."""
    if gres in ("", "(null)", "N/A"):
        return 0
    return sum(count for name, count, _ in gres_entries(gres) if name == "gpu")


def gpu_indexes(gres: str) -> tuple[int, ...]:
    """The GPU indexes (IDX) a GRES string names, sorted: a node's ``gres_used`` or one entry of
    a job's ``gres_detail``. ``gpu:a100:2(IDX:0,3),gpu:h100:3(IDX:4-6)`` -> (0, 3, 4, 5, 6)."""
    if gres in ("", "(null)", "N/A"):
        return ()
    indexes: set[int] = set()
    for name, _, detail in gres_entries(gres):
        if name != "gpu" or not detail.startswith("IDX:"):
            continue
        indexes.update(index_ranges(detail.removeprefix("IDX:")))
    return tuple(sorted(indexes))


def index_ranges(text: str) -> list[int]:
    """``0,2-3,5`` -> [0, 2, 3, 5]; an empty or ``N/A`` list is no index."""
    if text in ("", "N/A"):
        return []
    indexes: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise FieldError(f"unreadable index list {text!r}")
        indexes.extend(range(int(first), int(last or first) + 1))
    return indexes


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's host list syntax expanded, in order: ``gpu[01-02],cpu3`` -> (gpu01, gpu02,
    cpu3); brackets keep their zero padding and may repeat (``r[1-2]n[1-2]``)."""
    hosts: list[str] = []
    depth = 0
    start = 0
    for position, character in enumerate(text + ","):
        if character == "[":
            depth += 1
        elif character == "]":
            depth -= 1
        elif character == "," and depth == 0:
            if name := text[start:position].strip():
                hosts.extend(_expand_host(name))
            start = position + 1
    if depth != 0:
        raise FieldError(f"unbalanced brackets in host list {text!r}")
    return tuple(hosts)


def _expand_host(pattern: str) -> list[str]:
    pieces = re.split(r"\[([^\]]*)\]", pattern)
    # pieces alternate literal text and bracket contents: ["r", "1-2", "n", "1-2", ""]
    choices: list[list[str]] = []
    for number, piece in enumerate(pieces):
        if number % 2 == 0:
            choices.append([piece])
            continue
        expanded: list[str] = []
        for part in piece.split(","):
            first, _, last = part.partition("-")
            if not first.isdigit() or (last and not last.isdigit()):
                raise FieldError(f"unreadable host range {part!r} in {pattern!r}")
            expanded.extend(
                str(value).zfill(len(first)) for value in range(int(first), int(last or first) + 1)
            )
        choices.append(expanded)
    return ["".join(combination) for combination in itertools.product(*choices)]


def names(value: Any, field: str) -> tuple[str, ...]:
    """A list of names (v0.0.40's states and flags), upper case; anything else is an error."""
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise FieldError(f"{field} is not a list of names: {value!r}")
    return tuple(name.upper() for name in value)


def split_job_states(states: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """A job's state list as (base state, flags): ``["RUNNING", "COMPLETING"]`` -> ("RUNNING",
    ("COMPLETING",)); a list without a base state keeps its first name as the state."""
    first = states[0] if states else ""
    base = next((state for state in states if state in JOB_BASE_STATES), first)
    return base, tuple(state for state in states if state != base)


def from_epoch(seconds: int | None) -> datetime | None:
    """A Unix time as an aware datetime; 0 or None (Slurm's "not set") as None."""
    if not seconds:
        return None
    return datetime.fromtimestamp(seconds, UTC)


def reason(text: str | None) -> str:
    """A state reason, Slurm's ``None`` read as no reason."""
    return "" if text in (None, "None") else str(text)


def node(
    data: dict[str, Any], states: tuple[str, ...], reason_changed_at: datetime | None
) -> SlurmNode:
    """A node of any version's answer: the versions differ only in how they write its states
    and its reason's time, which their parser reads and passes here."""
    return SlurmNode(
        name=data["name"],
        states=states,
        reason=data.get("reason") or "",
        reason_set_by=data.get("reason_set_by_user") or "",
        reason_changed_at=reason_changed_at,
        partitions=tuple(data.get("partitions") or ()),
        cpus=data.get("cpus") or 0,
        alloc_cpus=data.get("alloc_cpus") or 0,
        real_memory_mib=data.get("real_memory") or 0,
        alloc_memory_mib=data.get("alloc_memory") or 0,
        gpus=gpu_count(data.get("gres") or ""),
        gpus_used=gpu_indexes(data.get("gres_used") or ""),
    )


def gpus_in_tres(tres: str) -> int:
    """GPUs a TRES string asks for: ``gres/gpu:h100:1,gres/gpu:h200:1`` -> 2, ``gres:gpu:2``
    (22.05) -> 2, ``cpu=2,gres/gpu=4,gres/gpu:h100=4`` -> 4 (an untyped total wins over its
    typed parts); 0 when it names none."""
    untyped = typed = 0
    found_untyped = False
    for item in tres.split(","):
        name, _, value = item.strip().replace("=", ":").rpartition(":")
        kind = name.replace("gres/", "gres:").split(":")
        if kind[:2] != ["gres", "gpu"] or not value.isdigit():
            continue
        if len(kind) == 2:
            untyped += int(value)
            found_untyped = True
        else:
            typed += int(value)
    return untyped if found_untyped else typed


def gpus_by_node(nodes: tuple[str, ...], gres_detail: list[str]) -> dict[str, tuple[int, ...]]:
    """The GPU indexes a job holds on each of its nodes: ``gres_detail`` has one entry per node,
    in the order of the job's host list. Nodes where it holds none are left out."""
    if len(gres_detail) != len(nodes):
        if gres_detail:
            raise FieldError(f"gres_detail has {len(gres_detail)} entries for {len(nodes)} nodes")
        return {}
    held = {name: gpu_indexes(detail) for name, detail in zip(nodes, gres_detail, strict=True)}
    return {name: indexes for name, indexes in held.items() if indexes}


def gpus_requested(
    data: dict[str, Any], node_count: int, tasks: int, gpus: dict[str, tuple[int, ...]]
) -> int:
    """The GPUs a job has (when it holds some) or asks for in all, from its ``tres_per_*``."""
    if held := sum(len(indexes) for indexes in gpus.values()):
        return held
    return (
        gpus_in_tres(data.get("tres_per_job") or "")
        or gpus_in_tres(data.get("tres_per_node") or "") * node_count
        or gpus_in_tres(data.get("tres_per_task") or "") * tasks
        or gpus_in_tres(data.get("tres_per_socket") or "") * node_count
    )


def job(
    data: dict[str, Any],
    state: str,
    flags: tuple[str, ...],
    number: Callable[[Any], int | None],
) -> SlurmJob:
    """A job of any version's answer: the versions differ only in how they write its state and
    flags, which their parser reads and passes here, and its numbers that may be unset or
    infinite (``number`` reads one as an int, None when unset or infinite)."""
    nodes = expand_hostlist(data.get("nodes") or "")
    gpus = gpus_by_node(nodes, data.get("gres_detail") or [])
    node_count = number(data.get("node_count")) or len(nodes) or 1
    tasks = number(data.get("tasks")) or 1
    return SlurmJob(
        job_id=data["job_id"],
        name=data.get("name") or "",
        user=data.get("user_name") or "",
        state=state,
        state_flags=flags,
        reason=reason(data.get("state_reason")),
        partition=data.get("partition") or "",
        account=data.get("account") or "",
        nodes=nodes,
        gpus=gpus,
        gpus_requested=gpus_requested(data, node_count, tasks, gpus),
        cpus=number(data.get("cpus")) or 0,
        array_job_id=number(data.get("array_job_id")) or None,
        array_task_id=number(data.get("array_task_id")),
        submit_time=from_epoch(number(data.get("submit_time"))),
        start_time=from_epoch(number(data.get("start_time"))),
        end_time=from_epoch(number(data.get("end_time"))),
        time_limit_min=number(data.get("time_limit")),
    )


def with_held_gpus(
    nodes: tuple[SlurmNode, ...], jobs: tuple[SlurmJob, ...]
) -> tuple[SlurmNode, ...]:
    """Nodes whose ``gpus_used`` include the GPUs their running jobs hold: v0.0.38's node
    ``gres_used`` is a count without indexes (``gpu:5``); its jobs' ``gres_detail`` has them."""
    held: dict[str, set[int]] = {}
    for job in jobs:
        if job.holds_gpus:
            for name, indexes in job.gpus.items():
                held.setdefault(name, set()).update(indexes)
    return tuple(
        dataclasses.replace(node, gpus_used=tuple(sorted(held[node.name].union(node.gpus_used))))
        if node.name in held
        else node
        for node in nodes
    )
