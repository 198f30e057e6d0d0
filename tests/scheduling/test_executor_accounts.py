"""Jobs run as their owner's Unix account, like Slurm: an executor running as root starts each
job with its account's uid, gid and groups (containers with ``--user uid:gid``), gives it its
log and scratch folder, refuses root unless allowed and fails a job whose account the node
lacks. Real accounts, made with ``useradd`` (root only: CI runs as root)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduling.agent.containers import container_process
from scheduling.agent.wire import Account, FinalState, JobFinished, JobSpec
from tests.scheduling.executors import MakeExecutor
from tests.scheduling.test_executor import abandons_processes, alive, wait_until
from tests.scheduling.test_executor_containers import FAKE_RUNTIME, IMAGE, install
from tests.unix_accounts import new_name, requires_root, unix_user

pytestmark = requires_root

# What the job tells about itself: uid, gid, all its groups, where it runs, who it thinks it is.
WHO_AM_I = 'id -u; id -g; id -G; pwd; echo "$HOME $USER $LOGNAME"'


@pytest.fixture
def alice() -> Iterator[pwd.struct_passwd]:
    with unix_user() as entry:
        yield entry


@pytest.fixture
def scratch_root() -> Iterator[Path]:
    """Where the agent keeps its jobs' scratch folders: outside pytest's private temporary
    folder, which no other account can enter."""
    path = Path(tempfile.mkdtemp(prefix="gpuadmin-accounts-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def make_owner_executor(make_executor: MakeExecutor, scratch_root: Path) -> MakeExecutor:
    """Executors as a root agent runs them: each job as its owner's account."""

    def make(**options: Any) -> Any:
        return make_executor(
            jobs_as_owner=True, scratch_dir=scratch_root / "work", node_name="node-7", **options
        )

    return make


def owned_job(job_id: str, unix_user: str, **fields: Any) -> JobSpec:
    return JobSpec(job_id=job_id, unix_user=unix_user, shell_command=WHO_AM_I, **fields)


def groups_of(entry: pwd.struct_passwd) -> set[int]:
    return set(os.getgrouplist(entry.pw_name, entry.pw_gid))


def test_a_job_runs_as_its_owners_account_with_its_groups_and_owns_its_log_and_scratch(
    make_owner_executor: MakeExecutor, alice: pwd.struct_passwd, scratch_root: Path
) -> None:
    executor, events = make_owner_executor()

    executor.launch(owned_job("7.1", alice.pw_name))

    finished = events.finished("7.1")
    assert (finished.state, finished.exit_code) == (FinalState.COMPLETED, 0), finished.message
    uid, gid, groups, cwd, who = executor.tail("7.1").splitlines()
    assert (int(uid), int(gid)) == (alice.pw_uid, alice.pw_gid)
    assert {int(group) for group in groups.split()} == groups_of(alice)
    assert len(groups_of(alice)) == 2  # its own group and the supplementary one
    scratch = scratch_root / "work" / "7.1"
    assert cwd == str(scratch)
    assert who == f"{alice.pw_dir} {alice.pw_name} {alice.pw_name}"
    for path in (executor.log_path("7.1"), scratch):
        owner = path.stat()
        assert (owner.st_uid, owner.st_gid) == (alice.pw_uid, alice.pw_gid), path
    assert stat.S_IMODE(executor.log_path("7.1").stat().st_mode) == 0o640


def test_the_pieces_of_a_rotated_log_belong_to_the_jobs_owner(
    make_owner_executor: MakeExecutor, alice: pwd.struct_passwd
) -> None:
    executor, events = make_owner_executor(log_max_bytes=100, log_backups=2)
    spec = JobSpec(
        job_id="7.2",
        unix_user=alice.pw_name,
        shell_command="i=0; while [ $i -lt 50 ]; do echo line $i; i=$((i+1)); done",
    )

    executor.launch(spec)

    assert events.finished("7.2").state == FinalState.COMPLETED
    log = executor.log_path("7.2")
    pieces = [log.with_name(f"{log.name}.{n}") for n in (1, 2)]
    assert all(piece.exists() for piece in pieces)
    for path in (log, *pieces):
        owner = path.stat()
        assert (owner.st_uid, owner.st_gid, stat.S_IMODE(owner.st_mode)) == (
            alice.pw_uid,
            alice.pw_gid,
            0o640,
        ), path


@pytest.mark.parametrize(
    ("allow_root", "state", "message"),
    [
        (
            False,
            FinalState.FAILED,
            "Unix account 'root' is root (uid 0) on node-7, and its owner may not run jobs as root",
        ),
        (True, FinalState.COMPLETED, ""),
    ],
    ids=["refused", "allowed"],
)
def test_root_runs_a_job_only_when_its_owner_is_allowed_it(
    make_owner_executor: MakeExecutor, allow_root: bool, state: FinalState, message: str
) -> None:
    executor, events = make_owner_executor()

    executor.launch(owned_job("7.3", "root", allow_root=allow_root))

    finished = events.finished("7.3")
    assert (finished.state, finished.message) == (state, message)
    if allow_root:
        assert executor.tail("7.3").splitlines()[:2] == ["0", "0"]
    else:
        assert executor.tail("7.3") == f"gpuadmin: {message}\n"


def test_a_job_whose_account_the_node_lacks_fails_with_the_reason(
    make_owner_executor: MakeExecutor,
) -> None:
    executor, events = make_owner_executor()
    missing = new_name()

    executor.launch(owned_job("7.4", missing))

    [finished] = events.of("7.4")
    assert isinstance(finished, JobFinished)
    assert (finished.state, finished.exit_code, finished.message) == (
        FinalState.FAILED,
        None,
        f"no Unix account '{missing}' on node-7",
    )
    assert executor.running() == []


def test_a_root_agent_refuses_a_job_that_names_no_account(
    make_owner_executor: MakeExecutor,
) -> None:
    executor, events = make_owner_executor()

    executor.launch(JobSpec(job_id="7.5", shell_command="id -u"))

    finished = events.finished("7.5")
    assert (finished.state, finished.message) == (
        FinalState.FAILED,
        "the job names no Unix account to run as",
    )


def test_an_agent_that_is_not_root_runs_jobs_as_itself(
    make_executor: MakeExecutor, alice: pwd.struct_passwd, tmp_path: Path
) -> None:
    executor, events = make_executor(jobs_as_owner=False)

    executor.launch(owned_job("7.6", alice.pw_name, cwd=str(tmp_path)))

    assert events.finished("7.6").state == FinalState.COMPLETED
    assert executor.tail("7.6").splitlines()[0] == str(os.geteuid())


@abandons_processes
def test_a_restarted_agent_readopts_a_job_running_as_its_owner_and_can_cancel_it(
    make_owner_executor: MakeExecutor, alice: pwd.struct_passwd
) -> None:
    first, events = make_owner_executor()
    first.launch(
        JobSpec(job_id="7.7", unix_user=alice.pw_name, shell_command="echo ready; sleep 30")
    )
    pid = events.started("7.7").pid
    wait_until(lambda: "ready" in first.tail("7.7"))
    first.shutdown(kill=False)
    assert Path(f"/proc/{pid}").stat().st_uid == alice.pw_uid

    second, events = make_owner_executor()
    [adopted] = second.reconcile()
    assert (adopted.job_id, adopted.pid) == ("7.7", pid)
    second.cancel("7.7")

    finished = events.finished("7.7")
    assert (finished.state, finished.exit_code) == (FinalState.CANCELED, None)
    assert not alive(pid)
    assert finished.message == "canceled"


# Containers


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``docker`` first on ``PATH`` that applies ``--user`` as docker does; returns
    where it records its calls."""
    calls = tmp_path / "docker-calls.jsonl"
    install(
        tmp_path / "bin", "docker", FAKE_RUNTIME.format(python=sys.executable, calls=str(calls))
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_a_container_job_runs_as_its_owners_uid_and_gid(
    make_owner_executor: MakeExecutor, alice: pwd.struct_passwd, fake_docker: Path
) -> None:
    executor, events = make_owner_executor(container_runtime="docker")

    executor.launch(owned_job("7.8", alice.pw_name, container_image=IMAGE))

    assert events.finished("7.8").state == FinalState.COMPLETED
    uid, gid = executor.tail("7.8").splitlines()[:2]
    assert (int(uid), int(gid)) == (alice.pw_uid, alice.pw_gid)
    assert f"--user={alice.pw_uid}:{alice.pw_gid}" in fake_docker.read_text()
    owner = executor.log_path("7.8").stat()
    assert (owner.st_uid, owner.st_gid) == (alice.pw_uid, alice.pw_gid)


def test_apptainer_is_started_as_the_owners_account(
    make_owner_executor: MakeExecutor,
    alice: pwd.struct_passwd,
    scratch_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Apptainer runs a container as whoever starts it: this fake (``apptainer exec --cleanenv
    # IMAGE COMMAND...``) runs the command as it is. Outside pytest's folder, for alice to run.
    install(scratch_root / "bin", "apptainer", '#!/bin/sh\nshift 3\nexec "$@"\n')
    monkeypatch.setenv("PATH", f"{scratch_root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    executor, events = make_owner_executor(container_runtime="apptainer", container_gpus=False)

    executor.launch(owned_job("7.9", alice.pw_name, container_image="/images/train.sif"))

    assert events.finished("7.9").state == FinalState.COMPLETED
    assert executor.tail("7.9").splitlines()[0] == str(alice.pw_uid)


HOSTILE = "--privileged -v=/:/host"


@pytest.mark.parametrize("runtime", ["docker", "podman", "apptainer"])
def test_nothing_the_owner_chose_comes_before_the_image(runtime: str) -> None:
    spec = JobSpec(
        job_id="8.1",
        cwd="/scratch",
        argv=["--privileged", "-v=/:/host"],
        env={"A": HOSTILE, "PATH": HOSTILE, "DOCKER_CONFIG": HOSTILE},
        gpu_uuids=["GPU-aaaa"],
        container_image="ubuntu:22.04",
        container_workdir=f"/work {HOSTILE}",
    )
    account = Account("alice", 1001, 1002, (1002,), "/home/alice")

    argv, _ = container_process(runtime, spec, {"PATH": "/usr/bin"}, account=account)

    image = next(i for i, arg in enumerate(argv) if arg.endswith("ubuntu:22.04"))
    options = argv[2:image]
    ours = {"--rm", "--init", "--name", "--user", "--gpus", "--device", "--env", "--workdir"}
    ours |= {"--nv", "--cleanenv", "--pwd"}
    # Each is one of gpuadmin's options, with its value (the owner's, if any) in the same word.
    assert {option.partition("=")[0] for option in options} <= ours
    assert argv[image + 1 :] == ["--privileged", "-v=/:/host"]
    if runtime != "apptainer":
        assert "--user=1001:1002" in options


@pytest.mark.parametrize(
    "image", ["-v=/:/host", "--privileged", "ubuntu latest", "ubuntu\n", "ubuntu\x00", ""]
)
def test_an_image_that_could_be_read_as_an_option_is_refused(image: str) -> None:
    with pytest.raises(ValueError, match="container image .* is not valid"):
        JobSpec(job_id="8.2", cwd="/", argv=["true"], container_image=image)
