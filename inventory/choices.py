"""Stable lowercase values for inventory states, with the badge colour the UI shows for each."""

from django.db import models


class NodeState(models.TextChoices):
    """What an admin decided for a node (its reachability is derived from heartbeats)."""

    ONLINE = "online", "Online"
    DRAINING = "draining", "Draining"
    OFFLINE = "offline", "Offline"


class GpuState(models.TextChoices):
    """What an admin decided for a GPU; health and allocation are tracked apart."""

    AVAILABLE = "available", "Available"
    DRAINING = "draining", "Draining"
    OFFLINE = "offline", "Offline"


class NvmlBackend(models.TextChoices):
    """What a node's agent queries (``GPUADMIN_NVML`` on that node)."""

    REAL = "real", "real NVML"
    SIM = "sim", "NVML simulator"


#: ``Node.job_account`` of a node whose agent runs as root: each job runs as its owner's Unix
#: account (not a Unix user name itself: it has a space).
JOBS_RUN_AS_OWNER = "per owner"

BADGE_COLOURS: dict[str, str] = {
    NodeState.ONLINE: "green",
    NodeState.DRAINING: "amber",
    NodeState.OFFLINE: "grey",
    GpuState.AVAILABLE: "green",
    GpuState.DRAINING: "amber",
    GpuState.OFFLINE: "grey",
}
