"""Jobs from submission to their end: the one owner of job state transitions (each audited),
allocations the database guards, and what node agents report.

The placement loop lives in ``scheduling.loop``; this module is what it and every interface
(API, pages, CLI, admin) call to change a job. Neither imports the other's caller: both wake
the loop and reach agents through ``scheduling.dispatch``.

Lock order: a transaction that locks jobs and GPUs locks the jobs first, then the GPUs, each
in id order. A transition locks its job and then the GPUs it releases; ``allocate_many`` its
jobs and then the GPUs it gives them; ``job_events`` its jobs and then their GPUs, in one
ordered statement. With the GPUs first in ``allocate_many``, a placement that waited for a
job whose end was being reported held the very GPU the report was waiting to release: a
deadlock (``tests/scheduling/test_lock_order.py``).
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import shlex
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple, TypedDict

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.postgres.expressions import ArraySubquery
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import IntegrityError, connection, transaction
from django.db.models import F, OuterRef, QuerySet, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone
from redis.exceptions import RedisError

from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.services import (
    audit_event,
    create_recorded,
    record,
    record_all,
    record_each,
)
from gpuadmin.refusals import FieldRefusal
from gpuadmin.text import unstorable
from inventory import live
from inventory.models import Gpu, MigInstance, Node, Pool
from inventory.nvlink import GpuPlace, nvlink_domains
from inventory.nvml.mig_catalog import table_for_gpu
from inventory.pages.common import short_gpu_name
from inventory.querysets import pool_name
from inventory.services import resolve_gpu_model
from inventory.units import memory_text
from inventory.usability import Reason as UsabilityReason
from scheduling import dependencies, dispatch, placement, slurm
from scheduling.executor import (
    ExecutorEvent,
    FinalState,
    JobFinished,
    JobStarted,
    executor_id,
    parse_executor_id,
)
from scheduling.models import (
    HOLDING_STATES,
    NOT_WAITING,
    TERMINAL_STATES,
    Allocation,
    AllocationKind,
    Job,
    JobArray,
    JobState,
    Priority,
    Reservation,
    ReservationGpu,
    ReservationState,
    Topology,
)
from scheduling.placement.decisions import Reason
from scheduling.placement.diagnosis import Diagnosis
from scheduling.placement.fleet import Shape, grouping
from scheduling.placement.reservations import ReservationBook
from scheduling.placement.text import plural

S = JobState
log = logging.getLogger("gpuadmin.jobs")
# The state machine (seeds 002/003). SCHEDULED may end directly: a short job's end can be
# reported before its start is processed.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.QUEUED, S.CANCELED}),
    S.QUEUED: frozenset({S.PENDING, S.SCHEDULED, S.CANCELED}),
    S.SCHEDULED: frozenset({S.RUNNING, S.QUEUED, S.COMPLETED, S.FAILED, S.CANCELED, S.PREEMPTED}),
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
# Slurm's afterok:12:13,... text: 100 jobs of 18 digits fit; longer is a paste gone wrong.
MAX_DEPENDENCY_CHARS = 2000
SUBMISSION_LIMITS: dict[str, tuple[int, int]] = {
    "gpu_count": (1, 64),  # per node
    "node_count": (1, 1024),
    "min_gpu_memory_mib": (0, 1024 * 1024),  # 1 TiB per GPU: anything above is a typo
    "estimated_duration_s": (1, MAX_RUNTIME_S),
    "max_runtime_s": (1, MAX_RUNTIME_S),
    "max_retries": (0, 20),
    "mps_percent": (1, 100),  # of the GPU's SMs
    "mps_memory_mib": (1, 1024 * 1024),
    # Host resources per node (0: none asked): Linux's CPU ids stop below 65,536
    # (NR_CPUS <= 8192 today); 64 TiB of RAM is beyond the largest single hosts.
    "cpus": (0, 65_536),
    "host_memory_mib": (0, 64 * 1024 * 1024),
    # Job arrays (``--array``): tasks of one array, its indexes, and its %N cap.
    "array_tasks": (1, 10_000),
    "array_index": (0, 9_999_999),
    "array_max_running": (1, 10_000),
    # Jobs one job may depend on (``--dependency``), and the dependencies of all the tasks of
    # one array together (each task depends on each job: 10,000 x 100 was a million rows,
    # read by every pass).
    "dependencies": (0, 100),
    "array_dependencies": (0, 20_000),
}


class IllegalTransition(ValueError):
    """A state change the state machine does not allow; nothing was written."""


def transition_refusal(job_id: int, state: str, to: str) -> str:
    """Why job ``job_id`` cannot go from ``state`` to ``to`` (the state machine refuses it):
    ``job 12 is already canceled``, ``job 12 already ended: it is completed``, ``job 12
    cannot go from running to pending``."""
    if state == to:
        return f"job {job_id} is already {state}"
    if state in TERMINAL_STATES:
        return f"job {job_id} already ended: it is {state}"
    return f"job {job_id} cannot go from {state} to {to}"


class JobRejected(FieldRefusal):
    """A submission that can never run, naming the field and why."""


class Bounds(TypedDict):
    min_value: int
    max_value: int


def limit_bounds(field: str) -> Bounds:
    """``min_value``/``max_value`` for the form's or the serializer's field of that name."""
    low, high = SUBMISSION_LIMITS[field]
    return {"min_value": low, "max_value": high}


# Django's range validators of each limit (their messages are the ones the form shows).
_LIMIT_VALIDATORS = {
    name: (MinValueValidator(low), MaxValueValidator(high))
    for name, (low, high) in SUBMISSION_LIMITS.items()
}


def check_limits(fields: Mapping[str, Any]) -> None:
    """``JobRejected`` naming the first field outside ``SUBMISSION_LIMITS``."""
    for name, validators in _LIMIT_VALIDATORS.items():
        value = fields.get(name)
        if value is None:
            continue
        try:
            for validator in validators:
                validator(value)
        except ValidationError as exc:
            raise JobRejected(name, exc.messages[0]) from None


# Environment variables a job may not set, by exact name or by prefix: they choose which GPUs,
# MIG instances or MPS server a job sees, or configure the container runtime that runs it
# (gpuadmin sets the ones it needs from the allocation). The one list; docs/reference/api.md,
# "What a job may not ask for", quotes it.
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
    if not _SHELL_QUOTING.search(command):  # most commands: as shlex would, 4x faster
        return _SHELL_WORD.findall(command)
    try:
        return shlex.split(command)
    except ValueError as exc:  # e.g. an unclosed quote
        raise JobRejected("command", f"cannot split into arguments: {exc}") from None


# What shlex.split() (POSIX mode, no comments) treats specially besides its whitespace: a
# string without these splits at runs of its whitespace, nothing else.
_SHELL_QUOTING = re.compile(r"[\\'\"]")
_SHELL_WORD = re.compile(r"[^ \t\r\n]+")


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
    leave (e.g. only QUEUED for a placement). A job whose cancel was asked for (and is under
    way) is canceled instead of re-queued or failed. Raises ``IllegalTransition``."""
    job_id = job if isinstance(job, int) else job.pk
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job_id)
        if locked.cancel_requested_at is not None and to in (S.QUEUED, S.FAILED):
            # Stopped for its hardware while its cancel was under way: canceled, as asked.
            to, message = S.CANCELED, f"canceled ({to} as it stopped: {message})"
        before, columns = _change(locked, to, message, expect, fields)
        locked.save(update_fields=columns)
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


def _change(
    locked: Job, to: str, message: str, expect: Iterable[str] | None, fields: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Move ``locked`` (its row locked, in memory only) to ``to``, the state machine's rule
    for every transition: what it sets besides ``fields`` (which it completes with them), and
    what it clears. Its ``before`` and the columns to write; ``IllegalTransition``, and
    nothing changed, when the move is not allowed."""
    if expect is not None and locked.state not in expect:
        wanted = " or ".join(sorted(expect))
        raise IllegalTransition(f"job {locked.pk} is {locked.state}, not {wanted}")
    if to not in TRANSITIONS[locked.state]:
        raise IllegalTransition(transition_refusal(locked.pk, locked.state, to))
    before = {"state": locked.state}
    if to in TERMINAL_STATES:
        fields.setdefault("finished_at", timezone.now())
    if to in TERMINAL_STATES or to == S.QUEUED:
        fields.setdefault("pid", None)
        if locked.preempted_by_id is not None:  # its preemption ends with its attempt
            fields.setdefault("preempted_by", None)
            fields.setdefault("preempt_requested_at", None)
        if locked.cancel_requested_at is not None:  # and so does a cancel asked for
            fields.setdefault("cancel_requested_at", None)
    if message:
        fields["message"] = message
    # A job that stops waiting drops the loop's word on its wait (not audited, like it).
    changes = {**({} if to == S.QUEUED else NOT_WAITING), **fields}
    for name, value in changes.items():
        setattr(locked, name, value)
    locked.state = to
    return before, ["state", *changes]


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if name != "message"}


def release_allocations(job: Job) -> list[str]:
    """End the job's active allocations (inside the caller's transaction); the GPU UUIDs.

    The GPU rows are locked after the job's (the module's lock order), and the release time
    is the database's statement time: the next allocation of a GPU is written only after this
    transaction commits, so its start is later than this end, on one clock."""
    return release_allocations_of([job.pk]).get(job.pk, [])


def release_allocations_of(job_ids: Collection[int]) -> dict[int, list[str]]:
    """``release_allocations`` for several jobs at once, in one statement: the GPU UUIDs
    released (in GPU order), by job id (a job without active allocations is left out)."""
    with connection.cursor() as cursor:
        cursor.execute(RELEASE_SQL, [list(job_ids)])
        rows = sorted(cursor.fetchall(), key=lambda row: row[1])
    released: dict[int, list[str]] = defaultdict(list)
    for job_id, _, uuid in rows:
        released[job_id].append(uuid)
    return dict(released)


# The GPU rows are locked in id order (as every writer locks them) before the allocations
# end at the statement's time (``Now()``, ``allocated_at``'s clock).
RELEASE_SQL = f"""
    UPDATE {Allocation._meta.db_table} AS allocation
    SET released_at = statement_timestamp()
    FROM (
        SELECT held.id, gpu.id AS gpu_id, gpu.uuid
        FROM {Allocation._meta.db_table} AS held
        JOIN {Gpu._meta.db_table} AS gpu ON gpu.id = held.gpu_id
        WHERE held.job_id = ANY(%s) AND held.released_at IS NULL
        ORDER BY gpu.id
        FOR UPDATE OF gpu
    ) AS active
    WHERE allocation.id = active.id
    RETURNING allocation.job_id, active.gpu_id, active.uuid
"""


# --------------------------------------------------------------------------- submission


@dataclass
class PoolShape:
    """What the GPUs of one pool (or those in no pool) could ever hold."""

    # model -> (most such GPUs on one node, nodes with them, largest memory in MiB), of the
    # GPUs that take whole-GPU jobs (every GPU but the MPS-shared ones)
    models: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    mig_models: set[str] = field(default_factory=set)  # models of its MIG-capable GPUs
    mps_models: dict[str, int] = field(default_factory=dict)  # MPS-shared: model -> memory MiB
    # The most CPUs and host MiB one of its nodes can give a job (total less reserved); None:
    # a node's is unknown (so any request may fit).
    cpus: int | None = 0
    memory_mib: int | None = 0

    def add_host(self, cpus: int | None, memory_mib: int | None) -> None:
        """Count a node that gives jobs ``cpus`` and ``memory_mib`` (None: unknown)."""
        self.cpus = _most(self.cpus, cpus)
        self.memory_mib = _most(self.memory_mib, memory_mib)

    def mig_profiles(self, gpu_model: str = "") -> dict[str, list[str]]:
        """The MIG profiles its MIG-capable GPUs (of ``gpu_model`` only, when given) have, in
        their tables' order: profile name -> the models that have it."""
        models = sorted({gpu_model} & self.mig_models if gpu_model else self.mig_models)
        profiles: dict[str, list[str]] = {}
        for model in models:
            table = table_for_gpu(model)
            for profile in table.profiles if table is not None else ():
                profiles.setdefault(profile.name, []).append(model)
        return profiles


def _most(known: int | None, other: int | None) -> int | None:
    """The larger, where None (unknown) is larger than any."""
    return None if known is None or other is None else max(known, other)


@dataclass(frozen=True)
class FleetShape:
    """What the fleet could ever hold, per pool, to refuse impossible requests up front. A
    GPU's pool is its own, else its node's; ``None``: the GPUs in no pool, the only ones a job
    without a pool runs on."""

    pools: dict[str | None, PoolShape]
    pool_names: frozenset[str]  # every pool, with GPUs or not
    # The engine's view of each pool's whole-GPU hardware: what it could never run.
    hardware: dict[str | None, Diagnosis] = field(default_factory=dict)

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
        """Read the fleet: its present GPUs, with their nodes' host figures and NVLink domains,
        and the pools, in three queries however large it is. The shape read last is returned
        again while they are equal (the hardware changes seldom), with what its ``hardware``
        worked out for the requests so far."""
        global _fleet_read
        rows = tuple(
            _GpuShapeRow._make(row)
            for row in Gpu.objects.present()
            .order_by("node_id", "index")
            .values_list(*_GPU_SHAPE_COLUMNS, pool_name())
        )
        domains = nvlink_domains([GpuPlace(*row[:4]) for row in rows])
        names = frozenset(Pool.objects.values_list("name", flat=True))
        read = (rows, names, domains)
        if _fleet_read is not None and _fleet_read[0] == read:
            return _fleet_read[1]
        shape = cls._of(rows, names, domains)
        _fleet_read = (read, shape)
        return shape

    @classmethod
    def _of(
        cls,
        rows: Sequence[_GpuShapeRow],
        names: frozenset[str],
        domains: Mapping[int, str],
    ) -> FleetShape:
        per_node: dict[tuple[str | None, int, str, bool], list[_GpuShapeRow]] = defaultdict(list)
        hosts: dict[int, placement.NodeInfo] = {}
        slots: dict[str | None, list[placement.GpuSlot]] = defaultdict(list)
        for row in rows:
            per_node[row.pool, row.node_id, row.name, row.mps_shared].append(row)
            if row.node_id not in hosts:
                hosts[row.node_id] = placement.NodeInfo(
                    row.hostname,
                    cpus=for_jobs(row.cpu_count, row.cpus_reserved),
                    memory_mib=for_jobs(row.memory_total_mib_node, row.memory_reserved_mib),
                )
            if not row.mps_shared:  # an MPS-shared GPU takes no whole-GPU job
                slots[row.pool].append(_hardware_slot(row, domains.get(row.pk)))
        pools: dict[str | None, PoolShape] = {}
        for (pool, node_id, name, mps_shared), gpus in per_node.items():
            shape = pools.setdefault(pool, PoolShape())
            info = hosts[node_id]
            shape.add_host(info.cpus, info.memory_mib)
            memory = max(gpu.memory_total_mib or 0 for gpu in gpus)
            if mps_shared:
                shape.mps_models[name] = max(shape.mps_models.get(name, 0), memory)
                continue  # nor a MIG device: an MPS-shared GPU is never in MIG mode
            if any(gpu.mig_capable for gpu in gpus):
                shape.mig_models.add(name)
            count, nodes, largest = shape.models.get(name, (0, 0, 0))
            shape.models[name] = (max(count, len(gpus)), nodes + 1, max(largest, memory))
        with_pools = any(pool is not None for pool in pools)
        infos = {info.hostname: info for info in hosts.values()}
        hardware = {}
        for pool, pool_slots in slots.items():
            scope = f"pool {pool}" if pool else "the GPUs in no pool" if with_pools else "the fleet"
            hostnames = sorted({slot.node for slot in pool_slots})
            hardware[pool] = Diagnosis.of_hardware(
                [infos[hostname] for hostname in hostnames], pool_slots, scope
            )
        return cls(pools, names, hardware)

    def mig_profile_offers(self) -> list[tuple[str, str]]:
        """Every MIG profile some GPU has, with where: (``1g.10gb``, ``A100-SXM4-80GB in pool
        a100; H100 80GB HBM3 outside the pools``), for a form to offer (``check`` decides)."""
        where: dict[str, list[str]] = {}
        for pool in sorted(self.pools, key=lambda name: (name is None, name or "")):
            for profile, models in self.pools[pool].mig_profiles().items():
                names = ", ".join(short_gpu_name(model) for model in models)
                where.setdefault(profile, []).append(f"{names} {self.where(pool)}")
        return [(profile, "; ".join(places)) for profile, places in where.items()]

    @property
    def model_names(self) -> set[str]:
        """Every GPU model of the fleet, in any pool, whole, MIG-capable or MPS-shared."""
        return {
            name
            for shape in self.pools.values()
            for name in (*shape.models, *shape.mig_models, *shape.mps_models)
        }

    def where(self, pool: str | None) -> str:
        """``in pool a100``, ``outside the pools``, or ``in the fleet`` when no GPU is in a
        pool."""
        if pool is not None:
            return f"in pool {pool}"
        return "in the fleet" if set(self.pools) <= {None} else "outside the pools"

    def check(
        self,
        *,
        pool: str | None,
        gpu_count: int,
        node_count: int,
        gpu_model: str,
        min_mib: int,
        topology: str = "any",
        mig_profile: str = "",
        mps_memory_mib: int | None = None,
        mps: bool = False,
        cpus: int = 0,
        host_memory_mib: int = 0,
    ) -> None:
        """``JobRejected`` naming the first field no GPU of ``pool`` could ever satisfy (nor
        the host of any: ``cpus`` and ``host_memory_mib`` per node), then, for whole GPUs,
        the field the engine's rule for what the pool could never run (``Diagnosis.never``:
        all of them together, its topology too) points at. The catalog decides, not the
        state: drained and fenced GPUs count."""
        if not self.pools:
            raise JobRejected("gpu_count", "the fleet has no GPUs yet")
        if pool is not None and pool not in self.pool_names:
            pools = ", ".join(sorted(self.pool_names)) or "none"
            raise JobRejected("pool", f"no pool {pool!r}; the pools are: {pools}")
        shape = self.pools.get(pool)
        if shape is None:
            with_gpus = ", ".join(sorted(name for name in self.pools if name is not None))
            if pool is None:
                raise JobRejected("pool", f"every GPU is in a pool: name one of {with_gpus}")
            raise JobRejected("pool", f"pool {pool} has no GPUs; these have: {with_gpus}")
        if mig_profile:
            self._check_mig(pool, shape, gpu_model, mig_profile)
        elif mps:
            self._check_mps(pool, shape, gpu_model, mps_memory_mib)
        else:
            self._check_whole(pool, shape, gpu_count, node_count, gpu_model, min_mib)
        if shape.cpus is not None and cpus > shape.cpus:
            raise JobRejected(
                "cpus",
                f"{cpus} CPUs per node, but no node {self.where(pool)} has more than "
                f"{shape.cpus} for jobs",
            )
        if shape.memory_mib is not None and host_memory_mib > shape.memory_mib:
            raise JobRejected(
                "host_memory_mib",
                f"{memory_text(host_memory_mib)} per node, but no node {self.where(pool)} has "
                f"more than {memory_text(shape.memory_mib)} for jobs",
            )
        if not mig_profile and not mps:
            ask = Shape(
                gpu_count,
                node_count,
                min_mib,
                gpu_model or None,
                grouping(topology),
                cpus,
                host_memory_mib,
            )
            self._check_hardware(self.hardware[pool], ask)

    @staticmethod
    def _check_hardware(hardware: Diagnosis, ask: Shape) -> None:
        """``JobRejected`` when the engine says ``hardware`` could never run ``ask``, naming
        the field at fault: the topology, the memory, the host figures (when the GPUs alone
        would do), else the size."""
        never = hardware.never(ask)
        if never is None:
            return
        reason, message = never
        field = _NEVER_FIELDS.get(reason)
        if field is None:
            host_only = ask.cpus or ask.host_memory_mib
            if host_only and hardware.never(ask._replace(cpus=0, host_memory_mib=0)) is None:
                field = "cpus" if ask.cpus else "host_memory_mib"
            else:
                field = "node_count" if ask.node_count > 1 else "gpu_count"
        raise JobRejected(field, message)

    def _check_whole(
        self,
        pool: str | None,
        shape: PoolShape,
        gpu_count: int,
        node_count: int,
        gpu_model: str,
        min_mib: int,
    ) -> None:
        if not shape.models:
            raise JobRejected(
                "gpu_count",
                f"every GPU {self.where(pool)} is MPS-shared: ask for a share (mps_percent)",
            )
        if gpu_model and gpu_model not in shape.models:
            known = ", ".join(sorted(shape.models))
            has = {"in the fleet": "the fleet has", "outside the pools": "the GPUs in no pool are"}
            where = has.get(self.where(pool), f"pool {pool} has")
            raise JobRejected("gpu_model", f"no GPU model {gpu_model!r}; {where}: {known}")
        candidates = [shape.models[gpu_model]] if gpu_model else list(shape.models.values())
        largest = max(count for count, _, _ in candidates)
        if gpu_count > largest:
            what = f"{gpu_model} " if gpu_model else ""
            raise JobRejected(
                "gpu_count",
                f"{plural(gpu_count, 'GPU')} per node, but no node has more than {largest} "
                f"{what}GPUs",
            )
        memory = max(mib for _, _, mib in candidates)
        if min_mib > memory:
            raise JobRejected(
                "min_gpu_memory_mib",
                f"{memory_text(min_mib)} per GPU, but the largest GPU has {memory_text(memory)}",
            )
        nodes = sum(nodes for count, nodes, _ in candidates if count >= gpu_count)
        if node_count > nodes:
            raise JobRejected(
                "node_count",
                f"{plural(node_count, 'node')} with {plural(gpu_count, 'GPU')} each, but only "
                f"{plural(nodes, 'node')} {'has' if nodes == 1 else 'have'} that many",
            )

    def _check_mig(self, pool: str | None, shape: PoolShape, gpu_model: str, profile: str) -> None:
        where = self.where(pool)
        if gpu_model and gpu_model not in shape.mig_models:
            raise JobRejected("gpu_model", f"no MIG-capable {gpu_model} {where}")
        if not shape.mig_models:
            raise JobRejected("mig_profile", f"no MIG-capable GPU {where}")
        known = shape.mig_profiles(gpu_model)
        if profile not in known:
            raise JobRejected(
                "mig_profile",
                f"no MIG-capable GPU {where} has a {profile!r} profile; they have: "
                f"{', '.join(known) or 'none known'}",
            )

    def _check_mps(
        self, pool: str | None, shape: PoolShape, gpu_model: str, memory_mib: int | None
    ) -> None:
        where = self.where(pool)
        memories = [mib for model, mib in shape.mps_models.items() if gpu_model in ("", model)]
        if not memories:
            what = f"{gpu_model} " if gpu_model else ""
            raise JobRejected("mps_percent", f"no MPS-shared {what}GPU {where}")
        if memory_mib is not None and memory_mib > max(memories):
            raise JobRejected(
                "mps_memory_mib",
                f"{memory_text(memory_mib)}, but the largest MPS-shared GPU {where} has "
                f"{memory_text(max(memories))}",
            )


_fleet_shape: tuple[float, FleetShape | None] = (0.0, None)
# What ``FleetShape.now`` read last (GPU rows, pool names, NVLink domains), and its shape.
_fleet_read: tuple[tuple[object, ...], FleetShape] | None = None
# The request field each of the engine's "never" reasons points at (TOO_LARGE: see
# ``FleetShape._check_hardware``).
_NEVER_FIELDS = {
    Reason.MODEL: "gpu_model",
    Reason.MEMORY: "min_gpu_memory_mib",
    Reason.TOPOLOGY: "topology",
}


class _GpuShapeRow(NamedTuple):
    """What ``FleetShape`` reads of a GPU and its node."""

    pk: int
    node_id: int
    # Shadows tuple.index on purpose (the column's name): legal at runtime, refused by mypy.
    index: int  # type: ignore[assignment]
    hostname: str
    name: str
    memory_total_mib: int | None
    numa_node: int | None
    socket: int | None
    mig_capable: bool
    mps_shared: bool
    cpu_count: int | None
    memory_total_mib_node: int | None
    cpus_reserved: int
    memory_reserved_mib: int
    pool: str | None  # its own pool's name, else its node's


_GPU_SHAPE_COLUMNS = (
    "pk",
    "node_id",
    "index",
    "node__hostname",
    "name",
    "memory_total_mib",
    "numa_node",
    "socket",
    "mig_capable",
    "mps_shared",
    "node__cpu_count",
    "node__memory_total_mib",
    "node__cpus_reserved",
    "node__memory_reserved_mib",
)


def _hardware_slot(row: _GpuShapeRow, domain: str | None) -> placement.GpuSlot:
    """A GPU as bare hardware, as the engine groups it (model, memory, NUMA, NVLink)."""
    memory = row.memory_total_mib or 0
    return placement.GpuSlot(
        id=row.pk,
        uuid="",
        node=row.hostname,
        index=row.index,
        model=row.name,
        memory_total_mib=memory,
        memory_free_mib=memory,
        numa_node=row.numa_node,
        socket=row.socket,
        nvlink_domain=domain,
        pool=row.pool,
    )


def for_jobs(total: int | None, reserved: int) -> int | None:
    """What jobs may be given of a node's ``total`` CPUs or host MiB: the total less what is
    ``reserved`` (at least 0); None when the total is unknown, and then no limit. The one
    rule: the placement loop's snapshot and the submission checks use it."""
    return None if total is None else max(total - reserved, 0)


SHARES_ONE_GPU = "a MIG device or an MPS share is one GPU of one node"


@dataclass(frozen=True)
class Submission:
    """A checked request: what ``Job`` rows of it hold, and what they depend on."""

    fields: dict[str, Any]  # Job fields, pool and reservation as rows
    needs: list[tuple[str, Job]]  # (DependencyKind, job it depends on)

    @property
    def dependency_text(self) -> str:
        """``afterok:12:13,afterany:14``, as Slurm writes it."""
        return dependencies.text((kind, job.pk) for kind, job in self.needs)


def check_submission(
    owner: User,
    *,
    command: str | list[str],
    use_shell: bool = False,
    pool: str | None = None,
    reservation: int | None = None,
    dependency: str | Sequence[tuple[str, int]] | None = None,
    **fields: Any,
) -> Submission:
    """Everything a submission must satisfy before anything is written: ``JobRejected``
    naming the field for a request that could never run. ``pool`` is a pool's name,
    ``reservation`` the id of a requested or approved reservation of ``owner``'s, and
    ``dependency`` Slurm's ``afterok:12:13,afterany:14`` or (kind, job id) pairs."""
    for arg in [command] if isinstance(command, str) else command:
        check_text("command", arg)
    argv = split_command(command, use_shell)
    if not argv or not argv[0].strip():
        raise JobRejected("command", "empty command")
    if len(argv) > MAX_ARGV:
        raise JobRejected("command", f"at most {MAX_ARGV} arguments")
    if sum(map(len, argv)) > MAX_COMMAND_CHARS:
        raise JobRejected("command", f"at most {MAX_COMMAND_CHARS} characters")
    for name, value in {**fields, "pool": pool}.items():
        if isinstance(value, str):
            check_text(name, value)
    check_limits(fields)
    check_env(fields.get("env") or {})
    if fields.get("container_image"):
        check_image(fields["container_image"])
    working_dir = fields.get("working_dir") or ""
    if working_dir and not posixpath.isabs(working_dir):
        raise JobRejected("working_dir", f"{working_dir!r} is not an absolute path")
    topology = fields.get("topology", Topology.ANY)
    if topology not in Topology.values:
        raise JobRejected("topology", f"must be one of {', '.join(Topology.values)}")
    _check_sharing(fields)
    shape = FleetShape.cached()
    if fields.get("gpu_model"):
        fields["gpu_model"] = resolve_gpu_model(
            fields["gpu_model"], shape.model_names, refusal=JobRejected
        )
    if reservation is not None:
        fields["reservation"], pool = _reservation(owner, reservation, pool, fields)
    shape.check(
        pool=pool,
        gpu_count=fields.get("gpu_count", 1),
        node_count=fields.get("node_count", 1),
        gpu_model=fields.get("gpu_model", ""),
        min_mib=fields.get("min_gpu_memory_mib", 0),
        topology=topology,
        mig_profile=fields.get("mig_profile", ""),
        mps=fields.get("mps_percent") is not None,
        mps_memory_mib=fields.get("mps_memory_mib"),
        cpus=fields.get("cpus", 0),
        host_memory_mib=fields.get("host_memory_mib", 0),
    )
    if pool is not None:
        fields["pool"] = Pool.objects.filter(name=pool).first()
        if fields["pool"] is None:  # deleted since the shape was read
            raise JobRejected("pool", f"no pool {pool!r}")
    needs = dependencies.check(owner, dependency) if dependency else []
    return Submission({"command": argv, "use_shell": use_shell, **fields}, needs)


def _check_sharing(fields: Mapping[str, Any]) -> None:
    """A MIG device or an MPS share: one GPU of one node, and not both."""
    mig, mps = fields.get("mig_profile"), fields.get("mps_percent") is not None
    if mig and mps:
        raise JobRejected("mps_percent", "a job gets a MIG device or an MPS share, not both")
    if fields.get("mps_memory_mib") is not None and not mps:
        raise JobRejected("mps_memory_mib", "a memory limit of an MPS share: give mps_percent")
    if (mig or mps) and fields.get("gpu_count", 1) != 1:
        raise JobRejected("gpu_count", f"{SHARES_ONE_GPU}: gpu_count must be 1")
    if (mig or mps) and fields.get("node_count", 1) != 1:
        raise JobRejected("node_count", f"{SHARES_ONE_GPU}: node_count must be 1")
    if mig and fields.get("min_gpu_memory_mib"):
        raise JobRejected("min_gpu_memory_mib", "a MIG device has its profile's memory")
    if mps and fields.get("min_gpu_memory_mib"):
        raise JobRejected(
            "min_gpu_memory_mib", "an MPS share's memory is its limit: give mps_memory_mib"
        )


def _reservation(
    owner: User, reservation_id: int, pool: str | None, fields: Mapping[str, Any]
) -> tuple[Reservation, str | None]:
    """The reservation a job runs in (``owner``'s own, requested or approved, not ended) and
    the job's pool: the reservation's when the job names none. A job that could never run in
    it (whole GPUs only; a maximum runtime that ends inside the window) is refused."""
    found = (
        Reservation.objects.select_related("pool").filter(pk=reservation_id, owner=owner).first()
    )
    if found is None:
        raise JobRejected("reservation", f"you have no reservation {reservation_id}")
    if found.state not in (ReservationState.REQUESTED, ReservationState.APPROVED):
        raise JobRejected(
            "reservation",
            f"reservation {found.pk} is {found.get_state_display().lower()}: jobs run only in "
            "a requested or approved one",
        )
    if found.end <= timezone.now():
        raise JobRejected(
            "reservation", f"reservation {found.pk} ended at {found.end:%Y-%m-%d %H:%M}"
        )
    held = found.pool.name if found.pool else None
    if pool is not None and pool != held:
        raise JobRejected(
            "reservation",
            f"reservation {found.pk} is in {held and f'pool {held}' or 'no pool'}, "
            f"not in pool {pool}",
        )
    needed = fields.get("gpu_count", 1) * fields.get("node_count", 1)
    if needed > found.gpu_count:
        raise JobRejected(
            "reservation",
            f"the job needs {plural(needed, 'GPU')}; reservation {found.pk} holds "
            f"{found.gpu_count}",
        )
    model = fields.get("gpu_model", "")
    if model and found.gpu_model and model != found.gpu_model:
        raise JobRejected(
            "reservation", f"reservation {found.pk} holds {found.gpu_model} GPUs, not {model}"
        )
    if fields.get("mig_profile") or fields.get("mps_percent") is not None:
        raise JobRejected(
            "reservation",
            f"reservation {found.pk} holds whole GPUs: a MIG device or an MPS share runs outside",
        )
    # The engine's rule for a job in a window, as it will place it: from the window's start on.
    window = placement.ReservationWindow(
        found.pk, str(owner.pk), (), found.start.timestamp(), found.end.timestamp()
    )
    book = ReservationBook([window], max(found.start, timezone.now()).timestamp())
    never = book.refusal(_Booker(str(owner.pk), fields.get("max_runtime_s"), found.pk))
    if never is not None:
        raise JobRejected("max_runtime_s", never[0])
    return found, held


def parse_array(spec: str) -> slurm.ArraySpec:
    """``spec`` (``0-999%50``) within ``SUBMISSION_LIMITS``; ``JobRejected`` naming ``array``."""
    check_text("array", spec)
    try:
        parsed = slurm.parse_array(
            spec,
            max_tasks=SUBMISSION_LIMITS["array_tasks"][1],
            max_index=SUBMISSION_LIMITS["array_index"][1],
        )
    except slurm.SpecError as exc:
        raise JobRejected("array", str(exc)) from None
    cap = SUBMISSION_LIMITS["array_max_running"][1]
    if parsed.max_running is not None and parsed.max_running > cap:
        raise JobRejected("array", f"a %N cap of at most {cap}")
    return parsed


def _submitted(job: Job, submission: Submission) -> dict[str, Any]:
    """What ``job.submitted`` records of a job: its request's state, size and priority, and
    what else it asked for."""
    after = {
        "state": job.state,
        "gpu_count": job.gpu_count,
        "node_count": job.node_count,
        "priority": job.priority,
    }
    optional = {
        "pool": job.pool.name if job.pool else None,
        "mig_profile": job.mig_profile,
        "mps_percent": job.mps_percent,
        "mps_memory_mib": job.mps_memory_mib,
        "cpus": job.cpus or None,  # 0: none asked
        "host_memory_mib": job.host_memory_mib or None,
        "reservation": job.reservation_id,
        "array": job.array_id,
        "array_index": job.array_index,
        "dependency": submission.dependency_text,
    }
    return {**after, **{name: value for name, value in optional.items() if value not in (None, "")}}


def submit_job(owner: User, *, hold: bool = False, **request: Any) -> Job:
    """Validate a request (``check_submission``), store it QUEUED (PENDING when held) with
    its dependencies and audit ``job.submitted``; the placement loop is woken when the
    transaction commits. Raises ``JobRejected`` for requests that could never run."""
    submission = check_submission(owner, **request)
    job = Job(owner=owner, state=S.PENDING if hold else S.QUEUED, **submission.fields)
    # The job and its audit row in one statement, atomic by itself (no BEGIN/COMMIT round
    # trips); a transaction only when its dependencies are rows of their own.
    with transaction.atomic() if submission.needs else nullcontext():
        create_recorded(job, "job.submitted", actor=owner, after=_submitted(job, submission))
        dependencies.store([job.pk], submission.needs)
        if not hold:
            request_placement_pass()
    return job


@dataclass(frozen=True)
class SubmittedArray:
    array: JobArray
    task_ids: list[int]  # in index order


def submit_array(owner: User, spec: str, *, hold: bool = False, **request: Any) -> SubmittedArray:
    """One ``--array`` submission (``spec`` as in ``slurm.parse_array``): a ``JobArray`` and
    a job per index, each as ``submit_job`` would store it, written in one transaction: the
    jobs in one INSERT (``_insert_tasks``), their dependencies in one multi-row INSERT, their
    audit rows (``job.submitted`` each) in one INSERT (``record_each``) and
    ``array.submitted``; the placement loop is woken once."""
    parsed = parse_array(spec)
    submission = check_submission(owner, **request)
    most = SUBMISSION_LIMITS["array_dependencies"][1]
    if len(parsed.indexes) * len(submission.needs) > most:
        raise JobRejected(
            "dependency",
            f"{len(parsed.indexes)} tasks each depending on "
            f"{plural(len(submission.needs), 'job')}: at most {most} dependencies in one array",
        )
    state = S.PENDING if hold else S.QUEUED
    with transaction.atomic():
        array = JobArray.objects.create(
            owner=owner,
            spec=spec.strip(),
            size=len(parsed.indexes),
            max_running=parsed.max_running,
        )
        task = Job(owner=owner, state=state, array=array, **submission.fields)
        task_ids = _insert_tasks(task, parsed.indexes)
        dependencies.store(task_ids, submission.needs)
        record(
            "array.submitted",
            actor=owner,
            target=array,
            after={"size": array.size, "max_running": array.max_running, "state": state},
        )
        record_each(
            "job.submitted",
            _task_changes(task, task_ids, parsed.indexes, submission),
            target_type=Job._meta.label_lower,
            actor=owner,
        )
        if not hold:
            request_placement_pass()
    return SubmittedArray(array, task_ids)


def _task_changes(
    task: Job, task_ids: Sequence[int], indexes: Sequence[int], submission: Submission
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Each task's (id, text, ``job.submitted`` after), ``task`` standing for each in turn."""
    after = _submitted(task, submission)
    for task.pk, task.array_index in zip(task_ids, indexes, strict=True):
        yield task.pk, str(task), {**after, "array_index": task.array_index}


def _insert_tasks(task: Job, indexes: Sequence[int]) -> list[int]:
    """Store ``task`` (unsaved) once per index as its ``array_index``, in one ``INSERT ...
    SELECT`` over ``unnest()`` of the indexes: a parameter per column, however many tasks (a
    multi-row ``VALUES`` takes one per column and row, and PostgreSQL at most 65,535 in all).
    The ids, in the order of ``indexes``."""
    meta = Job._meta
    columns = [f for f in meta.concrete_fields if not f.primary_key and f.name != "array_index"]
    quote = connection.ops.quote_name
    values = [f.get_db_prep_save(f.pre_save(task, add=True), connection) for f in columns]
    sql = (
        f"INSERT INTO {quote(meta.db_table)} "
        f"({', '.join(quote(f.column) for f in columns)}, {quote('array_index')}) "
        f"SELECT {', '.join(f'%s::{f.db_type(connection)}' for f in columns)}, task.index "
        "FROM unnest(%b::integer[]) WITH ORDINALITY AS task(index, n) ORDER BY task.n "
        f"RETURNING {quote(meta.pk.column)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, list(indexes)])
        return [row[0] for row in cursor.fetchall()]


def submit(owner: User, *, array: str = "", **request: Any) -> Job | SubmittedArray:
    """``submit_array`` with an ``array`` spec, else ``submit_job``: what the API, the form
    and the CLI call."""
    if array:
        return submit_array(owner, array, **request)
    return submit_job(owner, **request)


def release_job(job: Job, *, actor: User) -> Job:
    """Let a held (PENDING) job into the queue; the placement loop is woken on commit."""
    return transition(job, S.QUEUED, actor=actor, expect=[S.PENDING], message="released")


def cancel_job(job: Job, *, actor: User, reason: str = "", kill: bool = False) -> Job:
    """Cancel a job. A waiting one ends at once. One that holds GPUs is signalled through its
    nodes' agents and keeps its GPUs until an agent reports its processes gone (SIGTERM, then
    SIGKILL after the grace), so the next job never shares a GPU with a dying one; when a node
    is unreachable nothing can be signalled and the job ends at once. With ``kill`` (the
    seed's force kill, ``gpuadmin jobs kill``) its processes get SIGKILL at once, no grace,
    even when a cancel is already under way (its grace is cut short)."""
    message = reason or f"{'killed' if kill else 'canceled'} by {actor.get_username()}"
    stop: dict[str, Any] = {"signal": "SIGKILL", "grace_s": 0} if kill else {}
    job.refresh_from_db()  # decide on the stored state and attempt, never a stale copy
    nodes = job_nodes(job) if job.state in HOLDING_STATES else []
    if nodes and all(node.is_reachable() for node in nodes):
        with transaction.atomic():
            # A cancel overrides a preemption under way, and no later pass may start one: its
            # end is a cancel, not a re-queue (``_end_of``).
            Job.objects.filter(pk=job.pk).update(
                preempted_by=None, preempt_requested_at=None, cancel_requested_at=timezone.now()
            )
            record(
                "job.cancel_requested",
                actor=actor,
                target=job,
                before={"state": job.state},
                after=stop or None,
                message=message,
            )
            hostnames = [node.hostname for node in nodes]
            transaction.on_commit(lambda: dispatch.send_cancel(job, hostnames, message, **stop))
        return job
    return transition(job, S.CANCELED, actor=actor, message=message)


def cancel_waiting(
    messages: Mapping[int, str], *, actor: User | None = None, actor_name: str | None = None
) -> list[int]:
    """Cancel those of the jobs ``messages`` names (id -> why) that still wait (held or
    queued), as ``transition`` would one by one, but in one transaction of a fixed number of
    statements (one UPDATE per distinct message, one audit insert of ``job.canceled`` rows)
    whatever their number; the loop is woken on commit. The ids canceled: a job that moved on
    meanwhile is left alone (placed jobs end through their agents: ``cancel_job``)."""
    waiting = [state for state in (S.PENDING, S.QUEUED) if S.CANCELED in TRANSITIONS[state]]
    with transaction.atomic():
        jobs = list(
            Job.objects.select_for_update()
            .filter(pk__in=list(messages), state__in=waiting)
            .only("pk", "name", "state")
            .order_by("pk")
        )
        if not jobs:
            return []
        now = timezone.now()
        by_message: dict[str, list[int]] = defaultdict(list)
        for job in jobs:
            by_message[messages[job.pk]].append(job.pk)
        for message, ids in by_message.items():
            Job.objects.filter(pk__in=ids).update(
                state=S.CANCELED, finished_at=now, pid=None, message=message, **NOT_WAITING
            )
        record_all(
            [
                audit_event(
                    f"job.{S.CANCELED}",
                    actor=actor,
                    actor_name=actor_name,
                    target=job,
                    before={"state": job.state},
                    after={"state": S.CANCELED, "finished_at": now, "pid": None},
                    message=messages[job.pk],
                )
                for job in jobs
            ]
        )
        request_placement_pass()
    log.info("%d waiting jobs canceled", len(jobs))
    return [job.pk for job in jobs]


@dataclass(frozen=True)
class ArrayCanceled:
    canceled: list[int]  # tasks canceled now (those that were waiting, mostly)
    canceling: list[int]  # tasks on GPUs: their agents stop them (``cancel_job``)


def cancel_array(array: JobArray, *, actor: User) -> ArrayCanceled:
    """Cancel every unfinished task of ``array`` (Slurm's ``scancel`` of an array job): the
    waiting ones at once (``cancel_waiting``), those on GPUs through their agents."""
    message = f"array {array.pk} canceled by {actor.get_username()}"
    tasks = array.tasks.exclude(state__in=TERMINAL_STATES)
    waiting = list(tasks.filter(state__in=(S.PENDING, S.QUEUED)).values_list("pk", flat=True))
    canceled = cancel_waiting(dict.fromkeys(waiting, message), actor=actor)
    canceling: list[int] = []
    for task in tasks.exclude(pk__in=canceled).order_by("pk"):
        try:
            cancel_job(task, actor=actor, reason=message)
        except IllegalTransition:  # it ended meanwhile
            continue
        (canceled if task.is_terminal else canceling).append(task.pk)
    return ArrayCanceled(canceled, canceling)


def stop_jobs_on_gpus(
    gpu_ids: Collection[int],
    *,
    requeue: bool,
    reason: str,
    pid: int | None = None,
    actor_name: str = HEALTH_ACTOR,
) -> list[int]:
    """Stop now the jobs holding any of ``gpu_ids`` because the hardware under them failed (a
    health policy, or the GPUs went offline) or is reconfigured (a MIG re-layout that preempts,
    as ``actor_name``): requeue them (their next placement is their next
    attempt) or fail their run, which counts against their retries as a non-zero exit does
    (``_end_of``: re-queued while retries are left), with ``reason`` in the job's message,
    their GPUs released at once,
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
            current = holding.filter(pk=job.pk).select_for_update(of=("self",)).first()
            if current is None:
                continue  # ended, or requeued and placed elsewhere, since the query
            hostnames = [node.hostname for node in job_nodes(job) if node.is_reachable()]
            to, message, fields = (
                (S.QUEUED, reason, {}) if requeue else _end_of(current, "failed", None, reason)
            )
            locked = transition(job.pk, to, actor_name=actor_name, message=message, **fields)
            if hostnames:
                transaction.on_commit(partial(dispatch.send_cancel, locked, hostnames, message))
        stopped.append(job.pk)
    return stopped


def job_nodes(job: Job) -> list[Node]:
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


@dataclass(frozen=True)
class Grant:
    """What one placement gives a QUEUED job: whole GPUs, or one MIG device (``mig_instance``,
    a ``MigInstance`` id) or one MPS share of its one GPU."""

    job_id: int
    gpu_ids: tuple[int, ...]
    placement: dict[str, Any] | None = None  # why these GPUs (``Job.placement``)
    mig_instance: int | None = None
    mps_percent: int | None = None
    mps_memory_mib: int | None = None
    borrowed: bool = False  # placed over its quota on idle GPUs: reclaimed first

    @property
    def kind(self) -> AllocationKind:
        if self.mig_instance is not None:
            return AllocationKind.MIG
        return AllocationKind.GPU if self.mps_percent is None else AllocationKind.MPS


# What the one rule (``Gpu.unusable``) may say of a GPU that takes a grant of each kind: a
# whole GPU nothing at all; a MIG device or an MPS share only that the GPU is shared that way.
_SHARED_AS = {
    AllocationKind.GPU: None,
    AllocationKind.MIG: UsabilityReason.MIG,
    AllocationKind.MPS: UsabilityReason.MPS,
}


@dataclass
class Allocated:
    """What ``allocate_many`` committed: each job granted (SCHEDULED now, its owner's Unix
    account loaded) with its allocations (GPU and node loaded), and why each other was
    refused, by job id."""

    granted: list[tuple[Job, list[Allocation]]] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)

    def add(self, other: Allocated) -> None:
        self.granted += other.granted
        self.refused.update(other.refused)


def allocate_many(
    grants: Sequence[Grant],
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    manual: bool = False,
    decided_at: datetime | None = None,
) -> Allocated:
    """Commit ``grants`` (each job's all or nothing) in one transaction of a fixed number of
    statements however many there are: the jobs locked, then their GPUs (the module's lock
    order), each in one query in id order; each grant re-checked against
    the one rule with the GPUs' latest live samples and its job still QUEUED; the
    allocations inserted, audited (``allocation.created``), and the jobs made SCHEDULED
    (``job.scheduled``, their attempt counted) in bulk.

    A grant the checks refuse is left out and the others commit. When the database refuses
    the batch (the partial unique index or the sharing trigger: a GPU given meanwhile, or
    twice), nothing of it is written and its grants are committed one by one instead, so that
    one refusal never costs the others.

    ``decided_at`` (default: now) is the jobs' ``scheduled_at``: the placement loop gives the
    time its pass saw, so that the next pass expects a placed job to end when the pass that
    placed it did (from the commit's time, a second or two later, every waiting job's estimated
    start behind it would move and be rewritten)."""
    try:
        with transaction.atomic():
            return _allocate(grants, actor, actor_name, manual, decided_at)
    except IntegrityError as exc:
        if len(grants) == 1:
            why = f"a GPU was allocated meanwhile ({exc.__cause__})"
            return Allocated(refused={grants[0].job_id: why})
    outcome = Allocated()
    for grant in grants:
        outcome.add(
            allocate_many(
                [grant], actor=actor, actor_name=actor_name, manual=manual, decided_at=decided_at
            )
        )
    return outcome


def _allocate(
    grants: Sequence[Grant],
    actor: User | None,
    actor_name: str | None,
    manual: bool,
    decided_at: datetime | None,
) -> Allocated:
    """``allocate_many``'s transaction (the caller's)."""
    outcome = Allocated()
    jobs = {
        job.pk: job
        for job in Job.objects.select_for_update(of=("self",))
        .filter(pk__in=[grant.job_id for grant in grants])
        .select_related("owner__unix_account")
        .order_by("pk")
    }
    gpu_ids = sorted({gpu_id for grant in grants for gpu_id in grant.gpu_ids})
    gpus = {
        gpu.pk: gpu
        for gpu in Gpu.objects.select_for_update(of=("self",))
        .filter(pk__in=gpu_ids)
        .select_related("node")
        .only(*Gpu.RULE_FIELDS)
        .order_by("pk")
    }
    devices = _mig_devices(grants)
    # Read with the GPU rows locked: a reservation approved meanwhile is committed and seen
    # (its approval locks the rows of the GPUs it holds).
    now = timezone.now()
    book = ReservationBook(reservation_windows(now, gpu_ids), now.timestamp())
    try:
        samples = live.latest_of((gpu.node.hostname, gpu.uuid) for gpu in gpus.values())
    except RedisError as exc:
        why = f"the GPUs' live samples cannot be read: {exc}"
        return Allocated(refused=dict.fromkeys((grant.job_id for grant in grants), why))
    accepted: list[Grant] = []
    for grant in grants:
        refusal = _refusal(grant, jobs.get(grant.job_id), gpus, devices, samples, book)
        if refusal:
            outcome.refused[grant.job_id] = refusal
        else:
            accepted.append(grant)
    if not accepted:
        return outcome
    rows = [
        Allocation(
            job=jobs[grant.job_id],
            gpu=gpus[gpu_id],
            node=gpus[gpu_id].node,
            attempt=jobs[grant.job_id].attempt + 1,
            manual=manual,
            kind=grant.kind,
            mig_instance_id=grant.mig_instance,
            device_uuid=gpus[gpu_id].uuid
            if grant.mig_instance is None
            else devices[grant.mig_instance][1],
            mps_percent=grant.mps_percent,
            mps_memory_mib=grant.mps_memory_mib,
            borrowed=grant.borrowed,
        )
        for grant in accepted
        for gpu_id in sorted(grant.gpu_ids)
    ]
    _insert_allocations(rows)
    record_each(
        "allocation.created",
        ((row.pk, str(row), _allocation_facts(row)) for row in rows),
        target_type=Allocation._meta.label_lower,
        actor=actor,
        actor_name=actor_name,
    )
    scheduled = _schedule([(jobs[grant.job_id], grant) for grant in accepted], decided_at)
    record_each(
        f"job.{S.SCHEDULED}",
        ((job.pk, str(job), after) for job, after in scheduled),
        target_type=Job._meta.label_lower,
        actor=actor,
        actor_name=actor_name,
        before={"state": S.QUEUED},
    )
    held: dict[int, list[Allocation]] = defaultdict(list)
    for row in rows:
        held[row.job_id].append(row)
    outcome.granted += [(jobs[grant.job_id], held[grant.job_id]) for grant in accepted]
    for grant in accepted:
        log.info("job %d: %s -> %s", grant.job_id, S.QUEUED, S.SCHEDULED)
    return outcome


def _insert_allocations(rows: list[Allocation]) -> None:
    """Insert unsaved allocations in one statement, setting their ids and start times (a pass
    inserts thousands: ``bulk_create`` costs several times as much per row). Their start is
    the statement's time, as ``allocated_at``'s default (see ``release_allocations``)."""
    values = [[getattr(row, column) for row in rows] for column in INSERTED_COLUMNS]
    with connection.cursor() as cursor:
        cursor.execute(INSERT_ALLOCATIONS_SQL, values)
        inserted = {(job_id, gpu_id): (pk, at) for pk, job_id, gpu_id, at in cursor.fetchall()}
    for row in rows:
        row.pk, row.allocated_at = inserted[row.job_id, row.gpu_id]


INSERTED_COLUMNS = (
    "job_id",
    "gpu_id",
    "node_id",
    "attempt",
    "manual",
    "kind",
    "mig_instance_id",
    "device_uuid",
    "mps_percent",
    "mps_memory_mib",
    "borrowed",
)
INSERT_ALLOCATIONS_SQL = f"""
    INSERT INTO scheduling_allocation ({", ".join(INSERTED_COLUMNS)}, allocated_at)
    SELECT {", ".join(INSERTED_COLUMNS)}, statement_timestamp()
    FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::integer[], %s::boolean[],
                %s::text[], %s::bigint[], %s::text[], %s::integer[], %s::integer[],
                %s::boolean[])
        WITH ORDINALITY AS new ({", ".join(INSERTED_COLUMNS)}, n)
    ORDER BY n
    RETURNING id, job_id, gpu_id, allocated_at
"""


def _mig_devices(grants: Sequence[Grant]) -> dict[int, tuple[int, str]]:
    """The MIG devices the grants name: id -> (its GPU's id, its UUID); no query without."""
    ids = [grant.mig_instance for grant in grants if grant.mig_instance is not None]
    if not ids:
        return {}
    rows = MigInstance.objects.filter(pk__in=ids, uuid__isnull=False).values_list(
        "pk", "gpu_id", "uuid"
    )
    return {pk: (gpu_id, str(uuid)) for pk, gpu_id, uuid in rows}


def reservation_windows(
    now: datetime, gpu_ids: Collection[int] | None = None
) -> tuple[placement.ReservationWindow, ...]:
    """The approved reservations that end after ``now`` (of ``gpu_ids`` only, when given), with
    the GPUs each holds there (one query): the placement loop's snapshot, and what the commit
    of a placement checks again."""
    holds = ReservationGpu.objects.filter(
        reservation__state=ReservationState.APPROVED, reservation__end__gt=now
    )
    if gpu_ids is not None:
        holds = holds.filter(gpu_id__in=list(gpu_ids))
    rows = holds.order_by("reservation_id", "gpu_id").values_list(
        "reservation_id",
        "reservation__owner_id",
        "reservation__start",
        "reservation__end",
        "gpu_id",
    )
    gpus: dict[int, list[int]] = defaultdict(list)
    facts: dict[int, tuple[int, datetime, datetime]] = {}
    for reservation_id, owner_id, start, end, gpu_id in rows:
        gpus[reservation_id].append(gpu_id)
        facts[reservation_id] = (owner_id, start, end)
    return tuple(
        placement.ReservationWindow(
            id=pk,
            owner=str(owner_id),
            gpu_ids=tuple(gpus[pk]),
            start=start.timestamp(),
            end=end.timestamp(),
        )
        for pk, (owner_id, start, end) in facts.items()
    )


KIND_WORDS = {
    AllocationKind.GPU: "whole GPUs",
    AllocationKind.MIG: "a MIG device",
    AllocationKind.MPS: "an MPS share",
}


class _Booker(NamedTuple):
    """A job as the reservation windows see it (``placement.reservations.Booker``)."""

    owner: str
    max_runtime_s: float | None
    reservation: int | None


def _refusal(
    grant: Grant,
    job: Job | None,
    gpus: Mapping[int, Gpu],
    devices: Mapping[int, tuple[int, str]],
    samples: Mapping[str, Mapping[str, Mapping[str, Any]]],
    book: ReservationBook,
) -> str:
    """Why ``grant`` cannot be committed now (its rows locked), or ``""``: the job no longer
    waits, a GPU is gone, out of the job's pool, not usable (the one rule) or not shared as
    the job asked, or the reservation windows close it to the job (the engine's rule)."""
    if job is None:
        return f"job {grant.job_id} no longer exists"
    if job.state != S.QUEUED:
        return transition_refusal(job.pk, job.state, S.SCHEDULED)
    missing = sorted(set(grant.gpu_ids) - set(gpus))
    if missing:
        return f"no GPU with id {', '.join(map(str, missing))}"
    if grant.kind != job.allocation_kind:
        wanted, given = KIND_WORDS[job.allocation_kind], KIND_WORDS[grant.kind]
        return f"job {job.pk} asks for {wanted}, not {given}"
    elsewhere = [
        gpus[gpu_id].uuid
        for gpu_id in sorted(grant.gpu_ids)
        if gpus[gpu_id].pool_in_force_id != job.pool_id
    ]
    if elsewhere:
        return f"GPUs outside the job's pool: {', '.join(elsewhere)}"
    booker = _Booker(str(job.owner_id), job.max_runtime_s, job.reservation_id)
    reserved = [
        gpus[gpu_id].uuid for gpu_id in sorted(grant.gpu_ids) if book.closed(gpu_id, booker)
    ]
    if reserved:
        if (in_window := book.refusal(booker)) is not None:
            return in_window[0]
        return (
            f"GPUs held by a reservation the job would still run into (by its maximum "
            f"runtime): {', '.join(reserved)}"
        )
    if grant.mig_instance is not None:
        [gpu_id] = grant.gpu_ids
        if devices.get(grant.mig_instance, (None,))[0] != gpu_id:
            return f"MIG device {grant.mig_instance} is no longer a device of GPU {gpu_id}"
    allowed = _SHARED_AS[grant.kind]
    found = []
    for gpu_id in sorted(grant.gpu_ids):
        gpu = gpus[gpu_id]
        why = gpu.unusable(samples.get(gpu.node.hostname, {}).get(gpu.uuid))
        if why is not None and why.code != allowed:
            found.append(f"{gpu.uuid} ({why.message})")
        elif why is None and allowed is not None:
            found.append(f"{gpu.uuid} (it is not shared as {grant.kind})")
    return f"GPUs not usable now: {'; '.join(found)}" if found else ""


def _allocation_facts(row: Allocation) -> dict[str, Any]:
    """An allocation's audited ``after``: its job, GPU and node, and what share of it."""
    facts: dict[str, Any] = {"job": row.job_id, "gpu": row.gpu.uuid, "node": row.node.hostname}
    if row.kind == AllocationKind.MIG:
        facts.update(kind=row.kind, device=row.device_uuid)
    elif row.kind == AllocationKind.MPS:
        facts.update(kind=row.kind, mps_percent=row.mps_percent, mps_memory_mib=row.mps_memory_mib)
    if row.borrowed:
        facts["borrowed"] = True
    return facts


def _schedule(
    granted: list[tuple[Job, Grant]], decided_at: datetime | None
) -> list[tuple[Job, dict[str, Any]]]:
    """Make the granted jobs (locked, QUEUED) SCHEDULED at ``decided_at`` (default: now) in
    one statement, as ``transition`` would: attempt counted, placement stored, the loop's word
    on their wait cleared. Each job (updated in memory too) with its audited ``after``."""
    now = decided_at or timezone.now()
    columns: tuple[list[Any], ...] = ([], [], [], [])
    changed = []
    for job, grant in granted:
        fields = {
            "attempt": job.attempt + 1,
            "scheduled_at": now,
            "placement": grant.placement,
            "borrowed": grant.borrowed,
        }
        placement = None if grant.placement is None else json.dumps(grant.placement)
        row = (job.pk, fields["attempt"], placement, grant.borrowed)
        for column, value in zip(columns, row, strict=True):
            column.append(value)
        job.__dict__.update(NOT_WAITING, state=S.SCHEDULED, **fields)
        changed.append((job, {"state": S.SCHEDULED, **fields}))
    cleared = ", ".join(f"{name} = %s" for name in NOT_WAITING)
    with connection.cursor() as cursor:
        cursor.execute(
            SCHEDULE_SQL.format(cleared=cleared),
            [S.SCHEDULED, now, *NOT_WAITING.values(), *columns, S.QUEUED],
        )
    return changed


SCHEDULE_SQL = """
    UPDATE scheduling_job AS job
    SET state = %s, scheduled_at = %s, {cleared}, attempt = new.attempt,
        placement = new.placement::jsonb, borrowed = new.borrowed
    FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::boolean[])
        AS new (id, attempt, placement, borrowed)
    WHERE job.id = new.id AND job.state = %s
"""


def allocate(
    job: Job,
    gpu_ids: Collection[int],
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    placement: dict[str, Any] | None = None,
    manual: bool = False,
    mig_instance: int | None = None,
    mps_percent: int | None = None,
    mps_memory_mib: int | None = None,
) -> list[Allocation]:
    """Give the GPUs ``gpu_ids`` to a QUEUED job and make it SCHEDULED, all or nothing
    (``allocate_many`` of one grant): whole, or the MIG device ``mig_instance`` of its one GPU,
    or an MPS share of it (``mps_percent``). The allocations, with their GPU and node loaded,
    and ``job`` updated. Raises ``AllocationRefused`` and writes nothing."""
    grant = Grant(
        job.pk,
        tuple(sorted(set(gpu_ids))),
        placement,
        mig_instance=mig_instance,
        mps_percent=mps_percent,
        mps_memory_mib=mps_memory_mib,
    )
    outcome = allocate_many([grant], actor=actor, actor_name=actor_name, manual=manual)
    if outcome.refused:
        raise AllocationRefused(outcome.refused[job.pk])
    [(granted, rows)] = outcome.granted
    job.__dict__.update(granted.__dict__)
    return rows


# --------------------------------------------------------------------------- agent reports

# What an executor outcome makes of the job: retried outcomes re-queue while retries are left.
RETRIED_OUTCOMES = frozenset({"failed", "timed_out", "lost"})


def job_event(event: ExecutorEvent) -> None:
    """What an agent's executor reported (``scheduling.job_event``): ``job_events`` of one."""
    job_events([event])


@dataclass
class Recorded:
    """What ``job_events`` made of a batch: the state each job reached, by id, and the
    executor ids of the events refused because their job attempt was not placed on the node
    that sent them."""

    reached: dict[int, str] = field(default_factory=dict)
    not_placed_there: list[str] = field(default_factory=list)


def job_events(
    events: Sequence[ExecutorEvent],
    *,
    sender: str | None = None,
    node_stopped: Collection[str] = (),
) -> Recorded:
    """What an agent's executor reported, in the order it happened (``scheduling.job_events``: an
    agent sends together the events that pile up), recorded in one transaction of a fixed number of
    statements however many events: the jobs locked in id order (with the attempts placed on node
    ``sender``, when given: an event about a job attempt placed elsewhere is refused, not believed);
    each event's transition decided on its job as the state machine has it then (``_change``: a
    start SCHEDULED -> RUNNING, an end as ``_end_of`` says); the jobs written in one UPDATE; the
    GPUs of those that stopped holding them released in one statement; every transition audited, in
    one INSERT. An end adds its run's CPU time and peak memory to the job's earlier runs' (retries
    and preempted runs count too); a multi-node gang's parts add theirs with statements of their own
    (``_add_gang_part``). A stale report (another attempt, or a job that moved on) changes nothing.
    The end of a preempted job takes ``_requeue_preempted``'s path, in the same transaction: its
    GPUs are released by a statement of their own, so when others end with it, all their GPUs are
    locked first, in id order (the module's lock order). ``node_stopped``: the executor ids of the
    jobs that ``sender``'s agent stopped because it stopped (``--stop-jobs-on-exit``): their cancel
    is the node's stop, not a user's (``_end_of``)."""
    reports = []
    for event in events:
        job_id, attempt = parse_executor_id(event.job_id)
        reports.append((job_id, attempt, event))
    recorded = Recorded()
    reached = recorded.reached
    locking = Job.objects.select_for_update(of=("self",)).filter(
        pk__in={job_id for job_id, _, _ in reports}
    )
    if sender is not None:
        placed = Allocation.objects.filter(job=OuterRef("pk"), node__hostname=sender)
        locking = locking.annotate(placed_there=ArraySubquery(placed.values("attempt")))
    with transaction.atomic():
        jobs = {job.pk: job for job in locking.order_by("pk")}
        if len(jobs) > 1 and any(job.preempted_by_id is not None for job in jobs.values()):
            _lock_held_gpus(list(jobs))
        moves = _Moves(AGENT_ACTOR)
        gang_parts: list[tuple[int, int, JobFinished]] = []
        for job_id, attempt, event in reports:
            job = jobs.get(job_id)
            if sender is not None and attempt not in getattr(job, "placed_there", ()):
                recorded.not_placed_there.append(event.job_id)
                continue
            if job is None or job.attempt != attempt:
                continue
            if isinstance(event, JobStarted):
                if job.state == S.SCHEDULED:
                    moves.add(job, S.RUNNING, pid=event.pid, started_at=event.started_at)
                continue
            # A gang's parts end one by one, each on its node: their usage adds up.
            gang = job.node_count > 1 and sender is not None
            if job.state not in HOLDING_STATES:
                if gang:
                    gang_parts.append((job_id, attempt, event))
                continue
            preempted = job.preempted_by_id is not None and job.cancel_requested_at is None
            if preempted and event.state != "completed":
                reached.update(moves.write())
                if gang:
                    gang_parts.append((job_id, attempt, event))
                else:
                    _add_usage(job_id, event)
                if (state := _requeue_preempted(job_id, event.exit_code)) is not None:
                    reached[job_id] = state
                del jobs[job_id]  # its row changed under this copy; later reports are stale
                continue
            stopped_by = sender if event.job_id in node_stopped else None
            to, message, fields = _end_of(
                job, event.state, event.exit_code, event.message, node_stopped=stopped_by
            )
            fields["exit_code"] = event.exit_code
            if not gang:  # the run's usage, added to its earlier runs' (a gang's: by part)
                fields["cpu_seconds"] = _total(job.cpu_seconds, event.cpu_seconds)
                fields["max_memory_bytes"] = _peak(job.max_memory_bytes, event.max_memory_bytes)
            if to != S.QUEUED:
                fields["finished_at"] = event.finished_at
            moves.add(job, to, message, **fields)
            if gang:
                gang_parts.append((job_id, attempt, event))
        reached.update(moves.write())
        for job_id, attempt, event in gang_parts:
            assert sender is not None, "a gang's part is reported by its node"
            _add_gang_part(job_id, attempt, sender, event)
    moves.log()
    return recorded


# The audit row of one node's part of a multi-node gang's usage.
GANG_PART_USAGE = "job.part_usage"


def _add_gang_part(job_id: int, attempt: int, node: str, event: JobFinished) -> None:
    """Add the usage of a gang's part that ended on ``node`` to its job (CPU seconds summed,
    the largest peak memory kept; inside the caller's transaction, the job locked), audited
    ``job.part_usage``, that row also telling a repeated report (counted once per node and
    attempt)."""
    cpu, memory = event.cpu_seconds, event.max_memory_bytes
    if cpu is None and memory is None:
        return
    part = {"attempt": attempt, "node": node}
    counted = AuditEvent.objects.filter(
        event_type=GANG_PART_USAGE,
        target_type=Job._meta.label_lower,
        target_id=str(job_id),
        after__contains=part,
    )
    if counted.exists():
        return
    _add_usage(job_id, event)
    after = {**part, "cpu_seconds": cpu, "max_memory_bytes": memory}
    record(
        GANG_PART_USAGE,
        actor_name=AGENT_ACTOR,
        target_type=Job._meta.label_lower,
        target_id=job_id,
        after=after,
    )


def _add_usage(job_id: int, event: JobFinished) -> None:
    """Add what a run (or a gang's part) used to its job's: CPU seconds summed over its runs,
    the largest peak memory kept (one statement; the job locked by the caller)."""
    cpu, memory = event.cpu_seconds, event.max_memory_bytes
    Job.objects.filter(pk=job_id).update(
        cpu_seconds=F("cpu_seconds") if cpu is None else Coalesce(F("cpu_seconds"), 0.0) + cpu,
        max_memory_bytes=F("max_memory_bytes")
        if memory is None
        else Greatest(F("max_memory_bytes"), Value(memory)),  # NULL is not the greatest
    )


def _total(before: float | None, run: float | None) -> float | None:
    return before if run is None else (before or 0.0) + run


def _peak(before: int | None, run: int | None) -> int | None:
    return before if run is None else max(before or 0, run)


def _lock_held_gpus(job_ids: Collection[int]) -> None:
    """Lock the GPUs these jobs hold, in id order, in one statement (inside the caller's
    transaction, the jobs locked)."""
    with connection.cursor() as cursor:
        cursor.execute(LOCK_HELD_GPUS_SQL, [list(job_ids)])


LOCK_HELD_GPUS_SQL = f"""
    SELECT gpu.id FROM {Gpu._meta.db_table} AS gpu
    WHERE gpu.id IN (
        SELECT gpu_id FROM {Allocation._meta.db_table}
        WHERE job_id = ANY(%s) AND released_at IS NULL
    )
    ORDER BY gpu.id
    FOR UPDATE
"""


def job_started(job_id: int, attempt: int, pid: int, at: datetime) -> bool:
    """The agent started attempt ``attempt``: SCHEDULED -> RUNNING. ``False`` for a stale
    report (another attempt, or the job already moved on)."""
    event = JobStarted(executor_id(job_id, attempt), pid, at)
    return job_events([event]).reached.get(job_id) == S.RUNNING


def job_finished(
    job_id: int, attempt: int, outcome: str, exit_code: int | None, message: str, at: datetime
) -> str | None:
    """The agent says attempt ``attempt`` ended (``completed``, ``failed``, ``timed_out``,
    ``canceled`` or ``lost``). Re-queues while retries are left; the new state, or ``None``
    for a stale report."""
    event = JobFinished(executor_id(job_id, attempt), FinalState(outcome), exit_code, at, message)
    return job_events([event]).reached.get(job_id)


def _end_of(
    job: Job,
    outcome: str,
    exit_code: int | None,
    message: str,
    *,
    node_stopped: str | None = None,
) -> tuple[str, str, dict[str, Any]]:
    """What the end of the job's current attempt with ``outcome`` makes of it, its message
    and the fields that change with it: a cancel asked for ends it canceled whatever its
    processes made of the signal (unless they completed first); retried outcomes count a
    failure and re-queue it while retries are left (a preemption, a re-layout's or a fault's
    re-queue counts none). A job canceled because its node ``node_stopped`` (its agent
    stopped with its jobs) is re-queued without counting a retry (not its own failure, as on
    a silent node): Slurm's requeue of a batch job on node failure."""
    if outcome == "completed":
        return S.COMPLETED, message, {}
    if outcome == "canceled" and node_stopped is not None and job.cancel_requested_at is None:
        return S.QUEUED, f"requeued: node {node_stopped} stopped", {}
    if outcome == "canceled" or job.cancel_requested_at is not None:
        return S.CANCELED, message or f"canceled ({outcome} as it stopped)", {}
    if outcome not in RETRIED_OUTCOMES:
        return S.FAILED, message or f"{outcome}: exit code {exit_code}", {}
    failures = job.failures + 1
    if failures <= job.max_retries:
        why = message or f"exit code {exit_code}"
        said = f"retry {failures}/{job.max_retries} after attempt {job.attempt} {outcome}: {why}"
        return S.QUEUED, said, {"failures": failures}
    return S.FAILED, message or f"{outcome}: exit code {exit_code}", {"failures": failures}


class _Moves:
    """Transitions of locked jobs, decided in memory one after the other (``_change``, as
    ``transition`` decides them) and written together by ``write``: the jobs in one UPDATE,
    the allocations of those that stopped holding GPUs released in one statement, each
    transition's ``job.<state>`` audit row in one INSERT."""

    def __init__(self, actor_name: str) -> None:
        self.actor_name = actor_name
        self.pending: list[tuple[Job, dict[str, Any], str, str, dict[str, Any]]] = []
        self.written: list[tuple[int, str, str, str]] = []  # for ``log``, after the commit

    def add(self, job: Job, to: str, message: str = "", **fields: Any) -> None:
        """Move ``job`` (locked) to ``to`` in memory; a move the state machine refuses is
        left out, as ``transition`` would refuse it."""
        try:
            before, _ = _change(job, to, message, None, fields)
        except IllegalTransition:
            return
        self.pending.append((job, before, to, message, fields))

    def write(self) -> dict[int, str]:
        """Write what was added since the last write (inside the caller's transaction); the
        state each job reached, by id."""
        if not self.pending:
            return {}
        jobs = {job.pk: job for job, *_ in self.pending}
        columns = {"state"}
        for _, _, to, _, fields in self.pending:
            columns.update(fields)
            if to != S.QUEUED:
                columns.update(NOT_WAITING)
        _update_jobs(list(jobs.values()), columns)
        ended = [
            job.pk
            for job, before, to, _, _ in self.pending
            if before["state"] in HOLDING_STATES and to not in HOLDING_STATES
        ]
        released = release_allocations_of(ended) if ended else {}
        rows = []
        for job, before, to, message, fields in self.pending:
            after = {"state": to, **_plain(fields)}
            stopped_holding = before["state"] in HOLDING_STATES and to not in HOLDING_STATES
            if stopped_holding and released.get(job.pk):
                after["released_gpus"] = released[job.pk]
            rows.append(
                audit_event(
                    f"job.{to}",
                    actor_name=self.actor_name,
                    target=job,
                    before=before,
                    after=after,
                    message=message,
                )
            )
            self.written.append((job.pk, before["state"], to, message))
        record_all(rows)
        if any(to in TERMINAL_STATES or to == S.QUEUED for _, _, to, _, _ in self.pending):
            request_placement_pass()
        reached = {job.pk: to for job, _, to, _, _ in self.pending}
        self.pending = []
        return reached

    def log(self) -> None:
        """The line ``transition`` logs, for each transition written."""
        for job_id, before, to, message in self.written:
            log.info("job %d: %s -> %s%s", job_id, before, to, f" ({message})" if message else "")


def _update_jobs(jobs: Sequence[Job], names: Collection[str]) -> None:
    """Write the fields ``names`` of ``jobs`` (locked) as they are in memory, in one
    statement however many (an UPDATE from arrays: ``bulk_update``'s CASE per field and row
    costs several times as much to build and to run)."""
    fields = [field for field in Job._meta.concrete_fields if field.name in names]
    quote = connection.ops.quote_name
    columns = [quote(field.column) for field in fields]
    arrays = [f"%s::{field.db_type(connection)}[]" for field in fields]
    statement = (
        f"UPDATE {quote(Job._meta.db_table)} AS job "
        f"SET {', '.join(f'{column} = new.{column}' for column in columns)} "
        f"FROM unnest(%s::bigint[], {', '.join(arrays)}) AS new (id, {', '.join(columns)}) "
        "WHERE job.id = new.id"
    )
    values = [
        [field.get_db_prep_save(getattr(job, field.attname), connection) for job in jobs]
        for field in fields
    ]
    with connection.cursor() as cursor:
        cursor.execute(statement, [[job.pk for job in jobs], *values])


def _requeue_preempted(job_id: int, exit_code: int | None) -> str | None:
    """A preempted job's attempt ended (whatever the signal made of it): PREEMPTED (audited
    ``job.preempted`` with its ``preemptions`` counted, its GPUs released, the preemption's
    message kept), then back in the queue for its next attempt, which does not count against
    its retries."""
    try:
        with transaction.atomic():
            counted = Job.objects.select_for_update().values_list("preemptions", flat=True)
            preempted = counted.get(pk=job_id) + 1
            transition(
                job_id,
                S.PREEMPTED,
                actor_name=AGENT_ACTOR,
                exit_code=exit_code,
                preemptions=preempted,
            )
            transition(job_id, S.QUEUED, actor_name=AGENT_ACTOR)
    except IllegalTransition:
        return None
    return S.QUEUED


def request_placement_pass() -> None:
    """Wake the placement loop once the current transaction commits (coalesced)."""
    transaction.on_commit(dispatch.wake)


def reconcile_node_jobs(hostname: str, running: set[tuple[int, int]]) -> list[int]:
    """A (re)started agent says which (job, attempt) it runs: a job RUNNING on that node that
    it does not know was lost with the previous agent (fails, or re-queues while retries are
    left); one SCHEDULED there longer than ``GPUADMIN_SCHEDULED_CONFIRM_S`` that it does not
    run is re-queued (``requeue_unconfirmed``: one placed since may still be in its queue).
    Returns those jobs' ids."""
    lost = requeue_unconfirmed(hostname, running)
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


def unconfirmed_jobs(now: datetime | None = None) -> QuerySet[Job]:
    """Jobs SCHEDULED longer than ``GPUADMIN_SCHEDULED_CONFIRM_S``: no agent has reported
    them started (the message that carried them was lost, or their agent stopped or went
    silent). ``gpuadmin check`` reports them; ``requeue_unconfirmed`` re-queues them."""
    bound = timedelta(seconds=settings.GPUADMIN_SCHEDULED_CONFIRM_S)
    return Job.objects.filter(state=S.SCHEDULED, scheduled_at__lt=(now or timezone.now()) - bound)


def requeue_unconfirmed(
    hostname: str | None = None, running: Collection[tuple[int, int]] = ()
) -> list[int]:
    """Re-queue the ``unconfirmed_jobs`` (only those placed on ``hostname``, when given, but
    not the (job, attempt) its agent says it ``running``): audited, with the reason as the
    job's message ("requeued: dgx-01 did not start it within 120 s"), its GPUs released, not
    counted against its retries, and its agents asked to cancel that attempt should its
    message still arrive (``agent.cancel_job``: it then never starts). The ids re-queued."""
    jobs = unconfirmed_jobs()
    if hostname is not None:
        jobs = jobs.filter(
            allocations__node__hostname=hostname, allocations__released_at__isnull=True
        )
    bound = settings.GPUADMIN_SCHEDULED_CONFIRM_S
    requeued = []
    for job_id, attempt in jobs.distinct().order_by("pk").values_list("pk", "attempt"):
        if (job_id, attempt) in running:
            continue
        with transaction.atomic():
            locked = unconfirmed_jobs().select_for_update().filter(pk=job_id, attempt=attempt)
            job = locked.first()
            if job is None:
                continue  # started, or moved on, since the query
            hostnames = [node.hostname for node in job_nodes(job)]
            message = f"requeued: {', '.join(hostnames)} did not start it within {bound} s"
            job = transition(job, S.QUEUED, actor_name=LOOP_ACTOR, message=message)
            transaction.on_commit(partial(dispatch.send_cancel, job, hostnames, message))
        requeued.append(job_id)
    return requeued
