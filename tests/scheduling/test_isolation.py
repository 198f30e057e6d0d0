"""A job holds exactly what it was given, on real cgroups (v1 controllers and the cgroup2 tree of
this project's hybrid machines; CI runs as root): only its own GPUs' device nodes open, its CPUs
are those chosen for it, its memory limit stops it with a message that says so, and nothing it
started outlives it. Device nodes are made with mknod (195:N, no driver behind them): an allowed
one fails to open with ENXIO, a refused one with EPERM."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduling.agent.containers import ContainerLimits, container_process
from scheduling.agent.isolation.cgroups import HostCgroups, JobCgroup, host_cgroups, remove_tree
from scheduling.agent.isolation.cpus import choose_cpus
from scheduling.agent.isolation.devices import (
    DeviceRule,
    MigDevice,
    character_majors,
    job_device_rules,
    mig_capability_minors,
)
from scheduling.agent.wire import FinalState, JobSpec
from tests.scheduling.executors import MakeExecutor

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 and not os.environ.get("CI"), reason="cgroups and mknod need root"
)
# Both paths: the cgroup v1 controllers, and the unified hierarchy (the BPF device program,
# cgroup.kill), each as the only one; "auto" uses both, as a hybrid host does.
VERSIONS = ["1", "2"]

OPEN_DEVICES = """
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        print(path, "opened")
    except OSError as exc:
        print(path, errno.errorcode[exc.errno])
"""


@pytest.fixture
def cgroup_root() -> Iterator[str]:
    """A subtree of the test's own in every hierarchy, killed and removed afterwards."""
    root = f"gpuadmin-test-{uuid.uuid4().hex[:8]}"
    yield root
    remove_tree(host_cgroups("auto", root))


@pytest.fixture
def gpu_nodes() -> Iterator[Path]:
    """/dev/<test>/nvidia0..3 (c 195:0..3): on /dev, since a ``nodev`` tmpfs refuses them all."""
    folder = Path("/dev") / f"gpuadmin-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    for minor in range(4):
        os.mknod(folder / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    yield folder
    shutil.rmtree(folder)


def confined_executor(
    make_executor: MakeExecutor, root: str, version: str, **options: object
) -> tuple[object, object]:
    return make_executor(cgroups=host_cgroups(version, root), node_name="node-9", **options)


def python_job(job_id: str, code: str, *args: str, **fields: object) -> JobSpec:
    return JobSpec(job_id=job_id, argv=[sys.executable, "-c", code, *args], cwd="/", **fields)


def escaping(pid_file: Path, *, then: str) -> str:
    """A shell command that leaves a ``setsid`` child (its pid in ``pid_file``), then ``then``."""
    return f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 300' & {then}"


def lines(executor: object, job_id: str) -> list[str]:
    return executor.tail(job_id).splitlines()  # type: ignore[attr-defined]


@needs_root
@pytest.mark.parametrize("version", VERSIONS)
def test_a_job_opens_its_own_gpu_and_no_other(
    make_executor: MakeExecutor, cgroup_root: str, gpu_nodes: Path, version: str
) -> None:
    executor, events = confined_executor(make_executor, cgroup_root, version)
    paths = [str(gpu_nodes / f"nvidia{minor}") for minor in range(4)]
    spec = python_job("1.0", OPEN_DEVICES, *paths, "/dev/null", gpu_uuids=["GPU-b"], gpu_minors=[1])

    executor.launch(spec)

    assert events.finished("1.0").state == FinalState.COMPLETED
    assert lines(executor, "1.0") == [
        f"{paths[0]} EPERM",
        f"{paths[1]} ENXIO",  # allowed: no driver behind it
        f"{paths[2]} EPERM",
        f"{paths[3]} EPERM",
        "/dev/null opened",
    ]


@needs_root
def test_without_confinement_every_gpu_opens(
    make_executor: MakeExecutor, cgroup_root: str, gpu_nodes: Path
) -> None:
    # What the tests above would see if confinement were switched off.
    executor, events = confined_executor(make_executor, cgroup_root, "off")
    paths = [str(gpu_nodes / f"nvidia{minor}") for minor in range(4)]

    executor.launch(python_job("2.0", OPEN_DEVICES, *paths, gpu_uuids=["GPU-b"], gpu_minors=[1]))

    assert events.finished("2.0").state == FinalState.COMPLETED
    assert lines(executor, "2.0") == [f"{path} ENXIO" for path in paths]


@needs_root
@pytest.mark.parametrize("version", ["1", "auto"])
def test_a_job_runs_on_the_cpus_chosen_near_its_gpus_exclusively(
    make_executor: MakeExecutor, cgroup_root: str, version: str
) -> None:
    host_cpus = sorted(os.sched_getaffinity(0))
    if len(host_cpus) < 2:
        pytest.skip("needs two CPUs")
    executor, events = confined_executor(make_executor, cgroup_root, version)
    show = "import os, time; print(sorted(os.sched_getaffinity(0)), flush=True); time.sleep(30)"
    near = str(host_cpus[1])  # its GPUs' NUMA node holds the second CPU

    executor.launch(python_job("3.0", show, cpus=1, cpu_affinity=near))
    events.started("3.0")
    executor.launch(python_job("3.1", show, cpus=1, cpu_affinity=near))
    events.started("3.1")

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (lines(executor, "3.0") and lines(executor, "3.1")):
        time.sleep(0.05)
    assert lines(executor, "3.0") == [f"[{host_cpus[1]}]"]  # near its GPUs
    assert lines(executor, "3.1") == [f"[{host_cpus[0]}]"]  # not the one already taken
    cpuset = Path(f"/sys/fs/cgroup/cpuset/{cgroup_root}/node-9/3.0/cpuset.cpus")
    assert cpuset.read_text().strip() == str(host_cpus[1])  # held by the cgroup, not only asked
    executor.cancel("3.0")
    executor.cancel("3.1")
    assert events.finished("3.0").state == FinalState.CANCELED


@needs_root
@pytest.mark.parametrize("version", ["1", "auto"])
def test_a_job_over_its_memory_limit_is_stopped_and_says_why(
    make_executor: MakeExecutor, cgroup_root: str, version: str
) -> None:
    executor, events = confined_executor(make_executor, cgroup_root, version)
    grab = "data = b'x' * (512 << 20); print('allocated')"

    executor.launch(python_job("4.0", grab, memory_mib=64))

    finished = events.finished("4.0", timeout=30)
    assert finished.state == FinalState.FAILED
    assert finished.message == "stopped: it used more than its 64 MiB of host memory"
    assert "allocated" not in lines(executor, "4.0")
    assert finished.max_memory_bytes is not None
    assert 0 < finished.max_memory_bytes <= 64 << 20


@needs_root
@pytest.mark.parametrize("version", VERSIONS)
def test_nothing_a_job_started_outlives_it(
    make_executor: MakeExecutor, cgroup_root: str, tmp_path: Path, version: str
) -> None:
    executor, events = confined_executor(make_executor, cgroup_root, version)
    pid_file = tmp_path / "escaped.pid"
    escape = escaping(pid_file, then="sleep 0.3; exit 0")

    executor.launch(JobSpec(job_id="5.0", shell_command=escape, cwd="/"))

    finished = events.finished("5.0", timeout=30)
    assert finished.state == FinalState.COMPLETED
    escaped = int(pid_file.read_text())
    assert not _alive(escaped), "the setsid child outlived its job"
    left = Path(f"/sys/fs/cgroup/pids/{cgroup_root}/node-9/5.0")
    _wait_for(lambda: not left.exists())  # removed once its end is reported
    assert not left.exists()


@needs_root
@pytest.mark.parametrize("version", VERSIONS)
def test_a_restarted_agent_readopts_a_job_and_its_end_still_kills_everything(
    make_executor: MakeExecutor, cgroup_root: str, tmp_path: Path, version: str
) -> None:
    first, first_events = confined_executor(make_executor, cgroup_root, version)
    pid_file = tmp_path / "escaped.pid"
    job = escaping(pid_file, then="exec sleep 300")
    first.launch(JobSpec(job_id="6.0", shell_command=job, cwd="/"))
    first_events.started("6.0")
    first.shutdown(kill=False)  # the agent stops; the job runs on

    second, events = confined_executor(make_executor, cgroup_root, version)
    [adopted] = second.reconcile()
    assert adopted.job_id == "6.0"
    _wait_for(pid_file.exists)
    second.cancel("6.0")

    assert events.finished("6.0", timeout=30).state == FinalState.CANCELED
    assert not _alive(int(pid_file.read_text()))


@needs_root
def test_an_agent_start_ends_a_cgroup_no_record_names(
    make_executor: MakeExecutor, cgroup_root: str
) -> None:
    # An agent that died between creating a job's cgroup and recording the job.
    host = host_cgroups("auto", cgroup_root)
    left = JobCgroup.create(host, "node-9", "7.0", devices=None)
    with contextlib.ExitStack() as stack:
        sleeper = stack.enter_context(_process_in(left, "sleep 300"))
        executor, _ = confined_executor(make_executor, cgroup_root, "auto")

        executor.reconcile()

        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert not any(path.exists() for path in left.directories.values())


@needs_root
def test_a_node_that_confines_nothing_refuses_jobs_unless_allowed(
    make_executor: MakeExecutor, cgroup_root: str
) -> None:
    executor, events = confined_executor(
        make_executor, cgroup_root, "off", require_confinement=True
    )

    executor.launch(python_job("8.0", "print('ran')"))
    executor.launch(python_job("8.1", "print('ran')", allow_unconfined=True))

    refused = events.finished("8.0")
    assert refused.state == FinalState.FAILED
    assert refused.message.startswith("node-9 confines no job (switched off")
    assert events.finished("8.1").state == FinalState.COMPLETED


@needs_root
@pytest.mark.parametrize("version", VERSIONS)
def test_a_job_reports_its_cpu_time(
    make_executor: MakeExecutor, cgroup_root: str, version: str
) -> None:
    executor, events = confined_executor(make_executor, cgroup_root, version)
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"

    executor.launch(python_job("9.0", burn))

    finished = events.finished("9.0", timeout=30)
    assert finished.cpu_seconds is not None and finished.cpu_seconds >= 0.3


def test_the_host_says_what_confines_jobs_and_why_not() -> None:
    off = host_cgroups("off")
    assert (off.confined, off.describe()) == (False, "none")
    assert off.reason() == "switched off (GPUADMIN_CGROUP_VERSION=off)"
    hybrid = HostCgroups(
        {"devices": "2", "kill": "2", "memory": "1"}, Path("/u"), {"memory": Path("/m")}, "g"
    )
    assert hybrid.describe() == "cgroup v2 (devices, kill) + cgroup v1 (memory)"


def test_a_mig_job_gets_its_instance_capabilities_and_the_control_devices() -> None:
    majors = character_majors(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n"
        "508 nvidia-uvm\n509 nvidia-caps\n\nBlock devices:\n  8 sd\n"
    )
    minors = mig_capability_minors(
        "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"
    )

    rules = job_device_rules([], [MigDevice(0, 1, 0)], majors=majors, mig_minors=minors)

    allowed = {str(rule) for rule in rules}
    assert {"c 195:0 rwm", "c 195:255 rwm", "c 195:254 rwm"} <= allowed
    assert {"c 508:0 rwm", "c 508:1 rwm", "c 509:12 rwm", "c 509:13 rwm"} <= allowed
    assert not any(rule.major == 195 and rule.minor not in (0, 254, 255) for rule in rules)
    with pytest.raises(ValueError, match="gpu0/gi2/access is not on this host"):
        job_device_rules([], [MigDevice(0, 2, 0)], majors=majors, mig_minors=minors)
    assert str(DeviceRule.parse("c 231:* rw")) == "c 231:* rw"


def test_cpus_are_near_the_gpus_and_exclusive_while_the_node_has_free_ones() -> None:
    host = range(8)
    assert choose_cpus(2, near=[4, 5, 6, 7], available=host, taken=Counter()) == (4, 5)
    assert choose_cpus(2, near=[4, 5, 6, 7], available=host, taken=Counter([4, 5])) == (6, 7)
    # Near ones all taken: free ones elsewhere before sharing.
    assert choose_cpus(1, near=[4, 5], available=host, taken=Counter([4, 5])) == (0,)
    # None asked: all near its GPUs, shared; GPUs' CPUs this host lacks (a simulated model).
    assert choose_cpus(0, near=[4, 5], available=host, taken=Counter([4])) == (4, 5)
    assert choose_cpus(0, near=[64, 65], available=[0, 1], taken=Counter()) == (0, 1)


def test_a_container_gets_the_jobs_cpus_memory_processes_and_cgroup() -> None:
    spec = JobSpec(job_id="3.1", argv=["train"], container_image="pytorch:24.01")
    limits = ContainerLimits(
        cpus=(4, 5, 6), memory_mib=2048, pids_max=4096, cgroup_parent="/g/n/3.1"
    )

    argv, _ = container_process("docker", spec, {"PATH": "/bin"}, limits=limits)

    options = argv[: argv.index("pytorch:24.01")]
    assert {"--cpuset-cpus=4-6", "--memory=2048m", "--pids-limit=4096"} <= set(options)
    assert "--cgroup-parent=/g/n/3.1" in options


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text()
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(condition: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


@contextlib.contextmanager
def _process_in(cgroup: JobCgroup, command: str) -> Iterator[object]:
    procs = " ".join(str(path) for path in cgroup.procs_files())
    joined = f"for f in {procs}; do echo $$ > $f; done; exec {command}"
    process = subprocess.Popen(["sh", "-c", joined])
    _wait_for(lambda: process.pid in cgroup.pids())
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()


def test_a_job_that_cannot_be_confined_runs_nothing(
    make_executor: MakeExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job's process waits at its gate until it is confined: a failure there (here a
    # cgroup that refuses it) kills it before the job's first instruction.
    from scheduling.agent import supervisor as executor_module

    def refuse(pid: int, cgroup: object, cpus: object) -> None:
        raise PermissionError(13, "Permission denied", "cgroup.procs")

    monkeypatch.setattr(executor_module, "_confine", refuse)
    executor, events = make_executor()
    ran = tmp_path / "ran"

    executor.launch(JobSpec(job_id="10.0", argv=["touch", str(ran)], cwd="/"))

    finished = events.finished("10.0")
    assert finished.state == FinalState.FAILED
    assert finished.message.startswith("cannot confine it: [Errno 13] Permission denied")
    assert [type(event).__name__ for event in events.of("10.0")] == ["JobFinished"]
    time.sleep(0.2)
    assert not ran.exists()


def test_the_host_says_whether_moving_a_job_into_its_cgroup_is_cheap(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    line = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime{} 0 0\n"
    mounts.write_text(line.format(""))
    assert not host_cgroups("2", mounts=mounts).favordynmods
    mounts.write_text(line.format(",favordynmods"))
    assert host_cgroups("2", mounts=mounts).favordynmods
