"""Run the jobs placed on this node as subprocesses, and account for them across agent restarts.

The node agent owns one :class:`Executor`. It starts each placed job, reports what happens to
it through ``on_event`` (:class:`JobStarted`, then one :class:`JobFinished`), enforces the
maximum runtime, cancels on request, and keeps the job's log. Retries are the central side's
decision; the executor only reports outcomes accurately. Plain Python (no Django); Linux only,
because process identity and process-group membership are read from ``/proc``.

Design and trade-offs:

- **Isolation.** ``argv`` runs without a shell unless the job gives a ``shell_command`` (run as
  ``/bin/sh -c``). The environment is clean: the few node-describing variables of
  :data:`BASE_ENV_KEYS`, the job's own variables, then ``CUDA_VISIBLE_DEVICES`` (the allocated
  GPU or MIG UUIDs; empty means no GPU) and ``GPUADMIN_JOB_ID``, which the job cannot override;
  an MPS share adds its GPU's MPS variables (:mod:`scheduling.mps`, whose control daemon the
  executor starts before the GPU's first share and stops after its last).
  Each job leads its own session, so its process group is what cancel and timeouts signal
  (SIGTERM, then SIGKILL after ``kill_grace_s``; a preemption's cancel chooses its first signal
  and grace; a kill is SIGKILL at once, even during a cancel's grace). A job ends when its
  main process exits (seen at once: a thread waits for the executor's child and wakes its
  monitor; an adopted job is polled every ``poll_interval_s``);
  what it left behind is then terminated the same way, so its GPUs are free by the time
  :class:`JobFinished` is reported. On a node that confines jobs each runs in a cgroup of its
  own (:mod:`scheduling.isolation`: devices, CPUs, memory, processes), joined at a gate
  before the job's first instruction; "its processes" are then the cgroup's, so those that
  left its group (``setsid``, daemons) end with it too.
- **Containers.** A job that names a ``container_image`` runs through the node's container
  runtime (``docker``, ``podman`` or ``apptainer``; see :func:`container_process`), never on the
  host: without a runtime it fails at once. The tracked process is the runtime's client
  (``docker run`` ...), which leads the job's session as the job itself would, so cancel,
  timeouts and restarts work unchanged: SIGTERM reaches the client, which forwards it to the
  container (``--sig-proxy``, on by default; ``--init`` passes it on to the job's process).
  Apptainer's container processes are the client's children, in its group; a docker or podman
  container is not, and can outlive its client, so there SIGKILL after the grace also runs
  ``<runtime> kill <container>``, and every end of such a job (or its discovery as lost) runs
  ``<runtime> rm -f``. The record keeps the runtime, for the next agent's clean-up.
  GPUs: docker ``--gpus`` and podman's CDI ``--device`` give the container exactly the
  allocated GPUs, which keep their UUIDs inside, so ``CUDA_VISIBLE_DEVICES`` holds the same
  UUIDs as on the host and ``NVIDIA_VISIBLE_DEVICES`` names them too (``void`` for none: CUDA
  images ask for ``all``). ``apptainer --nv`` binds every GPU of the node into a container; the
  job's cgroup (the client's) lets it open only its own, as on the host. Every option is one
  ``--name=value`` word and the image (never one that could read as an option) ends them, so
  nothing of the job's becomes an option of the runtime. Job variables reach a docker or podman
  container by name (``--env=NAME``, the value in the client's environment), so that, as on
  the host, they never show in the node's process list; one the client itself would read (its
  configuration, ``PATH``, ``LD_*``) goes as ``--env=NAME=VALUE`` instead.
  Without bind mounts, the image's file system is all the job sees (apptainer's defaults
  aside: it binds ``$HOME``, ``/tmp`` and the client's directory).
- **Accounts.** Like Slurm, an executor running as root starts each job as its owner's Unix
  account (:attr:`JobSpec.unix_user`, looked up on this node: uid, gid, supplementary groups,
  home): the host process and apptainer's client run as it, docker and podman containers get
  ``--user=uid:gid`` (their client stays the agent's, which talks to the daemon). The job's
  log (and its rotated pieces) and its scratch folder are the account's. A job fails at once
  when the node lacks the account, or when it is root (uid 0) and not ``allow_root``. An
  executor that is not root cannot switch and runs every job as itself.
- **Logs.** The job's stdout and stderr *are* its log file (``O_APPEND``), not a pipe to the
  agent, so a job keeps logging while the agent restarts and no output dies with a pump
  thread. The job's monitor thread enforces the size limit every poll interval, copytruncate
  style (as logrotate does): a log past ``log_max_bytes`` is cut into at most ``log_backups``
  pieces of at most ``log_max_bytes`` (``<log>.1`` newest) and truncated; the job's appending
  writes continue at offset 0. The costs: the live file can overshoot by what the job writes
  in one poll interval (and grows unchecked while no agent runs, until the next one adopts
  the job), and output written in the instant between copy and truncation is lost.
- **Restarts.** Each running job has a small JSON record in ``state_dir``, written atomically
  (temp file and rename; no fsync, since a record only matters while its process lives, and a
  machine crash ends both). A process is identified by boot id, pid and the start time in
  ``/proc/<pid>/stat``, so a reused pid is never adopted or signalled. :meth:`Executor.reconcile`
  re-adopts live jobs (limits, cancel and log rotation resume) and reports vanished ones
  :attr:`FinalState.LOST`. An adopted process is no longer the agent's child, so its exit
  status cannot be read: if it ends by itself it is reported LOST with no exit code (its log is
  intact) and the central side decides between failing and re-queueing it. A cancel that was
  in its grace period when the agent stopped is not remembered either.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from inventory.nvml import smi
from inventory.nvml.parsers.common import format_cpu_list, parse_cpu_list
from inventory.units import memory_text
from scheduling.isolation.cgroups import (
    CgroupError,
    HostCgroups,
    JobCgroup,
    Usage,
    stale_job_directories,
)
from scheduling.isolation.cpus import choose_cpus
from scheduling.isolation.devices import (
    MIG_MINORS,
    PROC_DEVICES,
    DeviceRule,
    MigDevice,
    character_majors,
    job_device_rules,
    mig_capability_minors,
)
from scheduling.mps import MpsDaemons, MpsError

logger = logging.getLogger(__name__)

#: The only variables a job inherits from the agent: where programs are, whose account it runs
#: under, locale, time zone and scratch space. Never the agent's configuration or secrets.
BASE_ENV_KEYS = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR")
#: Used when the agent's own environment lacks them.
BASE_ENV_DEFAULTS = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

#: The container runtimes, in the order ``auto`` looks for them on ``PATH``.
CONTAINER_RUNTIMES = ("docker", "podman", "apptainer")
#: What a runtime's client inherits from the agent besides :data:`BASE_ENV_KEYS` (its
#: configuration: daemon socket, context, storage, cache; the rootless runtime directory; the
#: proxies it pulls through), by name prefix. A job variable so named, or one for the dynamic
#: loader, is never put in the client's environment.
_CLIENT_ENV_PREFIXES = {
    "docker": ("DOCKER_",),
    "podman": ("CONTAINER", "REGISTRY_AUTH_FILE"),
    "apptainer": ("APPTAINER_",),
}
_SHARED_CLIENT_ENV_PREFIXES = ("XDG_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
#: Runtimes whose containers can outlive their client (docker's daemon or podman's conmon keep
#: them): how to SIGKILL one, and how to remove one at once whether or not it still exists.
_CONTAINER_CALLS = {
    "docker": {"kill": ("kill",), "remove": ("rm", "-f")},
    "podman": {"kill": ("kill",), "remove": ("rm", "-f", "--ignore", "--time", "0")},
}
_RUNTIME_CALL_TIMEOUT_S = 60
# Image sources apptainer takes as they are (paths, SIF files, URIs, archives); anything else
# is a registry reference.
_APPTAINER_SOURCE = re.compile(
    r"[./]|.*\.sif\Z|[a-z]+://|(?:docker-archive|docker-daemon|oci|oci-archive):"
)

# Job ids become file names: no separators, no leading dot.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# What a container image and a Unix user name may be on an argv or in a lookup: never an
# option (a leading '-'), nor white space or control characters.
_ARGUMENT = re.compile(r"(?!-)[^\s\x00-\x1f\x7f-\x9f]+")
_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
_TAIL_BLOCK = 64 * 1024


class FinalState(StrEnum):
    COMPLETED = "completed"  # exit code 0
    FAILED = "failed"  # non-zero exit, killed by a signal, or could not start
    CANCELED = "canceled"
    TIMED_OUT = "timed_out"  # ran past max_runtime_s
    LOST = "lost"  # ended while no agent could see how (see the module docstring)


def executor_id(job_id: int, attempt: int) -> str:
    """gpuadmin's executor job id for one attempt of a job, so a retry never reads or signals
    an old run."""
    return f"{job_id}.{attempt}"


def parse_executor_id(value: str) -> tuple[int, int]:
    """(job, attempt) of an :func:`executor_id`."""
    job_id, attempt = value.split(".")
    return int(job_id), int(attempt)


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
    # What its cgroup gives it (see scheduling.isolation): its GPUs' device minor numbers, its
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
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec :meth:`to_dict` gave; a key this version does not know is ignored (a newer
        central side may send more). ``ValueError`` for an invalid spec."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{name: value for name, value in data.items() if name in known})
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
        return {**_base_environment(agent_env), **self.variables()}


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


@dataclass(frozen=True)
class ContainerLimits:
    """What a docker or podman container gets of its job's confinement (apptainer's container
    is the client's own processes, in the job's cgroup)."""

    cpus: tuple[int, ...] = ()
    memory_mib: int = 0
    pids_max: int = 0
    cgroup_parent: str | None = None  # the job's cgroup, relative to the hierarchy's root

    def options(self) -> list[str]:
        options = []
        if self.cpus:
            options.append(f"--cpuset-cpus={format_cpu_list(self.cpus)}")
        if self.memory_mib:
            options.append(f"--memory={self.memory_mib}m")
        if self.pids_max:
            options.append(f"--pids-limit={self.pids_max}")
        if self.cgroup_parent:
            options.append(f"--cgroup-parent={self.cgroup_parent}")
        return options


def container_process(
    runtime: str,
    spec: JobSpec,
    agent_env: Mapping[str, str],
    *,
    gpu_devices: bool = True,
    account: Account | None = None,
    limits: ContainerLimits | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the ``runtime`` client that runs ``spec`` in its image as
    ``account`` (default: this process's; see the module docstring and the README's command
    lines). ``gpu_devices=False`` gives the container no GPU devices (simulated GPUs have
    none), while ``CUDA_VISIBLE_DEVICES`` still names the allocated GPUs. ``limits`` are the
    job's CPUs, memory and processes, and the cgroup the container's goes under.

    Nothing the job's owner chose can become an option of the runtime: every option is one
    ``--name=value`` argument of gpuadmin's making before the image (which :class:`JobSpec`
    refuses when it could read as an option); the job's command only follows the image."""
    if not spec.container_image:
        raise ValueError(f"job {spec.job_id} has no container image")
    devices = ",".join(spec.gpu_uuids) if gpu_devices else ""
    variables = {**spec.variables(), "NVIDIA_VISIBLE_DEVICES": devices or "void"}
    env = _client_environment(runtime, agent_env)
    workdir = spec.container_workdir
    if runtime == "apptainer":  # it runs as the account that starts it (the executor's doing)
        image = spec.container_image
        if not _APPTAINER_SOURCE.match(image):
            image = f"docker://{image}"
        env.update({f"APPTAINERENV_{name}": value for name, value in variables.items()})
        argv = ["apptainer", "exec", *(["--nv"] if devices else []), "--cleanenv"]
        return [*argv, *([f"--pwd={workdir}"] if workdir else []), image, *spec.command], env
    account = account or Account.own()
    argv = [runtime, "run", "--rm", "--init", f"--name={spec.container_name}"]
    argv.append(f"--user={account.uid}:{account.gid}")
    argv += (limits or ContainerLimits()).options()
    if devices and runtime == "docker":
        # Quoted: --gpus is read as CSV, where a bare comma would start its next option.
        argv.append(f'--gpus="device={devices}"')
    elif devices:
        argv += [f"--device=nvidia.com/gpu={uuid}" for uuid in spec.gpu_uuids]  # CDI: by UUID
    client_reads = (*_client_env_prefixes(runtime), "LD_")
    for name, value in variables.items():
        if name in BASE_ENV_KEYS or name.upper().startswith(client_reads):
            argv.append(f"--env={name}={value}")  # in the client's environment, it would obey
        else:
            argv.append(f"--env={name}")
            env[name] = value
    workdir_option = [f"--workdir={workdir}"] if workdir else []
    return [*argv, *workdir_option, spec.container_image, *spec.command], env


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


#: ``hook(spec, pid)``; a re-adopted job's spec has no ``env`` (records do not keep it).
ProcessHook = Callable[[JobSpec, int], None]


class _LaunchError(Exception):
    pass


@dataclass(eq=False)
class _Job:
    spec: JobSpec
    pid: int  # also the process group id
    start_ticks: int  # from /proc/<pid>/stat: tells this process from a later one with its pid
    boot_id: str
    started_at: datetime
    deadline: float | None  # time.monotonic(), which counts from boot, so it survives restarts
    log_path: Path
    proc: subprocess.Popen[bytes] | None  # None when adopted: not our child
    runtime: str | None = None  # the container runtime it runs in; None: on the host
    cgroup: JobCgroup | None = None  # None: a node that confines no job
    cpus: tuple[int, ...] = ()  # the CPUs it is bound to
    gate: int | None = None  # the pipe its process waits on to exec the job (_open_gate)
    cancel_requested: bool = False
    cancel_message: str = "canceled"  # its JobFinished's message when canceled
    # What a cancel sends first, and how long it waits before SIGKILL (None: the executor's).
    stop_signal: signal.Signals = signal.SIGTERM
    stop_grace_s: float | None = None
    kill_requested: bool = False  # a kill (SIGKILL first): no grace, even a cancel's under way
    wake: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def alive(self) -> bool:
        """Whether a process of the job still runs: of its cgroup (wherever it went), else of
        its process group."""
        if self.cgroup is not None:
            return not self.cgroup.empty()
        return _group_alive(self.pid)

    def signal(self, sig: signal.Signals) -> None:
        """Signal every process of the job; SIGKILL through its cgroup's kill."""
        _signal_group(self.pid, sig)
        if self.cgroup is not None:
            self.cgroup.kill() if sig == signal.SIGKILL else self.cgroup.signal(sig)

    def poll(self) -> tuple[bool, int | None]:
        """Whether the main process has ended, and its exit code where that can be known."""
        if self.proc is not None:
            code = self.proc.poll()
            return code is not None, code
        return _live_start_ticks(self.pid) != self.start_ticks, None

    def to_record(self) -> dict[str, Any]:
        # env may hold secrets, and nothing needs it once the process runs.
        spec = {name: value for name, value in self.spec.to_dict().items() if name != "env"}
        return {
            "spec": spec,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "boot_id": self.boot_id,
            "started_at": self.started_at.isoformat(),
            "deadline_monotonic": self.deadline,
            "log_path": str(self.log_path),
            "runtime": self.runtime,
            "cgroup": None if self.cgroup is None else self.cgroup.to_record(),
            "cpus": list(self.cpus),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> _Job:
        return cls(
            spec=JobSpec.from_dict(record["spec"]),
            pid=record["pid"],
            start_ticks=record["start_ticks"],
            boot_id=record["boot_id"],
            started_at=datetime.fromisoformat(record["started_at"]),
            deadline=record["deadline_monotonic"],
            log_path=Path(record["log_path"]),
            proc=None,
            runtime=record.get("runtime"),  # absent from the records of older agents
            cgroup=JobCgroup.from_record(record["cgroup"]) if record.get("cgroup") else None,
            cpus=tuple(record.get("cpus", ())),
        )


class Executor:
    """Runs this node's jobs; thread-safe. Callbacks run on the executor's threads.

    Call :meth:`reconcile` once at start-up, before the first :meth:`launch`.
    ``container_runtime`` runs the jobs that give an image: one of :data:`CONTAINER_RUNTIMES`,
    ``auto`` (the first of them on ``PATH``) or ``none``; ``container_gpus=False`` gives their
    containers no GPU devices (see :func:`container_process`). ``node_name`` names this node in
    the errors of a job that cannot start. ``jobs_as_owner`` starts each job as its spec's
    ``unix_user`` (its uid, gid and groups; ``None``: when this process runs as root, the only
    one that can); otherwise jobs run as this process. A job without a ``cwd`` starts in a
    folder of its own under ``scratch_dir``, owned by its account. ``mps`` runs the MPS
    control daemons of the GPUs whose shares jobs get (``JobSpec.mps_percent``); without it
    such a job fails to start. ``cgroups`` (see :mod:`scheduling.isolation`) confines each
    job in a cgroup of its own under ``<root>/<node_name>``, with ``pids_max`` processes at
    most and the device allow-list plus ``extra_devices``; a job is refused on a node that
    confines nothing when ``require_confinement`` and its spec does not allow it.
    ``sim_tools_dir`` (a simulated node's: its ``nvidia-smi``, ``inventory.nvml.smi``) goes
    first on the ``PATH`` of the jobs run on the host; a job whose devices its cgroup confines
    is told its own (``smi.VISIBLE_ENV``), as NVML shows a confined job only those.
    ``container_cgroup_parent`` puts a docker or podman container's cgroup under its job's.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        state_dir: str | os.PathLike[str],
        on_event: Callable[[ExecutorEvent], None],
        *,
        kill_grace_s: float = 10.0,
        log_max_bytes: int = 16 * 1024 * 1024,
        log_backups: int = 3,
        poll_interval_s: float = 0.5,
        on_process_started: ProcessHook | None = None,
        on_process_ended: ProcessHook | None = None,
        container_runtime: str = "none",
        container_gpus: bool = True,
        node_name: str | None = None,
        jobs_as_owner: bool | None = None,
        scratch_dir: str | os.PathLike[str] | None = None,
        mps: MpsDaemons | None = None,
        cgroups: HostCgroups | None = None,
        require_confinement: bool = False,
        pids_max: int = 0,
        extra_devices: Sequence[DeviceRule] = (),
        container_cgroup_parent: bool = False,
        sim_tools_dir: Path | None = None,
        proc_devices: Path = PROC_DEVICES,
        mig_minors: Path = MIG_MINORS,
    ) -> None:
        if log_max_bytes <= 0 or log_backups < 0:
            raise ValueError("log_max_bytes must be positive and log_backups not negative")
        if container_runtime == "auto":
            found = (name for name in CONTAINER_RUNTIMES if shutil.which(name))
            container_runtime = next(found, "none")
        elif container_runtime not in (*CONTAINER_RUNTIMES, "none"):
            raise ValueError(f"unknown container runtime {container_runtime!r}")
        #: The runtime that runs jobs with a container image (``none``: they fail).
        self.container_runtime = container_runtime
        self._container_gpus = container_gpus
        self._node_name = node_name or socket.gethostname()
        #: Whether jobs run as their owners' accounts (otherwise as this process).
        self.jobs_as_owner = os.geteuid() == 0 if jobs_as_owner is None else jobs_as_owner
        self._scratch_dir = None if scratch_dir is None else Path(scratch_dir)
        self._mps = mps
        #: What confines this node's jobs (None: nothing).
        self.cgroups = cgroups
        self._require_confinement = require_confinement
        self._pids_max = pids_max
        self._extra_devices = tuple(extra_devices)
        self._container_cgroup_parent = container_cgroup_parent
        self._sim_tools_dir = sim_tools_dir
        self._proc_devices = proc_devices
        self._mig_minors = mig_minors
        self._log_dir = Path(log_dir)
        self._state_dir = Path(state_dir)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._on_event = on_event
        self._kill_grace_s = kill_grace_s
        self._log_max_bytes = log_max_bytes
        self._log_backups = log_backups
        self._poll_interval_s = poll_interval_s
        self._on_process_started = on_process_started
        self._on_process_ended = on_process_ended
        self._boot_id = _BOOT_ID_FILE.read_text().strip()
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._closed = False
        self._detached = False

    def log_path(self, job_id: str) -> Path:
        return self._log_dir / f"{job_id}.log"

    def launch(self, spec: JobSpec) -> None:
        """Start a job. JobStarted follows through ``on_event``, or, if it cannot start (no such
        working directory or executable), JobFinished FAILED with the error, also logged."""
        log_path = self.log_path(spec.job_id)
        with self._lock:
            if self._closed:
                raise RuntimeError("the executor is shut down")
            if spec.job_id in self._jobs:
                raise ValueError(f"job {spec.job_id} is already running")
            try:
                job = self._spawn(spec, log_path)
            except _LaunchError as exc:
                error = str(exc)
            else:
                self._write_record(job)
                self._monitor_in_thread(job, announce=True)
                return
        with log_path.open("a") as log:
            log.write(f"gpuadmin: {error}\n")
        self._emit(JobFinished(spec.job_id, FinalState.FAILED, None, _now(), error))

    def cancel(
        self,
        job_id: str,
        *,
        stop_signal: signal.Signals = signal.SIGTERM,
        grace_s: float | None = None,
    ) -> bool:
        """Stop a job: ``stop_signal`` (SIGTERM; a preemption may choose another, e.g. SIGUSR1
        for a checkpoint) to its process group, SIGKILL after ``grace_s`` (default: the
        executor's ``kill_grace_s``). False if it does not run here. Its JobFinished
        (CANCELED, unless it ended first) follows. The first request's signal and grace
        stand, except that a kill (``stop_signal`` SIGKILL: ``gpuadmin jobs kill``) cuts short
        the grace of a cancel under way."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            return False
        if not job.cancel_requested:
            job.stop_signal, job.stop_grace_s = stop_signal, grace_s
            job.cancel_requested = True
        if stop_signal is signal.SIGKILL:
            job.kill_requested = True
        job.wake.set()
        return True

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)

    def tail(self, job_id: str, lines: int = 100) -> str:
        """The last ``lines`` lines of a job's log, reaching into the rotated files if needed."""
        log = self.log_path(job_id)
        paths = [log, *(_backup_path(log, n) for n in range(1, self._log_backups + 1))]
        chunks: list[bytes] = []
        newlines = 0
        for path in paths:
            if newlines > lines:
                break
            try:
                file = path.open("rb")
            except FileNotFoundError:
                continue
            with file:
                end = file.seek(0, os.SEEK_END)
                while end > 0 and newlines <= lines:
                    start = max(0, end - _TAIL_BLOCK)
                    file.seek(start)
                    chunks.append(file.read(end - start))
                    newlines += chunks[-1].count(b"\n")
                    end = start
        data = b"".join(reversed(chunks))
        return _last_lines(data, lines).decode(errors="replace")

    def reconcile(self) -> list[ExecutorEvent]:
        """Account for the jobs that a previous agent left running: re-adopt those whose process
        still runs (JobStarted with ``adopted=True``), report the others LOST. The events go to
        ``on_event`` and are returned too."""
        events: list[ExecutorEvent] = []
        lost: list[JobSpec] = []
        for path in sorted(self._state_dir.glob("*.json")):
            with self._lock:
                if path.stem in self._jobs:
                    continue
            try:
                job = _Job.from_record(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                path.unlink(missing_ok=True)
                events.append(self._lost(path.stem, f"unreadable state record: {exc}"))
                continue
            if job.boot_id == self._boot_id and _live_start_ticks(job.pid) == job.start_ticks:
                events.append(JobStarted(job.spec.job_id, job.pid, job.started_at, adopted=True))
                self._emit(events[-1])
                with self._lock:
                    self._monitor_in_thread(job, announce=False)
            else:
                _container_call(job, "remove")
                if job.cgroup is not None:  # what it left behind (a setsid child) ends too
                    _end_cgroup(job.cgroup)
                self._call(self._on_process_ended, job.spec, job.pid)
                path.unlink()
                message = f"its process {job.pid} ended while no agent was watching it"
                events.append(self._lost(job.spec.job_id, message))
                lost.append(job.spec)
        with self._lock:  # once every live job is adopted: their GPUs' daemons stay
            for spec in lost:
                self._release_mps(spec)
            running = set(self._jobs)
        if self.cgroups is not None and self.cgroups.confined:
            for cgroup in stale_job_directories(self.cgroups, self._node_name, keep=running):
                _end_cgroup(cgroup)  # of a job no record names: its agent died launching it
        return events

    def shutdown(self, *, kill: bool, message: str = "canceled") -> None:
        """Stop the executor. ``kill``: cancel every job and wait for their JobFinished
        (CANCELED with ``message``, unless a job ended first). Otherwise leave them running,
        recorded for the next agent's :meth:`reconcile`."""
        with self._lock:
            self._closed = True
            jobs = list(self._jobs.values())
        if not kill:
            self._detached = True
        for job in jobs:
            if kill and not job.cancel_requested:  # one canceled before keeps its cancel
                job.cancel_requested, job.cancel_message = True, message
            job.wake.set()
        for job in jobs:
            assert job.thread is not None
            job.thread.join()
        with self._lock:
            self._jobs.clear()

    def _process(
        self, spec: JobSpec, account: Account | None, limits: ContainerLimits
    ) -> tuple[list[str], dict[str, str]]:
        """The argv and environment that run a job: its own, or its container runtime's."""
        if not spec.container_image:
            return spec.command, _as_account(spec.environment(os.environ), account)
        runtime = self.container_runtime
        if runtime != "none":
            argv, env = container_process(
                runtime,
                spec,
                os.environ,
                gpu_devices=self._container_gpus,
                account=account,
                limits=limits,
            )
            if runtime == "apptainer":
                env = _as_account(env, account)
            if shutil.which(argv[0], path=env["PATH"]):
                return argv, env
        why = "" if runtime == "none" else f" ({runtime} is not on PATH)"
        raise _LaunchError(
            f"no container runtime on {self._node_name}{why}: set GPUADMIN_CONTAINER_RUNTIME"
        )

    def _account(self, spec: JobSpec) -> Account | None:
        """The account the job runs as; ``None``: as this process."""
        if not self.jobs_as_owner:
            return None
        try:
            return Account.named(spec, self._node_name)
        except ValueError as exc:
            raise _LaunchError(str(exc)) from None

    def _spawn(self, spec: JobSpec, log_path: Path) -> _Job:
        if spec.cwd is not None and not os.path.isdir(spec.cwd):
            raise _LaunchError(f"working directory {spec.cwd!r} does not exist")
        if spec.cwd is None and self._scratch_dir is None:
            raise _LaunchError("no working directory given")
        account = self._account(spec)
        if spec.cwd is None:
            assert self._scratch_dir is not None
            spec = replace(spec, cwd=str(_scratch(self._scratch_dir / spec.job_id, account)))
        cpus = self._choose_cpus(spec)
        cgroup = self._cgroup(spec, cpus)
        try:
            if spec.mps_percent is not None:
                spec = replace(spec, env={**spec.env, **self._mps_client(spec)})
            try:
                argv, env = self._process(spec, account, self._container_limits(spec, cgroup, cpus))
                if not spec.container_image:  # its client is found like this one's
                    env = self._with_sim_tools(spec, env, self._confines_devices(cgroup))
                    _check_executable(argv[0], spec.cwd, env)
                return self._popen(spec, log_path, argv, env, account, cgroup, cpus)
            except _LaunchError:
                self._release_mps(spec)
                raise
        except _LaunchError:
            if cgroup is not None:
                cgroup.remove()
            raise

    def _confines_devices(self, cgroup: JobCgroup | None) -> bool:
        """Whether the job's cgroup (None: it has none) allows only its own devices."""
        return (
            cgroup is not None and self.cgroups is not None and ("devices" in self.cgroups.backends)
        )

    def _with_sim_tools(self, spec: JobSpec, env: dict[str, str], confined: bool) -> dict[str, str]:
        """A host job's environment with the simulated node's tools (``sim_tools_dir``) first
        on its ``PATH`` and, when ``confined``, its devices named for them."""
        if self._sim_tools_dir is None:
            return env
        env = {**env, "PATH": os.pathsep.join([str(self._sim_tools_dir), env["PATH"]])}
        if confined:
            env[smi.VISIBLE_ENV] = ",".join(spec.gpu_uuids)
        return env

    def _choose_cpus(self, spec: JobSpec) -> tuple[int, ...]:
        """The job's CPUs: near its GPUs, exclusive while this node has free ones."""
        taken: Counter[int] = Counter()
        for job in self._jobs.values():
            if job.spec.cpus:  # a job that asked for none shares those near its GPUs
                taken.update(job.cpus)
        near = parse_cpu_list(spec.cpu_affinity) or ()
        return choose_cpus(spec.cpus, near, os.sched_getaffinity(0), taken)

    def _cgroup(self, spec: JobSpec, cpus: tuple[int, ...]) -> JobCgroup | None:
        """The job's cgroup, created with its limits; None on a node that confines nothing
        (where a job is refused unless it may run unconfined)."""
        if self.cgroups is None or not self.cgroups.confined:
            if self._require_confinement and not spec.allow_unconfined:
                why = self.cgroups.reason() if self.cgroups is not None else "no cgroups"
                raise _LaunchError(
                    f"{self._node_name} confines no job ({why}): an admin must allow "
                    "unconfined jobs on it"
                )
            return None
        try:
            devices = self._device_rules(spec)
            return JobCgroup.create(
                self.cgroups,
                self._node_name,
                spec.job_id,
                devices=devices,
                cpus=cpus,
                memory_mib=spec.memory_mib,
                pids_max=self._pids_max,
            )
        except (CgroupError, ValueError) as exc:
            raise _LaunchError(str(exc)) from None

    def _device_rules(self, spec: JobSpec) -> list[DeviceRule] | None:
        """The job's device allow-list; None where this node does not confine devices."""
        if self.cgroups is None or "devices" not in self.cgroups.backends:
            return None
        if len(spec.gpu_minors) + len(spec.mig_devices) < len(spec.gpu_uuids):
            raise ValueError("its GPUs' device minor numbers are unknown: it cannot be confined")
        mig_devices = [MigDevice(*device) for device in spec.mig_devices]
        return job_device_rules(
            spec.gpu_minors,
            mig_devices,
            majors=character_majors(_read_text(self._proc_devices)),
            mig_minors=mig_capability_minors(_read_text(self._mig_minors)) if mig_devices else {},
            extra=self._extra_devices,
        )

    def _container_limits(
        self, spec: JobSpec, cgroup: JobCgroup | None, cpus: tuple[int, ...]
    ) -> ContainerLimits:
        """A docker or podman container's share of the job's confinement."""
        parent = None
        if self._container_cgroup_parent and cgroup is not None and self.cgroups is not None:
            parent = f"/{self.cgroups.root}/{self._node_name}/{spec.job_id}"
        return ContainerLimits(
            cpus=cpus if spec.cpus else (),
            memory_mib=spec.memory_mib,
            pids_max=self._pids_max if cgroup is not None else 0,
            cgroup_parent=parent,
        )

    def _mps_client(self, spec: JobSpec) -> dict[str, str]:
        """Start the MPS control daemon of the job's GPU unless it runs; the job's MPS
        variables (pipe and log directory, thread percentage, memory limit)."""
        if self._mps is None:
            raise _LaunchError(f"{self._node_name} runs no MPS: the job's share cannot start")
        [gpu_uuid] = spec.gpu_uuids
        assert spec.mps_percent is not None
        try:
            self._mps.ensure(gpu_uuid, _base_environment(os.environ))
        except MpsError as exc:
            raise _LaunchError(str(exc)) from None
        return self._mps.client_variables(gpu_uuid, spec.mps_percent, spec.mps_memory_mib)

    def _release_mps(self, spec: JobSpec) -> None:
        """After an MPS job ended (the caller holds the lock): stop its GPU's control daemon
        when no other running job has a share of that GPU."""
        if self._mps is None or spec.mps_percent is None:
            return
        [gpu_uuid] = spec.gpu_uuids
        sharing = (
            other
            for other in self._jobs.values()
            if other.spec.mps_percent is not None and gpu_uuid in other.spec.gpu_uuids
        )
        if next(sharing, None) is None:
            self._mps.stop(gpu_uuid, _base_environment(os.environ))

    def _popen(
        self,
        spec: JobSpec,
        log_path: Path,
        argv: list[str],
        env: dict[str, str],
        account: Account | None,
        cgroup: JobCgroup | None,
        cpus: tuple[int, ...],
    ) -> _Job:
        """Start the job behind a gate (:data:`_GATE`): its process waits, as its account,
        until its monitor has put it in its cgroup and bound its CPUs (``_open_gate``), then
        execs the job."""
        # Host jobs and apptainer's client run as the account; a docker or podman client stays
        # the agent's (it talks to the daemon) and gives the container the account (--user).
        as_account: dict[str, Any] = {}
        if account is not None and (
            not spec.container_image or self.container_runtime == "apptainer"
        ):
            as_account = {
                "user": account.uid,
                "group": account.gid,
                "extra_groups": list(account.groups),
            }
        gate_read, gate_write = os.pipe()
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        try:
            if account is not None:  # the job's log is its owner's
                os.fchown(log_fd, account.uid, account.gid)
            proc = subprocess.Popen(
                ["/bin/sh", "-c", _GATE, "gpuadmin-job", *argv],
                cwd=spec.cwd,
                env=env,
                stdin=gate_read,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,
                **as_account,
            )
        except (OSError, ValueError) as exc:
            os.close(gate_write)
            raise _LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
        finally:
            os.close(log_fd)
            os.close(gate_read)
        stat = _read_stat(proc.pid)  # our unreaped child: present even if it already exited
        assert stat is not None
        return _Job(
            spec=spec,
            pid=proc.pid,
            start_ticks=stat[2],
            boot_id=self._boot_id,
            started_at=_now(),
            deadline=None if spec.max_runtime_s is None else time.monotonic() + spec.max_runtime_s,
            log_path=log_path,
            proc=proc,
            runtime=self.container_runtime if spec.container_image else None,
            cgroup=cgroup,
            cpus=cpus,
            gate=gate_write,
        )

    def _monitor_in_thread(self, job: _Job, *, announce: bool) -> None:
        """Register the job and start its monitor thread; the caller holds the lock."""
        self._jobs[job.spec.job_id] = job
        job.thread = threading.Thread(
            target=self._monitor, args=(job, announce), name=f"job-{job.spec.job_id}", daemon=True
        )
        job.thread.start()
        if job.proc is not None:  # our child: its end wakes the monitor at once
            threading.Thread(
                target=_wake_on_exit,
                args=(job.proc, job.wake),
                name=f"job-{job.spec.job_id}-exit",
                daemon=True,
            ).start()

    def _monitor(self, job: _Job, announce: bool) -> None:
        """Follow one job until its last process is gone (or the executor detaches)."""
        if job.gate is not None and not self._open_gate(job):
            return
        if announce:
            self._call(self._on_process_started, job.spec, job.pid)
            self._emit(JobStarted(job.spec.job_id, job.pid, job.started_at))
        ended, exit_code = False, None
        stop_reason: FinalState | None = None
        kill_at: float | None = None
        killed = False
        while True:
            if self._detached:
                return  # the process runs on; its record stays for the next agent
            _rotate_log(job.log_path, self._log_max_bytes, self._log_backups)
            if not ended:
                ended, exit_code = job.poll()
            if ended and not job.alive():
                break
            now = time.monotonic()
            if stop_reason is None and _over_memory(job):  # the kernel killed one of them
                stop_reason, kill_at = FinalState.FAILED, now
            if kill_at is None:
                if not ended and job.cancel_requested:
                    stop_reason = FinalState.CANCELED
                elif not ended and job.deadline is not None and now >= job.deadline:
                    stop_reason = FinalState.TIMED_OUT
                # After the main process ends, this terminates what it left behind.
                if ended or stop_reason is not None:
                    canceled = stop_reason is FinalState.CANCELED
                    job.signal(job.stop_signal if canceled else signal.SIGTERM)
                    grace = job.stop_grace_s if canceled else None
                    kill_at = now + (self._kill_grace_s if grace is None else grace)
            if job.kill_requested and kill_at is not None:
                kill_at = min(kill_at, now)
            if kill_at is not None and now >= kill_at:
                if not killed:  # once: it can take the runtime a while
                    _container_call(job, "kill")
                    killed = True
                job.signal(signal.SIGKILL)
            job.wake.wait(self._poll_interval_s)
            job.wake.clear()
        if _over_memory(job):
            stop_reason = FinalState.FAILED
        _rotate_log(job.log_path, self._log_max_bytes, self._log_backups)
        _container_call(job, "remove")
        self._call(self._on_process_ended, job.spec, job.pid)
        state, message = _final_state(job.spec, stop_reason, exit_code)
        if state is FinalState.CANCELED:
            message = job.cancel_message
        self._end(job, JobFinished(job.spec.job_id, state, exit_code, _now(), message))

    def _end(self, job: _Job, finished: JobFinished) -> None:
        """After the job's last process: its usage read, its record and MPS share released,
        its end reported, then its cgroup removed (a restarted agent removes one left
        behind: ``reconcile``)."""
        usage = Usage() if job.cgroup is None else job.cgroup.usage()
        with self._lock:
            self._record_path(job.spec.job_id).unlink(missing_ok=True)
            del self._jobs[job.spec.job_id]
            self._release_mps(job.spec)
        self._emit(
            replace(
                finished, cpu_seconds=usage.cpu_seconds, max_memory_bytes=usage.max_memory_bytes
            )
        )
        if job.cgroup is not None:
            try:
                job.cgroup.remove()
            except OSError as exc:
                logger.warning("job %s: cannot remove its cgroup: %s", job.spec.job_id, exc)

    def _open_gate(self, job: _Job) -> bool:
        """Confine the job's process waiting at its gate, then let it exec the job; on a
        failure kill it (nothing of the job ran) and report the job failed. Done by the job's
        own thread: moving a process between cgroups waits for an RCU grace period (ms), and
        the jobs placed together share theirs instead of queueing behind each other."""
        assert job.gate is not None and job.proc is not None
        try:
            _confine(job.pid, job.cgroup, job.cpus)
            os.write(job.gate, b"\n")
            return True
        except OSError as exc:
            job.proc.kill()
            job.proc.wait()
            error = f"cannot confine it: {exc}"
            with job.log_path.open("a") as log:
                log.write(f"gpuadmin: {error}\n")
            self._end(job, JobFinished(job.spec.job_id, FinalState.FAILED, None, _now(), error))
            return False
        finally:
            os.close(job.gate)  # without the line (EOF) the gate exits, running nothing
            job.gate = None

    def _record_path(self, job_id: str) -> Path:
        return self._state_dir / f"{job_id}.json"

    def _write_record(self, job: _Job) -> None:
        path = self._record_path(job.spec.job_id)
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_text(json.dumps(job.to_record()))
        os.replace(temp, path)

    def _lost(self, job_id: str, message: str) -> JobFinished:
        event = JobFinished(job_id, FinalState.LOST, None, _now(), message)
        self._emit(event)
        return event

    def _emit(self, event: ExecutorEvent) -> None:
        self._call(self._on_event, event)

    @staticmethod
    def _call(callback: Callable[..., None] | None, *args: Any) -> None:
        """Run a callback. One that fails is logged: it must not stop a job's supervision."""
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            logger.exception("executor callback %r failed", callback)


def _now() -> datetime:
    return datetime.now(UTC)


def _wake_on_exit(proc: subprocess.Popen[bytes], wake: threading.Event) -> None:
    """Wait for the executor's child to exit (reaping it) and wake its monitor, which would
    otherwise see the end only at its next poll: a job that ends at once has its GPUs back
    within milliseconds, not a poll interval later."""
    proc.wait()
    wake.set()


def _base_environment(agent_env: Mapping[str, str]) -> dict[str, str]:
    return {**BASE_ENV_DEFAULTS, **{k: agent_env[k] for k in BASE_ENV_KEYS if k in agent_env}}


def _as_account(env: dict[str, str], account: Account | None) -> dict[str, str]:
    """``env`` with the account's identity (home and name) for a process that runs as it."""
    if account is None:
        return env
    return {**env, "HOME": account.home, "USER": account.name, "LOGNAME": account.name}


def _scratch(path: Path, account: Account | None) -> Path:
    """A job's scratch folder, created for (and owned by) its account."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if account is not None:
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
    return path


def _client_env_prefixes(runtime: str) -> tuple[str, ...]:
    return (*_CLIENT_ENV_PREFIXES[runtime], *_SHARED_CLIENT_ENV_PREFIXES)


def _client_environment(runtime: str, agent_env: Mapping[str, str]) -> dict[str, str]:
    """What a container runtime's client inherits from the agent: the base variables and the
    runtime's own configuration, never the rest (the agent's settings and secrets)."""
    prefixes = _client_env_prefixes(runtime)
    own = {name: value for name, value in agent_env.items() if name.upper().startswith(prefixes)}
    return {**_base_environment(agent_env), **own}


def _container_call(job: _Job, action: str) -> None:
    """``<runtime> kill|rm -f <container>`` for a job whose container can outlive its client;
    a failure is logged, not raised: the job's supervision must go on."""
    if job.runtime not in _CONTAINER_CALLS:
        return
    command = [job.runtime, *_CONTAINER_CALLS[job.runtime][action], job.spec.container_name]
    try:
        result = subprocess.run(
            command,
            env=_client_environment(job.runtime, os.environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_RUNTIME_CALL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        error = str(exc)
    else:
        if result.returncode == 0:
            return
        error = result.stderr.decode(errors="replace").strip() or f"exit {result.returncode}"
    logger.warning("job %s: %s failed: %s", job.spec.job_id, shlex.join(command), error)


def _final_state(
    spec: JobSpec, stop_reason: FinalState | None, exit_code: int | None
) -> tuple[FinalState, str]:
    if stop_reason is FinalState.FAILED:  # the only reason to stop one that fails: memory
        return stop_reason, (
            f"stopped: it used more than its {memory_text(spec.memory_mib)} of host memory"
        )
    if stop_reason is FinalState.CANCELED:
        return stop_reason, "canceled"
    if stop_reason is FinalState.TIMED_OUT:
        return stop_reason, f"ran past its maximum runtime of {spec.max_runtime_s:g} s"
    if exit_code is None:
        return FinalState.LOST, "ended after an agent restart: exit status unknown"
    if exit_code == 0:
        return FinalState.COMPLETED, ""
    if exit_code < 0:
        return FinalState.FAILED, f"killed by signal {-exit_code} ({signal.strsignal(-exit_code)})"
    return FinalState.FAILED, f"exited with code {exit_code}"


#: What a job's process runs until the executor has confined it (``$@``: the job's argv):
#: it waits for a line on its standard input (a pipe from the executor), then execs the job
#: as execvp would, its standard input /dev/null (and without the ``PWD`` the shell sets). The
#: executor's end of the pipe closing without a line (the agent died) ends it, having run
#: nothing of the job.
_GATE = 'read -r go || exit 125; exec </dev/null; unset PWD; exec "$@"'


def _confine(pid: int, cgroup: JobCgroup | None, cpus: tuple[int, ...]) -> None:
    """Put a job's process (at its gate) in its cgroup and bind it to its CPUs (also where
    no cpuset controller holds them: the scheduler's affinity, as Slurm's task/affinity)."""
    for procs in cgroup.procs_files() if cgroup is not None else ():
        procs.write_text(str(pid))
    if cpus:
        os.sched_setaffinity(pid, cpus)


def _end_cgroup(cgroup: JobCgroup) -> None:
    """Kill whatever still runs in a job's cgroup and remove it."""
    try:
        cgroup.destroy()
    except OSError as exc:
        logger.warning("cannot remove the job cgroup %s: %s", cgroup.procs_files()[0].parent, exc)


def _over_memory(job: _Job) -> bool:
    """Whether the kernel killed a process of the job for its memory limit."""
    return job.cgroup is not None and job.spec.memory_mib > 0 and job.cgroup.oom_kills() > 0


def _check_executable(program: str, cwd: str | None, env: Mapping[str, str]) -> None:
    """``_LaunchError`` when exec would find no file to run for ``program`` (on the job's
    ``PATH`` from its working directory, as execvp searches), so that such a job fails before
    its start is reported; the gate's exec reports the rest (an account that may not run it:
    exit status 126)."""
    if "/" in program:
        candidates = [os.path.join(cwd or ".", program)]
    else:
        path = env.get("PATH", os.defpath).split(os.pathsep)
        candidates = [os.path.join(cwd or ".", folder, program) for folder in path]
    found = [candidate for candidate in candidates if os.path.isfile(candidate)]
    if any(os.access(candidate, os.X_OK) for candidate in found):
        return
    if found:
        error: OSError = PermissionError(errno.EACCES, os.strerror(errno.EACCES), found[0])
    else:
        error = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    raise _LaunchError(f"cannot start {program!r}: {error}")


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks since boot) of a process, if it exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            raw = file.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and ")": the other fields follow its last ")".
    rest = raw[raw.rindex(b")") + 2 :].split()
    return rest[0].decode(), int(rest[2]), int(rest[19])


def _live_start_ticks(pid: int) -> int | None:
    """A running process's start time; None if it is gone or a zombie."""
    stat = _read_stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else stat[2]


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies hold nothing and are ignored)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for name in os.listdir("/proc"):
        stat = _read_stat(int(name)) if name.isdecimal() else None
        if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _backup_path(log: Path, n: int) -> Path:
    return log.with_name(f"{log.name}.{n}")


def _rotate_log(log: Path, max_bytes: int, backups: int) -> None:
    """Copytruncate a log past ``max_bytes``: its newest bytes become ``.1`` (then ``.2`` ...),
    at most ``max_bytes`` each and ``backups`` files in all; older backups shift up or go.
    Backups belong to the log's owner (the job's) and have its mode."""
    try:
        stat = log.stat()
    except FileNotFoundError:
        return
    size = stat.st_size
    if size <= max_bytes:
        return
    pieces = min(backups, -(-size // max_bytes))
    for n in range(backups, 0, -1):
        backup = _backup_path(log, n)
        if n + pieces > backups:
            backup.unlink(missing_ok=True)
        elif backup.exists():
            os.replace(backup, _backup_path(log, n + pieces))
    with log.open("r+b") as file:
        for n in range(1, pieces + 1):
            start = max(0, size - n * max_bytes)
            file.seek(start)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            backup_fd = os.open(_backup_path(log, n), flags, stat.st_mode & 0o777)
            with open(backup_fd, "wb") as piece:
                if (stat.st_uid, stat.st_gid) != (os.geteuid(), os.getegid()):
                    os.fchown(backup_fd, stat.st_uid, stat.st_gid)
                piece.write(file.read(size - (n - 1) * max_bytes - start))
        file.truncate(0)


def _last_lines(data: bytes, lines: int) -> bytes:
    # A final newline ends the last line; it does not start an empty one.
    start = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        start = data.rfind(b"\n", 0, start)
        if start < 0:
            return data
    return data[start + 1 :]
