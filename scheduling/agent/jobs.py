"""The job side of a node agent: one ``Executor`` per agent process, its events reported to
the central worker, and (on simulated nodes) the simulator following the jobs' processes.

Jobs arrive as the executor's own ``JobSpec`` (``to_dict``, built by ``scheduling.loop.dispatch``)
and go back as its events. A job without a directory starts in a scratch folder of its own
(``<agent dir>/work/<job>.<attempt>``); an agent running as root starts each job as its owner's
Unix account (see the executor).

The agent's Celery worker runs with the solo pool, so the tasks of ``scheduling.tasks`` that
run on the node queue and the executor's threads share this process and its one executor.
Jobs arrive in batches (``run_jobs``: those placed on this node together); events leave in
batches too, through one sender thread (``report``, ``send_unsent``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import signal
import sys
import threading
import time
from collections import deque
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone
from kombu.exceptions import KombuError
from redis.exceptions import RedisError

from gpuadmin.access.node_signing import send_as_node
from inventory.agent import (
    jobs_run_as_owner,
    publish_sample,
    scan_this_node,
    write_sim_nvidia_smi,
)
from inventory.nvml.scanner import GpuFacts
from inventory.nvml.sim import faults
from scheduling.agent import mps_standin
from scheduling.agent.isolation.cgroups import HostCgroups, host_cgroups
from scheduling.agent.isolation.devices import DeviceRule
from scheduling.agent.mps import MpsDaemons
from scheduling.agent.supervisor import Executor
from scheduling.agent.wire import (
    ExecutorEvent,
    FinalState,
    JobFinished,
    JobSpec,
    JobStarted,
    executor_id,
    parse_executor_id,
)

log = logging.getLogger("gpuadmin.agent")

# What a simulated job's process does to each of its GPUs.
SIM_MEMORY_FRACTION = 0.6
SIM_UTILIZATION_PCT = 92
# What a simulated MPS server takes of its GPU.
SIM_MPS_SERVER_MIB = 300

_lock = threading.Lock()
_executor: Executor | None = None
_canceled: set[str] = set()  # executor ids canceled before their run_job arrived
_unsent: deque[ExecutorEvent] = deque()  # events not sent yet, oldest first
_unsent_lock = threading.RLock()
_unsent_changed = threading.Condition(_unsent_lock)
_sending = threading.Lock()  # held while events are sent (the sender thread, or the exit)
_sender: threading.Thread | None = None
_node_stopped: set[str] = set()  # executor ids of the jobs ``stop_jobs`` stopped


def agent_dir(hostname: str) -> Path:
    return settings.GPUADMIN_DATA_DIR / "agent" / hostname


def executor() -> Executor:
    """This agent's executor, started (and reconciled with what a previous agent left running)
    on first use."""
    global _executor
    with _lock:
        if _executor is None:
            root = agent_dir(settings.GPUADMIN_NODE_NAME)
            cgroups = node_cgroups()
            sim_options: dict[str, Any] = {}
            mps = MpsDaemons(root / "mps")
            if settings.GPUADMIN_NVML == "sim":
                sim_options = {
                    "on_process_started": _sim_started,
                    "on_process_ended": _sim_ended,
                    # Its jobs' nvidia-smi answers from the simulator.
                    "sim_tools_dir": write_sim_nvidia_smi(root / "sim-bin").parent,
                }
                mps = MpsDaemons(
                    root / "mps",
                    command=(sys.executable, mps_standin.__file__),
                    on_started=_sim_mps_started,
                    on_stopped=_sim_mps_stopped,
                )
            _executor = Executor(
                root / "logs",
                root / "executor",
                report,
                kill_grace_s=settings.GPUADMIN_JOB_KILL_GRACE_S,
                log_max_bytes=settings.GPUADMIN_JOB_LOG_MAX_BYTES,
                log_backups=settings.GPUADMIN_JOB_LOG_BACKUPS,
                container_runtime=settings.GPUADMIN_CONTAINER_RUNTIME,
                # Simulated GPUs have no devices to give a container.
                container_gpus=settings.GPUADMIN_NVML != "sim",
                node_name=settings.GPUADMIN_NODE_NAME,
                scratch_dir=root / "work",
                jobs_as_owner=jobs_run_as_owner(),
                mps=mps,
                cgroups=cgroups,
                # A real GPU of another user is at stake; a simulated one is not.
                require_confinement=settings.GPUADMIN_NVML == "real",
                pids_max=settings.GPUADMIN_JOB_PIDS_MAX,
                extra_devices=[
                    DeviceRule.parse(rule) for rule in settings.GPUADMIN_JOB_EXTRA_DEVICES
                ],
                container_cgroup_parent=settings.GPUADMIN_CONTAINER_CGROUP_PARENT,
                ray_python=settings.GPUADMIN_RAY_PYTHON or None,
                **sim_options,
            )
            log.info(
                "jobs run as %s; container runtime for jobs with an image: %s",
                "their owners' Unix accounts" if _executor.jobs_as_owner else "this agent",
                _executor.container_runtime,
            )
            log_isolation(cgroups)
            _executor.reconcile()
            running = [parse_executor_id(name) for name in _executor.running()]
            send_as_node("scheduling.agent_jobs", args=(settings.GPUADMIN_NODE_NAME, running))
        return _executor


@functools.cache
def node_cgroups() -> HostCgroups:
    """What confines this node's jobs (``GPUADMIN_CGROUP_VERSION``, ``GPUADMIN_CGROUP_ROOT``)."""
    return host_cgroups(settings.GPUADMIN_CGROUP_VERSION, settings.GPUADMIN_CGROUP_ROOT)


def isolation_report() -> dict[str, str]:
    """What the agent reports with its scans (the node page, the API, the fleet page)."""
    cgroups = node_cgroups()
    return {"isolation": cgroups.describe(), "reason": cgroups.reason()}


def log_isolation(cgroups: HostCgroups) -> None:
    """Say at the agent's start what confines its jobs, and why something does not."""
    if cgroups.confined:
        log.info("jobs are confined by %s", cgroups.describe())
        if cgroups.reason():
            log.warning("not confined: %s", cgroups.reason())
        if cgroups.unified is not None and not cgroups.favordynmods:
            log.info(
                "%s is not mounted with favordynmods: each job's start waits for an RCU grace "
                "period (5-20 ms) to move it into its cgroup",
                cgroups.unified,
            )
        return
    refused = settings.GPUADMIN_NVML == "real"
    log.warning(
        "jobs are NOT confined (%s): a job can open every GPU of this node and leave "
        "processes behind%s",
        cgroups.reason(),
        "; jobs are refused unless an admin allows unconfined jobs on this node" if refused else "",
    )


def run_job(data: dict[str, Any]) -> None:
    """Start the node's part of a placed job (a ``JobSpec.to_dict()``)."""
    name = data["job_id"]
    log.debug("job %s: run_job received", name)  # bench/throughput.py --profile reads it
    if name in _canceled:
        report(JobFinished(name, FinalState.CANCELED, None, timezone.now(), "canceled"))
        return
    try:
        spec = _with_device_numbers(JobSpec.from_dict(data))
    except ValueError as exc:  # a job that cannot start must end, not stay SCHEDULED
        report(JobFinished(name, FinalState.FAILED, None, timezone.now(), f"cannot start: {exc}"))
        return
    executor().launch(spec)


def _with_device_numbers(spec: JobSpec) -> JobSpec:
    """The spec with its devices' numbers read from this node's NVML when the central side
    did not send them all (GPUs its catalog has not yet scanned with them): the device
    allow-list needs each GPU's minor number and each MIG device's instances."""
    if len(spec.gpu_minors) + len(spec.mig_devices) >= len(spec.gpu_uuids):
        return spec
    minors: list[int] = []
    mig_devices: list[tuple[int, int, int]] = []
    by_uuid = _node_gpus()
    for uuid in spec.gpu_uuids:
        facts = by_uuid.get(uuid)
        if facts is not None and facts.minor_number is not None:
            minors.append(facts.minor_number)
    if len(minors) < len(spec.gpu_uuids):  # MIG devices: scanned now (they change)
        for gpu in scan_this_node(include=("facts", "mig")).gpus:
            for gi in gpu.mig.gpu_instances if gpu.mig else ():
                for ci in gi.compute_instances:
                    if ci.uuid in spec.gpu_uuids and gpu.facts.minor_number is not None:
                        mig_devices.append((gpu.facts.minor_number, gi.gi_id, ci.ci_id))
    return replace(spec, gpu_minors=minors, mig_devices=mig_devices)


def run_jobs(specs: list[dict[str, Any]]) -> None:
    """Start the jobs of one ``scheduling.run_jobs`` message, in order; one that fails to
    start is logged and never keeps the others from starting."""
    for data in specs:
        try:
            run_job(data)
        except Exception:
            log.exception("job %s: cannot start it", data.get("job_id"))


def cancel_job(
    job_id: int,
    attempt: int,
    message: str,
    signal_name: str = "SIGTERM",
    grace_s: float | None = None,
) -> bool:
    """Signal the job's processes with ``signal_name`` (then SIGKILL after ``grace_s``, by
    default the agent's grace; its JobFinished follows once they are gone); ``False`` when it
    does not run here: it is reported canceled now and will not start if it arrives."""
    name = executor_id(job_id, attempt)
    try:
        first = signal.Signals[signal_name]
    except KeyError:
        log.warning("job %s: unknown signal %r, sending SIGTERM", name, signal_name)
        first = signal.SIGTERM
    if executor().cancel(name, stop_signal=first, grace_s=grace_s):
        return True
    _canceled.add(name)
    report(JobFinished(name, FinalState.CANCELED, None, timezone.now(), message))
    return False


def stop_jobs(node: str) -> None:
    """The agent stops with its jobs (``--stop-jobs-on-exit``): each is canceled ("node NAME
    stopped") and its end reported as its node's stop, which the central side re-queues
    within the job's retries (``reports.job_events``), unlike a user's cancel."""
    jobs = executor()
    _node_stopped.update(jobs.running())
    jobs.shutdown(kill=True, message=f"node {node} stopped")


def tail_log(job_id: int, attempt: int, lines: int) -> dict[str, Any]:
    name = executor_id(job_id, attempt)
    runner = executor()
    return {"text": runner.tail(name, lines), "exists": runner.log_path(name).exists()}


def report(event: ExecutorEvent) -> None:
    """Queue an executor event for the central worker; the agent's sender thread sends it
    (``send_unsent``): an end at once, a start after at most ``START_LINGER_S``, together with
    whatever else is queued by then. The job's own thread never waits on the broker."""
    with _unsent_changed:
        _unsent.append(event)
        _unsent_changed.notify()
        _start_sender()


# Events one message carries at most (a message stays well under the broker's limits).
REPORT_BATCH = 500
# How long a start waits for other events before it is sent (an end goes at once): the starts
# of the jobs placed together, and the end of a job that ends at once, go in its message.
# Nothing waits on a start (its job holds its GPUs either way); ends free GPUs.
START_LINGER_S = 0.05


def send_unsent() -> bool:
    """Send the events not yet delivered, oldest first, in ``scheduling.job_events`` messages
    of all that wait (up to ``REPORT_BATCH``); ``False`` when the broker refuses one (its
    events and those after them are kept). A message with an end refreshes the node's live
    sample first: the executor reports a job finished only once its processes are gone, and
    the placement pass that the release wakes must not see them in an older sample (it would
    take the GPUs for busy and wait for the next wake). A burst of ends costs one message,
    one sample and one transaction centrally. A message names the ends of the jobs that
    ``stop_jobs`` stopped among its events (its second argument)."""
    with _sending:
        while True:
            with _unsent_lock:
                batch = list(itertools.islice(_unsent, REPORT_BATCH))
            if not batch:
                return True
            if any(isinstance(event, JobFinished) for event in batch):
                _publish_sample(batch)
            stopped = [
                event.job_id
                for event in batch
                if isinstance(event, JobFinished) and event.job_id in _node_stopped
            ]
            args = ([event.to_dict() for event in batch], *([stopped] if stopped else []))
            try:
                send_as_node("scheduling.job_events", args=args)
            except (KombuError, OSError, RedisError):
                return False
            with _unsent_lock:
                for _ in batch:
                    _unsent.popleft()
            if log.isEnabledFor(logging.DEBUG):  # bench/throughput.py --profile reads it
                log.debug("job events sent: %s", " ".join(_event_names(batch)))


def flush_reports() -> bool:
    """Send what is queued now (the agent's exit: its sender thread dies with it); ``False``
    when the broker refuses (the events are lost with the process, and the next agent's
    ``agent_jobs`` list accounts for their jobs)."""
    return send_unsent()


def _start_sender() -> None:
    """The agent's one sender thread, started with the first event (the caller holds the
    lock). While the broker refuses, it retries every ``GPUADMIN_SAMPLE_INTERVAL_S``: a job
    that ends while the broker is down would otherwise stay RUNNING, its GPUs held, for as
    long as the agent lives."""
    global _sender
    if _sender is None:
        _sender = threading.Thread(target=_send_forever, name="job-event-sender", daemon=True)
        _sender.start()


def _send_forever() -> None:
    refused = False
    while True:
        with _unsent_changed:
            _unsent_changed.wait_for(lambda: _unsent)
            linger_until = time.monotonic() + START_LINGER_S
            while not any(isinstance(event, JobFinished) for event in _unsent):
                left = linger_until - time.monotonic()
                if left <= 0:
                    break
                _unsent_changed.wait(left)
        if send_unsent():
            if refused:
                log.info("job events held while the broker was away are delivered")
            refused = False
            continue
        if not refused:
            log.warning(
                "cannot reach the broker to report job %s; its events are resent every %g s",
                _unsent[0].job_id,
                settings.GPUADMIN_SAMPLE_INTERVAL_S,
            )
        refused = True
        time.sleep(settings.GPUADMIN_SAMPLE_INTERVAL_S)


def _event_names(batch: list[ExecutorEvent]) -> list[str]:
    return [
        f"{event.job_id}:{'started' if isinstance(event, JobStarted) else 'finished'}"
        for event in batch
    ]


def _publish_sample(batch: list[ExecutorEvent]) -> None:
    """The node's live sample, before ends are reported (see ``send_unsent``)."""
    try:
        publish_sample(settings.GPUADMIN_NODE_NAME)
    except (OSError, RedisError) as exc:  # the periodic sample and beat's pass will come
        ended = ", ".join(event.job_id for event in batch if isinstance(event, JobFinished))
        log.warning("cannot publish the sample after job %s: %s", ended, exc)


# Simulated nodes: the job's real process shows on its GPUs in the simulator's NVML.


def _sim_target() -> tuple[str, str]:
    return str(settings.GPUADMIN_SIM_STATE_DIR), settings.GPUADMIN_NODE_NAME


def _sim_started(spec: JobSpec, pid: int) -> None:
    """The job's process shows on its GPUs: whole GPUs, its MIG device, or its MPS share (its
    memory limit, else its percent of the memory, and its percent of the utilization)."""
    state_dir, node = _sim_target()
    by_uuid = _node_gpus()
    mig_devices = {}
    if not by_uuid.keys() >= set(spec.gpu_uuids):  # MIG devices: scanned now (they change)
        scanned = scan_this_node(include=("facts", "mig")).gpus
        by_uuid = {gpu.facts.uuid: gpu.facts for gpu in scanned if gpu.facts.uuid}
        mig_devices = {
            ci.uuid: (gpu.facts.index, gi, ci.ci_id)
            for gpu in scanned
            for gi in (gpu.mig.gpu_instances if gpu.mig else ())
            for ci in gi.compute_instances
            if ci.uuid
        }
    for uuid in spec.gpu_uuids:
        if uuid in mig_devices:
            index, gi, ci_id = mig_devices[uuid]
            faults.start_process(
                state_dir,
                node,
                index,
                pid,
                used_mib=int(gi.memory_mib * SIM_MEMORY_FRACTION),
                util=SIM_UTILIZATION_PCT,
                gpu_instance=gi.gi_id,
                compute_instance=ci_id,
            )
            continue
        facts = by_uuid.get(uuid)
        if facts is None:
            continue
        total = facts.memory_total_mib or 0
        used, util = int(total * SIM_MEMORY_FRACTION), SIM_UTILIZATION_PCT
        if spec.mps_percent is not None:
            used = spec.mps_memory_mib or total * spec.mps_percent // 100
            util = SIM_UTILIZATION_PCT * spec.mps_percent // 100
        faults.start_process(state_dir, node, facts.index, pid, used_mib=used, util=util)


_gpu_facts: dict[str, dict[str, GpuFacts]] = {}  # by node, then by GPU UUID


def _node_gpus() -> dict[str, GpuFacts]:
    """The node's GPUs by UUID, scanned once (a GPU's UUID, index, minor number and memory do
    not change while the agent runs): a job's start does not re-scan the node."""
    gpus = _gpu_facts.setdefault(settings.GPUADMIN_NODE_NAME, {})
    if not gpus:
        scanned = scan_this_node(include=("facts",)).gpus
        # Not one the scan could not read: it is scanned again at the next start.
        readable = (g.facts for g in scanned if g.facts.uuid and g.facts.memory_total_mib)
        gpus.update({facts.uuid: facts for facts in readable if facts.uuid})
    return gpus


def _sim_ended(spec: JobSpec, pid: int) -> None:
    _sim_stop(pid)


def _sim_stop(pid: int) -> None:
    state_dir, node = _sim_target()
    with suppress(ValueError):  # already gone (a GPU reset, or it never started on a GPU)
        faults.stop_process(state_dir, node, pid)


def _sim_mps_started(gpu_uuid: str, pid: int) -> None:
    """An MPS control daemon shows on its simulated GPU, as the MPS server does on a real one."""
    state_dir, node = _sim_target()
    by_uuid = {gpu.facts.uuid: gpu.facts for gpu in scan_this_node(include=("facts",)).gpus}
    if gpu_uuid in by_uuid:
        faults.start_process(
            state_dir,
            node,
            by_uuid[gpu_uuid].index,
            pid,
            used_mib=SIM_MPS_SERVER_MIB,
            util=0,
            name="nvidia-cuda-mps-server",
        )


def _sim_mps_stopped(gpu_uuid: str, pid: int) -> None:
    _sim_stop(pid)
