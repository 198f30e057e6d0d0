"""Jobs with a container image: the runtimes' command lines, and real jobs run end to end
through a fake ``docker`` first on ``PATH`` (no database)."""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuadmin.celery import app
from scheduling.agent import jobs as agent
from scheduling.agent.containers import container_process
from scheduling.agent.wire import Account, FinalState, JobFinished, JobSpec, event_from_dict
from tests.scheduling.conftest import RecordingBroker
from tests.scheduling.executors import MakeExecutor
from tests.scheduling.test_executor import (
    SLEEP,
    abandons_processes,
    alive,
    python,
    wait_until,
)

IMAGE = "nvcr.io/nvidia/pytorch:24.01-py3"
ALICE = Account("alice", uid=1001, gid=1002, groups=(1002, 44), home="/home/alice")
GPUS = ("GPU-aaaa", "MIG-bbbb")
AGENT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/agent",
    "SECRET_KEY": "agent-secret",
    "DATABASE_URL": "postgresql://gpuadmin:pw@db/gpuadmin",
    "LD_LIBRARY_PATH": "/opt/agent/lib",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "DOCKER_HOST": "unix:///run/user/1000/docker.sock",
    "CONTAINER_HOST": "unix:///run/user/1000/podman/podman.sock",
    "APPTAINER_CACHEDIR": "/scratch/apptainer",
}
JOB_ENV = {
    "WANDB_API_KEY": "s3cret",
    "PATH": "/opt/conda/bin:/usr/bin:/bin",  # for the image: the client keeps the agent's
    "LD_PRELOAD": "/usr/lib/libjemalloc.so.2",
    "DOCKER_HOST": "tcp://dind:2375",
}


def spec(**fields: Any) -> JobSpec:
    defaults: dict[str, Any] = {
        "job_id": "12.3",
        "cwd": "/scratch/12.3",
        "argv": ["python", "train.py"],
        "env": JOB_ENV,
        "gpu_uuids": GPUS,
        "container_image": IMAGE,
        "container_workdir": "/workspace",
    }
    return JobSpec(**{**defaults, **fields})


def test_docker_gets_the_account_the_gpus_the_variables_by_name_and_the_workdir() -> None:
    argv, env = container_process("docker", spec(), AGENT_ENV, account=ALICE)

    assert argv == [
        "docker", "run", "--rm", "--init", "--name=gpuadmin-job-12-3",
        "--user=1001:1002",
        '--gpus="device=GPU-aaaa,MIG-bbbb"',
        "--env=WANDB_API_KEY",
        "--env=PATH=/opt/conda/bin:/usr/bin:/bin",
        "--env=LD_PRELOAD=/usr/lib/libjemalloc.so.2",
        "--env=DOCKER_HOST=tcp://dind:2375",
        "--env=CUDA_VISIBLE_DEVICES",
        "--env=GPUADMIN_JOB_ID",
        "--env=NVIDIA_VISIBLE_DEVICES",
        "--workdir=/workspace",
        IMAGE, "python", "train.py",
    ]  # fmt: skip
    # The client's environment: its own (never the agent's secrets), then the values by name.
    assert env == {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/home/agent",
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "DOCKER_HOST": "unix:///run/user/1000/docker.sock",
        "WANDB_API_KEY": "s3cret",
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa,MIG-bbbb",
        "GPUADMIN_JOB_ID": "12.3",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,MIG-bbbb",
    }


def test_podman_gets_one_cdi_device_per_gpu_and_runs_a_shell_command() -> None:
    job = spec(argv=(), shell_command="nvidia-smi; python train.py", container_workdir=None)

    argv, env = container_process("podman", job, AGENT_ENV, account=ALICE)

    assert argv == [
        "podman", "run", "--rm", "--init", "--name=gpuadmin-job-12-3",
        "--user=1001:1002",
        "--device=nvidia.com/gpu=GPU-aaaa",
        "--device=nvidia.com/gpu=MIG-bbbb",
        "--env=WANDB_API_KEY",
        "--env=PATH=/opt/conda/bin:/usr/bin:/bin",
        "--env=LD_PRELOAD=/usr/lib/libjemalloc.so.2",
        "--env=DOCKER_HOST",
        "--env=CUDA_VISIBLE_DEVICES",
        "--env=GPUADMIN_JOB_ID",
        "--env=NVIDIA_VISIBLE_DEVICES",
        IMAGE, "/bin/sh", "-c", "nvidia-smi; python train.py",
    ]  # fmt: skip
    assert env["CONTAINER_HOST"] == AGENT_ENV["CONTAINER_HOST"]
    assert env["DOCKER_HOST"] == "tcp://dind:2375"  # podman does not read it: the job's value
    assert "SECRET_KEY" not in env


def test_apptainer_gets_nv_a_clean_environment_and_prefixed_variables() -> None:
    argv, env = container_process("apptainer", spec(), AGENT_ENV)

    assert argv == [
        "apptainer", "exec", "--nv", "--cleanenv", "--pwd=/workspace",
        f"docker://{IMAGE}", "python", "train.py",
    ]  # fmt: skip
    assert env == {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/home/agent",
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "APPTAINER_CACHEDIR": "/scratch/apptainer",
        "APPTAINERENV_WANDB_API_KEY": "s3cret",
        "APPTAINERENV_PATH": "/opt/conda/bin:/usr/bin:/bin",
        "APPTAINERENV_LD_PRELOAD": "/usr/lib/libjemalloc.so.2",
        "APPTAINERENV_DOCKER_HOST": "tcp://dind:2375",
        "APPTAINERENV_CUDA_VISIBLE_DEVICES": "GPU-aaaa,MIG-bbbb",
        "APPTAINERENV_GPUADMIN_JOB_ID": "12.3",
        "APPTAINERENV_NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,MIG-bbbb",
    }


@pytest.mark.parametrize(
    ("image", "source"),
    [
        ("ubuntu:22.04", "docker://ubuntu:22.04"),
        ("localhost:5000/team/train", "docker://localhost:5000/team/train"),
        ("/images/pytorch.sif", "/images/pytorch.sif"),
        ("./pytorch.sif", "./pytorch.sif"),
        ("pytorch.sif", "pytorch.sif"),
        ("oras://ghcr.io/team/train:1", "oras://ghcr.io/team/train:1"),
        ("docker://ubuntu:22.04", "docker://ubuntu:22.04"),
        ("docker-archive:/images/train.tar", "docker-archive:/images/train.tar"),
    ],
)
def test_apptainer_reads_registry_images_through_docker_uris(image: str, source: str) -> None:
    argv, _ = container_process("apptainer", spec(container_image=image), AGENT_ENV)

    assert argv[-3:] == [source, "python", "train.py"]


@pytest.mark.parametrize("runtime", ["docker", "podman", "apptainer"])
@pytest.mark.parametrize(
    ("gpu_uuids", "gpu_devices", "cuda_visible"),
    [((), True, ""), (GPUS, False, "GPU-aaaa,MIG-bbbb")],
    ids=["no-gpus", "simulated-gpus"],
)
def test_a_container_without_gpu_devices_gets_none_of_the_nodes(
    runtime: str, gpu_uuids: tuple[str, ...], gpu_devices: bool, cuda_visible: str
) -> None:
    job = spec(gpu_uuids=gpu_uuids, env={})

    argv, env = container_process(runtime, job, AGENT_ENV, gpu_devices=gpu_devices)

    assert not {"--gpus", "--device", "--nv"} & {arg.partition("=")[0] for arg in argv}
    # CUDA images ask for every GPU (NVIDIA_VISIBLE_DEVICES=all): void refuses them all.
    prefix = "APPTAINERENV_" if runtime == "apptainer" else ""
    assert env[f"{prefix}NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env[f"{prefix}CUDA_VISIBLE_DEVICES"] == cuda_visible


def test_only_a_container_job_has_a_container_workdir_and_it_is_absolute() -> None:
    with pytest.raises(ValueError, match="needs a container_image"):
        spec(container_image=None)
    with pytest.raises(ValueError, match="is not absolute"):
        spec(container_workdir="data")
    with pytest.raises(ValueError, match="no container image"):
        container_process("docker", spec(container_image=None, container_workdir=None), {})


# End to end, through a fake runtime.

FAKE_RUNTIME = '''#!{python}
"""docker, as far as the executor can tell: records its argv, then runs the container's
command itself (its variables from --env, in its --workdir, as its --user), so the job is a
real process. Every option must be one --name or --name=value argument before the image."""
import json, os, sys

args = sys.argv[1:]
with open({calls!r}, "a") as calls:
    calls.write(json.dumps(args) + "\\n")
if args[0] != "run":
    sys.exit(0)
env, workdir, user, i = {{"PATH": os.environ["PATH"]}}, None, None, 1
while args[i].startswith("-"):
    flag, _, value = args[i].partition("=")
    i += 1
    if flag == "--env":
        name, given, text = value.partition("=")
        env[name] = text if given else os.environ[name]
    elif flag == "--workdir":
        workdir = value
    elif flag == "--user":
        user = value
    elif flag not in ("--rm", "--init", "--name", "--gpus", "--device", "--cpuset-cpus",
                      "--memory", "--pids-limit", "--cgroup-parent"):
        sys.exit(f"fake docker: unknown option {{args[i - 1]}}")
if user:  # as docker does: only the uid and gid, no supplementary groups
    uid, gid = (int(part) for part in user.split(":"))
    if os.geteuid() == 0:
        os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
if workdir:
    os.chdir(workdir)
os.execve(args[i + 1], args[i + 1 :], env)  # args[i] is the image
'''


@dataclass
class FakeRuntime:
    bin_dir: Path
    calls_file: Path

    def calls(self) -> list[list[str]]:
        """The fake's argv (without its name) of each call so far."""
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]


def install(bin_dir: Path, name: str, text: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    """A fake ``docker`` first on the agent's ``PATH``."""
    fake = FakeRuntime(tmp_path / "bin", tmp_path / "docker-calls.jsonl")
    install(
        fake.bin_dir,
        "docker",
        FAKE_RUNTIME.format(python=sys.executable, calls=str(fake.calls_file)),
    )
    monkeypatch.setenv("PATH", f"{fake.bin_dir}{os.pathsep}{os.environ['PATH']}")
    return fake


# Docker executors of node ``node-7`` (see the ``make_executor`` fixture).
EXECUTOR_OPTIONS = {"container_runtime": "docker", "node_name": "node-7"}


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """Where the runtime's client starts on the host."""
    path = tmp_path / "scratch"
    path.mkdir()
    return path


def container_job(job_id: str, scratch: Path, argv: list[str], **fields: Any) -> JobSpec:
    return JobSpec(job_id=job_id, cwd=str(scratch), argv=argv, container_image=IMAGE, **fields)


def test_a_container_job_runs_in_its_runtime_with_its_gpus_variables_and_workdir(
    runtime: FakeRuntime,
    make_executor: MakeExecutor,
    scratch: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_SECRET", "hunter2")
    in_image = tmp_path / "workspace"  # the fake has no image: -w names a host directory
    in_image.mkdir()
    executor, events = make_executor()
    code = """
        import json, os
        print(json.dumps({"cwd": os.getcwd(), "env": dict(os.environ)}), flush=True)
        raise SystemExit(3)
    """
    argv = python(code)
    executor.launch(
        container_job(
            "12.3",
            scratch,
            argv,
            env={"EPOCHS": "3"},
            gpu_uuids=GPUS,
            container_workdir=str(in_image),
        )
    )

    finished = events.finished("12.3")
    assert (finished.state, finished.exit_code) == (FinalState.FAILED, 3)
    assert finished.message == "exited with code 3"
    assert events.started("12.3").pid > 0
    run, remove = runtime.calls()
    assert run == [
        "run", "--rm", "--init", "--name=gpuadmin-job-12-3",
        f"--user={os.geteuid()}:{os.getegid()}",  # this agent's own account
        '--gpus="device=GPU-aaaa,MIG-bbbb"',
        "--env=EPOCHS",
        "--env=CUDA_VISIBLE_DEVICES",
        "--env=GPUADMIN_JOB_ID",
        "--env=NVIDIA_VISIBLE_DEVICES",
        f"--workdir={in_image}",
        IMAGE, *argv,
    ]  # fmt: skip
    assert remove == ["rm", "-f", "gpuadmin-job-12-3"]  # a container never outlives its job
    seen = json.loads(executor.tail("12.3", 1))
    assert seen["cwd"] == str(in_image)
    assert {name: seen["env"].get(name) for name in ("EPOCHS", "AGENT_SECRET")} == {
        "EPOCHS": "3",
        "AGENT_SECRET": None,
    }
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == seen["env"]["NVIDIA_VISIBLE_DEVICES"]
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa,MIG-bbbb"
    assert not (tmp_path / "state" / "12.3.json").exists()


def test_cancel_sends_sigterm_through_the_runtime_client_and_removes_the_container(
    runtime: FakeRuntime, make_executor: MakeExecutor, scratch: Path
) -> None:
    executor, events = make_executor()
    code = """
        import signal, sys, time
        def stop(*_):
            print("got SIGTERM", flush=True)
            sys.exit(143)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        time.sleep(30)
    """
    executor.launch(container_job("polite", scratch, python(code)))
    wait_until(lambda: executor.tail("polite").endswith("ready\n"))

    assert executor.cancel("polite") is True

    finished = events.finished("polite")
    assert (finished.state, finished.exit_code) == (FinalState.CANCELED, 143)
    assert executor.tail("polite") == "ready\ngot SIGTERM\n"
    assert runtime.calls()[1:] == [["rm", "-f", "gpuadmin-job-polite"]]


@pytest.mark.parametrize("stop", ["cancel", "max-runtime"])
def test_a_container_job_that_ignores_sigterm_is_killed_by_the_runtime_after_the_grace(
    runtime: FakeRuntime, make_executor: MakeExecutor, scratch: Path, stop: str
) -> None:
    executor, events = make_executor()
    code = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(30)
    """
    limit = {"max_runtime_s": 0.5} if stop == "max-runtime" else {}
    executor.launch(container_job("stubborn", scratch, python(code), **limit))
    wait_until(lambda: executor.tail("stubborn").endswith("ready\n"))
    if stop == "cancel":
        executor.cancel("stubborn")

    finished = events.finished("stubborn")
    state = FinalState.CANCELED if stop == "cancel" else FinalState.TIMED_OUT
    assert (finished.state, finished.exit_code) == (state, -signal.SIGKILL)
    assert runtime.calls()[1:] == [
        ["kill", "gpuadmin-job-stubborn"],
        ["rm", "-f", "gpuadmin-job-stubborn"],
    ]


@pytest.mark.parametrize(
    ("runtime_setting", "path", "message"),
    [
        ("none", None, "no container runtime on node-7: set GPUADMIN_CONTAINER_RUNTIME"),
        (
            "docker",
            "empty",
            "no container runtime on node-7 (docker is not on PATH): "
            "set GPUADMIN_CONTAINER_RUNTIME",
        ),
    ],
    ids=["none", "missing-binary"],
)
def test_a_container_job_on_a_node_without_a_runtime_fails_at_once_instead_of_on_the_host(
    runtime: FakeRuntime,
    make_executor: MakeExecutor,
    scratch: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runtime_setting: str,
    path: str | None,
    message: str,
) -> None:
    if path is not None:
        (tmp_path / path).mkdir()
        monkeypatch.setenv("PATH", str(tmp_path / path))
    executor, events = make_executor(container_runtime=runtime_setting)
    marker = scratch / "ran-on-the-host"
    executor.launch(container_job("img", scratch, ["/usr/bin/touch", str(marker)]))

    [finished] = events.of("img")
    assert isinstance(finished, JobFinished)
    assert (finished.state, finished.exit_code, finished.message) == (
        FinalState.FAILED,
        None,
        message,
    )
    assert executor.tail("img") == f"gpuadmin: {message}\n"
    assert executor.running() == []
    assert list((tmp_path / "state").iterdir()) == []
    assert runtime.calls() == []
    assert not marker.exists()


def test_a_job_without_an_image_still_runs_on_the_host(
    runtime: FakeRuntime, make_executor: MakeExecutor, scratch: Path
) -> None:
    executor, events = make_executor()
    executor.launch(JobSpec(job_id="host", cwd=str(scratch), argv=python("print('on host')")))

    assert events.finished("host").state == FinalState.COMPLETED
    assert executor.tail("host") == "on host\n"
    assert runtime.calls() == []


@pytest.mark.parametrize(
    ("installed", "found"),
    [(["podman", "apptainer"], "podman"), (["apptainer", "docker"], "docker"), ([], "none")],
)
def test_auto_picks_the_first_runtime_on_path(
    make_executor: MakeExecutor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    installed: list[str],
    found: str,
) -> None:
    bin_dir = tmp_path / "runtimes"
    bin_dir.mkdir()
    for name in installed:
        install(bin_dir, name, "#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(bin_dir))

    executor, _ = make_executor(container_runtime="auto")

    assert executor.container_runtime == found


def test_an_unknown_runtime_is_refused(make_executor: MakeExecutor) -> None:
    with pytest.raises(ValueError, match="unknown container runtime 'containerd'"):
        make_executor(container_runtime="containerd")


def leave_running(make_executor: MakeExecutor, job: JobSpec) -> int:
    """Start a container job, then stop the agent without killing it (an agent restart)."""
    executor, events = make_executor()
    executor.launch(job)
    pid = events.started(job.job_id).pid
    wait_until(lambda: "ready" in executor.tail(job.job_id))
    executor.shutdown(kill=False)
    assert alive(pid)
    return pid


@abandons_processes
def test_a_restarted_agent_readopts_a_container_job_and_can_cancel_it(
    runtime: FakeRuntime, make_executor: MakeExecutor, scratch: Path
) -> None:
    pid = leave_running(make_executor, container_job("survivor", scratch, SLEEP))
    # The runtime the job was started with is in its record, whatever this agent is given.
    executor, events = make_executor(container_runtime="none")

    [adopted] = executor.reconcile()
    assert (adopted.job_id, adopted.pid, adopted.adopted) == ("survivor", pid, True)
    executor.cancel("survivor")

    finished = events.finished("survivor")
    assert finished.state == FinalState.CANCELED
    assert not alive(pid)
    assert runtime.calls()[1:] == [["rm", "-f", "gpuadmin-job-survivor"]]


@abandons_processes
def test_a_container_job_found_lost_after_a_restart_has_its_container_removed(
    runtime: FakeRuntime, make_executor: MakeExecutor, scratch: Path
) -> None:
    pid = leave_running(make_executor, container_job("gone", scratch, SLEEP))
    os.killpg(pid, signal.SIGKILL)  # the client dies; its container would run on
    wait_until(lambda: not alive(pid))
    executor, _ = make_executor()

    [lost] = executor.reconcile()

    assert isinstance(lost, JobFinished)
    assert (lost.job_id, lost.state) == ("gone", FinalState.LOST)
    assert runtime.calls()[1:] == [["rm", "-f", "gpuadmin-job-gone"]]


def test_the_agent_runs_a_placed_job_with_an_image_in_its_container(
    runtime: FakeRuntime, settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings.GPUADMIN_DATA_DIR = tmp_path / "data"
    settings.GPUADMIN_NODE_NAME = "dgx-01"
    settings.GPUADMIN_NVML = "real"
    settings.GPUADMIN_CONTAINER_RUNTIME = "auto"  # finds the fake docker
    broker = RecordingBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    monkeypatch.setattr(agent, "_executor", None)
    # No live sample of this made-up node goes to the shared Redis when the job ends.
    monkeypatch.setattr(agent, "publish_sample", lambda hostname: None)
    in_image = tmp_path / "workspace"
    in_image.mkdir()
    command = "echo $GPUADMIN_JOB_ID $CUDA_VISIBLE_DEVICES; pwd"

    def reported() -> list[str]:
        sent = broker.named("scheduling.job_events")
        events = [event_from_dict(event) for args, _ in sent for event in args[0]]
        return [e.state if isinstance(e, JobFinished) else "started" for e in events]

    try:
        agent.run_job(
            JobSpec(  # as the central side sends a job with an image and a working directory
                job_id="5.1",
                unix_user=Account.own().name,  # the test's account, root in CI
                allow_root=True,
                shell_command=command,
                gpu_uuids=["GPU-aaaa"],
                gpu_minors=[0],  # /dev/nvidia0: the device its cgroup lets it open
                container_image="alpine:3.20",
                container_workdir=str(in_image),
            ).to_dict()
        )
        wait_until(lambda: "completed" in reported())
    finally:
        agent.executor().shutdown(kill=True)

    assert reported() == ["started", "completed"]
    run, _ = runtime.calls()
    assert run[:4] == ["run", "--rm", "--init", "--name=gpuadmin-job-5-1"]
    assert run[-5:] == [f"--workdir={in_image}", "alpine:3.20", "/bin/sh", "-c", command]
    if os.geteuid() == 0:  # a root agent confines the job: the container gets its limits
        assert "--pids-limit=4096" in run[: run.index("alpine:3.20")]
    assert agent.tail_log(5, 1, 10)["text"] == f"5.1 GPU-aaaa\n{in_image}\n"
    # Its client started in the agent's scratch directory, not in the image's workdir.
    assert (agent.agent_dir("dgx-01") / "work" / "5.1").is_dir()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cwd": "runs/today"}, "working directory 'runs/today' is not an absolute path"),
        (
            {"container_image": "--privileged"},
            "container image '--privileged' is not valid: it starts with '-' or holds white "
            "space or control characters",
        ),
    ],
    ids=["relative-workdir", "image-as-option"],
)
def test_the_agent_fails_a_job_it_cannot_start_instead_of_leaving_it_scheduled(
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    fields: dict[str, str],
    message: str,
) -> None:
    """A spec the executor refuses (a relative working directory, or an image that would be
    an option of the runtime, from an older central worker, which now rejects them at
    submission) is reported failed, with the reason."""
    settings.GPUADMIN_DATA_DIR = tmp_path / "data"
    settings.GPUADMIN_NODE_NAME = "dgx-01"
    broker = RecordingBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    monkeypatch.setattr(agent, "_executor", None)
    # No live sample of this made-up node goes to the shared Redis when the job ends.
    monkeypatch.setattr(agent, "publish_sample", lambda hostname: None)
    agent.run_job({"job_id": "6.1", "argv": ["true"], **fields})
    agent.flush_reports()  # what the agent's sender thread does
    [(args, _)] = broker.named("scheduling.job_events")
    [failed] = [event_from_dict(event) for event in args[0]]
    assert isinstance(failed, JobFinished)
    assert (failed.job_id, failed.state) == ("6.1", FinalState.FAILED)
    assert failed.message == f"cannot start: {message}"
