"""What the central side sends out: placed jobs to their nodes' agents, and wake-ups to the
placement loop.

A job crosses to an agent as the executor's own :class:`~scheduling.agent.wire.JobSpec`
(``to_dict``, one per node of the job, in a ``scheduling.run_jobs`` message per node with the
other jobs placed with it); the agent reports back with the executor's events
(``scheduling.job_events``). The loop and the job services both
use this module, and neither imports the other.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass

from celery import current_app
from django.conf import settings
from django.utils import timezone
from kombu import Producer
from redis.exceptions import RedisError

from gpuadmin.access.node_signing import send_as_central
from gpuadmin.access.nodes import NoCredential, order_keys, send_order
from gpuadmin.access.services import unix_account_of
from inventory import live
from inventory.models import Gpu, MigInstance
from inventory.nvml.parsers.common import format_cpu_list, parse_cpu_list
from scheduling.agent.wire import FinalState, JobFinished, JobSpec, RayPart, executor_id
from scheduling.jobs import ray
from scheduling.models import Allocation, Job

log = logging.getLogger("gpuadmin.placement")


def wake_key() -> str:
    """Set while a pass is asked for and not yet started (one per central queue)."""
    return f"gpuadmin:placement:wake:{settings.GPUADMIN_CENTRAL_QUEUE}"


def running_key() -> str:
    """Set while a woken pass holds the loop (``pass_running`` to ``pass_done``)."""
    return f"gpuadmin:placement:running:{settings.GPUADMIN_CENTRAL_QUEUE}"


WAKE_TTL_S = 60
# A wake left to a running pass (``DEFERRED``) lasts as long as that pass's lease unrenewed
# (``GPUADMIN_LEASE_TTL_S``): should its worker die (no ``pass_done``), wakes send tasks again
# once its lease has expired, and their pass takes the loop over.
# Longer than a pass takes at 10,000 waiting jobs (bench/loop.py); a pass that outlives it,
# or a worker that dies in one, only brings back the tasks that find the lock taken
# (``defer_wake``).
RUNNING_TTL_S = 10
# The wake key's value once a wake was left to the pass running: that pass asks again.
DEFERRED = b"deferred"
# A wake and the end of a pass are each one script, so that they never miss each other. A
# wake while a woken pass runs sends no task (it would find the loop's lock taken and do
# nothing) but leaves the wake to that pass. KEYS: the wake key, the running key.
_WAKE = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then return 1 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 0
"""
_PASS_DONE = """
redis.call('DEL', KEYS[2])
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0
"""


def wake() -> None:
    """Ask for a placement pass, unless one is already asked for and not yet started, or a
    woken pass runs: the wake is then left to it (``pass_done`` asks for the next pass)."""
    try:
        keys = (wake_key(), running_key())
        send = live.client().eval(
            _WAKE, 2, *keys, str(WAKE_TTL_S), DEFERRED.decode(), str(settings.GPUADMIN_LEASE_TTL_S)
        )
    except RedisError as exc:  # beat's backstop pass will come
        log.warning("cannot wake the placement loop: %s", exc)
        return
    if send:
        current_app.send_task("scheduling.placement_pass")


def defer_wake() -> None:
    """Before a pass that was asked for tries the loop's lock: mark the wake as left to the
    pass that holds the lock, should one hold it (``pass_done`` then asks again)."""
    with suppress(RedisError):  # the pass holding the lock, or beat's, will come
        live.client().set(wake_key(), DEFERRED, xx=True, ex=settings.GPUADMIN_LEASE_TTL_S)


def pass_running() -> None:
    """A woken pass holds the loop's lock: wakes from now on are left to it. (Should Redis
    fail here, they ask for passes that find the lock taken and defer to this one.)"""
    with suppress(RedisError):
        live.client().set(running_key(), "1", ex=RUNNING_TTL_S)


def pass_done() -> None:
    """After a woken pass, its lock released: a wake left to it asks for the next pass now,
    behind what the central queue holds (the agents' reports that came meanwhile, mostly):
    those are recorded first, and one pass places all the GPUs they gave back."""
    try:
        again = live.client().eval(_PASS_DONE, 2, wake_key(), running_key(), DEFERRED.decode())
    except RedisError as exc:  # beat's backstop pass will come
        log.warning("cannot wake the placement loop: %s", exc)
        return
    if again:
        current_app.send_task("scheduling.placement_pass")


def dispatch(job_id: int) -> None:
    """Send a SCHEDULED job to the agent of every node it was placed on."""
    job = Job.objects.select_related("owner__unix_account").get(pk=job_id)
    send_to_agents(job, Allocation.objects.active().filter(job=job).select_related("gpu", "node"))


def send_placed(
    placed: Iterable[tuple[Job, Iterable[Allocation]]], producer: Producer | None = None
) -> None:
    """Send the placed jobs to their nodes' agents: one ``scheduling.run_jobs`` message per
    node with the specs of all its jobs (``job_spec``, in the order given), through one
    broker producer whose messages go out together (a Redis pipeline: the loop places
    hundreds at once, and a message or a round trip each would cost more than their commit;
    the agent starts a message's jobs one after the other), each signed for its node
    (``send_order``). A job whose spec is invalid (a row stored before today's submission
    checks), or placed on a node that has no credential to sign its orders with, is reported
    failed, as an agent reports a job it cannot start."""
    placed = [(job, list(allocations)) for job, allocations in placed]
    facts = _catalog_facts(allocation for _, allocations in placed for allocation in allocations)
    jobs = [(job, _node_specs(job, allocations, facts)) for job, allocations in placed]
    keys = order_keys({hostname for _, specs in jobs for hostname, _ in specs})
    by_node: dict[str, list[JobSpec]] = defaultdict(list)
    for job, specs in jobs:
        if unsigned := sorted({hostname for hostname, _ in specs if not keys[hostname]}):
            _report_failed(job, f"cannot reach the agent of {', '.join(unsigned)}: the node "
                           "has no credential")  # fmt: skip
            continue
        for hostname, spec in specs:
            by_node[hostname].append(spec)
    if not by_node:
        return
    with current_app.producer_or_acquire(producer) as sender, sender.batch():
        for hostname, node_specs in by_node.items():
            send_order(
                hostname,
                "scheduling.run_jobs",
                ([spec.to_dict() for spec in node_specs],),
                keys=keys[hostname],
                # What logs and events show of the message: its jobs, not their commands
                # and environments (nor the time Celery takes to print them).
                argsrepr=f"({[spec.job_id for spec in node_specs]!r},)",
                producer=sender,
            )


def send_to_agents(
    job: Job, allocations: Iterable[Allocation], producer: Producer | None = None
) -> None:
    """Send ``job`` to the agent of each node of its ``allocations`` (GPU rows and nodes
    loaded): ``send_placed`` of one job."""
    send_placed([(job, allocations)], producer)


@dataclass(frozen=True)
class Confinement:
    """What confines a job's part on one node: its GPUs' device minor numbers, its MIG
    devices (GPU minor, GPU instance, compute instance), the CPUs near its GPUs (a cpulist),
    and whether the node's admin allows it to run unconfined."""

    gpu_minors: tuple[int, ...] = ()
    mig_devices: tuple[tuple[int, int, int], ...] = ()
    cpu_affinity: str = ""
    allow_unconfined: bool = False


def _catalog_facts(
    allocations: Iterable[Allocation],
) -> tuple[dict[int, tuple[int | None, str, bool]], dict[int, tuple[int, int]]]:
    """GPU id -> (minor number, CPU affinity, its node allows unconfined jobs), and MIG device
    id -> (GPU instance, compute instance), in two queries for all the jobs sent together."""
    gpu_ids = {allocation.gpu_id for allocation in allocations}
    mig_ids = {a.mig_instance_id for a in allocations if a.mig_instance_id is not None}
    gpus = {
        pk: (minor, affinity or "", allowed)
        for pk, minor, affinity, allowed in Gpu.objects.filter(pk__in=gpu_ids).values_list(
            "pk", "minor_number", "cpu_affinity", "node__allow_unconfined"
        )
    }
    migs = {
        pk: (gi, ci)
        for pk, gi, ci in MigInstance.objects.filter(pk__in=mig_ids).values_list(
            "pk", "gi_id", "ci_id"
        )
    }
    return gpus, migs


def _confinement(
    allocations: list[Allocation],
    gpus: dict[int, tuple[int | None, str, bool]],
    migs: dict[int, tuple[int, int]],
) -> Confinement:
    minors: list[int] = []
    mig_devices: list[tuple[int, int, int]] = []
    near: set[int] = set()
    allowed = True
    for allocation in allocations:
        minor, affinity, allowed_here = gpus.get(allocation.gpu_id, (None, "", False))
        near.update(parse_cpu_list(affinity) or ())
        allowed = allowed and allowed_here
        if minor is None:  # not scanned yet: the agent refuses to confine what it cannot name
            continue
        if allocation.mig_instance_id in migs:
            mig_devices.append((minor, *migs[allocation.mig_instance_id]))
        elif allocation.mig_instance_id is None:
            minors.append(minor)
    return Confinement(tuple(minors), tuple(mig_devices), format_cpu_list(near), allowed)


def _node_specs(
    job: Job,
    allocations: Iterable[Allocation],
    facts: tuple[dict[int, tuple[int | None, str, bool]], dict[int, tuple[int, int]]],
) -> list[tuple[str, JobSpec]]:
    """What each node of the job's ``allocations`` runs of it (GPUs in index order), by
    hostname; none, and the job reported failed, when the executor would refuse its spec."""
    by_node: dict[str, list[Allocation]] = defaultdict(list)
    for allocation in sorted(allocations, key=lambda allocation: allocation.gpu.index):
        by_node[allocation.node.hostname].append(allocation)
    hostnames = sorted(by_node)
    try:
        ray_parts: list[RayPart | None] = [None] * len(hostnames)
        if job.ray:
            ray_parts = list(ray.cluster_parts(job, hostnames))
        return [
            (
                host,
                job_spec(
                    job,
                    # A MIG device's own UUID (MIG-...); a whole GPU's or an MPS share's, GPU-...
                    [a.device_uuid or a.gpu.uuid for a in by_node[host]],
                    rank,
                    hostnames,
                    confinement=_confinement(by_node[host], *facts),
                    ray_part=ray_parts[rank],
                ),
            )
            for rank, host in enumerate(hostnames)
        ]
    except ValueError as exc:
        _report_failed(job, f"cannot start: {exc}")
        return []


def _report_failed(job: Job, message: str) -> None:
    """Report the job's attempt failed with ``message``, as an agent reports a job it
    cannot start."""
    failed = JobFinished(
        executor_id(job.pk, job.attempt), FinalState.FAILED, None, timezone.now(), message
    )
    send_as_central("scheduling.job_event", args=(failed.to_dict(),))


def send_cancel(
    job: Job,
    hostnames: Iterable[str],
    message: str,
    *,
    signal: str = "SIGTERM",
    grace_s: float | None = None,
) -> None:
    """Ask the agents of ``hostnames`` to stop the job's current attempt (``signal``, then
    SIGKILL after ``grace_s``, by default the agent's grace); each reports the end as a
    ``JobFinished``. A node without a credential is skipped (``send_order`` logs it)."""
    chosen = () if (signal, grace_s) == ("SIGTERM", None) else (signal, grace_s)
    for hostname in hostnames:
        with suppress(NoCredential):
            send_order(hostname, "scheduling.cancel_job", (job.pk, job.attempt, message, *chosen))


def job_spec(
    job: Job,
    gpu_uuids: list[str],
    rank: int,
    hostnames: list[str],
    *,
    confinement: Confinement | None = None,
    ray_part: RayPart | None = None,
) -> JobSpec:
    """What an agent runs of a job on one of its nodes (``hostnames``, ``rank`` its place
    among them), as its owner's Unix account, confined to its ``confinement``; with
    ``ray_part``, its part of a Ray application. ``ValueError`` for a job the executor would
    refuse."""
    confinement = confinement or Confinement()
    env = {str(name): str(value) for name, value in job.env.items()}
    if len(hostnames) > 1:  # a multi-node gang: each part learns its place in it
        env.update(
            GPUADMIN_NODE_RANK=str(rank),
            GPUADMIN_NNODES=str(len(hostnames)),
            GPUADMIN_NODES=",".join(hostnames),
        )
    if job.array_id is not None:  # a task of a job array; Slurm's names too, for its scripts
        array, index = str(job.array_id), str(job.array_index)
        env.update(
            GPUADMIN_ARRAY_JOB_ID=array,
            GPUADMIN_ARRAY_TASK_ID=index,
            SLURM_ARRAY_JOB_ID=array,
            SLURM_ARRAY_TASK_ID=index,
        )
    env.update(host_request_env(job.cpus, job.host_memory_mib))
    if ray_part is not None:
        env.update(ray.environment(job))
    image = job.container_image or None
    workdir = job.working_dir or None
    account = unix_account_of(job.owner)
    return JobSpec(
        job_id=executor_id(job.pk, job.attempt),
        unix_user=account.username,
        allow_root=account.allow_root,
        argv=() if job.use_shell else job.command,
        shell_command=" ".join(job.command) if job.use_shell else None,
        env=env,
        gpu_uuids=gpu_uuids,
        max_runtime_s=job.max_runtime_s,
        container_image=image,
        # A container's working directory is inside its image; its runtime's client, like a
        # job without a directory, starts in a scratch folder the agent gives it.
        cwd=None if image else workdir,
        container_workdir=workdir if image else None,
        mps_percent=job.mps_percent,
        mps_memory_mib=job.mps_memory_mib,
        gpu_minors=confinement.gpu_minors,
        mig_devices=confinement.mig_devices,
        cpu_affinity=confinement.cpu_affinity,
        cpus=job.cpus,
        memory_mib=job.host_memory_mib,
        allow_unconfined=confinement.allow_unconfined,
        ray=ray_part,
    )


def host_request_env(cpus: int, memory_mib: int) -> dict[str, str]:
    """What a job learns of its host request on each node (0: none asked, nothing set), with
    Slurm's names for its scripts: ``GPUADMIN_CPUS`` (``SLURM_CPUS_PER_TASK``) and
    ``GPUADMIN_HOST_MEMORY_MIB`` (``SLURM_MEM_PER_NODE``), which its cgroup enforces on a
    node that confines jobs (``JobSpec.cpus``, ``JobSpec.memory_mib``). ``OMP_NUM_THREADS``
    is left to the job: a launcher such as torchrun sets it to 1 per process when it is
    unset, and the request's count would oversubscribe the CPUs once per process."""
    env: dict[str, str] = {}
    if cpus:
        env.update(GPUADMIN_CPUS=str(cpus), SLURM_CPUS_PER_TASK=str(cpus))
    if memory_mib:
        env.update(GPUADMIN_HOST_MEMORY_MIB=str(memory_mib), SLURM_MEM_PER_NODE=str(memory_mib))
    return env
