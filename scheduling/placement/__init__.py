"""The placement engine: a pure function from a snapshot of the fleet to decisions.

Plain Python, no Django imports; the scheduling app builds the Snapshot from the database,
calls `plan`, and commits each decision.

Inputs (frozen dataclasses): a `Snapshot` taken at `now` holds `NodeInfo`s, `GpuSlot`s (whole
GPUs with NUMA node, socket, NVLink domain, availability, allocation, pool, MIG devices and MPS
use), the `RunningJob`s with their expected ends, owners and whether they may be preempted, the
`queue` of `JobRequest`s (`node_count` nodes with `gpus_per_node` GPUs each, a GPU model, a
minimum of free memory, a NUMA/NVLink requirement; or a MIG device or an MPS share), each
pool's `PoolConfig`, the `QuotaLimit`s, fair-share `usage`, `ReservationWindow`s and job
arrays' caps.

    result = plan(snapshot)                       # each pool's own policy
    result = plan(snapshot, POLICIES["fcfs"]())   # one policy for every pool (benches, tests)

A job runs only on the GPUs of its pool (no pool: the GPUs in no pool). Each pool's queue is
ordered by its policy (`policy_for`): `Fcfs`, `PriorityWithAging`, `Sjf` (by the user's
estimate), `FairShare` (weighted per user and project, `fairshare`), `Las` (Tiresias'
discretized least attained service) or `Qssf` (Helios' quasi-shortest service first: the least
likely GPU-seconds first, runtimes predicted from finished jobs by `predict.History` where
users give no estimate). Every policy but FCFS adds points for waiting (LAS:
returns a job to its top queue), so a job that waited long enough ranks ahead of every later
one. Then, job by job in that order:
- Admission: a job whose array runs as many tasks as its cap allows waits (`ARRAY_LIMIT`); a
  job naming a reservation waits until its window runs, and must end by its end
  (`RESERVATION`); a job over its user's or project's quota (`quotas`, this pass's starts
  counted) waits (`QUOTA`), or, where the pool lends idle GPUs, runs on them as `borrowed`
  (preemptible, reclaimed first); a job in its own reservation is never over quota (the
  quotas admitted the reservation); unless its pool's hardware, whatever its state, could
  never run it (`Diagnosis.never`): then that is its reason.
- MIG and MPS jobs go to the sharing pass (`sharing`), which may instead ask for a MIG
  instance to be created (`mig_creates`).
- Whole-GPU jobs are placed in their view of the fleet: the free GPUs less those a reservation
  window holds before the job would end (by its maximum runtime; unknown: never), and, once
  the pool has a head job, less the head's GPUs unless the job ends before the head's shadow
  start (EASY backfill, `backfill`), by its likely runtime (`JobRequest.likely_runtime_s`:
  the estimate, else the prediction, else the maximum runtime; running jobs' ends likewise,
  `predict.release_at`). The first job that does not fit and that the working
  hardware can ever hold becomes the head; the pool's later jobs may not delay its start.
  Without backfill nothing starts behind the head (strict order). So the job first in line
  always starts, and by the ordering every job gets to be first: no job starves.
- A whole-GPU job that does not fit may preempt (`preemption`): the fewest preemptible or
  borrowed running jobs that free a topology-correct placement (`preemptions`): borrowed
  work at once; other work that has run the pool's `preempt_exempt_s`, would rank below the
  job in the pool's order were it waiting, and is of a lower priority, in a higher queue of
  attained service (LAS) or held by owners further over their fair share by a margin. The
  job waits (`PREEMPTING`) and their GPUs go to no one else in the pass. Where stopping
  running jobs would start it but none may be stopped, its reason says why
  (`PREEMPT_EXEMPT`, `PREEMPT_ORDER`, `NOT_PREEMPTIBLE`; `preemption.Victims.refusal`).
- `placements`: a `Placement` per job placed: its GPUs per node (or MIG device, MPS share),
  topology class, score and an explanation ("4 GPUs in one NVLink domain on dgx-01 (GPUs
  0-3), NUMA nodes 1 and 3 on one socket; best fit: leaves 4 free GPUs on that node").
- `pending`: a `Pending` per job left waiting, pool by pool in queue order (positions count
  per pool): a `Reason` code, a message ("needs 4 GPUs in one NVLink domain; the largest free
  block is 3 on dgx-02"), the estimated start from running jobs' expected ends, and a what-if
  ("with 4 GPUs instead of 8 it could start now"). A job that would fit the free GPUs but is
  kept off them waits for the head (`PRIORITY`) or a reservation (`RESERVATION`).

Placement rules:
- A GPU that is unavailable or allocated is never placed, and none is given twice.
- Gangs (node_count > 1) are all or nothing; every node's part sits on one node.
- A node's part (whole GPUs, a MIG device or an MPS share) goes only where the node's free
  host CPUs and memory hold the job's `cpus` and `host_memory_mib` (`hosts`: the node's
  `NodeInfo` figures, None no limit, less what running jobs hold on each node of their GPUs
  and what the pass placed there).
- Topology first: one NVLink domain, then one NUMA node, then one socket, then anywhere on
  the node. Then best fit: the node with the fewest free GPUs that still holds the job, so
  whole nodes stay free for large jobs; then fewer sockets and NUMA nodes, and inside the
  node the smallest group that holds the job. Ties go to the hostname, then the GPU index,
  so a snapshot always gives the same result.
- Pending reasons and what-ifs describe the fleet after the pass's placements. The estimated
  start ignores the waiting jobs ahead in the queue (they may take the GPUs first): it is the
  earliest possible start, counting the jobs placed in this pass as running.

`PlacementPass` places whole-GPU jobs on one set of GPUs one job at a time (`place`, then
`explain`), for callers that interleave their own decisions, and for timing single decisions.
"""

from __future__ import annotations

from scheduling.placement.decisions import (
    MigCreate,
    PassResult,
    Pending,
    Placement,
    Preemption,
    Reason,
    TopologyClass,
)
from scheduling.placement.engine import PlacementPass
from scheduling.placement.fairshare import (
    FairShareExplanation,
    FairShareTable,
    Standing,
    fairshare_factor,
)
from scheduling.placement.planner import plan
from scheduling.placement.policies import (
    DEFAULT_PRIORITY_POINTS,
    POLICIES,
    FairShare,
    Fcfs,
    Las,
    Policy,
    PriorityWithAging,
    Qssf,
    Sjf,
    policy_for,
)
from scheduling.placement.predict import Completed, History
from scheduling.placement.sharing import MpsState, mps_fits
from scheduling.placement.snapshot import (
    GpuSlot,
    JobRequest,
    MigSlot,
    NodeInfo,
    NodeState,
    PoolConfig,
    Priority,
    QuotaLimit,
    ReservationWindow,
    RunningJob,
    Snapshot,
    TopologyRequirement,
)

__all__ = [
    "DEFAULT_PRIORITY_POINTS",
    "POLICIES",
    "FairShare",
    "FairShareExplanation",
    "FairShareTable",
    "Completed",
    "Fcfs",
    "GpuSlot",
    "History",
    "JobRequest",
    "Las",
    "MigCreate",
    "MigSlot",
    "MpsState",
    "NodeInfo",
    "NodeState",
    "PassResult",
    "Pending",
    "Placement",
    "PlacementPass",
    "Policy",
    "PoolConfig",
    "Preemption",
    "Priority",
    "PriorityWithAging",
    "Qssf",
    "QuotaLimit",
    "Reason",
    "ReservationWindow",
    "RunningJob",
    "Sjf",
    "Snapshot",
    "Standing",
    "TopologyClass",
    "TopologyRequirement",
    "fairshare_factor",
    "mps_fits",
    "plan",
    "policy_for",
]
