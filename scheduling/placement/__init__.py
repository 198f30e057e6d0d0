"""The placement engine: a pure function from a snapshot of the fleet to decisions.

Plain Python, no Django imports; the scheduling app builds the Snapshot from the database,
calls `plan`, and commits each decision:

    result = plan(snapshot)                       # each pool's own policy
    result = plan(snapshot, POLICIES["fcfs"]())   # one policy for every pool (benches, tests)

The inputs, the order of a pass and the placement rules: docs/development/design-notes.md,
"The placement engine".
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
