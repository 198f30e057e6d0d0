"""Run the jobs placed on this node as subprocesses, and account for them across agent restarts.

The node agent owns one :class:`Executor`: it starts each placed job, reports what happens to it
through ``on_event``, enforces the maximum runtime, cancels on request and keeps the job's log.
Plain Python (no Django); Linux only (process identity is read from ``/proc``). Its design and
trade-offs (isolation, containers, accounts, logs, restarts): docs/development/executor.md.
Containers (``containers``), processes and logs as /proc shows them (``processes``) and the wire
format (``wire``) are modules of their own; what stays is the executor, whose state (the jobs it
runs, their records and monitors) its methods share.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from inventory.nvml import smi
from inventory.nvml.parsers.common import parse_cpu_list
from inventory.units import memory_text
from scheduling.agent import ray_launch
from scheduling.agent.containers import (
    CONTAINER_RUNTIMES,
    ContainerLimits,
    container_call,
    container_process,
)
from scheduling.agent.isolation.cgroups import (
    CgroupError,
    HostCgroups,
    JobCgroup,
    Usage,
    stale_job_directories,
)
from scheduling.agent.isolation.cpus import choose_cpus
from scheduling.agent.isolation.devices import (
    MIG_MINORS,
    PROC_DEVICES,
    DeviceRule,
    MigDevice,
    character_majors,
    job_device_rules,
    mig_capability_minors,
)
from scheduling.agent.mps import MpsDaemons, MpsError
from scheduling.agent.processes import (
    BOOT_ID_FILE,
    TAIL_BLOCK,
    backup_path,
    group_alive,
    last_lines,
    live_start_ticks,
    read_stat,
    read_text,
    rotate_log,
    signal_group,
)
from scheduling.agent.wire import (
    Account,
    ExecutorEvent,
    FinalState,
    JobFinished,
    JobSpec,
    JobStarted,
    base_environment,
    time_limit_message,
)

logger = logging.getLogger(__name__)


#: The longest path of a Ray application's temporary folder in its scratch folder; a longer
#: one goes to ``TMP`` (``Executor._ray_temp_dir``).
RAY_TEMP_DIR_MAX = 40
TMP = Path("/tmp")

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
        return group_alive(self.pid)

    def signal(self, sig: signal.Signals) -> None:
        """Signal every process of the job; SIGKILL through its cgroup's kill. A Ray
        application's other signals go to its process group only (its launcher and
        entrypoint): its launcher stops the Ray it started, whose daemons would die of a
        checkpoint signal such as SIGUSR1 before the entrypoint could use them."""
        signal_group(self.pid, sig)
        if self.cgroup is not None:
            if sig == signal.SIGKILL:
                self.cgroup.kill()
            elif self.spec.ray is None:
                self.cgroup.signal(sig)

    def poll(self) -> tuple[bool, int | None]:
        """Whether the main process has ended, and its exit code where that can be known."""
        if self.proc is not None:
            code = self.proc.poll()
            return code is not None, code
        return live_start_ticks(self.pid) != self.start_ticks, None

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
    such a job fails to start. ``cgroups`` (see :mod:`scheduling.agent.isolation`) confines each
    job in a cgroup of its own under ``<root>/<node_name>``, with ``pids_max`` processes at
    most and the device allow-list plus ``extra_devices``; a job is refused on a node that
    confines nothing when ``require_confinement`` and its spec does not allow it.
    ``sim_tools_dir`` (a simulated node's: its ``nvidia-smi``, ``inventory.nvml.smi``) goes
    first on the ``PATH`` of the jobs run on the host; a job whose devices its cgroup confines
    is told its own (``smi.VISIBLE_ENV``), as NVML shows a confined job only those.
    ``container_cgroup_parent`` puts a docker or podman container's cgroup under its job's.
    ``ray_python`` is the interpreter with Ray (``pip install gpuadmin[ray]``; default: this
    one) that runs a Ray application's part (``JobSpec.ray``: ``scheduling.agent.ray_launch``),
    its ``ray`` command beside it.
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
        ray_python: str | None = None,
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
        self._ray_python = ray_python or sys.executable
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
        self._boot_id = BOOT_ID_FILE.read_text().strip()
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
        paths = [log, *(backup_path(log, n) for n in range(1, self._log_backups + 1))]
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
                    start = max(0, end - TAIL_BLOCK)
                    file.seek(start)
                    chunks.append(file.read(end - start))
                    newlines += chunks[-1].count(b"\n")
                    end = start
        data = b"".join(reversed(chunks))
        return last_lines(data, lines).decode(errors="replace")

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
            if job.boot_id == self._boot_id and live_start_ticks(job.pid) == job.start_ticks:
                events.append(JobStarted(job.spec.job_id, job.pid, job.started_at, adopted=True))
                self._emit(events[-1])
                with self._lock:
                    self._monitor_in_thread(job, announce=False)
            else:
                container_call(job.runtime, job.spec, "remove")
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
            argv = spec.command if spec.ray is None else self._ray_launcher(spec, account)
            return argv, _as_account(spec.environment(os.environ), account)
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

    def _ray_launcher(self, spec: JobSpec, account: Account | None) -> list[str]:
        """What runs the job's part of its Ray application: ``ray_launch`` under
        ``ray_python``, its temporary folder made for the job's account."""
        assert spec.ray is not None
        ray = Path(self._ray_python).with_name("ray")
        if not ray.is_file():
            raise _LaunchError(
                f"{self._node_name} has no Ray beside {self._ray_python}: install gpuadmin[ray] "
                "there, or set GPUADMIN_RAY_PYTHON to a Python that has it"
            )
        temp = self._ray_temp_dir(spec)
        owners = {0, os.geteuid(), *([account.uid] if account is not None else [])}
        if temp.is_symlink() or (temp.exists() and temp.stat().st_uid not in owners):
            raise _LaunchError(f"{temp} exists and is not the job's: it cannot hold Ray's files")
        part = spec.ray
        return [
            self._ray_python, ray_launch.__file__,
            "--ray", str(ray),
            "--temp-dir", str(_scratch(temp, account)),
            "--head-address", part.head_address,
            "--port", str(part.port),
            "--node-address", part.node_address,
            "--nodes", str(part.nodes),
            *(["--head"] if part.head else []),
            "--", *spec.command,
        ]  # fmt: skip

    def _ray_temp_dir(self, spec: JobSpec) -> Path:
        """Ray's temporary folder for the job: ``ray`` in the job's scratch folder, unless
        that path is too long for the Unix sockets Ray makes in it (107 bytes in all, of
        which Ray's session folder and socket names take about 67): then one of its own in
        /tmp, which the executor removes at the job's end."""
        if self._scratch_dir is not None:
            inside = self._scratch_dir / spec.job_id / "ray"
            if len(str(inside)) <= RAY_TEMP_DIR_MAX:
                return inside
        return TMP / f"gpuadmin-ray-{spec.job_id}"

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
            majors=character_majors(read_text(self._proc_devices)),
            mig_minors=mig_capability_minors(read_text(self._mig_minors)) if mig_devices else {},
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
            self._mps.ensure(gpu_uuid, base_environment(os.environ))
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
            self._mps.stop(gpu_uuid, base_environment(os.environ))

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
        stat = read_stat(proc.pid)  # our unreaped child: present even if it already exited
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
            rotate_log(job.log_path, self._log_max_bytes, self._log_backups)
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
                    container_call(job.runtime, job.spec, "kill")
                    killed = True
                job.signal(signal.SIGKILL)
            job.wake.wait(self._poll_interval_s)
            job.wake.clear()
        if _over_memory(job):
            stop_reason = FinalState.FAILED
        rotate_log(job.log_path, self._log_max_bytes, self._log_backups)
        container_call(job.runtime, job.spec, "remove")
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
        if job.spec.ray is not None and (temp := self._ray_temp_dir(job.spec)).parent == TMP:
            shutil.rmtree(temp, ignore_errors=True)

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
        assert spec.max_runtime_s is not None  # only a job with a time limit times out
        return stop_reason, time_limit_message(spec.max_runtime_s)
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
