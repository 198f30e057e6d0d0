"""Redis behind Sentinel (``REDIS_URL=sentinel://...``): Debian's redis-server as a primary and
a replica, two redis-sentinel processes, all on loopback ports of the session's own; the
primary is SIGKILLed while a central worker, beat and a simulated node's agent run on it.

"Lost" here: a report an agent was told the broker took that the central side never stored,
a job that never reached its end, a node that stopped being heard from, or live samples that
stopped. A send the broker refused is not lost: the agent sends it again (its job events are
kept until sent, its heartbeats and samples repeat), as the sender below does.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from gpuadmin.access.nodes import node_token
from gpuadmin.audit.models import AuditEvent
from gpuadmin.broker import SentinelTransport
from health.choices import EventKind
from health.models import HealthEvent
from health.wire import HealthReport
from inventory import live
from inventory.models import Node
from scheduling.jobs import submission
from scheduling.models import Job, JobState
from tests.conftest import REPO_DIR
from tests.integration import failover_tasks
from tests.integration.reports import send_reports
from tests.integration.sentinel import SentinelRedis, sentinel_servers
from tests.integration.stack import stack_env, stop_warmly, wait_until_ready, worker_and_agent
from tests.unix_accounts import runs_as_this_account
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def health_report(key: str) -> HealthReport:
    """A node's health report that no recovery policy acts on (a correctable ECC count)."""
    return HealthReport(EventKind.ECC_CORRECTED, key, time.time(), message=key)


@pytest.fixture(scope="session")
def sentinel_redis() -> Iterator[SentinelRedis]:
    """One for the session's tests here (their failover leaves the replica promoted)."""
    with sentinel_servers() as servers:
        yield servers


def test_the_redis_client_broker_and_results_reach_the_primary_sentinels_name(sentinel_redis):
    """The processes' own client (latest samples, marks) on a sentinel:// URL writes to the
    primary; Celery's broker and result backend, configured from the same parsed URL as
    settings.py configures them, reach it too."""
    target = sentinel_redis.target
    client = target.client(socket_timeout=2)
    client.set("gpuadmin:sentinel-probe", "1")
    primary = sentinel_redis.server(sentinel_redis.primary_port())
    assert primary.get("gpuadmin:sentinel-probe") == b"1"
    app = Celery("sentinel-probe", set_as_current=False)
    app.conf.update(
        broker_url=target.celery_url,
        broker_transport_options=target.celery_transport_options,
        result_backend=target.celery_url,
        result_backend_transport_options=target.celery_transport_options,
    )
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, SentinelTransport)  # gpuadmin/celery.py's
        queue = connection.SimpleQueue(f"sentinel-probe-{uuid.uuid4().hex[:6]}")
        queue.put({"n": 1})
        assert queue.get(timeout=5).payload == {"n": 1}
        queue.close()
    task_id = uuid.uuid4().hex
    app.backend.store_result(task_id, {"gpus": 8}, "SUCCESS")
    assert app.AsyncResult(task_id).get(timeout=5) == {"gpus": 8}
    assert primary.exists(f"celery-task-meta-{task_id}")


# The health reports sent 0.2 s apart, and when the primary is killed.
REPORTS = 20
KILL_AFTER_S = 1.5


@pytest.mark.django_db(transaction=True)
def test_the_primary_lost_under_load_loses_no_report_job_or_sample(
    sentinel_redis, gpuadmin_env, tmp_path, report_figure
):
    """A central worker, beat and a simulated DGX's agent on the Sentinels' URL; jobs run
    and signed reports stream in while the primary is SIGKILLed. The replica is promoted,
    and afterwards: every report the broker took is stored once, every job submitted before
    and after ends completed (its start and end reported once each), the node's heartbeats
    and its live samples come from after the failover."""
    hostname = f"sen-{uuid.uuid4().hex[:6]}"
    owner = get_user_model().objects.create_user("sentinel")
    runs_as_this_account(owner)
    with worker_and_agent(
        gpuadmin_env,
        hostname,
        ("--sim", "dgx-a100-80gb"),
        8,
        tmp_path,
        beat=True,
        REDIS_URL=sentinel_redis.url,
        # Beat's backstop pass places the jobs: this process wakes passes through its own
        # Redis, not the Sentinels'.
        GPUADMIN_PLACEMENT_INTERVAL_S="1",
        GPUADMIN_HEARTBEAT_GRACE_S="60",
    ):
        before = [
            submission.submit_job(owner, command="sleep 2", use_shell=True, gpu_count=1)
            for _ in range(4)
        ]
        target = sentinel_redis.target
        reports = [
            ("health.report", [hostname, [health_report(f"failover-{index}").to_dict()]])
            for index in range(REPORTS)
        ]
        sent: list[int] = []
        refused: list[int] = []
        sender = threading.Thread(
            target=send_reports,
            args=(
                target.celery_url,
                target.celery_transport_options,
                settings.GPUADMIN_CENTRAL_QUEUE,
                hostname,
                node_token(hostname, actor_name="tests"),
                reports,
                sent,
                refused,
            ),
        )
        sender.start()
        time.sleep(KILL_AFTER_S)
        old = sentinel_redis.primary_port()
        sentinel_redis.servers[old].send_signal(signal.SIGKILL)
        killed_at, killed_wall = time.monotonic(), timezone.now()
        failover_s = wait_for(
            lambda: sentinel_redis.primary_port() != old, 30, "a Sentinel to promote the replica"
        )
        after = [
            submission.submit_job(owner, command="true", use_shell=True, gpu_count=1)
            for _ in range(4)
        ]
        sender.join()
        jobs = [*before, *after]

        def ended() -> bool:
            states = Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list(
                "state", flat=True
            )
            return set(states) == {JobState.COMPLETED}

        wait_for(ended, 120, "every job to end")  # workers reconnect on kombu's backoff
        stored = HealthEvent.objects.filter(node__hostname=hostname, kind=EventKind.ECC_CORRECTED)
        wait_for(
            lambda: stored.count() == len(sent),
            60,
            "every report the broker took to be stored",
        )
        wait_for(
            lambda: Node.objects.get(hostname=hostname).last_heartbeat_at > killed_wall,
            30,
            "a heartbeat after the failover",
        )
        samples = sentinel_redis.target.client().hgetall(live.KEY_PREFIX + hostname)
        newest = max(
            json.loads(value)["sampled_at"]
            for gpu, value in samples.items()
            if gpu != live.LOOP_FIELD.encode()
        )
        recovered_s = time.monotonic() - killed_at

    keys = sorted(stored.values_list("dedupe_key", flat=True))
    report_figure(
        f"Redis primary SIGKILLed: promoted in {failover_s:.1f} s, reports taken {len(sent)} "
        f"(refusals resent {len(refused)}), stored {len(keys)}, jobs "
        f"{len(jobs)} completed, all caught up {recovered_s:.1f} s after the kill"
    )
    assert len(sent) == REPORTS and refused, "the broker took every report, refused some"
    assert keys == sorted(f"{hostname}:failover-{index}" for index in sent)  # each once
    assert newest > killed_wall.timestamp()
    for job in jobs:  # its start and its end each applied once
        rows = list(
            AuditEvent.objects.filter(
                target_type="scheduling.job", target_id=str(job.pk)
            ).values_list("event_type", flat=True)
        )
        assert rows.count("job.running") == 1 and rows.count("job.completed") == 1, rows


# How long the worker's task runs, and the countdown of the task it holds for later.
HOLD_S = 6
COUNTDOWN_S = 20


@pytest.mark.django_db
def test_a_worker_that_loses_the_primary_holding_messages_runs_on_and_gets_them_back(
    gpuadmin_env, tmp_path, report_figure
):
    """A central worker runs a task and holds another for its countdown, both unacknowledged,
    when the primary is SIGKILLed. It reconnects to the promoted replica and runs on; it puts
    both messages back there at once (not after the visibility timeout): the held task runs
    at its time, once, and the running one runs to its end.

    The worker's remote-control connection (a SUBSCRIBE) is dropped just before the kill, so
    that the worker learns of the loss there while its task channel still waits on a BRPOP:
    kombu then closes that channel only after Celery collected the connection, the sequence in
    which kombu 5.7's Sentinel channel could not find the broker to put the messages back
    ('NoneType' object has no attribute 'hostname') and the worker exited. Without it, which
    socket the worker reads first is chance (the test above, two runs of three)."""
    with sentinel_servers() as servers:
        env = stack_env(gpuadmin_env, REDIS_URL=servers.url)
        log = tmp_path / "worker.log"
        worker = subprocess.Popen(
            [
                sys.executable, "-X", "faulthandler", "-m", "celery", "-A", "gpuadmin.celery",
                "worker", "--include", failover_tasks.__name__, "-n", "central@%h", "-c", "2",
                "-l", "INFO",
            ],
            env=env,
            cwd=REPO_DIR,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_until_ready([worker], [log], 90)
            app = Celery("sentinel-sender", set_as_current=False)
            app.conf.update(
                broker_url=servers.target.celery_url,
                broker_transport_options=servers.target.celery_transport_options,
            )
            running, later = f"running-{uuid.uuid4().hex[:6]}", f"later-{uuid.uuid4().hex[:6]}"
            queue = settings.GPUADMIN_CENTRAL_QUEUE
            sent_at = time.monotonic()
            app.send_task(failover_tasks.HOLD, args=(running, HOLD_S), queue=queue)
            app.send_task(failover_tasks.HOLD, args=(later, 0), countdown=COUNTDOWN_S, queue=queue)
            old = servers.primary_port()
            primary = servers.server(old)
            wait_for(
                lambda: primary.hlen("unacked") == 2 and primary.lrange(running, 0, -1),
                30,
                "the worker to run one task and hold the other",
            )
            # What the worker wrote reaches the replica first (replication keeps its order).
            primary.set("failover-mark", 1)
            assert primary.execute_command("WAIT", 1, 5000) == 1
            primary.client_kill_filter(_type="pubsub")
            servers.servers[old].send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            failover_s = wait_for(
                lambda: servers.primary_port() != old, 30, "a Sentinel to promote the replica"
            )
            promoted = servers.server(servers.primary_port())
            wait_for(
                lambda: worker.poll() is not None or promoted.lrange(later, 0, -1),
                COUNTDOWN_S + 60,
                "the held task to run on the promoted replica",
            )
            assert worker.poll() is None, "the worker exited"
            ran_after_s = time.monotonic() - sent_at
            wait_for(
                lambda: (
                    b"end" in promoted.lrange(running, 0, -1)
                    and not promoted.hlen("unacked")
                    and not promoted.llen(settings.GPUADMIN_CENTRAL_QUEUE)
                ),
                60,
                "the running task to end and every message to be acknowledged",
            )
            assert promoted.lrange(later, 0, -1) == [b"start", b"end"]  # once, at its time
            assert COUNTDOWN_S <= ran_after_s < COUNTDOWN_S + 30
            assert worker.poll() is None
            caught_up_s = time.monotonic() - killed_at
        finally:
            stop_warmly([worker])
            sys.stderr.write(f"--- worker.log\n{log.read_text()[-6000:]}\n")
    report_figure(
        f"Redis primary SIGKILLed under a worker holding 2 messages: promoted in {failover_s:.1f} "
        f"s, both put back on it, the one held for its countdown run "
        f"{ran_after_s - COUNTDOWN_S:.1f} s after it was due, all acknowledged "
        f"{caught_up_s:.1f} s after the kill"
    )
