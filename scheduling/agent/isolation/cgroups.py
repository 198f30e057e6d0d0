"""Job cgroups on the unified hierarchy (cgroup v2) and on the v1 controllers.

:func:`host_cgroups` finds what the host offers and picks a backend per resource: on a v2
host everything is v2; on a hybrid host (v1 controllers beside an empty cgroup2 tree, like
systemd's "hybrid" layout) devices, kill and CPU time come from the cgroup2 tree and the
CPU, memory and process limits from the v1 controllers. Each job gets a directory of its own
in every hierarchy it uses, ``<mount>/<root>/<node>/<job>``, created with its limits (and, on
v2, its device program attached) before its first process joins it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inventory.nvml.parsers.common import format_cpu_list, parse_cpu_list
from scheduling.agent.isolation.bpf import BpfError, attach_device_program
from scheduling.agent.isolation.devices import DeviceRule

MOUNTS = Path("/proc/self/mounts")
NUMA_NODES = Path("/sys/devices/system/node")

#: The resources a job's cgroup confines or measures.
RESOURCES = ("devices", "cpuset", "memory", "pids", "kill", "cpu_time")
#: The v1 controller that serves each resource.
_V1_CONTROLLER = {
    "devices": "devices",
    "cpuset": "cpuset",
    "memory": "memory",
    "pids": "pids",
    "kill": "freezer",
    "cpu_time": "cpuacct",
}
#: The v2 controller a resource needs enabled (devices, kill and CPU time need none).
_V2_CONTROLLER = {"cpuset": "cpuset", "memory": "memory", "pids": "pids"}
VERSIONS = ("auto", "1", "2", "off")
_KILL_ROUNDS = 100


class CgroupError(OSError):
    pass


@dataclass(frozen=True)
class Usage:
    """What a job used, read from its cgroup at its end (``None``: not measured here)."""

    cpu_seconds: float | None = None
    max_memory_bytes: int | None = None


@dataclass(frozen=True)
class HostCgroups:
    """The cgroup hierarchies this host offers jobs: ``backends`` maps each resource of
    :data:`RESOURCES` to ``"2"`` or ``"1"`` (absent: not confined); ``unified`` is the cgroup2
    mount, ``v1`` the mount of each v1 controller; ``root`` the agent's subtree in each;
    ``problems`` say why a resource is missing."""

    backends: Mapping[str, str]
    unified: Path | None
    v1: Mapping[str, Path]
    root: str
    problems: Sequence[str] = ()
    # Moving a process between cgroups waits for an RCU grace period unless the
    # cgroup2 mount has ``favordynmods`` (kernel 6.0+), which makes the moves cheap.
    favordynmods: bool = False

    @property
    def confined(self) -> bool:
        """Whether a job is held at all: its devices, or at least its end (nothing escapes)."""
        return "devices" in self.backends or "kill" in self.backends

    def describe(self) -> str:
        """One line for the node page, the API and the agent's start: what confines a job."""
        if not self.confined:
            return "none"
        parts = []
        for version in ("2", "1"):
            names = [name for name in RESOURCES if self.backends.get(name) == version]
            if names:
                parts.append(f"cgroup v{version} ({', '.join(names)})")
        return " + ".join(parts)

    def reason(self) -> str:
        """Why a resource is not confined ("" when all are)."""
        return "; ".join(self.problems)

    def directories(self, node: str) -> dict[str, Path]:
        """The node's subtree in every hierarchy used: ``"unified"`` or a v1 controller."""
        found: dict[str, Path] = {}
        for resource, version in self.backends.items():
            if version == "2":
                assert self.unified is not None
                found["unified"] = self.unified / self.root / node
            else:
                controller = _V1_CONTROLLER[resource]
                found[controller] = self.v1[controller] / self.root / node
        return found


def host_cgroups(
    version: str = "auto", root: str = "gpuadmin", mounts: Path = MOUNTS
) -> HostCgroups:
    """What this host offers, for ``version`` (``auto``: v2 where the unified hierarchy has
    it, else the v1 controllers; ``1`` or ``2`` only that one; ``off`` nothing)."""
    if version not in VERSIONS:
        raise ValueError(f"cgroup version {version!r} is not one of {', '.join(VERSIONS)}")
    root = root.strip("/")
    unified, v1, favordynmods = _mounts(mounts)
    if version == "off":
        return HostCgroups({}, unified, v1, root, ("switched off (GPUADMIN_CGROUP_VERSION=off)",))
    problems: list[str] = []
    if unified is None and not v1:
        problems.append("no cgroup file system is mounted")
    usable_unified = unified if version in ("auto", "2") else None
    if usable_unified is not None and not _writable(usable_unified, root):
        problems.append(_not_writable(usable_unified, root))
        usable_unified = None
    usable_v1 = {
        name: path
        for name, path in v1.items()
        if version in ("auto", "1") and _writable(path, root)
    }
    if version in ("auto", "1") and v1 and not usable_v1:
        problems.append(_not_writable(next(iter(v1.values())), root))
    v2_controllers = _v2_controllers(usable_unified, root) if usable_unified else set()
    backends: dict[str, str] = {}
    for resource in RESOURCES:
        needs = _V2_CONTROLLER.get(resource)
        in_unified = usable_unified is not None and (needs is None or needs in v2_controllers)
        if in_unified and (resource != "devices" or _may_attach_bpf()):
            backends[resource] = "2"
            continue
        if _V1_CONTROLLER[resource] in usable_v1:
            backends[resource] = "1"
        elif unified is not None or v1:
            problems.append(_missing(resource, version))
    return HostCgroups(backends, unified, v1, root, tuple(problems), favordynmods)


def _mounts(mounts: Path) -> tuple[Path | None, dict[str, Path], bool]:
    """The cgroup2 mount, each v1 controller's, and whether cgroup2 has ``favordynmods``."""
    unified: Path | None = None
    v1: dict[str, Path] = {}
    favordynmods = False
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None, {}, False
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        path, kind, options = fields[1], fields[2], fields[3].split(",")
        if kind == "cgroup2" and unified is None:
            unified, favordynmods = Path(path), "favordynmods" in options
        elif kind == "cgroup":
            for name in set(_V1_CONTROLLER.values()) & set(options):
                v1.setdefault(name, Path(path))
    return unified, v1, favordynmods


def _writable(mount: Path, root: str) -> bool:
    """Whether this process may create the subtree (or it exists and is delegated to it)."""
    path = mount / root
    while not path.exists() and path != mount:
        path = path.parent
    return os.access(path, os.W_OK)


def _not_writable(mount: Path, root: str) -> str:
    who = "not root" if os.geteuid() != 0 else f"uid {os.geteuid()}"
    return f"{who}, and {mount / root} is not delegated to this agent"


def _v2_controllers(unified: Path, root: str) -> set[str]:
    """The controllers the subtree's parent can hand down (``cgroup.controllers``)."""
    path = unified / root
    while not path.exists() and path != unified:
        path = path.parent
    try:
        return set((path / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def _may_attach_bpf() -> bool:
    """BPF device programs need CAP_BPF or CAP_SYS_ADMIN: root, in practice."""
    return os.geteuid() == 0


def _missing(resource: str, version: str) -> str:
    controller = _V2_CONTROLLER.get(resource) or _V1_CONTROLLER[resource]
    where = {"2": "the unified hierarchy", "1": "the v1 controllers"}.get(version, "either")
    if resource == "devices" and os.geteuid() != 0:
        return "devices: a device allow-list needs root (CAP_BPF on cgroup v2)"
    return f"{resource}: no {controller} controller in {where}"


@dataclass
class JobCgroup:
    """One job's cgroup: a directory in each hierarchy used (``"unified"`` or a v1 controller
    name, to its path), and which backend serves each resource."""

    directories: dict[str, Path]
    backends: dict[str, str]
    cpus: tuple[int, ...] = ()
    _oom_seen: int = field(default=0, repr=False)

    @classmethod
    def create(
        cls,
        host: HostCgroups,
        node: str,
        name: str,
        *,
        devices: Sequence[DeviceRule] | None,
        cpus: Iterable[int] = (),
        memory_mib: int = 0,
        pids_max: int = 0,
    ) -> JobCgroup:
        """Create the job's directories with its limits: ``devices`` (its allow-list; None:
        no device rules), ``cpus`` (empty: those of the subtree), ``memory_mib`` and
        ``pids_max`` (0: no limit). ``CgroupError`` when the kernel refuses; what was created
        is removed again."""
        subtrees = host.directories(node)
        job = cls({key: path / name for key, path in subtrees.items()}, dict(host.backends))
        job.cpus = tuple(sorted(cpus))
        try:
            for key, subtree in subtrees.items():
                _ensure_subtree(subtree, host.unified if key == "unified" else None)
                job.directories[key].mkdir()  # one that exists is another job's
            job._limit(devices, memory_mib, pids_max)
        except OSError as exc:
            job.remove()
            raise CgroupError(exc.errno, f"cannot set up the job's cgroup: {exc}") from exc
        return job

    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` files a process writes its pid to, to join the job."""
        return [path / "cgroup.procs" for path in self.directories.values()]

    def pids(self) -> set[int]:
        """The job's processes (in any hierarchy it uses). A cgroup removed, or being removed
        while it is read (ENODEV), holds none."""
        found: set[int] = set()
        for procs in self.procs_files():
            try:
                found.update(int(pid) for pid in procs.read_text().split())
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENODEV):
                    raise
        return found

    def signal(self, sig: signal.Signals) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill(self) -> None:
        """SIGKILL every process of the job, including those that left its process group
        (``setsid``, double forks): ``cgroup.kill`` on v2, a frozen cgroup on v1 (no process
        can fork while the signals go out)."""
        if self.backends.get("kill") == "2":
            with contextlib.suppress(FileNotFoundError):
                (self.directories["unified"] / "cgroup.kill").write_text("1")
            return
        freezer = self.directories.get("freezer")
        for _ in range(_KILL_ROUNDS):
            if freezer is not None:
                _write(freezer / "freezer.state", "FROZEN")
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if freezer is not None:
                _write(freezer / "freezer.state", "THAWED")
            if not pids:
                return
            time.sleep(0.01)

    def empty(self) -> bool:
        return not self.pids()

    def oom_kills(self) -> int:
        """How many of the job's processes the kernel killed for its memory limit."""
        memory = self._resource_dir("memory")
        if memory is None:
            return 0
        name = "memory.events" if self.backends["memory"] == "2" else "memory.oom_control"
        return _keyed(memory / name).get("oom_kill", 0)

    def usage(self) -> Usage:
        """CPU time and peak memory so far (the latter counts the page cache, as the memory
        limit does)."""
        cpu_seconds: float | None = None
        cpu = self._resource_dir("cpu_time")
        if cpu is not None and self.backends["cpu_time"] == "2":
            usec = _keyed(cpu / "cpu.stat").get("usage_usec")
            cpu_seconds = None if usec is None else usec / 1e6
        elif cpu is not None:
            with contextlib.suppress(OSError, ValueError):
                cpu_seconds = int((cpu / "cpuacct.usage").read_text()) / 1e9
        peak: int | None = None
        memory = self._resource_dir("memory")
        if memory is not None:
            name = "memory.peak" if self.backends["memory"] == "2" else "memory.max_usage_in_bytes"
            with contextlib.suppress(OSError, ValueError):
                peak = int((memory / name).read_text())
        return Usage(cpu_seconds, peak)

    def remove(self) -> None:
        """Remove the job's directories (once its processes are gone)."""
        for path in self.directories.values():
            with contextlib.suppress(FileNotFoundError):
                _rmdir(path)

    def destroy(self) -> None:
        """Kill whatever still runs in it, then remove it."""
        self.kill()
        self.remove()

    def to_record(self) -> dict[str, Any]:
        return {
            "directories": {key: str(path) for key, path in self.directories.items()},
            "backends": self.backends,
            "cpus": list(self.cpus),
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> JobCgroup:
        directories = {key: Path(path) for key, path in record["directories"].items()}
        return cls(directories, dict(record["backends"]), tuple(record.get("cpus", ())))

    def _resource_dir(self, resource: str) -> Path | None:
        version = self.backends.get(resource)
        if version is None:
            return None
        return self.directories["unified" if version == "2" else _V1_CONTROLLER[resource]]

    def _limit(self, devices: Sequence[DeviceRule] | None, memory_mib: int, pids: int) -> None:
        cpuset = self._resource_dir("cpuset")
        if cpuset is not None:
            parent_cpus = parse_cpu_list(_effective(cpuset.parent, "cpuset.cpus")) or ()
            cpus = self.cpus or parent_cpus
            mems = _memory_nodes(cpus) or _effective(cpuset.parent, "cpuset.mems")
            _write(cpuset / "cpuset.mems", mems)
            _write(cpuset / "cpuset.cpus", format_cpu_list(cpus))
        memory = self._resource_dir("memory")
        if memory is not None and memory_mib:
            limit = str(memory_mib * 1024 * 1024)
            if self.backends["memory"] == "2":
                _write(memory / "memory.max", limit)
                _write_if_present(memory / "memory.swap.max", "0")
                _write(memory / "memory.oom.group", "1")
            else:
                _write(memory / "memory.limit_in_bytes", limit)
                _write_if_present(memory / "memory.memsw.limit_in_bytes", limit)
        pids_dir = self._resource_dir("pids")
        if pids_dir is not None and pids:
            _write(pids_dir / "pids.max", str(pids))
        devices_dir = self._resource_dir("devices")
        if devices_dir is not None and devices is not None:
            if self.backends["devices"] == "2":
                try:
                    attach_device_program(devices_dir, devices)
                except BpfError as exc:
                    raise CgroupError(exc.errno, str(exc)) from None
            else:
                _write(devices_dir / "devices.deny", "a")
                for rule in devices:
                    _write(devices_dir / "devices.allow", str(rule))


def stale_job_directories(host: HostCgroups, node: str, keep: Iterable[str]) -> list[JobCgroup]:
    """Job cgroups of ``node`` left behind by a job no record names (an agent that died
    between creating one and recording its job): to be killed and removed."""
    subtrees = host.directories(node)
    names: set[str] = set()
    for subtree in subtrees.values():
        with contextlib.suppress(FileNotFoundError):
            names.update(entry.name for entry in subtree.iterdir() if entry.is_dir())
    return [
        JobCgroup({key: path / name for key, path in subtrees.items()}, dict(host.backends))
        for name in sorted(names - set(keep))
    ]


def remove_tree(host: HostCgroups) -> None:
    """Kill every process under the agent's subtree and remove it, in every hierarchy (a test
    session's own subtree, at its end)."""
    for mount in {host.unified, *host.v1.values()} - {None}:
        assert mount is not None
        # Deepest first; one that goes meanwhile (its job's end) is passed over.
        for directory, _, _ in os.walk(mount / host.root, topdown=False):
            with contextlib.suppress(OSError):
                JobCgroup({"any": Path(directory)}, {}).destroy()


def _ensure_subtree(subtree: Path, unified: Path | None) -> None:
    """Create the node's subtree (and the agent's root above it); on v2 hand the enabled
    controllers down each level, on v1 give cpuset directories their parent's CPUs."""
    chain: list[Path] = []
    path = subtree
    while not path.exists():
        chain.append(path)
        path = path.parent
    for directory in reversed(chain):
        directory.mkdir(exist_ok=True)
        if unified is None and (directory.parent / "cpuset.cpus").exists():
            for name in ("cpuset.mems", "cpuset.cpus"):
                if not _read(directory / name):
                    _write(directory / name, _read(directory.parent / name))
    if unified is not None:
        path = subtree
        levels = []
        while path != unified:
            levels.append(path.parent)
            path = path.parent
        for directory in reversed(levels):
            wanted = set(_V2_CONTROLLER.values()) & set(
                _read(directory / "cgroup.controllers").split()
            )
            enabled = set(_read(directory / "cgroup.subtree_control").split())
            for name in sorted(wanted - enabled):
                _write(directory / "cgroup.subtree_control", f"+{name}")


def _memory_nodes(cpus: Iterable[int]) -> str:
    """The NUMA nodes of ``cpus`` (for ``cpuset.mems``), "" when the host does not say."""
    wanted = set(cpus)
    return format_cpu_list(node for node, node_cpus in _numa_cpus().items() if node_cpus & wanted)


@functools.cache
def _numa_cpus() -> dict[int, frozenset[int]]:
    """This host's NUMA nodes and their CPUs (read once: they do not change)."""
    nodes = {}
    with contextlib.suppress(OSError):
        for entry in NUMA_NODES.glob("node[0-9]*"):
            cpus = parse_cpu_list(_read(entry / "cpulist")) or ()
            nodes[int(entry.name.removeprefix("node"))] = frozenset(cpus)
    return nodes


def _keyed(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file (``name value`` lines) as numbers; {} when absent."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdecimal():
            values[name] = int(value)
    return values


def _effective(directory: Path, name: str) -> str:
    """A cpuset file's effective value (v2 leaves ``cpuset.cpus`` empty to inherit)."""
    return _read(directory / f"{name}.effective") or _read(directory / name)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as file:
        file.write(value)


def _write_if_present(path: Path, value: str) -> None:
    if path.exists():
        _write(path, value)


def _rmdir(path: Path) -> None:
    """rmdir, retried briefly while the kernel still counts an exiting process."""
    for _ in range(50):
        try:
            path.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            time.sleep(0.01)
    path.rmdir()
