"""The job's wire format between the central side and a node agent: the spec of a placed job
(``JobSpec``) and the events an executor reports about it (``JobStarted``, ``JobFinished``),
each with ``to_dict``/``from_dict``. Plain Python (no Django).
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

from inventory.nvml.parsers.common import parse_cpu_list

#: The only variables a job inherits from the agent: where programs are, whose account it runs
#: under, locale, time zone and scratch space. Never the agent's configuration or secrets.
BASE_ENV_KEYS = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR")
#: Used when the agent's own environment lacks them.
BASE_ENV_DEFAULTS = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

# Job ids become file names: no separators, no leading dot.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# What a container image and a Unix user name may be on an argv or in a lookup: never an
# option (a leading '-'), nor white space or control characters.
_ARGUMENT = re.compile(r"(?!-)[^\s\x00-\x1f\x7f-\x9f]+")


class FinalState(StrEnum):
    COMPLETED = "completed"  # exit code 0
    FAILED = "failed"  # non-zero exit, killed by a signal, or could not start
    CANCELED = "canceled"
    TIMED_OUT = "timed_out"  # ran past max_runtime_s
    LOST = "lost"  # ended while no agent could see how (see the module docstring)


def time_limit_message(max_runtime_s: float) -> str:
    """Why a job's attempt ended TIMED_OUT: the agent's report, and the central side's end of
    one whose processes never went after its time limit."""
    return f"ran past its maximum runtime of {max_runtime_s:g} s"


def executor_id(job_id: int, attempt: int) -> str:
    """gpuadmin's executor job id for one attempt of a job, so a retry never reads or signals
    an old run."""
    return f"{job_id}.{attempt}"


def parse_executor_id(value: str) -> tuple[int, int]:
    """(job, attempt) of an :func:`executor_id`."""
    job_id, attempt = value.split(".")
    return int(job_id), int(attempt)


@dataclass(frozen=True)
class RayPart:
    """A node's part of a Ray application (``JobSpec.ray``): the head on the job's first node,
    a worker on each other one (``scheduling.agent.ray_launch`` runs either). ``port`` is the
    head's GCS port, its dashboard's the next one and its client server's the one after."""

    head_address: str  # where the head's node is reached (its Node.address)
    port: int
    node_address: str  # this node's
    nodes: int  # of the job: the head runs the entrypoint once all have joined
    head: bool

    def __post_init__(self) -> None:
        for address in (self.head_address, self.node_address):
            if not _ARGUMENT.fullmatch(address):
                raise ValueError(f"Ray address {address!r} is not valid")
        if not 1024 <= self.port <= 65533 or self.nodes < 1:
            raise ValueError("a Ray head's port is 1024-65533, and a cluster has a node or more")

    @property
    def dashboard_port(self) -> int:
        return self.port + 1


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One placed job, and the wire format that carries it from the central side to its node's
    agent (:meth:`to_dict`, :meth:`from_dict`). Give ``argv`` (run as is) or ``shell_command``
    (run by ``/bin/sh -c``).

    ``cwd`` is where the process starts; ``None``: a scratch folder of its own (the
    executor's ``scratch_dir``; without one it refuses to launch). ``unix_user`` is the owner's
    Unix account, which a root executor runs the job as (root only with ``allow_root``). With a
    ``container_image`` the command runs in that image, in ``container_workdir`` when given (a
    path inside the container), and ``cwd`` is only where the runtime's client starts.
    """

    job_id: str
    cwd: str | None = None
    unix_user: str | None = None
    allow_root: bool = False
    argv: Sequence[str] = ()
    shell_command: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_uuids: Sequence[str] = ()
    max_runtime_s: float | None = None
    container_image: str | None = None
    container_workdir: str | None = None
    # An MPS share of its one GPU: percent of the GPU's SMs, and its device memory limit.
    mps_percent: int | None = None
    mps_memory_mib: int | None = None
    # What its cgroup gives it (see scheduling.agent.isolation): its GPUs' device minor numbers, its
    # MIG devices as (GPU minor, GPU instance, compute instance), the CPUs near its GPUs (a
    # cpulist), how many CPUs it asked for (0: those near its GPUs, shared) and its host
    # memory limit (0: none).
    gpu_minors: Sequence[int] = ()
    mig_devices: Sequence[Sequence[int]] = ()
    cpu_affinity: str = ""
    cpus: int = 0
    memory_mib: int = 0
    # Whether it may run on a node that confines no job (the node's admin allowed it).
    allow_unconfined: bool = False
    # A Ray application's part on this node: its command is the entrypoint, run on the head.
    ray: RayPart | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "gpu_uuids", tuple(self.gpu_uuids))
        object.__setattr__(self, "gpu_minors", tuple(self.gpu_minors))
        object.__setattr__(self, "mig_devices", tuple(tuple(d) for d in self.mig_devices))
        if any(len(device) != 3 for device in self.mig_devices):
            raise ValueError("a MIG device is (GPU minor, GPU instance, compute instance)")
        if self.cpus < 0 or self.memory_mib < 0:
            raise ValueError("cpus and memory_mib are 0 or more")
        if self.cpu_affinity and parse_cpu_list(self.cpu_affinity) is None:
            raise ValueError(f"CPU affinity {self.cpu_affinity!r} is not a cpulist")
        if not _JOB_ID.fullmatch(self.job_id):
            raise ValueError(f"job id {self.job_id!r} is not a valid file name")
        if bool(self.argv) == (self.shell_command is not None):
            raise ValueError("give exactly one of argv and shell_command")
        if self.cwd is not None and not os.path.isabs(self.cwd):
            raise ValueError(f"working directory {self.cwd!r} is not an absolute path")
        if self.max_runtime_s is not None and self.max_runtime_s <= 0:
            raise ValueError("max_runtime_s must be positive")
        if self.unix_user is not None and not _ARGUMENT.fullmatch(self.unix_user):
            raise ValueError(f"Unix user name {self.unix_user!r} is not valid")
        for name, value in self.env.items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise ValueError(f"environment variable {name!r} is not valid")
        if self.container_image is not None and not _ARGUMENT.fullmatch(self.container_image):
            raise ValueError(
                f"container image {self.container_image!r} is not valid: it starts with '-' or "
                "holds white space or control characters"
            )
        if self.mps_percent is not None:
            if not 1 <= self.mps_percent <= 100 or len(self.gpu_uuids) != 1:
                raise ValueError("an MPS share is 1-100 percent of exactly one GPU")
            if self.container_image:
                raise ValueError("an MPS share runs on the host, not in a container")
        if self.mps_memory_mib is not None and (
            self.mps_percent is None or self.mps_memory_mib < 1
        ):
            raise ValueError("an MPS memory limit is a positive MiB count of an MPS share")
        if self.ray is not None and (self.container_image or self.mps_percent is not None):
            raise ValueError("a Ray application runs on the host with whole GPUs or MIG devices")
        if self.container_workdir is not None:
            if not self.container_image:
                raise ValueError("container_workdir needs a container_image")
            if not os.path.isabs(self.container_workdir):
                raise ValueError(f"container workdir {self.container_workdir!r} is not absolute")

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-safe values (what ``scheduling.run_job`` carries)."""
        return {
            **{f.name: getattr(self, f.name) for f in fields(self)},
            "argv": list(self.argv),
            "env": dict(self.env),
            "gpu_uuids": list(self.gpu_uuids),
            "gpu_minors": list(self.gpu_minors),
            "mig_devices": [list(device) for device in self.mig_devices],
            "ray": None if self.ray is None else asdict(self.ray),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec :meth:`to_dict` gave; a key this version does not know is ignored (a newer
        central side may send more). ``ValueError`` for an invalid spec."""
        known = {f.name for f in fields(cls)}
        values = {name: value for name, value in data.items() if name in known}
        try:
            if values.get("ray") is not None:
                values["ray"] = RayPart(**values["ray"])
            return cls(**values)
        except TypeError as exc:  # a missing field, or a value of the wrong type
            raise ValueError(f"invalid job spec: {exc}") from None

    @property
    def command(self) -> list[str]:
        """The argv that is executed."""
        if self.shell_command is not None:
            return ["/bin/sh", "-c", self.shell_command]
        return list(self.argv)

    @property
    def container_name(self) -> str:
        """The container's name: ``gpuadmin-job-<job>-<attempt>`` for the agent's job ids."""
        return "gpuadmin-job-" + self.job_id.replace(".", "-")

    def variables(self) -> dict[str, str]:
        """The job's own variables, then those gpuadmin sets, which it cannot override."""
        return {
            **self.env,
            "CUDA_VISIBLE_DEVICES": ",".join(self.gpu_uuids),
            "GPUADMIN_JOB_ID": self.job_id,
        }

    def environment(self, agent_env: Mapping[str, str]) -> dict[str, str]:
        """The job's whole environment on the host, given the agent's (see the module
        docstring)."""
        return {**base_environment(agent_env), **self.variables()}


@dataclass(frozen=True)
class Account:
    """The Unix account a job runs as on this node."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def named(cls, spec: JobSpec, node_name: str) -> Account:
        """The account of ``spec.unix_user`` on this node. ``ValueError`` saying why the job
        cannot run as it: no such account, or root (uid 0) for an owner not allowed it."""
        if spec.unix_user is None:
            raise ValueError("the job names no Unix account to run as")
        try:
            entry = pwd.getpwnam(spec.unix_user)
        except KeyError:
            raise ValueError(f"no Unix account {spec.unix_user!r} on {node_name}") from None
        if entry.pw_uid == 0 and not spec.allow_root:
            raise ValueError(
                f"Unix account {spec.unix_user!r} is root (uid 0) on {node_name}, and its "
                "owner may not run jobs as root"
            )
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)

    @classmethod
    def own(cls) -> Account:
        """The account this process runs as."""
        uid = os.geteuid()
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:  # a uid without a passwd entry (a container's arbitrary user)
            return cls(str(uid), uid, os.getegid(), tuple(os.getgroups()), "/")
        return cls(entry.pw_name, uid, os.getegid(), tuple(os.getgroups()), entry.pw_dir)


# Events are also the wire format of what an agent reports (``scheduling.job_event``): their
# ``to_dict`` names the kind under "event" and gives times as ISO 8601 strings.


@dataclass(frozen=True)
class JobStarted:
    job_id: str
    pid: int
    started_at: datetime
    adopted: bool = False  # re-adopted by reconcile() after an agent restart

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": "started",
            "job_id": self.job_id,
            "pid": self.pid,
            "started_at": self.started_at.isoformat(),
            "adopted": self.adopted,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobStarted:
        return cls(
            job_id=data["job_id"],
            pid=data["pid"],
            started_at=datetime.fromisoformat(data["started_at"]),
            adopted=data.get("adopted", False),
        )


@dataclass(frozen=True)
class JobFinished:
    job_id: str
    state: FinalState
    exit_code: int | None  # negative: killed by that signal; None: never started, or unknown
    finished_at: datetime  # when the executor saw the job's last process gone
    message: str = ""
    # Read from its cgroup (None: not measured): CPU time of all its processes, and the peak
    # of its memory (RSS and page cache, as its limit counts it).
    cpu_seconds: float | None = None
    max_memory_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": "finished",
            "job_id": self.job_id,
            "state": str(self.state),
            "exit_code": self.exit_code,
            "finished_at": self.finished_at.isoformat(),
            "message": self.message,
            "cpu_seconds": self.cpu_seconds,
            "max_memory_bytes": self.max_memory_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobFinished:
        return cls(
            job_id=data["job_id"],
            state=FinalState(data["state"]),
            exit_code=data["exit_code"],
            finished_at=datetime.fromisoformat(data["finished_at"]),
            message=data.get("message", ""),
            cpu_seconds=data.get("cpu_seconds"),
            max_memory_bytes=data.get("max_memory_bytes"),
        )


ExecutorEvent = JobStarted | JobFinished
_EVENTS: dict[str, type[JobStarted] | type[JobFinished]] = {
    "started": JobStarted,
    "finished": JobFinished,
}


def event_from_dict(data: Mapping[str, Any]) -> ExecutorEvent:
    """The event an ``ExecutorEvent.to_dict`` gave."""
    return _EVENTS[data["event"]].from_dict(data)


def base_environment(agent_env: Mapping[str, str]) -> dict[str, str]:
    return {**BASE_ENV_DEFAULTS, **{k: agent_env[k] for k in BASE_ENV_KEYS if k in agent_env}}
