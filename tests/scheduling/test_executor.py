"""The node agent's job executor, with real subprocesses (no database)."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduling.agent.wire import FinalState, JobFinished, JobSpec, JobStarted, RayPart
from tests.scheduling.executors import GRACE_S, MakeExecutor


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *args]


def job(job_id: str, workdir: Path, argv: list[str] | None = None, **fields: Any) -> JobSpec:
    return JobSpec(job_id=job_id, cwd=str(workdir), argv=argv or [], **fields)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its parent does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


SLEEP = python("import time; print('ready', flush=True); time.sleep(30)")


def test_job_gets_a_clean_environment_plus_its_variables_and_gpus(
    make_executor: MakeExecutor, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("USER", "LOGNAME", "LC_ALL", "TZ", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", "/opt/agent/bin:/usr/bin:/bin")
    monkeypatch.setenv("HOME", "/home/agent")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("AGENT_SECRET", "hunter2")
    executor, events = make_executor()
    executor.launch(
        job(
            "env",
            workdir,
            python("import json, os; print(json.dumps(dict(os.environ)))"),
            env={"EPOCHS": "3", "PATH": "/job/bin:/usr/bin", "CUDA_VISIBLE_DEVICES": "all"},
            gpu_uuids=["GPU-aaaa", "MIG-bbbb"],
        )
    )

    assert events.finished("env").state == FinalState.COMPLETED
    assert json.loads(executor.tail("env", 1)) == {
        "PATH": "/job/bin:/usr/bin",
        "HOME": "/home/agent",
        "LANG": "C.UTF-8",
        "EPOCHS": "3",
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa,MIG-bbbb",
        "GPUADMIN_JOB_ID": "env",
    }


def test_a_job_without_gpus_sees_none(make_executor: MakeExecutor, workdir: Path) -> None:
    executor, events = make_executor()
    code = "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    executor.launch(job("cpu", workdir, python(code)))

    events.finished("cpu")
    assert executor.tail("cpu") == "''\n"


def test_argv_is_passed_literally_without_a_shell(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    executor, events = make_executor()
    executor.launch(
        job("argv", workdir, python("import sys; print(sys.argv[1:])", "a; rm -rf x", "$HOME", "*"))
    )

    events.finished("argv")
    assert executor.tail("argv") == "['a; rm -rf x', '$HOME', '*']\n"


def test_a_shell_command_runs_in_sh(make_executor: MakeExecutor, workdir: Path) -> None:
    executor, events = make_executor()
    executor.launch(job("sh", workdir, shell_command="echo $GPUADMIN_JOB_ID; echo b | tr b B"))

    assert events.finished("sh").state == FinalState.COMPLETED
    assert executor.tail("sh") == "sh\nB\n"


def test_job_runs_in_its_working_directory(make_executor: MakeExecutor, workdir: Path) -> None:
    executor, events = make_executor()
    executor.launch(job("cwd", workdir, python("import os; print(os.getcwd())")))

    events.finished("cwd")
    assert executor.tail("cwd") == f"{workdir}\n"


@pytest.mark.parametrize(
    ("cwd", "argv", "error"),
    [
        ("missing", ["true"], "working directory '{workdir}/missing' does not exist"),
        (None, ["true"], "no working directory given"),  # the agent gives one; a bug if not
        (".", ["no-such-program-4e1f"], "cannot start 'no-such-program-4e1f': [Errno 2]"),
        (".", ["{workdir}/notes.txt"], "cannot start '{workdir}/notes.txt': [Errno 13]"),
    ],
    ids=["missing-cwd", "no-cwd", "missing-executable", "not-executable"],
)
def test_a_job_that_cannot_start_fails_with_the_error_in_event_and_log(
    make_executor: MakeExecutor, workdir: Path, cwd: str | None, argv: list[str], error: str
) -> None:
    (workdir / "notes.txt").write_text("not a program")
    argv = [arg.format(workdir=workdir) for arg in argv]
    executor, events = make_executor()
    path = None if cwd is None else os.path.normpath(workdir / cwd)
    executor.launch(JobSpec(job_id="bad", cwd=path, argv=argv))

    [finished] = events.of("bad")
    assert isinstance(finished, JobFinished)
    assert (finished.state, finished.exit_code) == (FinalState.FAILED, None)
    assert finished.message.startswith(error.format(workdir=workdir))
    assert executor.tail("bad") == f"gpuadmin: {finished.message}\n"
    assert executor.running() == []
    assert list((workdir.parent / "state").iterdir()) == []


@pytest.mark.parametrize(
    ("code", "state", "exit_code", "message"),
    [
        ("pass", FinalState.COMPLETED, 0, ""),
        ("raise SystemExit(3)", FinalState.FAILED, 3, "exited with code 3"),
        (
            "import os; os.kill(os.getpid(), 9)",
            FinalState.FAILED,
            -9,
            "killed by signal 9 (Killed)",
        ),
    ],
    ids=["exit-0", "exit-3", "killed"],
)
def test_exit_status_decides_the_final_state(
    make_executor: MakeExecutor,
    workdir: Path,
    code: str,
    state: FinalState,
    exit_code: int,
    message: str,
) -> None:
    executor, events = make_executor()
    executor.launch(job("exit", workdir, python(code)))

    events.finished("exit")
    started, finished = events.of("exit")
    assert isinstance(started, JobStarted)
    assert isinstance(finished, JobFinished)
    assert (finished.state, finished.exit_code, finished.message) == (state, exit_code, message)
    assert finished.finished_at >= started.started_at
    assert executor.running() == []


def test_stdout_and_stderr_share_the_log_and_tail_reads_its_end(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    executor, events = make_executor()
    code = """
        import sys
        for i in range(5):
            print(f"out {i}", flush=True)
            print(f"err {i}", file=sys.stderr, flush=True)
        sys.stdout.write("no newline")
    """
    executor.launch(job("log", workdir, python(code)))

    events.finished("log")
    assert executor.log_path("log").read_text().startswith("out 0\nerr 0\nout 1\n")
    assert executor.tail("log", 3) == "out 4\nerr 4\nno newline"
    assert executor.tail("log", 0) == ""
    assert executor.tail("never-ran") == ""


def test_log_rotation_keeps_each_file_under_the_limit_and_the_newest_output(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    executor, events = make_executor(log_max_bytes=1000, log_backups=2)
    # Two bursts of 10-byte lines, the second after the first was rotated.
    code = """
        import os, time
        os.write(1, b"".join(b"%09d\\n" % i for i in range(250)))
        time.sleep(0.3)
        os.write(1, b"".join(b"%09d\\n" % i for i in range(250, 400)))
    """
    executor.launch(job("big", workdir, python(code)))

    events.finished("big")
    log = executor.log_path("big")
    files = [log.with_name("big.log.2"), log.with_name("big.log.1"), log]
    assert [f.stat().st_size <= 1000 for f in files] == [True, True, True]
    assert not log.with_name("big.log.3").exists()
    kept = b"".join(f.read_bytes() for f in files)
    everything = b"".join(b"%09d\n" % i for i in range(400))
    assert len(kept) >= 1000
    assert everything.endswith(kept)
    assert executor.tail("big", 120) == everything[-1200:].decode()


def test_max_runtime_terminates_the_job(make_executor: MakeExecutor, workdir: Path) -> None:
    executor, events = make_executor()
    executor.launch(job("slow", workdir, SLEEP, max_runtime_s=0.3))

    started = events.started("slow")
    finished = events.finished("slow")
    assert (finished.state, finished.exit_code) == (FinalState.TIMED_OUT, -signal.SIGTERM)
    assert finished.message == "ran past its maximum runtime of 0.3 s"
    assert finished.finished_at - started.started_at >= timedelta(seconds=0.3)


def test_max_runtime_kills_a_job_that_ignores_sigterm_after_the_grace(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    executor, events = make_executor()
    code = """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *_: print("got SIGTERM", flush=True))
        print("ready", flush=True)
        while True:
            time.sleep(1)
    """
    executor.launch(job("stubborn", workdir, python(code), max_runtime_s=1.0))

    started = events.started("stubborn")
    finished = events.finished("stubborn")
    assert (finished.state, finished.exit_code) == (FinalState.TIMED_OUT, -signal.SIGKILL)
    assert finished.finished_at - started.started_at >= timedelta(seconds=1.0 + GRACE_S)
    assert executor.tail("stubborn") == "ready\ngot SIGTERM\n"


def test_cancel_kills_the_whole_process_tree(make_executor: MakeExecutor, workdir: Path) -> None:
    executor, events = make_executor()
    # The job's child ignores SIGTERM: only the SIGKILL after the grace ends it.
    child = """if 1:
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(30)
    """
    code = f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {child!r}])
        print(child.pid, flush=True)
        time.sleep(30)
    """
    executor.launch(job("tree", workdir, python(code)))
    wait_until(lambda: executor.tail("tree").endswith("ready\n"))
    child_pid = int(executor.tail("tree", 2).split()[0])

    assert executor.cancel("tree") is True
    finished = events.finished("tree")
    assert (finished.state, finished.exit_code) == (FinalState.CANCELED, -signal.SIGTERM)
    assert not alive(child_pid)
    assert executor.cancel("tree") is False


STUBBORN = """
    import signal, time
    signal.signal(signal.SIGTERM, lambda *_: print("got SIGTERM", flush=True))
    print("ready", flush=True)
    while True:
        time.sleep(1)
"""


def test_a_kill_is_sigkill_at_once(make_executor: MakeExecutor, workdir: Path) -> None:
    """``gpuadmin jobs kill``: no SIGTERM, no grace (the executor's own grace is 30 s here)."""
    executor, events = make_executor(kill_grace_s=30)
    executor.launch(job("kill", workdir, python(STUBBORN)))
    wait_until(lambda: executor.tail("kill") == "ready\n")
    asked = time.monotonic()
    assert executor.cancel("kill", stop_signal=signal.SIGKILL, grace_s=0)
    finished = events.finished("kill")
    assert (finished.state, finished.exit_code) == (FinalState.CANCELED, -signal.SIGKILL)
    assert time.monotonic() - asked < 5
    assert executor.tail("kill") == "ready\n"  # it never saw a SIGTERM


def test_a_kill_cuts_short_the_grace_of_a_cancel_under_way(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    executor, events = make_executor()
    executor.launch(job("stuck", workdir, python(STUBBORN)))
    wait_until(lambda: executor.tail("stuck") == "ready\n")
    assert executor.cancel("stuck", grace_s=60)  # the job ignores it: 60 s to wait
    wait_until(lambda: executor.tail("stuck") == "ready\ngot SIGTERM\n")
    asked = time.monotonic()
    assert executor.cancel("stuck", stop_signal=signal.SIGKILL, grace_s=0)
    finished = events.finished("stuck")
    assert (finished.state, finished.exit_code) == (FinalState.CANCELED, -signal.SIGKILL)
    assert time.monotonic() - asked < 5


def test_processes_left_behind_are_killed_when_the_job_ends(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    executor, events = make_executor()
    executor.launch(job("bg", workdir, shell_command="sleep 30 & echo $! > leftover.pid"))

    assert events.finished("bg").state == FinalState.COMPLETED
    assert not alive(int((workdir / "leftover.pid").read_text()))


def test_a_jobs_end_is_reported_at_once_not_at_the_next_poll(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    # Polled only every minute: the end must come from the child's exit itself.
    executor, events = make_executor(poll_interval_s=60)
    executor.launch(job("quick", workdir, ["sleep", "0.2"]))

    started = events.started("quick")
    finished = events.finished("quick", timeout=5)
    assert finished.state == FinalState.COMPLETED
    # 0.2 s of sleep, then tens of milliseconds (on a loaded test machine: under a second).
    assert finished.finished_at - started.started_at < timedelta(seconds=1)


def test_a_running_job_is_recorded_in_the_state_directory_until_it_ends(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    executor, events = make_executor()
    executor.launch(job("rec", workdir, SLEEP, gpu_uuids=["GPU-1"], env={"TOKEN": "secret"}))
    started = events.started("rec")
    record_path = workdir.parent / "state" / "rec.json"

    record = json.loads(record_path.read_text())
    assert record["pid"] == started.pid
    assert record["started_at"] == started.started_at.isoformat()
    assert record["log_path"] == str(executor.log_path("rec"))
    assert record["spec"]["gpu_uuids"] == ["GPU-1"]
    assert "env" not in record["spec"]
    assert executor.running() == ["rec"]

    executor.cancel("rec")
    events.finished("rec")
    assert not record_path.exists()


def test_process_hooks_follow_the_job_and_a_failing_hook_changes_nothing(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    calls: list[tuple[str, str, int]] = []

    def started(spec: JobSpec, pid: int) -> None:
        calls.append(("started", spec.job_id, pid))
        raise ValueError("the simulator refused")

    executor, events = make_executor(
        on_process_started=started,
        on_process_ended=lambda spec, pid: calls.append(("ended", spec.job_id, pid)),
    )
    executor.launch(job("hooked", workdir, python("pass")))

    finished = events.finished("hooked")
    pid = events.started("hooked").pid
    assert calls == [("started", "hooked", pid), ("ended", "hooked", pid)]
    assert finished.state == FinalState.COMPLETED


def test_launching_a_running_job_again_is_refused(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    executor, events = make_executor()
    executor.launch(job("twice", workdir, SLEEP))

    with pytest.raises(ValueError, match="already running"):
        executor.launch(job("twice", workdir, SLEEP))
    events.started("twice")
    assert [type(e) for e in events.of("twice")] == [JobStarted]


def test_shutdown_with_kill_cancels_every_job(make_executor: MakeExecutor, workdir: Path) -> None:
    executor, events = make_executor()
    executor.launch(job("a", workdir, SLEEP))
    executor.launch(job("b", workdir, SLEEP))

    executor.shutdown(kill=True, message="node dgx-01 stopped")

    ended = [events.finished(j) for j in ("a", "b")]
    assert [(e.state, e.message) for e in ended] == [
        (FinalState.CANCELED, "node dgx-01 stopped")
    ] * 2
    assert executor.running() == []
    with pytest.raises(RuntimeError, match="shut down"):
        executor.launch(job("c", workdir, SLEEP))


# An agent that stops without killing its jobs drops their Popen objects on purpose.
abandons_processes = pytest.mark.filterwarnings(
    r"ignore:subprocess \d+ is still running:ResourceWarning"
)


def start_and_leave(make_executor: MakeExecutor, *specs: JobSpec) -> list[JobStarted]:
    """Launch jobs, then stop the agent without killing them (as an agent restart does)."""
    executor, events = make_executor()
    for spec in specs:
        executor.launch(spec)
    started = [events.started(spec.job_id) for spec in specs]
    for spec in specs:
        wait_until(lambda spec=spec: "ready" in executor.tail(spec.job_id))
    executor.shutdown(kill=False)
    assert executor.running() == []
    assert all(alive(event.pid) for event in started)
    return started


@abandons_processes
def test_reconcile_readopts_a_job_that_still_runs(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    code = """
        import time
        print("ready", flush=True)
        time.sleep(0.5)
        print("done", flush=True)
    """
    [started] = start_and_leave(make_executor, job("survivor", workdir, python(code)))
    ended: list[int] = []
    executor, events = make_executor(on_process_ended=lambda spec, pid: ended.append(pid))

    assert executor.reconcile() == [replace(started, adopted=True)]
    assert events.events == [replace(started, adopted=True)]
    assert executor.running() == ["survivor"]
    finished = events.finished("survivor")
    # No longer our child: its exit status cannot be known.
    assert (finished.state, finished.exit_code) == (FinalState.LOST, None)
    assert executor.tail("survivor") == "ready\ndone\n"
    assert ended == [started.pid]
    assert executor.running() == []


@abandons_processes
def test_an_adopted_job_can_be_canceled_and_keeps_its_max_runtime(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    start_and_leave(
        make_executor,
        job("to-cancel", workdir, SLEEP),
        job("to-time-out", workdir, SLEEP, max_runtime_s=1.0),
    )
    executor, events = make_executor()
    assert [e.job_id for e in executor.reconcile()] == ["to-cancel", "to-time-out"]

    executor.cancel("to-cancel")

    assert events.finished("to-cancel").state == FinalState.CANCELED
    assert events.finished("to-time-out").state == FinalState.TIMED_OUT


@abandons_processes
def test_reconcile_reports_a_job_whose_process_vanished_as_lost(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    [started] = start_and_leave(make_executor, job("gone", workdir, SLEEP))
    pid = started.pid
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid))
    ended: list[tuple[str, int]] = []
    executor, events = make_executor(
        on_process_ended=lambda spec, pid: ended.append((spec.job_id, pid))
    )

    [lost] = executor.reconcile()

    assert isinstance(lost, JobFinished)
    assert (lost.job_id, lost.state, lost.exit_code) == ("gone", FinalState.LOST, None)
    assert lost.message == f"its process {pid} ended while no agent was watching it"
    assert events.events == [lost]
    assert ended == [("gone", pid)]
    assert executor.running() == []
    assert executor.reconcile() == []


@abandons_processes
@pytest.mark.parametrize("field", ["start_ticks", "boot_id"])
def test_reconcile_never_adopts_another_process_with_the_same_pid(
    make_executor: MakeExecutor, workdir: Path, field: str
) -> None:
    [started] = start_and_leave(make_executor, job("reused", workdir, SLEEP))
    pid = started.pid
    try:
        # The recorded process is gone; another one now has its pid (or the node rebooted).
        record_path = workdir.parent / "state" / "reused.json"
        record = json.loads(record_path.read_text())
        record[field] = record[field] + 1 if field == "start_ticks" else "another-boot"
        record_path.write_text(json.dumps(record))
        executor, _ = make_executor()

        [lost] = executor.reconcile()

        assert isinstance(lost, JobFinished)
        assert (lost.job_id, lost.state) == ("reused", FinalState.LOST)
        assert executor.running() == []
        time.sleep(GRACE_S)
        assert alive(pid), "the unrelated process must not be signalled"
    finally:
        os.killpg(pid, signal.SIGKILL)


def test_reconcile_reports_an_unreadable_record_as_lost(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    executor, _ = make_executor()
    (tmp_path / "state" / "broken.json").write_text("{")

    [lost] = executor.reconcile()

    assert isinstance(lost, JobFinished)
    assert (lost.job_id, lost.state) == ("broken", FinalState.LOST)
    assert lost.message.startswith("unreadable state record:")
    assert list((tmp_path / "state").iterdir()) == []


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"job_id": "../etc", "argv": ["true"]}, "not a valid file name"),
        ({"argv": []}, "exactly one of argv and shell_command"),
        ({"argv": ["true"], "shell_command": "true"}, "exactly one of argv and shell_command"),
        ({"argv": ["true"], "cwd": "relative"}, "not an absolute path"),
        ({"argv": ["true"], "max_runtime_s": 0}, "must be positive"),
        ({"argv": ["true"], "unix_user": "-oProxy"}, "Unix user name '-oProxy' is not valid"),
        ({"argv": ["true"], "env": {"A=B": "1"}}, "environment variable 'A=B' is not valid"),
        ({"argv": ["true"], "env": {"A": "1\x00"}}, "environment variable 'A' is not valid"),
    ],
)
def test_job_spec_refuses_invalid_jobs(fields: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        JobSpec(**{"job_id": "j", "cwd": "/", **fields})


RAY_PART = RayPart(
    head_address="127.0.0.1", port=31000, node_address="127.0.0.1", nodes=1, head=True
)


def test_a_ray_application_needs_ray_beside_its_python(
    make_executor: MakeExecutor, workdir: Path
) -> None:
    executor, events = make_executor(ray_python="/usr/bin/python3", node_name="dgx-01")
    executor.launch(
        JobSpec(job_id="ray.1", cwd=str(workdir), argv=["python", "app.py"], ray=RAY_PART)
    )
    [finished] = events.of("ray.1")
    assert finished.state == FinalState.FAILED
    assert finished.message.startswith(
        "dgx-01 has no Ray beside /usr/bin/python3: install gpuadmin[ray]"
    )


def test_ray_keeps_its_files_in_the_jobs_folder_unless_its_sockets_would_not_fit(
    make_executor: MakeExecutor, tmp_path: Path
) -> None:
    spec = JobSpec(job_id="12.1", argv=["python", "app.py"], ray=RAY_PART)
    short = Path("/tmp/gpuadmin-t")
    executor, _ = make_executor(scratch_dir=short)
    assert executor._ray_temp_dir(spec) == short / "12.1" / "ray"
    executor, _ = make_executor(scratch_dir=tmp_path / ("x" * 40))
    assert executor._ray_temp_dir(spec) == Path("/tmp/gpuadmin-ray-12.1")
