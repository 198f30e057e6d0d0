"""Stable lowercase values for inventory states, with the badge colour the UI shows for each."""

from django.db import models


class NodeState(models.TextChoices):
    """What an admin decided for a node (its reachability is derived from heartbeats)."""

    ONLINE = "online", "Online"
    DRAINING = "draining", "Draining"
    OFFLINE = "offline", "Offline"


class GpuState(models.TextChoices):
    """A GPU's service state, as an admin or the health policies set it through
    ``inventory.services.set_gpu_state`` (the one place that changes it; ``GPU_TRANSITIONS``
    says which changes are legal). Whether a job holds the GPU is the allocations' business,
    and "missing" is what the last scan saw (``Gpu.missing_since``): neither is stored here."""

    AVAILABLE = "available", "Available"
    DRAINING = "draining", "Draining"  # no new work; running work finishes
    DEGRADED = "degraded", "Degraded"  # fenced by a health policy: no new work until it recovers
    RESETTING = "resetting", "Resetting"  # a GPU reset is under way through the node's agent
    OFFLINE = "offline", "Offline"  # out of service now


# The states people put a GPU in (maintenance from the admin, the API and its page), with
# what the change is called; degraded and resetting are the health policies' to set.
MAINTENANCE_GPU_STATES: dict[str, str] = {
    GpuState.AVAILABLE: "Bring online",
    GpuState.DRAINING: "Drain",
    GpuState.OFFLINE: "Take offline",
}
MAINTENANCE_NODE_STATES: dict[str, str] = {
    NodeState.ONLINE: "Bring online",
    NodeState.DRAINING: "Drain",
    NodeState.OFFLINE: "Take offline",
}


class NvmlBackend(models.TextChoices):
    """What a node's agent queries (``GPUADMIN_NVML`` on that node)."""

    REAL = "real", "real NVML"
    SIM = "sim", "NVML simulator"


#: ``Node.job_account`` of a node whose agent runs as root: each job runs as its owner's Unix
#: account (not a Unix user name itself: it has a space).
JOBS_RUN_AS_OWNER = "per owner"
# A node's isolation (``Node.isolation``) when its agent confines none of a job's resources.
ISOLATION_NONE = "none"

BADGE_COLOURS: dict[str, str] = {
    NodeState.ONLINE: "green",
    NodeState.DRAINING: "amber",
    NodeState.OFFLINE: "grey",
    GpuState.AVAILABLE: "green",
    GpuState.DRAINING: "amber",
    GpuState.DEGRADED: "red",
    GpuState.RESETTING: "amber",
    GpuState.OFFLINE: "grey",
}
