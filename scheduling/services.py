"""Jobs from submission to their end: the one owner of job state transitions (each audited),
allocations the database guards, and what node agents report.

The placement loop lives in ``scheduling.loop``; this module is what it and every interface
(API, pages, CLI, admin) call to change a job. Neither imports the other's caller: both wake
the loop and reach agents through ``scheduling.dispatch``.
"""

from __future__ import annotations

import logging
import posixpath
import re
import shlex
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypedDict

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import IntegrityError, transaction
from django.db.models import Count, Max
from django.db.models.functions import Now
from django.utils import timezone
from redis.exceptions import RedisError

from gpuadmin.audit.services import audit_event, record, record_all
from gpuadmin.text import unstorable
from inventory import live
from inventory.models import Gpu, Node
from scheduling import dispatch
from scheduling.executor import ExecutorEvent, JobStarted, parse_executor_id
from scheduling.models import (
    HOLDING_STATES,
    NOT_WAITING,
    TERMINAL_STATES,
    Allocation,
    Job,
    JobState,
    Priority,
)

S = JobState
log = logging.getLogger("gpuadmin.jobs")
# The state machine (seeds 002/003). SCHEDULED may end directly: a short job's end can be
# reported before its start is processed.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.QUEUED, S.CANCELED}),
    S.QUEUED: frozenset({S.PENDING, S.SCHEDULED, S.CANCELED}),
    S.SCHEDULED: frozenset({S.RUNNING, S.QUEUED, S.COMPLETED, S.FAILED, S.CANCELED}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.CANCELED, S.QUEUED, S.PREEMPTED}),
    S.PREEMPTED: frozenset({S.QUEUED, S.CANCELED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELED: frozenset(),
}

LOOP_ACTOR = "placement-loop"
AGENT_ACTOR = "agent"
HEALTH_ACTOR = "health"  # jobs stopped because the hardware under them failed

# Submission limits beyond the fleet's own shape: absurd values are refused up front. The one
# definition: the form and the serializer take their bounds from ``SUBMISSION_LIMITS``, and a
# value out of range is refused in the same words (Django's range validators') whichever way
# the job came in.
MAX_RUNTIME_S = 90 * 24 * 3600
MAX_ENV_VARS = 200
MAX_ARGV = 4096
# Linux takes at most 128 KiB per argument (MAX_ARG_STRLEN) and about 2 MiB of arguments and
# environment together: a job's whole command, and its whole environment, stay below 128 KiB.
MAX_COMMAND_CHARS = 128 * 1024
MAX_ENV_CHARS = 128 * 1024
SUBMISSION_LIMITS: dict[str, tuple[int, int]] = {
    "gpu_count": (1, 64),  # per node
    "node_count": (1, 1024),
    "min_gpu_memory_mib": (0, 1024 * 1024),  # 1 TiB per GPU: anything above is a typo
    "estimated_duration_s": (1, MAX_RUNTIME_S),
    "max_runtime_s": (1, MAX_RUNTIME_S),
    "max_retries": (0, 20),
}


class IllegalTransition(ValueError):
    """A state change the state machine does not allow; nothing was written."""


class JobRejected(ValueError):
    """A submission that can never run, naming the field and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Bounds(TypedDict):
    min_value: int
    max_value: int


def limit_bounds(field: str) -> Bounds:
    """``min_value``/``max_value`` for the form's or the serializer's field of that name."""
    low, high = SUBMISSION_LIMITS[field]
    return {"min_value": low, "max_value": high}


def check_limits(fields: Mapping[str, Any]) -> None:
    """``JobRejected`` naming the first field outside ``SUBMISSION_LIMITS``."""
    for name, (low, high) in SUBMISSION_LIMITS.items():
        value = fields.get(name)
        if value is None:
            continue
        try:
            MinValueValidator(low)(value)
            MaxValueValidator(high)(value)
        except ValidationError as exc:
            raise JobRejected(name, exc.messages[0]) from None


# Environment variables a job may not set, by exact name or by prefix: they choose which GPUs,
# MIG instances or MPS server a job sees, or configure the container runtime that runs it
# (gpuadmin sets the ones it needs from the allocation). The one list; README "What a job may
# not ask for" quotes it.
RESERVED_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_DISABLE_REQUIRE",
        "NVIDIA_GDS",
        "NVIDIA_IMEX_CHANNELS",
        "GPU_DEVICE_ORDINAL",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    }
)
RESERVED_ENV_PREFIXES = (
    "NVIDIA_REQUIRE_",
    "NVIDIA_MIG_",
    "CUDA_MPS_",
    "GPUADMIN_",
    "APPTAINERENV_",
    "APPTAINER_",
    "SINGULARITYENV_",
    "SINGULARITY_",
    "DOCKER_",
    "CONTAINERS_",
    "CONTAINER_HOST",
    "PODMAN_",
)
# A POSIX variable name (portable character set, no leading digit).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# The OCI image reference grammar (github.com/distribution/reference, regexp.go):
# [host[:port]/]path[:tag][@digest], at most 255 characters of name.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_HOST}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?\Z"
)
IMAGE_NAME_MAX = 255


def check_text(field: str, value: str) -> None:
    """``JobRejected`` for text PostgreSQL cannot store: NUL characters or lone surrogates."""
    problem = unstorable(value)
    if problem:
        raise JobRejected(field, problem)


def check_image(image: str) -> None:
    """``JobRejected`` unless ``image`` is an OCI image reference (``name[:tag][@digest]``):
    nothing a container runtime could read as one of its options."""
    match = IMAGE_REFERENCE.match(image)
    if match is None:
        raise JobRejected(
            "container_image",
            f"{image!r} is not an image reference: [registry[:port]/]name[:tag][@digest], "
            "name in lowercase letters, digits and separators",
        )
    if len(match["name"]) > IMAGE_NAME_MAX:
        raise JobRejected("container_image", f"a name of at most {IMAGE_NAME_MAX} characters")


def reserved_env_name(name: str) -> bool:
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def check_env(env: Mapping[str, str]) -> None:
    """``JobRejected`` naming ``env`` for a variable that is not a POSIX name, is reserved
    (``RESERVED_ENV_NAMES``/``_PREFIXES``) or holds text PostgreSQL cannot store."""
    if len(env) > MAX_ENV_VARS:
        raise JobRejected("env", f"at most {MAX_ENV_VARS} variables")
    if sum(len(name) + len(value) for name, value in env.items()) > MAX_ENV_CHARS:
        raise JobRejected("env", f"at most {MAX_ENV_CHARS} characters of names and values")
    for name, value in env.items():
        check_text("env", name)
        if not ENV_NAME.match(name):
            raise JobRejected("env", f"not a variable name: {name!r}")
        if reserved_env_name(name):
            raise JobRejected(
                "env", f"{name} is reserved: it would change the job's GPUs or its runtime"
            )
        check_text("env", value)


def split_command(command: str | list[str], use_shell: bool) -> list[str]:
    """A command as argv: a list is kept, a string is split like a POSIX shell would, and with
    ``use_shell`` the string is kept whole for ``/bin/sh -c``. ``JobRejected`` when a string
    cannot be split."""
    if isinstance(command, list):
        return command
    if use_shell:
        return [command]
    try:
        return shlex.split(command)
    except ValueError as exc:  # e.g. an unclosed quote
        raise JobRejected("command", f"cannot split into arguments: {exc}") from None


# --------------------------------------------------------------------------- transitions


def transition(
    job: Job | int,
    to: str,
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    message: str = "",
    expect: Iterable[str] | None = None,
    **fields: Any,
) -> Job:
    """Move a job to state ``to`` under a row lock, set ``fields``, release its allocations
    when it stops holding GPUs, and audit ``job.<to>``. ``expect`` narrows the states it may
    leave (e.g. only QUEUED for a placement). Raises ``IllegalTransition``."""
    job_id = job if isinstance(job, int) else job.pk
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job_id)
        allowed = TRANSITIONS[locked.state]
        if to not in allowed or (expect is not None and locked.state not in expect):
            raise IllegalTransition(f"job {job_id} cannot go from {locked.state} to {to}")
        before = {"state": locked.state}
        now = timezone.now()
        if to in TERMINAL_STATES:
            fields.setdefault("finished_at", now)
        if to in TERMINAL_STATES or to == S.QUEUED:
            fields.setdefault("pid", None)
        if message:
            fields["message"] = message
        # A job that stops waiting drops the loop's word on its wait (not audited, like it).
        changes = {**({} if to == S.QUEUED else NOT_WAITING), **fields}
        for name, value in changes.items():
            setattr(locked, name, value)
        locked.state = to
        locked.save(update_fields=["state", *changes])
        if before["state"] in HOLDING_STATES and to not in HOLDING_STATES:
            released = release_allocations(locked)
            if released:
                fields["released_gpus"] = released
        record(
            f"job.{to}",
            actor=actor,
            actor_name=actor_name,
            target=locked,
            before=before,
            after={"state": to, **_plain(fields)},
            message=message,
        )
        if to in TERMINAL_STATES or to == S.QUEUED:
            request_placement_pass()
    log.info("job %d: %s -> %s%s", job_id, before["state"], to, f" ({message})" if message else "")
    if not isinstance(job, int):
        job.__dict__.update(locked.__dict__)
    return locked


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if name != "message"}


def release_allocations(job: Job) -> list[str]:
    """End the job's active allocations (inside the caller's transaction); the GPU UUIDs.

    The GPU rows are locked first, as ``allocate`` locks them, and the release time is the
    database's statement time: the next allocation of a GPU is written only after this
    transaction commits, so its start is later than this end, on one clock."""
    active = list(
        Allocation.objects.active()
        .filter(job=job)
        .select_related("gpu")
        .select_for_update(of=("gpu",))
        .order_by("gpu_id")
    )
    if active:
        Allocation.objects.filter(pk__in=[a.pk for a in active]).update(released_at=Now())
    return [allocation.gpu.uuid for allocation in active]


# --------------------------------------------------------------------------- submission


@dataclass(frozen=True)
class FleetShape:
    """What the fleet could ever hold, to refuse impossible requests up front."""

    # model -> (largest GPU count on one node, nodes with GPUs of it, largest memory in MiB)
    models: dict[str, tuple[int, int, int]]

    @classmethod
    def cached(cls, max_age_s: float = 5.0) -> FleetShape:
        """The shape as of at most ``max_age_s`` ago (submissions come in bursts)."""
        global _fleet_shape
        taken_at, shape = _fleet_shape
        if shape is None or time.monotonic() - taken_at > max_age_s:
            shape = cls.now()
            _fleet_shape = (time.monotonic(), shape)
        return shape

    @staticmethod
    def forget() -> None:
        """Drop the cached shape (the next submission reads the fleet again)."""
        global _fleet_shape
        _fleet_shape = (0.0, None)

    @classmethod
    def now(cls) -> FleetShape:
        per_node = (
            Gpu.objects.present()
            .values("node_id", "name")
            .annotate(count=Count("pk"), memory=Max("memory_total_mib"))
        )
        models: dict[str, tuple[int, int, int]] = {}
        for row in per_node:
            count, nodes, memory = models.get(row["name"], (0, 0, 0))
            models[row["name"]] = (
                max(count, row["count"]),
                nodes + 1,
                max(memory, row["memory"] or 0),
            )
        return cls(models)

    def check(self, *, gpu_count: int, node_count: int, gpu_model: str, min_mib: int) -> None:
        """``JobRejected`` naming the first field no part of the fleet could ever satisfy."""
        if not self.models:
            raise JobRejected("gpu_count", "the fleet has no GPUs yet")
        if gpu_model and gpu_model not in self.models:
            known = ", ".join(sorted(self.models))
            raise JobRejected("gpu_model", f"no GPU model {gpu_model!r}; the fleet has: {known}")
        candidates = [self.models[gpu_model]] if gpu_model else list(self.models.values())
        largest = max(count for count, _, _ in candidates)
        if gpu_count > largest:
            where = f"{gpu_model} " if gpu_model else ""
            raise JobRejected(
                "gpu_count",
                f"{gpu_count} GPUs per node, but no node has more than {largest} {where}GPUs",
            )
        memory = max(mib for _, _, mib in candidates)
        if min_mib > memory:
            raise JobRejected(
                "min_gpu_memory_mib",
                f"{min_mib} MiB per GPU, but the largest GPU has {memory} MiB",
            )
        nodes = sum(nodes for count, nodes, _ in candidates if count >= gpu_count)
        if node_count > nodes:
            raise JobRejected(
                "node_count",
                f"{node_count} nodes with {gpu_count} GPUs each, but only {nodes} nodes have "
                f"that many",
            )


_fleet_shape: tuple[float, FleetShape | None] = (0.0, None)


def submit_job(
    owner: User,
    *,
    command: str | list[str],
    use_shell: bool = False,
    hold: bool = False,
    **fields: Any,
) -> Job:
    """Validate a request against the fleet's shape, store it QUEUED (PENDING when held) and
    audit ``job.submitted``; the placement loop is woken when the transaction commits.
    Raises ``JobRejected`` for requests that could never run."""
    for arg in [command] if isinstance(command, str) else command:
        check_text("command", arg)
    argv = split_command(command, use_shell)
    if not argv or not argv[0].strip():
        raise JobRejected("command", "empty command")
    if len(argv) > MAX_ARGV:
        raise JobRejected("command", f"at most {MAX_ARGV} arguments")
    if sum(map(len, argv)) > MAX_COMMAND_CHARS:
        raise JobRejected("command", f"at most {MAX_COMMAND_CHARS} characters")
    for name, value in fields.items():
        if isinstance(value, str):
            check_text(name, value)
    check_limits(fields)
    check_env(fields.get("env") or {})
    if fields.get("container_image"):
        check_image(fields["container_image"])
    working_dir = fields.get("working_dir") or ""
    if working_dir and not posixpath.isabs(working_dir):
        raise JobRejected("working_dir", f"{working_dir!r} is not an absolute path")
    FleetShape.cached().check(
        gpu_count=fields.get("gpu_count", 1),
        node_count=fields.get("node_count", 1),
        gpu_model=fields.get("gpu_model", ""),
        min_mib=fields.get("min_gpu_memory_mib", 0),
    )
    state = S.PENDING if hold else S.QUEUED
    with transaction.atomic():
        job = Job.objects.create(
            owner=owner, command=argv, use_shell=use_shell, state=state, **fields
        )
        record(
            "job.submitted",
            actor=owner,
            target=job,
            after={
                "state": state,
                "gpu_count": job.gpu_count,
                "node_count": job.node_count,
                "priority": job.priority,
            },
        )
        if not hold:
            request_placement_pass()
    return job


def release_job(job: Job, *, actor: User) -> Job:
    """Let a held (PENDING) job into the queue; the placement loop is woken on commit."""
    return transition(job, S.QUEUED, actor=actor, expect=[S.PENDING], message="released")


def cancel_job(job: Job, *, actor: User, reason: str = "") -> Job:
    """Cancel a job. A waiting one ends at once. One that holds GPUs is signalled through its
    nodes' agents and keeps its GPUs until an agent reports its processes gone (SIGTERM, then
    SIGKILL after the grace), so the next job never shares a GPU with a dying one; when a node
    is unreachable nothing can be signalled and the job ends at once."""
    message = reason or f"canceled by {actor.get_username()}"
    job.refresh_from_db()  # decide on the stored state and attempt, never a stale copy
    nodes = _job_nodes(job) if job.state in HOLDING_STATES else []
    if nodes and all(node.is_reachable() for node in nodes):
        with transaction.atomic():
            record(
                "job.cancel_requested",
                actor=actor,
                target=job,
                before={"state": job.state},
                message=message,
            )
            hostnames = [node.hostname for node in nodes]
            transaction.on_commit(lambda: dispatch.send_cancel(job, hostnames, message))
        return job
    return transition(job, S.CANCELED, actor=actor, message=message)


def stop_jobs_on_gpus(
    gpu_ids: Collection[int], *, requeue: bool, reason: str, pid: int | None = None
) -> list[int]:
    """Stop now the jobs holding any of ``gpu_ids`` because the hardware under them failed (a
    health policy, or the GPUs went offline): requeue them (their next placement is their next
    attempt) or fail them, with ``reason`` as the job's message, their GPUs released at once,
    and their processes canceled through their nodes' agents (the agent's later report of
    the old attempt's end is stale and changes nothing). With ``pid``: only the job whose
    process it is, when one of them is. A job that already moved on is left alone; the ids of
    the jobs stopped."""
    holding = Job.objects.filter(
        state__in=HOLDING_STATES,
        allocations__gpu_id__in=gpu_ids,
        allocations__released_at__isnull=True,
    )
    jobs = list(holding.distinct().order_by("pk"))
    if pid is not None and any(job.pid == pid for job in jobs):
        jobs = [job for job in jobs if job.pid == pid]
    stopped = []
    for job in jobs:
        with transaction.atomic():
            if not holding.filter(pk=job.pk).select_for_update(of=("self",)).exists():
                continue  # ended, or requeued and placed elsewhere, since the query
            hostnames = [node.hostname for node in _job_nodes(job) if node.is_reachable()]
            locked = transition(
                job.pk, S.QUEUED if requeue else S.FAILED, actor_name=HEALTH_ACTOR, message=reason
            )
            if hostnames:
                transaction.on_commit(partial(dispatch.send_cancel, locked, hostnames, reason))
        stopped.append(job.pk)
    return stopped


def _job_nodes(job: Job) -> list[Node]:
    return list(
        Node.objects.filter(allocations__job=job, allocations__released_at__isnull=True)
        .distinct()
        .order_by("hostname")
    )


def set_priority(job: Job, priority: str, *, actor: User) -> Job:
    """Change a waiting job's priority (audited ``job.priority_changed``)."""
    if priority not in Priority.values:
        raise JobRejected("priority", f"must be one of {', '.join(Priority.values)}")
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.state not in (S.PENDING, S.QUEUED):
            raise IllegalTransition(
                f"job {job.pk} is {locked.state}: only a waiting job's priority can change"
            )
        if locked.priority != priority:
            record(
                "job.priority_changed",
                actor=actor,
                target=locked,
                before={"priority": locked.priority},
                after={"priority": priority},
            )
            locked.priority = priority
            locked.save(update_fields=["priority"])
            request_placement_pass()
    job.priority = priority
    return locked


# --------------------------------------------------------------------------- allocations


class AllocationRefused(ValueError):
    """GPUs that could not be given: taken already, unschedulable, or the job is not waiting."""


def allocate(
    job: Job,
    gpu_ids: Collection[int],
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    placement: dict[str, Any] | None = None,
    manual: bool = False,
) -> list[Allocation]:
    """Give the GPUs ``gpu_ids`` to a QUEUED job and make it SCHEDULED, all or nothing, in one
    transaction; the allocations, with their GPU and node loaded.

    The GPU rows are locked in primary-key order (no deadlock between two passes) and must
    still be usable (``Gpu.objects.schedulable()``, then their latest live samples: no NVML
    error, no foreign process); the partial unique index refuses a GPU that has an active
    allocation even if a caller skipped the lock. Raises ``AllocationRefused`` and writes
    nothing."""
    ids = sorted(set(gpu_ids))
    try:
        with transaction.atomic():
            locked = list(
                Gpu.objects.schedulable()
                .select_for_update(of=("self",))
                .filter(pk__in=ids)
                .select_related("node")
                .order_by("pk")
            )
            if len(locked) != len(ids):
                gone = set(ids) - {gpu.pk for gpu in locked}
                bad = Gpu.objects.filter(pk__in=gone).select_related("node").order_by("pk")
                raise AllocationRefused(f"GPUs not schedulable: {_unusable_text(bad) or 'unknown'}")
            try:
                samples = live.latest({gpu.node.hostname for gpu in locked})
            except RedisError as exc:
                raise AllocationRefused(f"the GPUs' live samples cannot be read: {exc}") from None
            refused = _unusable_text(locked, samples)
            if refused:
                raise AllocationRefused(f"GPUs not usable now: {refused}")
            attempt = job.attempt + 1
            rows = Allocation.objects.bulk_create(
                Allocation(job=job, gpu=gpu, node=gpu.node, attempt=attempt, manual=manual)
                for gpu in locked
            )
            record_all(
                [
                    audit_event(
                        "allocation.created",
                        actor=actor,
                        actor_name=actor_name,
                        target=allocation,
                        after={"job": job.pk, "gpu": gpu.uuid, "node": gpu.node.hostname},
                    )
                    for allocation, gpu in zip(rows, locked, strict=True)
                ]
            )
            transition(
                job,
                S.SCHEDULED,
                actor=actor,
                actor_name=actor_name,
                expect=[S.QUEUED],
                attempt=attempt,
                scheduled_at=timezone.now(),
                placement=placement,
            )
    except IntegrityError as exc:
        raise AllocationRefused(f"a GPU was allocated meanwhile ({exc.__cause__})") from None
    except IllegalTransition as exc:
        raise AllocationRefused(str(exc)) from None
    return rows


def _unusable_text(
    gpus: Iterable[Gpu], samples: dict[str, dict[str, dict[str, Any]]] | None = None
) -> str:
    """The GPUs (nodes loaded) that the one rule refuses, each with why, given their nodes'
    live samples: ``GPU-... (it is in MIG mode: ...); ...``."""
    found = []
    for gpu in gpus:
        sample = (samples or {}).get(gpu.node.hostname, {}).get(gpu.uuid)
        if why := gpu.unusable(sample):
            found.append(f"{gpu.uuid} ({why.message})")
    return "; ".join(found)


# --------------------------------------------------------------------------- agent reports

# What an executor outcome makes of the job: retried outcomes re-queue while retries are left.
RETRIED_OUTCOMES = frozenset({"failed", "timed_out", "lost"})


def job_event(event: ExecutorEvent) -> None:
    """What an agent's executor reported (``scheduling.job_event``)."""
    job_id, attempt = parse_executor_id(event.job_id)
    if isinstance(event, JobStarted):
        job_started(job_id, attempt, event.pid, event.started_at)
    else:
        job_finished(
            job_id, attempt, event.state, event.exit_code, event.message, event.finished_at
        )


def job_started(job_id: int, attempt: int, pid: int, at: datetime) -> bool:
    """The agent started attempt ``attempt``: SCHEDULED -> RUNNING. ``False`` for a stale
    report (another attempt, or the job already moved on)."""
    if not _is_current(job_id, attempt):
        return False
    try:
        transition(
            job_id, S.RUNNING, actor_name=AGENT_ACTOR, expect=[S.SCHEDULED], pid=pid, started_at=at
        )
    except IllegalTransition:
        return False
    return True


def job_finished(
    job_id: int, attempt: int, outcome: str, exit_code: int | None, message: str, at: datetime
) -> str | None:
    """The agent says attempt ``attempt`` ended (``completed``, ``failed``, ``timed_out``,
    ``canceled`` or ``lost``). Re-queues while retries are left; the new state, or ``None``
    for a stale report."""
    job = Job.objects.filter(pk=job_id, attempt=attempt).first()
    if job is None or job.state not in HOLDING_STATES:  # another attempt, or it moved on
        return None
    if outcome == "completed":
        to = S.COMPLETED
    elif outcome == "canceled":
        to = S.CANCELED
    elif outcome in RETRIED_OUTCOMES and job.attempt <= job.max_retries:
        to = S.QUEUED
        message = f"retry {job.attempt}/{job.max_retries} after attempt {attempt} {outcome}: " + (
            message or f"exit code {exit_code}"
        )
    else:
        to = S.FAILED
        message = message or f"{outcome}: exit code {exit_code}"
    fields: dict[str, Any] = {} if to == S.QUEUED else {"finished_at": at}
    try:
        transition(
            job_id,
            to,
            actor_name=AGENT_ACTOR,
            message=message,
            exit_code=exit_code,
            **fields,
        )
    except IllegalTransition:
        return None
    return to


def _is_current(job_id: int, attempt: int) -> bool:
    return Job.objects.filter(pk=job_id, attempt=attempt).exists()


def placed_on(name: str, hostname: str) -> bool:
    """Whether the job attempt of executor id ``name`` was placed on node ``hostname`` (the
    only node whose agent may report about it)."""
    job_id, attempt = parse_executor_id(name)
    return Allocation.objects.filter(
        job_id=job_id, attempt=attempt, node__hostname=hostname
    ).exists()


def request_placement_pass() -> None:
    """Wake the placement loop once the current transaction commits (coalesced)."""
    transaction.on_commit(dispatch.wake)


def reconcile_node_jobs(hostname: str, running: set[tuple[int, int]]) -> list[int]:
    """A (re)started agent says which (job, attempt) it runs: a job RUNNING on that node that
    it does not know was lost with the previous agent (fails, or re-queues while retries are
    left). Returns those jobs' ids."""
    lost = []
    jobs = Job.objects.filter(
        state=S.RUNNING,
        allocations__node__hostname=hostname,
        allocations__released_at__isnull=True,
    ).distinct()
    for job in jobs:
        if (job.pk, job.attempt) not in running:
            message = f"the agent of {hostname} restarted and no longer runs it"
            if job_finished(job.pk, job.attempt, "lost", None, message, timezone.now()):
                lost.append(job.pk)
    return lost
