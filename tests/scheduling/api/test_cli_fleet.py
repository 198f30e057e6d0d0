"""The operator's verbs (``gpuadmin status|nodes|gpus|health|watch|drain|offline|online|
completion``) against a live server, with an operator's or a user's API token."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from gpuadmin import cli, fleet_cli
from gpuadmin.access.services import create_token
from gpuadmin.audit.models import AuditEvent
from health.choices import EventKind
from health.models import RecoveryPolicy
from inventory import live
from inventory.agent import SAMPLE_SECTIONS
from inventory.models import Gpu, Node
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.pages import fleet as fleet_page
from scheduling.loop import dispatch
from scheduling.loop import passes as loop
from scheduling.models import Job, JobState
from tests.conftest import REPO_DIR
from tests.health import test_quarantine as quarantine_tests
from tests.scheduling.api.conftest import submit
from tests.scheduling.conftest import processes_gone

pytestmark = pytest.mark.django_db(transaction=True)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")


@pytest.fixture
def fleet_with_samples(fleet, settings):
    """The two DGX A100 80GB nodes, their agents' live samples published (a process on GPU 5
    of dgx-01, 97% busy)."""
    settings.GPUADMIN_SAMPLE_STREAM = "test:samples:cli-fleet"
    for node in fleet:
        nvml = SimulatedNvml.from_model("dgx-a100-80gb", node_name=node.hostname)
        if node.hostname == "dgx-01":
            faults.start_process(nvml, None, 5, 4242, used_mib=30_000, util=97)
        live.publish(node.hostname, scan(nvml, include=SAMPLE_SECTIONS))
    yield fleet
    live.client().delete(*(live.KEY_PREFIX + node.hostname for node in fleet))


@pytest.fixture
def gpuadmin(live_server, capsys, monkeypatch, make_user):
    """``gpuadmin(*argv, user="ops")`` -> (status, stdout, stderr) through the live server,
    with the API token of ``ops`` (an operator) or ``alice`` (a user)."""
    monkeypatch.setattr(dispatch, "wake", lambda: None)  # no placement pass on the shared Redis
    keys = {
        name: create_token(make_user(name, role), "cli")[1]
        for name, role in (("ops", "operator"), ("alice", "user"))
    }
    monkeypatch.setenv("GPUADMIN_URL", live_server.url)
    monkeypatch.delenv("NO_COLOR", raising=False)

    def run(*argv: str, user: str = "ops") -> tuple[int, str, str]:
        monkeypatch.setenv("GPUADMIN_TOKEN", keys[user])
        status = cli.main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    run.keys = keys  # type: ignore[attr-defined]
    return run


def place_job(owner: str = "alice", gpus: int = 8) -> Job:
    from django.contrib.auth import get_user_model

    job = submit(get_user_model().objects.get(username=owner), gpu_count=gpus)
    loop.run_pass()
    job.refresh_from_db()
    assert job.state in (JobState.SCHEDULED, JobState.RUNNING), job.state
    return job


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()]


# --------------------------------------------------------------------------- status


def test_status_counts_as_the_fleet_page(gpuadmin, fleet_with_samples):
    job = place_job()  # 8 GPUs of one node
    status, out, err = gpuadmin("status", "--json")
    assert status == 0, err
    body = json.loads(out)
    _, summary = fleet_page.fleet_view(Gpu.objects.all(), filtered=False)
    assert body["total"]["counts"] == {str(k): v for k, v in summary.counts.items()}
    assert (body["total"]["gpus"], body["total"]["counts"]["busy"]) == (16, 8)
    held = job.allocations.first().node.hostname
    nodes = {node["hostname"]: node for node in body["nodes"]}
    assert nodes[held]["counts"]["busy"] == 8
    assert (nodes[held]["state"], nodes[held]["reachable"]) == ("online", True)
    assert nodes[held]["gpu_models"] == ["NVIDIA A100-SXM4-80GB"]

    status, out, _ = gpuadmin("status")
    lines = table(out)
    foreign = ["FOREIGN"] if body["total"]["counts"]["foreign"] else []
    assert lines[0] == [
        "NODE",
        "STATE",
        "REACHABLE",
        "GPUS",
        "FREE",
        "BUSY",
        "DRAINING",
        "MIG",
        "MPS",
        *foreign,
        "DEGRADED",
        "MODEL",
    ]  # fmt: skip  (the page's order)
    rows = {line[0]: line for line in lines[1:-1]}
    assert rows[held][:6] == [held, "online", "yes", "8", "0", "8"]
    assert rows["total"][:4] == ["total", "-", "2/2", "16"]
    free = summary.counts["free"]
    assert out.splitlines()[-1].startswith(f"16 GPUs on 2 nodes: {free} free, 8 busy, 0 draining")

    one = table(gpuadmin("status", "--node", held)[1])
    assert [line[0] for line in one[1:-1]] == [held, "total"]
    assert gpuadmin("status", "--node", "dgx-99") == (1, "", "gpuadmin status: no node 'dgx-99'\n")


# --------------------------------------------------------------------------- gpus, nodes


def test_gpus_show_the_fleet_page_columns_and_the_job_on_each(gpuadmin, fleet_with_samples):
    job = place_job()
    held = job.allocations.first().node.hostname
    status, out, err = gpuadmin("gpus", "--node", held)
    assert status == 0, err
    lines = table(out)
    assert lines[0] == [
        "NODE", "GPU", "MODEL", "STATE", "STATUS", "UTIL", "MEM", "GiB", "TEMP", "POWER", "JOB",
        "USER", "UUID",
    ]  # fmt: skip
    assert len(lines) == 9
    first = lines[1]
    assert first[:6] == [held, "0", "NVIDIA", "A100-SXM4-80GB", "available", "busy"]
    assert first[-3:-1] == [str(job.pk), "alice"]

    status, out, _ = gpuadmin("gpus", "--json")
    gpus = json.loads(out)
    assert len(gpus) == 16
    busy = next(gpu for gpu in gpus if gpu["node"] == "dgx-01" and gpu["index"] == 5)
    assert busy["live"]["utilization_pct"] == 97
    assert busy["live"]["text"]["utilization"] == "97%"
    assert busy["live"]["memory_used_mib"] >= 30_000

    status, out, _ = gpuadmin("gpus", "--free")
    free_rows = table(out)[1:]
    assert free_rows and all(row[5] == "free" for row in free_rows)
    assert held not in {row[0] for row in free_rows}
    assert gpuadmin("gpus", "--state", "draining")[1].splitlines()[1:] == []


def test_the_job_column_names_a_slurm_job_holding_the_gpu():
    """The API's ``job`` is only ever a gpuadmin job; a Slurm job is named by ``held_by``."""
    slurm = {"job": None, "held_by": "Slurm job 7 on hpc", "held_by_kind": "slurm"}
    assert fleet_cli._holder(slurm) == "Slurm job 7 on hpc"
    assert fleet_cli._holder({"job": 12, "held_by": "job #12", "held_by_kind": "job"}) == 12
    assert fleet_cli._holder({"job": None, "held_by": None, "held_by_kind": None}) is None


def test_nodes(gpuadmin, fleet_with_samples):
    status, out, err = gpuadmin("nodes")
    assert status == 0, err
    lines = table(out)
    assert lines[0][:5] == ["NODE", "STATE", "REACHABLE", "GPUS", "MODEL"]
    assert [line[:5] for line in lines[1:]] == [
        ["dgx-01", "online", "yes", "8", "-"],  # no agent registered it: no model
        ["dgx-02", "online", "yes", "8", "-"],
    ]
    status, out, _ = gpuadmin("nodes", "--json")
    assert [node["hostname"] for node in json.loads(out)] == ["dgx-01", "dgx-02"]
    assert gpuadmin("nodes", "--state", "draining")[1].splitlines()[1:] == []


# --------------------------------------------------------------------------- health


def test_health_of_a_fenced_gpu_names_the_xid_and_its_counters(gpuadmin, fleet_with_samples):
    gpu = Gpu.objects.get(node__hostname="dgx-02", index=3)
    policy, _ = RecoveryPolicy.objects.get_or_create(  # a shipped one, unless a test flushed it
        kind=EventKind.XID, xid=79, defaults={"name": "cli test XID 79", "probation_s": 60}
    )
    quarantine_tests.fence(gpu, policy, xid=79, message="fell off")

    status, out, err = gpuadmin("health", "--gpu", gpu.uuid)
    assert status == 0, err
    assert out.startswith("GPU 3 of dgx-02: degraded (")
    assert "now degraded" in out.splitlines()[0]
    assert "  quarantine:" in out and "waiting for:" in out
    assert "  ECC errors, volatile (corrected / uncorrected):" in out
    assert "  Remapped rows (correctable / uncorrectable / pending / failure):" in out
    events = out[out.index("latest health events") :].splitlines()
    assert "XID 79 (GPU has fallen off the bus)" in events[2]

    status, out, _ = gpuadmin("health")  # the fleet: only the GPU that needs a look
    assert [line for line in out.splitlines() if line.startswith("GPU ")] == [out.splitlines()[0]]
    body = json.loads(gpuadmin("health", "--node", "dgx-02", "--json")[1])
    assert len(body["gpus"]) == 8
    fenced = body["gpus"][3]
    assert fenced["quarantine"]["state"] == "fenced"
    assert body["events"][0]["xid_name"] == "GPU has fallen off the bus"
    remapped = next(c for c in fenced["counters"] if c["label"].startswith("Remapped rows"))
    assert remapped["values"]["remapped_rows_uncorrectable"] == 0
    assert gpuadmin("health", "--node", "nowhere") == (
        1,
        "",
        "gpuadmin health: HTTP 404: No Node matches the given query.\n",
    )


# --------------------------------------------------------------------------- drain, offline, online


def test_drain_offline_online_a_node_as_scontrol(gpuadmin, fleet_with_samples):
    job = place_job()
    held = job.allocations.first().node.hostname

    status, out, err = gpuadmin("drain", held, "--reason", "BIOS update")
    assert (status, out, err) == (0, f"node {held}: draining (job {job.pk} still running)\n", "")
    row = AuditEvent.objects.get(event_type="node.state_changed")
    assert (row.actor_name, row.channel, row.message) == ("ops", "cli drain", "BIOS update")

    status, out, err = gpuadmin("offline", held, "--reason", "RMA")
    assert (status, out) == (1, "")
    assert err == (
        f"gpuadmin offline: HTTP 409: node {held}: job {job.pk} still runs there; drain it "
        "to let them finish, or force offline to requeue them\n"
    )
    assert Node.objects.get(hostname=held).state == "draining"

    status, out, err = gpuadmin("offline", held, "--reason", "RMA", "--force")
    assert (status, out, err) == (0, f"node {held}: offline (job {job.pk} requeued)\n", "")
    requeued = AuditEvent.objects.filter(target_id=str(job.pk), channel="cli offline")
    assert set(requeued.values_list("event_type", "actor_name")) == {("job.stopping", "ops")}
    assert processes_gone(job) == JobState.QUEUED  # its GPUs held until then

    assert gpuadmin("online", held, "--reason", "fixed")[1] == f"node {held}: online\n"
    assert gpuadmin("online", held, "--reason", "again")[1] == f"node {held}: already online\n"


def test_drain_a_gpu_by_its_uuid(gpuadmin, fleet_with_samples):
    gpu = Gpu.objects.get(node__hostname="dgx-02", index=6)
    status, out, err = gpuadmin("drain", gpu.uuid, "--reason", "fan", "--json")
    assert status == 0, err
    body = json.loads(out)
    assert (body["state"], body["change"]) == (
        "draining",
        {"changed": True, "running_jobs": [], "stopped_jobs": []},
    )
    assert body["live"]["status"] == "draining"
    assert gpuadmin("online", gpu.uuid, "--reason", "ok")[1] == "GPU 6 of dgx-02: available\n"
    assert AuditEvent.objects.filter(channel="cli online", target_id=gpu.uuid).count() == 1
    assert gpuadmin("drain", "GPU-00000000-0000-0000-0000-000000000000", "--reason", "x") == (
        1,
        "",
        "gpuadmin drain: no GPU 'GPU-00000000-0000-0000-0000-000000000000'\n",
    )
    assert gpuadmin("drain", "dgx-99", "--reason", "x")[2] == (
        "gpuadmin drain: no node (a GPU is named by its UUID, GPU-...) 'dgx-99'\n"
    )


def test_a_plain_user_cannot_drain(gpuadmin, fleet_with_samples):
    status, out, err = gpuadmin("drain", "dgx-01", "--reason", "mine", user="alice")
    assert (status, out) == (1, "")
    assert err == ("gpuadmin drain: HTTP 403: You do not have permission to perform this action.\n")
    assert Node.objects.get(hostname="dgx-01").state == "online"
    assert not AuditEvent.objects.filter(event_type="node.state_changed").exists()


# --------------------------------------------------------------------------- help, completion


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(
    "verb",
    ["status", "nodes", "gpus", "health", "watch", "drain", "offline", "online", "completion"],
)
def test_help_of_each_verb(verb, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main([verb, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: gpuadmin {verb}")


COMPLETION_ENV = {**os.environ, "PYTHONPATH": str(REPO_DIR)}


@pytest.mark.django_db(transaction=False)
def test_the_bash_completion_loads():
    loaded = subprocess.run(
        ["bash", "-c", f"source <({sys.executable} -m gpuadmin completion bash) && "
         "complete -p gpuadmin"],
        capture_output=True,
        text=True,
        env=COMPLETION_ENV,
        check=False,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith("complete ") and loaded.stdout.rstrip().endswith(" gpuadmin")


@pytest.mark.django_db(transaction=False)
def test_the_zsh_completion_is_a_compdef():
    zsh = subprocess.run(
        [sys.executable, "-m", "gpuadmin", "completion", "zsh"],
        capture_output=True,
        text=True,
        env=COMPLETION_ENV,
        check=True,
    ).stdout
    assert zsh.startswith("#compdef gpuadmin")
    assert "drain" in zsh and "--force" in zsh


# --------------------------------------------------------------------------- watch


def watch_env(gpuadmin, live_server) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_DIR),
        "GPUADMIN_URL": live_server.url,
        "GPUADMIN_TOKEN": gpuadmin.keys["ops"],
    }


def test_watch_into_a_pipe_prints_a_table_each_interval(gpuadmin, fleet_with_samples, live_server):
    child = subprocess.Popen(
        [sys.executable, "-m", "gpuadmin", "watch", "--interval", "500ms", "--node", "dgx-01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=watch_env(gpuadmin, live_server),
    )
    titles: list[int] = []  # where each frame's title line is
    lines: list[str] = []
    assert child.stdout is not None
    while len(titles) < 2:
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else ""
        if "every 0.5s on dgx-01: 8 GPUs" in line:
            titles.append(len(lines))
        lines.append(line)
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=10) == 130
    assert child.stderr is not None and child.stderr.read() == ""
    frame = lines[titles[0] : titles[1]]  # title, header, the rows, a blank line
    assert frame[1].split()[:2] == ["NODE", "GPU"], frame
    assert frame[-1] == "\n", frame
    assert [row.split()[:2] for row in frame[2:-1]] == [["dgx-01", str(i)] for i in range(8)], frame


def test_watch_on_an_80x24_terminal_redraws_in_place_and_restores_it(
    gpuadmin, fleet_with_samples, live_server
):
    env = {**watch_env(gpuadmin, live_server), "TERM": "xterm", "COLUMNS": "80", "LINES": "24"}
    argv = [sys.executable, "-m", "gpuadmin", "watch", "--interval", "500ms"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the watch on the terminal's other end
        os.execvpe(argv[0], argv, env)
    output = b""
    deadline = time.monotonic() + 20
    while output.count(b"Ctrl-C to quit") < 2 and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            output += os.read(fd, 65536)
    os.kill(pid, signal.SIGINT)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 130
    text = output.decode()
    assert text.count("\x1b[?1049h") == 1 and text.rstrip().endswith("\x1b[?1049l")
    assert "\x1b[?25h" in text  # the cursor shown again
    # Each refresh draws the whole screen from its top left corner (no scrolling, no flicker).
    frames = [frame for frame in text.split("\x1b[H") if "Ctrl-C to quit" in frame]
    assert len(frames) >= 2
    plain = [ANSI.sub("", line) for line in frames[-1].replace("\r\n", "\n").split("\n")]
    assert len(plain) == 24
    assert all(len(line) <= 80 for line in plain), max(plain, key=len)
    assert plain[1].split()[:3] == ["NODE", "GPU", "STATE"]
    assert [line.split()[:2] for line in plain[2:18]] == [
        [node, str(index)] for node in ("dgx-01", "dgx-02") for index in range(8)
    ]


@pytest.mark.django_db(transaction=False)
def test_the_watched_table_fits_80_columns_and_24_lines():
    gpus = [
        {
            "node": "dgx-a100-80gb-01",
            "index": index,
            "name": "NVIDIA A100-SXM4-80GB",
            "state": "available",
            "uuid": f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd",
            "live": {
                "status": "busy",
                "job": 12345,
                "user": "someone-long",
                "text": {"utilization": "100%", "memory": "79.9/80", "temperature": "83",
                         "power": "412"},
            },
        }
        for index in range(40)
    ]  # fmt: skip
    out = io.StringIO()
    console = Console(file=out, width=80, height=24, force_terminal=True)
    console.print(fleet_cli._watch_view("12:00:00  every 2s", gpus, 80, 24))
    lines = ANSI.sub("", out.getvalue()).splitlines()
    assert len(lines) == 24
    assert all(len(line) <= 80 for line in lines)
    assert lines[1].split() == [
        "NODE", "GPU", "STATUS", "UTIL", "MEM", "GiB", "TEMP", "POWER", "JOB", "USER",
    ]  # fmt: skip
    assert lines[-1] == "... 19 more GPUs (--node N shows one node)"
    assert lines[2].split()[:4] == ["dgx-a100-80gb-01", "0", "busy", "100%"]
    wide = io.StringIO()
    Console(file=wide, width=200, height=60, force_terminal=True).print(
        fleet_cli._watch_view("t", gpus, 200, 60)
    )
    assert "UUID" in wide.getvalue() and "MODEL" in wide.getvalue()
