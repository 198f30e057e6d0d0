"""The scheduling app's models, each defined with its subject (Django loads an app's models from
this module): jobs, arrays and dependencies; allocations and accounted usage; reservations;
pool policies and quotas; MIG re-layouts; the placement loop's switch. Roles and API tokens live
in ``gpuadmin.access``."""

from scheduling.allocations.models import Allocation, AllocationKind, AllocationQuerySet, UsageDay
from scheduling.jobs.models import (
    HOLDING_STATES,
    NOT_WAITING,
    TERMINAL_STATES,
    DependencyKind,
    Job,
    JobArray,
    JobDependency,
    JobState,
    Priority,
    Topology,
    expected_end,
)
from scheduling.loop.models import SchedulerSettings
from scheduling.policies.models import PolicyName, PoolPolicy, Quota, QuotaPeriod
from scheduling.reservations.models import Reservation, ReservationGpu, ReservationState
from scheduling.sharing.models import (
    RELAYOUT_FIELDS,
    RELAYOUT_OPEN_STATES,
    MigRelayout,
    RelayoutState,
)

__all__ = [
    "HOLDING_STATES",
    "NOT_WAITING",
    "RELAYOUT_FIELDS",
    "RELAYOUT_OPEN_STATES",
    "TERMINAL_STATES",
    "Allocation",
    "AllocationKind",
    "AllocationQuerySet",
    "DependencyKind",
    "Job",
    "JobArray",
    "JobDependency",
    "JobState",
    "MigRelayout",
    "PolicyName",
    "PoolPolicy",
    "Priority",
    "Quota",
    "QuotaPeriod",
    "RelayoutState",
    "Reservation",
    "ReservationGpu",
    "ReservationState",
    "SchedulerSettings",
    "Topology",
    "UsageDay",
    "expected_end",
]
