"""A node speaks only for itself: what agents send through the broker (scans, heartbeats, job
events, job lists) is signed with the node's credential, and the central worker refuses a
report about another node, or about a job not placed on the sender's node."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Task

from gpuadmin.access import nodes
from gpuadmin.access.node_signing import HEADER, parse_token, send_as_central, send_as_node
from gpuadmin.audit.models import AuditEvent
from gpuadmin.celery import app
from inventory import tasks as inventory_tasks
from inventory.agent import AgentLoop
from inventory.models import Node
from inventory.nvml import open_backend
from inventory.nvml.scanner import scan
from scheduling import tasks as scheduling_tasks
from scheduling.agent.wire import FinalState, JobFinished, JobStarted
from scheduling.jobs import submission
from scheduling.loop import passes as loop
from scheduling.models import Job, JobState
from tests.conftest import REPO_DIR
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed(monkeypatch, settings):
    """``signed(token, node, task, args)``: the (args, headers) an agent of ``node`` holding
    ``token`` puts on the broker for that report, as the central worker receives them."""

    def sign(token: str | None, node: str, name: str, args: tuple) -> tuple[list, dict]:
        settings.GPUADMIN_NODE_TOKEN, settings.GPUADMIN_NODE_NAME = token or "", node
        sent: list[Any] = []
        monkeypatch.setattr(app, "send_task", lambda *a, **options: sent.append(options))
        (send_as_central if token is None else send_as_node)(name, args)
        [options] = sent
        wire = json.loads(json.dumps({"args": options["args"], "headers": options["headers"]}))
        return wire["args"], wire["headers"]

    return sign


def deliver(task: Task, report: tuple[list, dict]) -> Any:
    """Run ``task`` as a worker runs a message (not as a direct call in this process)."""
    args, headers = report
    return task.apply(args=args, headers=headers).get()


def refusals() -> list[str]:
    return list(
        AuditEvent.objects.filter(event_type="node.report_refused").values_list(
            "message", flat=True
        )
    )


def token_of(node: str) -> str:
    return nodes.node_token(node, actor_name="tests")


@pytest.fixture
def running_on_dgx_01(django_user_model, broker) -> Job:
    add_sim_node("dgx-01")
    add_sim_node("dgx-02")
    job = submission.submit_job(
        django_user_model.objects.create_user("alice"), command=["true"], gpu_count=8
    )
    loop.run_pass()
    job.refresh_from_db()
    assert set(job.allocations.values_list("node__hostname", flat=True)) == {"dgx-01"}
    return job


def started(job: Job) -> tuple[dict]:
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    return (JobStarted(f"{job.pk}.{job.attempt}", 4242, at).to_dict(),)


def test_a_job_event_from_the_jobs_node_is_believed(running_on_dgx_01, signed):
    job = running_on_dgx_01
    deliver(
        scheduling_tasks.job_event,
        signed(token_of("dgx-01"), "dgx-01", "scheduling.job_event", started(job)),
    )
    job.refresh_from_db()
    assert (job.state, job.pid) == (JobState.RUNNING, 4242)
    assert refusals() == []


def test_a_forged_job_event_for_another_nodes_job_is_refused(running_on_dgx_01, signed, caplog):
    job = running_on_dgx_01
    forged = signed(token_of("dgx-02"), "dgx-02", "scheduling.job_event", started(job))
    with caplog.at_level(logging.WARNING, logger="gpuadmin.access"):
        deliver(scheduling_tasks.job_event, forged)
    job.refresh_from_db()
    assert (job.state, job.pid) == (JobState.SCHEDULED, None)
    why = f"job {job.pk}.1 was not placed on node 'dgx-02'"
    assert refusals() == [why]
    assert f"refused scheduling.job_event from node dgx-02: {why}" in caplog.text


def test_the_central_side_may_report_about_any_job(running_on_dgx_01, signed):
    job = running_on_dgx_01
    deliver(scheduling_tasks.job_event, signed(None, "", "scheduling.job_event", started(job)))
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_a_batch_of_job_events_believes_each_only_from_its_jobs_node(
    running_on_dgx_01, signed, django_user_model
):
    """An agent's batch (``scheduling.job_events``) is judged event by event: the events of
    jobs placed on the sender are recorded in order, one about a job elsewhere is refused."""
    job = running_on_dgx_01
    other = submission.submit_job(
        django_user_model.objects.create_user("bob"), command=["true"], gpu_count=8
    )
    loop.run_pass()
    other.refresh_from_db()
    assert set(other.allocations.values_list("node__hostname", flat=True)) == {"dgx-02"}
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    batch = [
        JobStarted(f"{job.pk}.1", 4242, at).to_dict(),
        JobStarted(f"{other.pk}.1", 99, at).to_dict(),
        JobFinished(f"{job.pk}.1", FinalState.COMPLETED, 0, at).to_dict(),
    ]
    deliver(
        scheduling_tasks.job_events,
        signed(token_of("dgx-01"), "dgx-01", "scheduling.job_events", (batch,)),
    )
    job.refresh_from_db()
    other.refresh_from_db()
    assert (job.state, job.exit_code) == (JobState.COMPLETED, 0)
    assert not job.allocations.filter(released_at__isnull=True).exists()
    assert (other.state, other.pid) == (JobState.SCHEDULED, None)
    assert refusals() == [f"job {other.pk}.1 was not placed on node 'dgx-01'"]
    audited = AuditEvent.objects.filter(target_type="scheduling.job", target_id=str(job.pk))
    assert list(audited.order_by("pk").values_list("event_type", flat=True))[-2:] == [
        "job.running",
        "job.completed",
    ]


def sync_args(hostname: str, model: str, tmp_path) -> tuple:
    backend = open_backend("sim", sim_model=model, node_name=hostname, state_dir=str(tmp_path))
    now = datetime.now(UTC).isoformat()
    return (hostname, scan(backend).to_dict(), now, model, "1.0", "sim")


def test_a_forged_scan_for_another_node_is_refused(signed, tmp_path):
    add_sim_node("dgx-01")
    before = list(Node.objects.get(hostname="dgx-01").gpus.values_list("uuid", flat=True))
    forged = signed(
        token_of("dgx-02"),
        "dgx-02",
        "inventory.sync_node",
        sync_args("dgx-01", "pcie-l40s-4x", tmp_path),
    )
    assert deliver(inventory_tasks.sync_node, forged) == {"changes": 0}
    node = Node.objects.get(hostname="dgx-01")
    assert list(node.gpus.values_list("uuid", flat=True)) == before
    assert node.model != "pcie-l40s-4x"
    assert refusals() == ["node 'dgx-02' reported for node 'dgx-01'"]


def test_a_scan_from_its_own_node_registers_it(signed, tmp_path):
    own = signed(
        token_of("box-01"),
        "box-01",
        "inventory.sync_node",
        sync_args("box-01", "pcie-l40s-4x", tmp_path),
    )
    deliver(inventory_tasks.sync_node, own)
    assert Node.objects.get(hostname="box-01").gpus.count() == 4


def test_a_revoked_credential_is_refused(signed):
    node = add_sim_node("dgx-01")
    token = token_of("dgx-01")
    beat = ("dgx-01", datetime(2030, 1, 1, tzinfo=UTC).isoformat())
    deliver(inventory_tasks.heartbeat, signed(token, "dgx-01", "inventory.heartbeat", beat))
    node.refresh_from_db()
    assert node.last_heartbeat_at == datetime(2030, 1, 1, tzinfo=UTC)

    assert nodes.revoke_credentials("dgx-01", actor_name="tests") == 1
    later = ("dgx-01", datetime(2030, 1, 2, tzinfo=UTC).isoformat())
    deliver(inventory_tasks.heartbeat, signed(token, "dgx-01", "inventory.heartbeat", later))
    node.refresh_from_db()
    assert node.last_heartbeat_at == datetime(2030, 1, 1, tzinfo=UTC)
    [why] = refusals()
    assert why.endswith("is revoked")
    assert AuditEvent.objects.filter(event_type="node_credential.revoked").count() == 1


def test_an_agents_scan_says_what_confines_its_jobs(signed, settings, tmp_path):
    """``inventory.sync_node``'s ``isolation``: what the agent says confines the node's jobs
    and why not, stored with its registration (so a first start is never lost) and audited
    once per change; an older agent's scan (without it) leaves it alone."""
    why = "not root, and /sys/fs/cgroup/gpuadmin is not delegated to this agent"
    said = {"isolation": "none", "reason": why}
    settings.GPUADMIN_NVML, settings.GPUADMIN_SIM_MODEL = "sim", "pcie-l40s-4x"
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path / "sim"

    def scan_report(node: str, isolation: dict[str, str] | None) -> tuple:
        sent: list[tuple] = []
        loop = AgentLoop(node, lambda name, args, **_: sent.append(args), isolation=isolation)
        loop.sync()
        return sent[0]

    token = token_of("dgx-01")
    for isolation in [said, said, None]:
        args = scan_report("dgx-01", isolation)
        deliver(inventory_tasks.sync_node, signed(token, "dgx-01", "inventory.sync_node", args))
    node = Node.objects.get(hostname="dgx-01")
    assert (node.isolation, node.isolation_reason) == ("none", why)
    [changed] = AuditEvent.objects.filter(event_type="node.isolation_changed")
    assert (changed.actor_name, changed.after) == (
        "agent",
        {"isolation": "none", "isolation_reason": why},
    )
    confined = {"isolation": "cgroup v2 (devices, kill, cpu_time)", "reason": ""}
    args = scan_report("dgx-01", confined)
    deliver(inventory_tasks.sync_node, signed(token, "dgx-01", "inventory.sync_node", args))
    node.refresh_from_db()
    assert (node.isolation, node.isolation_reason) == (confined["isolation"], "")
    # Another node's word about it is refused.
    forged = scan_report("dgx-01", said)
    deliver(
        inventory_tasks.sync_node,
        signed(token_of("dgx-02"), "dgx-02", "inventory.sync_node", forged),
    )
    assert Node.objects.get(hostname="dgx-01").isolation == confined["isolation"]


def test_unsigned_tampered_stale_and_borrowed_reports_are_refused(signed, settings):
    token = token_of("dgx-01")
    args, headers = signed(token, "dgx-01", "scheduling.agent_jobs", ("dgx-01", []))
    header = headers[HEADER]
    name = "scheduling.agent_jobs"
    assert nodes.verify(header, name, args, {}) == "dgx-01"

    def refused(header: Any, args: Any = args, **kwargs: Any) -> str:
        with pytest.raises(nodes.ReportRefused) as caught:
            nodes.verify(header, name, args, {}, **kwargs)
        return str(caught.value)

    assert refused(None) == "unsigned report"
    assert refused(header, ["dgx-01", [[1, 1]]]) == "bad signature"
    assert refused({**header, "sig": "\u00e9" * len(header["sig"])}) == "bad signature"
    assert refused({**header, "sender": "dgx-02"}).startswith("credential #")
    assert refused(header, now=header["at"] + settings.GPUADMIN_NODE_REPORT_MAX_AGE_S + 1)
    # A node cannot pass its report off as the central side's.
    assert refused({**header, "sender": "", "key": 0}) == "bad signature"


@pytest.mark.parametrize(
    "token",
    ["", "gpn_", "gpn_x_secret", "gpn_12", "gpn_0_secret", "xgpn_1_s", "gpn_\u00b2_secret"],
)
def test_what_is_not_a_node_token_is_a_value_error(token):
    with pytest.raises(ValueError, match="not a gpuadmin node token"):
        parse_token(token)
    assert parse_token(" gpn_12_secret\n") == (12, "secret")


@pytest.mark.integration
def test_an_agent_process_has_no_database(tmp_path):
    """``GPUADMIN_AGENT``: settings load without DATABASE_URL, and any ORM use raises."""
    code = (
        "import django; django.setup()\n"
        "from inventory.models import Node\n"
        "try:\n    Node.objects.count()\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "GPUADMIN_AGENT": "1",
        "SECRET_KEY": "x" * 40,
        "GPUADMIN_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO_DIR, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ImproperlyConfigured a node agent has no database")
    assert list(tmp_path.iterdir()) == []  # no embedded server, nothing written
