"""`gpuadmin up`: on a machine with no database or Redis configured (the embedded servers), and
keeping its processes running, then stopping them in order."""

import http.cookiejar
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from datetime import timedelta
from functools import partial
from pathlib import Path

import grpc
import psutil
import pytest
from django.utils import timezone
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import REPO_DIR, session_database_url, unused_port
from tests.unix_accounts import requires_root, runs_as_this_account
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 120


def read_until(process: subprocess.Popen, marker: str, timeout: float) -> str:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"{marker!r} not seen; output so far:\n{''.join(seen)}")


def log_in(base_url: str, username: str, password: str) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{base_url}/admin/login/")
    token = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    form = urllib.parse.urlencode(
        {
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": token,
            "next": "/admin/",
        }
    ).encode()
    request = urllib.request.Request(
        f"{base_url}/admin/login/", data=form, headers={"Referer": f"{base_url}/admin/login/"}
    )
    assert "<title>Fleet catalog | gpuadmin</title>" in opener.open(request).read().decode()
    return opener


def test_up_starts_everything_serves_the_admin_and_stops_without_orphans(server_dir, free_port):
    tmp_path = server_dir
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"nodes": [{"name": "dgx-h100-01", "model": "dgx-h100"}]}))
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")
    }
    env.update(
        GPUADMIN_DATA_DIR=str(tmp_path / "data"),
        GPUADMIN_SIM_FLEET=str(fleet),
        PYTHONUNBUFFERED="1",
    )
    base_url = f"http://127.0.0.1:{free_port}"
    grpc_bind = f"127.0.0.1:{unused_port()}"
    up = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuadmin", "up", "--bind", f"127.0.0.1:{free_port}"),
            *("--grpc-bind", grpc_bind),
        ],
        env=env,
        cwd=REPO_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output = read_until(up, "gpuadmin is up", START_TIMEOUT_S)
        password = re.search(r"username 'admin', password '([^']+)'", output).group(1)
        descendants = psutil.Process(up.pid).children(recursive=True)
        data_dir = tmp_path / "data"
        servers = [
            psutil.Process(int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])),
            psutil.Process(int((data_dir / "redis" / "redis.pid").read_text())),
        ]
        assert {"web", "grpc", "worker", "beat", "agent dgx-h100-01"} <= set(
            re.findall(r"starting ([\w -]+?):", output)
        )
        assert read_until(up, "gRPC API", 10) == f"gRPC API (gpuadmin.v1): {grpc_bind}\n"
        with grpc.insecure_channel(grpc_bind) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            checks = health_pb2_grpc.HealthStub(channel)
            answer = checks.Check(health_pb2.HealthCheckRequest(), timeout=30)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

        deadline = time.monotonic() + 60
        while True:
            try:
                health = json.loads(urllib.request.urlopen(f"{base_url}/-/health").read())
                break
            except OSError:
                assert time.monotonic() < deadline, "web server never answered"
                time.sleep(0.5)
        assert health["status"] == "ok"
        admin = log_in(base_url, "admin", password)
        # The demo node's agent registered it and synced its GPUs through the central worker.
        # The change list counts its rows in one query and reads them in another, so a page
        # served while the sync commits may list GPU7 under "0 GPUs": wait for both.
        deadline = time.monotonic() + 60
        while True:
            page = admin.open(f"{base_url}/admin/inventory/gpu/?q=dgx-h100-01").read().decode()
            if "dgx-h100-01/GPU7" in page and "8 GPUs" in page:
                break
            assert time.monotonic() < deadline, (
                "the demo node's GPUs never reached the catalog",
                re.findall(r"\d+ GPUs?\b|errornote.*", page),
            )
            time.sleep(0.5)
        assert not (tmp_path / "data" / "secret_key").stat().st_mode & 0o077
    finally:
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=60)

    assert up.returncode == 0, rest
    _, alive = psutil.wait_procs(descendants + servers, timeout=15)
    assert alive == []
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()
    assert not (data_dir / "redis" / "redis.pid").exists()


def wait_for_line(log: Path, marker: str, timeout: float, process: subprocess.Popen) -> str:
    """The log (a file, so a busy stack never blocks on a full pipe) once it shows ``marker``."""
    deadline = time.monotonic() + timeout
    while marker not in (text := log.read_text()):
        assert process.poll() is None, f"exited with {process.returncode}:\n{text}"
        assert time.monotonic() < deadline, f"{marker!r} not seen; output so far:\n{text}"
        time.sleep(0.2)
    return text


def job_state(job) -> str:
    return type(job).objects.get(pk=job.pk).state


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_up_restarts_a_dead_child_and_requeues_the_demo_jobs_when_stopped(
    signum, gpuadmin_env, tmp_path, free_port
):
    """Its agents stop their jobs as their nodes stop: re-queued within their retries (the
    first job has one), failed without (the second)."""
    from django.contrib.auth import get_user_model

    from gpuadmin.audit.models import AuditEvent
    from inventory.models import Node
    from scheduling.jobs import submission
    from scheduling.models import Job, JobState

    node = f"up-{uuid.uuid4().hex[:6]}"  # node queues are shared by sessions on one Redis
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"nodes": [{"name": node, "model": "pcie-l40s-4x"}]}))
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_SIM_FLEET": str(fleet),
        "GPUADMIN_HEARTBEAT_INTERVAL_S": "1",
        "GPUADMIN_SAMPLE_INTERVAL_S": "1",
        "GPUADMIN_JOB_KILL_GRACE_S": "2",
    }
    log = tmp_path / "up.log"
    with log.open("w") as out:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuadmin",
                "up",
                "--no-grpc",
                "--bind",
                f"127.0.0.1:{free_port}",
            ],
            env=env,
            cwd=REPO_DIR,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    owner = get_user_model().objects.create_user(f"owner-{node}")
    runs_as_this_account(owner)
    try:
        wait_for_line(log, "gpuadmin is up", START_TIMEOUT_S, up)
        wait_for(
            lambda: Node.objects.filter(hostname=node, gpus__isnull=False).exists(),
            60,
            "the demo node to register",
        )
        jobs = [submission.submit_job(owner, command=["sleep", "600"], gpu_count=1, max_retries=1)]
        wait_for(lambda: job_state(jobs[0]) == JobState.RUNNING, 60, "the job to start")

        if signum == signal.SIGTERM:  # one variant is enough for the restart
            worker = next(
                child
                for child in psutil.Process(up.pid).children()
                if child.cmdline()[-1:] == ["worker"]
            )
            worker.kill()
            wait_for(lambda: log.read_text().count("starting worker:") == 2, 30, "a restart")
            text = log.read_text().split("worker exited", 1)[1]
            assert text.startswith(" with killed by SIGKILL at ")
            assert "restarting it in 1 s" in text.splitlines()[0]
            # The restarted worker places the next job, and its agent runs it.
            jobs.append(submission.submit_job(owner, command=["sleep", "600"], gpu_count=1))
            wait_for(lambda: job_state(jobs[1]) == JobState.RUNNING, 60, "a job after the restart")
    finally:
        up.send_signal(signum)
        up.wait(timeout=90)

    text = log.read_text()
    assert up.returncode == 0, text
    rows = Job.objects.filter(pk__in=[job.pk for job in jobs]).order_by("pk")
    ended = [(job.state, job.message) for job in rows]
    # Re-queued whether or not they have retries (the second has none): not their failure.
    assert ended == [(JobState.QUEUED, f"requeued: node {node} stopped")] * len(jobs), text
    assert [job.failures for job in rows] == [0] * len(jobs)
    for job, (state, _) in zip(jobs, ended, strict=True):
        audited = AuditEvent.objects.filter(target_id=str(job.pk)).latest("pk")
        assert (audited.event_type, audited.actor_name) == (f"job.{state}", "agent")
    assert f"agent {node}: stopping {len(jobs)} running job(s)" in text
    # State changes are logged, polling is not.
    assert f"job {jobs[0].pk}: running -> queued (requeued: node {node} stopped)" in text
    assert "Task inventory.heartbeat" not in text
    assert "NVML initialised" not in text


# What a hostile demo job tries (docs/administration/security.md): each line it prints names a
# read that worked; the last shows it still reaches its own scratch folder by its full path.
PROBE = (
    "id -u; p=$PPID; "
    'while [ "$p" -gt 1 ]; do echo "tried environ of $p"; '
    'cat /proc/$p/environ >/dev/null && echo "READ environ of $p"; '
    "p=$(awk '/^PPid:/ {{print $2}}' /proc/$p/status); done; "
    'cat {token} && echo "READ the credential"; '
    'ls {data} && echo "LISTED the data folder"; '
    'ls {data}/agent/{node} && echo "LISTED the agent folder"; '
    'ls {data}/agent/{node}/executor && echo "LISTED the executor records"; '
    'cat {data}/sim/{node}.json && echo "READ the simulator state"; '
    'ls {data}/sim && echo "LISTED the simulator state"; '
    'echo mine > "$PWD/own-file" && echo "wrote its own scratch folder"'
)


@requires_root
@pytest.mark.django_db(transaction=True)
def test_up_runs_demo_jobs_as_their_own_account_which_reads_nothing_of_the_installation(
    gpuadmin_env, server_dir, free_port
):
    from django.contrib.auth import get_user_model

    from inventory.models import Node
    from scheduling.agent.wire import executor_id
    from scheduling.jobs import submission
    from scheduling.models import TERMINAL_STATES, Job, JobState

    node = f"up-{uuid.uuid4().hex[:6]}"  # node queues are shared by sessions on one Redis
    # Parents every account may enter: what refuses the job is the data folder's own modes.
    server_dir.chmod(0o711)
    data = server_dir / "data"
    fleet = server_dir / "fleet.json"
    fleet.write_text(json.dumps({"nodes": [{"name": node, "model": "pcie-l40s-4x"}]}))
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_DATA_DIR": str(data),
        "GPUADMIN_SIM_FLEET": str(fleet),
        "GPUADMIN_HEARTBEAT_INTERVAL_S": "1",
        "GPUADMIN_SAMPLE_INTERVAL_S": "1",
    }
    env.pop("GPUADMIN_DEFAULT_UNIX_ACCOUNT", None)
    log = server_dir / "up.log"
    with log.open("w") as out:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuadmin",
                "up",
                "--no-grpc",
                "--bind",
                f"127.0.0.1:{free_port}",
            ],
            env=env,
            cwd=REPO_DIR,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    person = get_user_model().objects.create_user(f"demo-{node}")  # no Unix account of theirs
    try:
        wait_for_line(log, "gpuadmin is up", START_TIMEOUT_S, up)
        wait_for(
            lambda: Node.objects.filter(hostname=node, gpus__isnull=False).exists(),
            60,
            "the demo node to register",
        )
        [agent] = [
            child
            for child in psutil.Process(up.pid).children()
            if node in " ".join(child.cmdline())  # the agent's name, its --node
        ]
        agent_uid = agent.uids().real
        token = data / "agent" / node / "node-token"
        probe = PROBE.format(token=token, data=data, node=node)
        job = submission.submit_job(person, command=["sh", "-c", probe], gpu_count=1)
        wait_for(lambda: job_state(job) in TERMINAL_STATES, 60, "the probe job to end")
        job = Job.objects.get(pk=job.pk)
        logs = data / "agent" / node / "logs"
        output = (logs / f"{executor_id(job.pk, job.attempt)}.log").read_text()
        agent_env = agent.environ()
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=90)

    text = log.read_text()
    assert up.returncode == 0, text
    assert job.state == JobState.COMPLETED, (job.message, output)
    assert f"tried environ of {agent.pid}" in output  # its parent, then up and beyond
    assert "READ" not in output and "LISTED" not in output, output
    assert "wrote its own scratch folder" in output, output
    # Its own account: not root, not the agent's; made by up, which says so.
    account = pwd.getpwnam("gpuadmin-job")
    assert output.splitlines()[0] == str(account.pw_uid) != str(agent_uid), output
    assert f"demo jobs run as the Unix account gpuadmin-job (uid {account.pw_uid})" in text
    # The agent holds what a real node holds: the broker and its credential.
    assert {"DATABASE_URL", "SECRET_KEY", "SECRET_KEY_FILE"}.isdisjoint(agent_env), agent_env
    assert agent_env["REDIS_URL"] == env["REDIS_URL"]


@pytest.mark.django_db(transaction=True)
def test_stops_and_starts_under_load_place_nothing_while_stopping_and_strand_nothing(
    gpuadmin_env, tmp_path, free_port
):
    """Three stops and starts of a stack busy with short jobs. Once a stop has begun nothing
    is placed: no job is scheduled after the agents' first report of a job their stop ended
    (it was before the fix: the ends woke passes that placed waiting jobs on the stopping
    agents). Between two runs, a job placed on the node whose message is lost (its queue
    emptied, as when an agent dies holding it) is re-queued once GPUADMIN_SCHEDULED_CONFIRM_S
    has passed (it stayed scheduled for good before); no GPU is ever allocated twice."""
    from django.contrib.auth import get_user_model

    from gpuadmin.access.node_orders import node_queue
    from gpuadmin.audit.models import AuditEvent
    from inventory import live
    from inventory.models import Node
    from scheduling.checks import gpus_allocated_twice
    from scheduling.jobs import submission
    from scheduling.loop import passes as loop
    from scheduling.models import Job, JobState

    node = f"up-{uuid.uuid4().hex[:6]}"
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"nodes": [{"name": node, "model": "pcie-l40s-4x"}]}))
    confirm_s = 3
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_SIM_FLEET": str(fleet),
        "GPUADMIN_HEARTBEAT_INTERVAL_S": "1",
        "GPUADMIN_SAMPLE_INTERVAL_S": "1",
        "GPUADMIN_JOB_KILL_GRACE_S": "1",
        "GPUADMIN_SCHEDULED_CONFIRM_S": str(confirm_s),
    }
    owner = get_user_model().objects.create_user(f"owner-{node}")
    runs_as_this_account(owner)
    ours = Job.objects.filter(owner=owner)
    stranded: list[int] = []

    def requeued(pks: list[int]) -> bool:
        """Each job re-queued by the bound (a slow start on a loaded host may add another)."""
        rows = AuditEvent.objects.filter(
            target_id__in=[str(pk) for pk in pks],
            event_type="job.queued",
            message=f"requeued: {node} did not start it within {confirm_s} s",
        )
        return rows.values("target_id").distinct().count() == len(pks)

    for cycle in range(3):
        log = tmp_path / f"up-{cycle}.log"
        with log.open("w") as out:
            up = subprocess.Popen(
                [
                    *(sys.executable, "-m", "gpuadmin", "up", "--no-grpc"),
                    *("--bind", f"127.0.0.1:{free_port}"),
                ],
                env=env,
                cwd=REPO_DIR,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for_line(log, "gpuadmin is up", START_TIMEOUT_S, up)
            if cycle == 0:  # the load: more jobs than GPUs, once the node is there
                wait_for(
                    lambda: Node.objects.filter(hostname=node, gpus__isnull=False).exists(),
                    60,
                    "the demo node to register",
                )
                for _ in range(30):
                    command = ["sleep", "5"]  # still running when the stop reaches them
                    submission.submit_job(owner, command=command, gpu_count=1, max_retries=1)
            # What was left scheduled with no message is re-queued within the bound.
            done = partial(requeued, list(stranded))
            # Beat's sweep, or the agent as it starts: once the worker is up (slow when loaded).
            wait_for(done, 60, "the stranded jobs to be re-queued")
            # None stays scheduled past the bound and beat's sweeps after it.
            stale = timezone.now() - timedelta(seconds=confirm_s + 10)
            assert not ours.filter(state=JobState.SCHEDULED, scheduled_at__lt=stale).exists()
            wait_for(
                lambda: ours.filter(state=JobState.RUNNING).count() >= 2,
                30,
                "jobs to run",
            )
        finally:
            first_audit = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True)[0]
            up.send_signal(signal.SIGINT)
            up.wait(timeout=90)
        text = log.read_text()
        assert up.returncode == 0, text
        stopped = AuditEvent.objects.filter(
            pk__gt=first_audit, actor_name="agent", message__contains=f"node {node} stopped"
        )
        first_stop = stopped.order_by("pk").values_list("pk", flat=True).first()
        assert first_stop is not None, text
        placed_late = AuditEvent.objects.filter(pk__gt=first_stop, event_type="job.scheduled")
        assert not placed_late.exists(), text
        assert gpus_allocated_twice() == []
        if cycle < 2:  # a placement whose message is lost while the stack is down
            Node.objects.filter(hostname=node).update(last_heartbeat_at=timezone.now())
            stranded = loop.run_pass().dispatched
            assert stranded
            live.client().delete(node_queue(node))
