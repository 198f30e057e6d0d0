"""The placement engine: a pure function from a snapshot of the fleet to decisions.

Plain Python, no Django imports; the scheduling app builds the Snapshot from the database,
calls `plan`, and commits each decision in its own transaction.

Inputs (frozen dataclasses): a `Snapshot` taken at `now` holds `NodeInfo`s, `GpuSlot`s (whole
GPUs with NUMA node, socket, NVLink domain, availability and allocation), the `RunningJob`s
with their expected ends, and the `queue` of `JobRequest`s (`node_count` nodes with
`gpus_per_node` GPUs each, a GPU model, a minimum of free memory, a NUMA/NVLink requirement).

    result = plan(snapshot, POLICIES["priority"]())

One pass considers the queued jobs in the `Policy`'s order (`Fcfs`, `PriorityWithAging`) and
returns a `PassResult`:
- `placements`: a `Placement` per job placed: its GPUs per node, topology class, score and an
  explanation ("4 GPUs in one NVLink domain on dgx-01 (GPUs 0-3), NUMA nodes 1 and 3 on
  socket 0; best fit: leaves 4 free GPUs on that node").
- `pending`: a `Pending` per job left waiting, in queue order: its position, a `Reason` code,
  a message ("needs 4 GPUs in one NVLink domain; the largest free block is 3 on dgx-02"), the
  estimated start from running jobs' expected ends, and a what-if ("with 4 GPUs instead of 8
  it could start now").

Rules:
- A GPU that is unavailable or allocated is never placed, and none is given twice.
- Gangs (node_count > 1) are all or nothing; every node's part sits on one node.
- Topology first: one NVLink domain, then one NUMA node, then one socket, then anywhere on
  the node. Then best fit: the node with the fewest free GPUs that still holds the job, so
  whole nodes stay free for large jobs; then fewer sockets and NUMA nodes, and inside the
  node the smallest group that holds the job. Ties go to the hostname, then the GPU index,
  so a snapshot always gives the same result.
- A job that does not fit does not hold back the jobs behind it (no reservations yet).
- Pending reasons and what-ifs describe the fleet after the pass's placements. The estimated
  start ignores the waiting jobs ahead in the queue (they may take the GPUs first): it is the
  earliest possible start, counting the jobs placed in this pass as running.

`PlacementPass` is the same pass one job at a time (`place`, then `explain`), for callers
that interleave their own decisions, and for timing single decisions.
"""

from __future__ import annotations

from scheduling.placement.decisions import PassResult, Pending, Placement, Reason, TopologyClass
from scheduling.placement.engine import PlacementPass, plan
from scheduling.placement.policies import (
    DEFAULT_PRIORITY_POINTS,
    POLICIES,
    Fcfs,
    Policy,
    PriorityWithAging,
)
from scheduling.placement.snapshot import (
    GpuSlot,
    JobRequest,
    NodeInfo,
    NodeState,
    Priority,
    RunningJob,
    Snapshot,
    TopologyRequirement,
)

__all__ = [
    "DEFAULT_PRIORITY_POINTS",
    "POLICIES",
    "Fcfs",
    "GpuSlot",
    "JobRequest",
    "NodeInfo",
    "NodeState",
    "PassResult",
    "Pending",
    "Placement",
    "PlacementPass",
    "Policy",
    "Priority",
    "PriorityWithAging",
    "Reason",
    "RunningJob",
    "Snapshot",
    "TopologyClass",
    "TopologyRequirement",
    "plan",
]
