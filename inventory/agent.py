"""What runs on a node agent: its NVML backend, its queue, and the loop that keeps the central
catalog current (registration, heartbeats, scans on start and periodically)."""

from __future__ import annotations

import logging
import os
import pwd
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone
from kombu.exceptions import KombuError
from redis.exceptions import RedisError

from gpuadmin import __version__
from inventory import live, signals
from inventory.choices import JOBS_RUN_AS_OWNER
from inventory.models import Node
from inventory.nvml import SECTIONS, open_backend, smi
from inventory.nvml.scanner import NodeScan, scan

# What a live sample needs: memory used and MIG mode are facts, the counters the health
# watcher compares are the health section.
SAMPLE_SECTIONS = ("facts", "metrics", "health")

log = logging.getLogger("gpuadmin.agent")

# Held from a scan to the publication of its sample, so that samples reach Redis in the order
# they were taken: a sample taken before a job's processes ended never replaces one taken after.
_sampling = threading.Lock()


def jobs_run_as_owner() -> bool:
    """Whether this agent starts each job as its owner's Unix account: only as root (nothing
    else can switch accounts), unless ``GPUADMIN_JOBS_AS_OWNER`` is off."""
    return os.geteuid() == 0 and settings.GPUADMIN_JOBS_AS_OWNER == "auto"


def job_account() -> str:
    """Whose Unix account this node's jobs run as: ``JOBS_RUN_AS_OWNER`` (each job's owner's),
    or the agent's own."""
    if jobs_run_as_owner():
        return JOBS_RUN_AS_OWNER
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (a container's arbitrary user)
        return str(uid)


def _simulator() -> dict[str, Any]:
    """Which simulator a simulated node's agent opens: its machine model (or its entry of the
    fleet spec), its name, its state directory."""
    return {
        "sim_model": settings.GPUADMIN_SIM_MODEL or None,
        "sim_fleet": None if settings.GPUADMIN_SIM_MODEL else settings.GPUADMIN_SIM_FLEET,
        "node_name": settings.GPUADMIN_NODE_NAME,
        "state_dir": str(settings.GPUADMIN_SIM_STATE_DIR),
    }


def node_backend() -> Any:
    """The agent's own NVML backend: real NVML, or the simulated machine model it was given
    (its state shared with the node's other processes under ``GPUADMIN_SIM_STATE_DIR``)."""
    if settings.GPUADMIN_NVML == "sim":
        return open_backend("sim", **_simulator())
    return open_backend("real")


def write_sim_nvidia_smi(directory: Path) -> Path:
    """A simulated node's ``nvidia-smi`` in ``directory`` (``inventory.nvml.smi``), answering
    from the simulator ``node_backend`` opens: for its jobs' ``PATH``."""
    options = _simulator()
    return smi.write_shim(
        directory,
        python=sys.executable,
        node=options["node_name"],
        state_dir=options["state_dir"],
        sim_model=options["sim_model"],
        sim_fleet=str(options["sim_fleet"]) if options["sim_fleet"] else None,
    )


def scan_this_node(include: tuple[str, ...] = SECTIONS) -> NodeScan:
    """Scan the agent's own GPUs: real NVML, or the simulated machine model it was given."""
    return scan(node_backend(), include=include)


def machine_model(result: NodeScan) -> str:
    """What the node is: the simulated model's name, or e.g. ``8x NVIDIA H100 80GB HBM3``."""
    if settings.GPUADMIN_NVML == "sim" and settings.GPUADMIN_SIM_MODEL:
        return settings.GPUADMIN_SIM_MODEL
    names = sorted({gpu.facts.name for gpu in result.gpus if gpu.facts.name})
    return f"{len(result.gpus)}x {' + '.join(names)}" if names else ""


def publish_sample(hostname: str) -> NodeScan:
    """Scan the node's GPUs now, publish the live sample and return the scan. The job side
    calls it once a job's processes are gone, before reporting the job finished, so the
    placement pass that the report triggers sees the GPUs free, whenever the periodic sample
    comes."""
    with _sampling:
        result = scan_this_node(include=SAMPLE_SECTIONS)
        live.publish(hostname, result)
        sample_taken(hostname, result)
    return result


def sample_taken(hostname: str, result: NodeScan) -> None:
    """Tell the receivers (the health watcher) that a sample was published. Sent under the
    sampling lock, so they see samples in the order they were taken; a receiver that fails is
    logged and never stops the sampling."""
    for receiver, outcome in signals.sample_taken.send_robust(
        sender=Node, hostname=hostname, scan=result
    ):
        if isinstance(outcome, Exception):
            log.error(
                "agent %s: sample_taken receiver %s failed: %r",
                hostname,
                getattr(receiver, "__qualname__", receiver),
                outcome,
                exc_info=outcome,
            )


class AgentLoop(threading.Thread):
    """Registers the node and sends its scan, then publishes live samples, heartbeats and
    re-scans until stopped.

    Scans and heartbeats go to the central worker as Celery tasks; samples go to Redis. An
    outage is logged and the next tick tries again, starting with a full re-sync so the catalog
    reconciles. It logs what changes (a GPU failing or answering again, the broker lost or
    back), never each tick.
    """

    def __init__(
        self,
        hostname: str,
        send: Callable[..., Any],
        *,
        sample_s: float | None = None,
        heartbeat_s: float | None = None,
        rescan_s: float | None = None,
        isolation: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(name=f"agent-loop-{hostname}", daemon=True)
        self.hostname = hostname
        self.send = send
        #: What confines the node's jobs (``{"isolation": ..., "reason": ...}``), reported with
        #: every scan like whose account they run as.
        self.isolation = dict(isolation) if isolation is not None else None
        self.sample_s = sample_s or settings.GPUADMIN_SAMPLE_INTERVAL_S
        self.heartbeat_s = heartbeat_s or settings.GPUADMIN_HEARTBEAT_INTERVAL_S
        self.rescan_s = rescan_s or settings.GPUADMIN_RESCAN_INTERVAL_S
        self.stopped = threading.Event()
        self.gpu_errors: dict[int, str] = {}  # GPU index -> the NVML error last logged
        self.broker_lost = False
        self.synced = False

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        in_sync = False
        next_scan = next_beat = 0.0
        while True:
            now = time.monotonic()
            try:
                if not in_sync or now >= next_scan:
                    self.note_gpu_errors(self.sync())
                    in_sync, next_scan, next_beat = (
                        True,
                        now + self.rescan_s,
                        now + self.heartbeat_s,
                    )
                else:
                    self.note_gpu_errors(publish_sample(self.hostname))
                    if now >= next_beat:
                        self._send("inventory.heartbeat", self.hostname, timezone.now().isoformat())
                        next_beat = now + self.heartbeat_s
                if self.broker_lost:
                    log.info("agent %s: the broker answers again", self.hostname)
                    self.broker_lost = False
            except (KombuError, OSError, RedisError) as exc:
                if not self.broker_lost:
                    log.warning(
                        "agent %s: cannot reach the broker (%s); retrying every %g s",
                        self.hostname,
                        exc,
                        self.sample_s,
                    )
                    self.broker_lost = True
                in_sync = False
            if self.stopped.wait(self.sample_s):
                return

    def note_gpu_errors(self, result: NodeScan) -> None:
        """Log a GPU's NVML error when it appears or changes, and when the GPU answers again
        (every sample carries it; the scanner itself logs it at debug level only)."""
        errors = {}
        for gpu in result.gpus:
            index, message = gpu.facts.index, gpu.facts.error_message
            if message:
                errors[index] = message
                if self.gpu_errors.get(index) != message:
                    log.error("agent %s: GPU %d: %s", self.hostname, index, message)
            elif index in self.gpu_errors:
                log.info("agent %s: GPU %d answers again", self.hostname, index)
        self.gpu_errors = errors

    def sync(self) -> NodeScan:
        """Scan the whole node, publish its live sample, send the scan to the catalog and
        return it."""
        with _sampling:
            result = scan_this_node()
            live.publish(self.hostname, result)
            sample_taken(self.hostname, result)
        self._send(
            "inventory.sync_node",
            self.hostname,
            result.to_dict(),
            timezone.now().isoformat(),
            machine_model(result),
            __version__,
            settings.GPUADMIN_NVML,
            job_account(),
            self.isolation,
        )
        # The first scan is news; the periodic rescans are polling (the catalog logs changes).
        level = logging.DEBUG if self.synced else logging.INFO
        log.log(level, "agent %s: sent scan of %d GPUs", self.hostname, len(result.gpus))
        self.synced = True
        return result

    def _send(self, name: str, *args: Any) -> None:
        # A heartbeat is worthless once the next one is due: let the broker drop stale ones.
        self.send(name, args=args, expires=self.heartbeat_s * 3 if name.endswith("beat") else None)
