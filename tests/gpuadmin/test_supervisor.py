"""The supervisor of `gpuadmin up`'s processes: restarts with backoff, crash loops, stops."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest

from gpuadmin.supervisor import CrashLoop, Supervisor, exit_status


def python(argv: list[str], name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", *argv], start_new_session=True, stdout=subprocess.PIPE
    )


def supervisor(**options: float) -> Supervisor:
    return Supervisor(python, out=io.StringIO(), **options)


def poll_until(sup: Supervisor, condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        sup.poll()
        time.sleep(0.01)


def test_a_dead_child_is_restarted_after_a_growing_backoff_and_said_so():
    sup = supervisor(backoff_s=0.05)
    sup.start("worker", ["raise SystemExit(3)"], stop_grace_s=1)
    first = sup.children["worker"].process
    poll_until(sup, lambda: sup.children["worker"].process is not first)
    second = sup.children["worker"].process
    poll_until(sup, lambda: sup.children["worker"].process is not second)
    lines = sup.out.getvalue().splitlines()
    assert lines[0].startswith("worker exited with status 3 at ")
    assert lines[0].endswith("; restarting it in 0.05 s")
    assert lines[1].endswith("; restarting it in 0.1 s")
    sup.stop(["worker"])


def test_a_crash_loop_stops_restarting():
    sup = supervisor(backoff_s=0.01, crash_loop_exits=3, crash_loop_window_s=60)
    sup.start("beat", ["raise SystemExit(1)"], stop_grace_s=1)
    with pytest.raises(CrashLoop):
        poll_until(sup, lambda: False)
    assert len(sup.children["beat"].exits) == 3
    assert (
        "with status 1, 3 exits within 60 s: crash loop, stopping everything" in sup.out.getvalue()
    )


def test_stop_kills_a_child_that_ignores_sigterm_after_its_grace():
    sup = supervisor()
    sup.start(
        "agent",
        [
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)"
        ],
        stop_grace_s=0.3,
    )
    process = sup.children["agent"].process
    assert process.stdout.readline() == b"ready\n"
    sup.stop(["agent"])
    assert process.returncode == -9
    assert "agent did not stop within 0.3 s; killing it" in sup.out.getvalue()
    assert not sup.running("agent")


def test_exit_status_names_the_signal():
    assert exit_status(-9) == "killed by SIGKILL"
    assert exit_status(2) == "status 2"
