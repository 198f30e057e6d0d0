"""An agent takes orders only from the central side: what is sent to a node's queue (jobs to
run, cancels, log tails, MIG changes, scans, resets) is signed for that node with its
credential, and its agent carries out nothing else: not an unsigned order, nor one for another
node, signed with another key, too old, replayed or altered."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Task
from django.db import transaction

from gpuadmin.access import node_orders, nodes
from gpuadmin.access.node_orders import (
    ORDER_HEADER,
    OrderRefused,
    SeenOrders,
    check_order,
    order_header,
)
from gpuadmin.access.node_signing import make_token, parse_token, signature
from gpuadmin.celery import app
from health import resets
from inventory import live
from inventory import services as inventory_services
from inventory.agent import scan_this_node
from inventory.choices import GpuState
from scheduling import tasks as scheduling_tasks
from scheduling.agent import jobs as agent
from scheduling.agent.wire import JobSpec
from scheduling.jobs import submission
from scheduling.loop import passes as loop
from scheduling.models import Job, JobState
from tests.scheduling.conftest import add_sim_node
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db

TOKEN = make_token(7, "salt")
ARGS = [[{"job_id": "1.1", "argv": ["true"]}]]


def keys(token: str = TOKEN) -> tuple[tuple[int, str]]:
    return (parse_token(token),)


def refused(
    header: Any, args: Any = ARGS, seen: SeenOrders | None = None, token: str = TOKEN, **kw: Any
) -> str:
    with pytest.raises(OrderRefused) as caught:
        check_order(
            header,
            "scheduling.run_jobs",
            args,
            {},
            node="dgx-01",
            token=token,
            seen=seen or SeenOrders(),
            **kw,
        )
    return str(caught.value)


def test_an_order_is_taken_only_as_signed_for_this_agent_once_and_recently(settings):
    header = order_header(keys(), "scheduling.run_jobs", "dgx-01", ARGS)
    seen = SeenOrders()
    check_order(header, "scheduling.run_jobs", ARGS, {}, node="dgx-01", token=TOKEN, seen=seen)

    assert refused(header, seen=seen) == "replayed: this order was already carried out"
    assert refused(None) == "unsigned order"
    assert refused({"node": "dgx-01"}) == "malformed signature header"
    # Tampered: other arguments (a job run as root), another task, another node.
    as_root = [[{"job_id": "1.1", "argv": ["true"], "unix_user": "root", "allow_root": True}]]
    assert refused(header, as_root) == "bad signature"
    with pytest.raises(OrderRefused, match="bad signature"):
        check_order(header, "scheduling.cancel_job", ARGS, {}, node="dgx-01", token=TOKEN)
    assert refused({**header, "node": "dgx-02"}) == "signed for node 'dgx-02', not 'dgx-01'"
    # Signed for another node (with its key, or with this agent's).
    for token in (make_token(8, "other"), TOKEN):
        other = order_header(keys(token), "scheduling.run_jobs", "dgx-02", ARGS)
        assert refused(other) == "signed for node 'dgx-02', not 'dgx-01'"
        assert refused({**other, "node": "dgx-01"}).endswith(
            "bad signature" if token == TOKEN else "not signed with this agent's credential #7"
        )
    # A key that is not this agent's, under its credential's id (a guessed secret).
    guessed = order_header(((7, "guessed"),), "scheduling.run_jobs", "dgx-01", ARGS)
    assert refused(guessed) == "bad signature"
    assert refused({**header, "sigs": {"7": "\u00e9" * 64}}) == "bad signature"
    # Too old, or from too far ahead.
    max_age = settings.GPUADMIN_NODE_REPORT_MAX_AGE_S
    assert refused(header, now=header["at"] + max_age + 1).startswith(
        f"signed {max_age + 1} s ago, beyond GPUADMIN_NODE_REPORT_MAX_AGE_S"
    )
    assert refused(header, now=header["at"] - max_age - 1).startswith("signed -")
    # A report's signature (what an agent signs with the same key) is never an order's.
    report = signature(parse_token(TOKEN)[1], "scheduling.run_jobs", "dgx-01", header["at"], ARGS)
    assert refused({**header, "sigs": {"7": report}}) == "bad signature"
    assert refused(header, token="").startswith("this agent has no node credential")


def test_an_order_is_signed_with_each_credential_in_force_of_its_node(monkeypatch):
    first, first_token = nodes.create_credential("dgx-01", actor_name="tests")
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(app, "send_task", lambda name, **options: sent.append(options))
    nodes.send_order("dgx-01", "scheduling.tail_log", (3, 1, 10))
    _, second_token = nodes.create_credential("dgx-01", actor_name="tests")  # a rotation
    nodes.send_order("dgx-01", "scheduling.tail_log", (3, 1, 10))
    nodes.revoke_credential(first, actor_name="tests")
    nodes.send_order("dgx-01", "scheduling.tail_log", (3, 1, 10))
    signers = [sorted(options["headers"][ORDER_HEADER]["sigs"]) for options in sent]
    one, two = (str(parse_token(token)[0]) for token in (first_token, second_token))
    assert signers == [[one], sorted([one, two]), [two]]
    assert {options["queue"] for options in sent} == {"node.dgx-01"}
    for options, token in zip(sent, (first_token, second_token, second_token), strict=True):
        wire = json.loads(json.dumps(options))
        check_order(
            wire["headers"][ORDER_HEADER],
            "scheduling.tail_log",
            wire["args"],
            wire["kwargs"],
            node="dgx-01",
            token=token,
        )
    nodes.revoke_credentials("dgx-01", actor_name="tests")
    with pytest.raises(nodes.NoCredential, match="cannot reach the agent of dgx-01"):
        nodes.send_order("dgx-01", "scheduling.tail_log", (3, 1, 10))


def test_the_keys_of_a_pass_cost_one_query_and_none_once_cached(django_assert_num_queries):
    for node in ("dgx-01", "dgx-02"):
        nodes.create_credential(node, actor_name="tests")
    with django_assert_num_queries(1):
        loaded = nodes.order_keys(["dgx-01", "dgx-02", "dgx-03"])
    assert [len(loaded[node]) for node in ("dgx-01", "dgx-02", "dgx-03")] == [1, 1, 0]
    with django_assert_num_queries(0):
        assert nodes.order_keys(["dgx-01", "dgx-02", "dgx-03"]) == loaded


def test_a_job_placed_on_a_node_without_credential_fails_saying_so(
    django_user_model, broker, django_capture_on_commit_callbacks, caplog
):
    add_sim_node("dgx-01")
    job = submission.submit_job(
        django_user_model.objects.create_user("alice"), command=["true"], gpu_count=1
    )
    nodes.revoke_credentials("dgx-01", actor_name="tests")
    with django_capture_on_commit_callbacks(execute=True):
        loop.run_pass()
    assert broker.named("scheduling.run_jobs") == []
    [((event,), _)] = broker.named("scheduling.job_event")
    assert event["message"] == "cannot reach the agent of dgx-01: the node has no credential"
    # Recorded as an agent's report of a job it could not start (within its retries).
    scheduling_tasks.job_event(event)
    assert Job.objects.get(pk=job.pk).state == JobState.FAILED


def test_a_node_without_credential_is_not_asked_and_the_caller_is_told(broker):
    node = add_sim_node("dgx-01")
    nodes.revoke_credentials("dgx-01", actor_name="tests")
    why = "cannot reach the agent of dgx-01: the node has no credential"
    with pytest.raises(inventory_services.DiscoveryFailed, match=why):
        inventory_services.discover_node(node)
    gpu = node.gpus.get(index=0)
    with transaction.atomic():
        resets.start_reset(gpu, reason="XID 79")
    resets.ask_agent("dgx-01", gpu.index, gpu.uuid, None)
    gpu.refresh_from_db()
    assert gpu.state == GpuState.DEGRADED
    assert why in gpu.state_reason
    assert broker.sent == []


# --------------------------------------------------------------------------- on the agent


@pytest.fixture
def this_agent(settings: Any, tmp_path: Path, monkeypatch) -> str:
    """This process as the agent of a simulated node holding its credential; its reports are
    dropped."""
    hostname = f"orders-{uuid.uuid4().hex[:8]}"
    settings.GPUADMIN_NVML = "sim"
    settings.GPUADMIN_SIM_MODEL = "dgx-a100-40gb"
    settings.GPUADMIN_NODE_NAME = hostname
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path / "sim"
    settings.GPUADMIN_DATA_DIR = tmp_path / "data"
    settings.GPUADMIN_JOBS_AS_OWNER = "off"
    settings.GPUADMIN_NODE_TOKEN = nodes.create_credential(hostname, actor_name="tests")[1]
    monkeypatch.setattr(agent, "_executor", None)
    scan_this_node()  # creates the node's simulator state
    yield hostname
    if agent._executor is not None:
        agent._executor.shutdown(kill=True)
    monkeypatch.setattr(app, "send_task", lambda *args, **options: None)
    agent.flush_reports()
    live.client().delete(live.KEY_PREFIX + hostname)


def as_sent(monkeypatch, node: str, name: str, args: tuple) -> dict[str, Any]:
    """The message the central side puts on ``node``'s queue for this order, as the agent's
    worker receives it (JSON)."""
    sent: list[dict[str, Any]] = []
    with monkeypatch.context() as patch:
        patch.setattr(app, "send_task", lambda _, **options: sent.append(options))
        nodes.send_order(node, name, args)
    [options] = sent
    return json.loads(json.dumps({key: options[key] for key in ("args", "kwargs", "headers")}))


def deliver(task: Task, message: dict[str, Any]) -> None:
    """Run ``task`` as the agent's worker runs a message (not as a call in this process)."""
    task.apply(args=message["args"], kwargs=message["kwargs"], headers=message["headers"])


def test_a_forged_run_jobs_runs_nothing_and_a_signed_one_runs(
    this_agent, monkeypatch, tmp_path, caplog
):
    forged_file, signed_file = tmp_path / "forged", tmp_path / "signed"
    gpu = scan_this_node(include=("facts",)).gpus[2].facts.uuid

    def spec(job_id: str, touched: Path, **fields: Any) -> tuple[list[dict[str, Any]]]:
        job = JobSpec(job_id=job_id, argv=["touch", str(touched)], gpu_uuids=[gpu], cwd="/")
        return ([{**job.to_dict(), **fields}],)

    forged = spec("900.1", forged_file, unix_user="root", allow_root=True)
    signed = as_sent(monkeypatch, this_agent, "scheduling.run_jobs", spec("901.1", signed_file))
    nodes.create_credential("dgx-02", actor_name="tests")
    attempts = [
        {"args": forged, "kwargs": {}, "headers": {}},  # unsigned
        # Signed, but with the arguments swapped for the forger's.
        {**signed, "args": json.loads(json.dumps(forged))},
        # Signed for another node, by its own credential's key.
        {**as_sent(monkeypatch, "dgx-02", "scheduling.run_jobs", forged)},
    ]
    with caplog.at_level(logging.WARNING, logger="gpuadmin.access"):
        for message in attempts:
            deliver(scheduling_tasks.run_jobs, message)
    assert agent._executor is None  # nothing even reached the executor
    assert [record.getMessage().split(": ", 1)[1] for record in caplog.records] == [
        "unsigned order",
        "bad signature",
        f"signed for node 'dgx-02', not '{this_agent}'",
    ]
    assert all(
        record.getMessage().startswith("refused order scheduling.run_jobs[")
        for record in caplog.records
    )

    deliver(scheduling_tasks.run_jobs, signed)
    wait_for(signed_file.exists, 30, "the signed job to run")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpuadmin.access"):
        deliver(scheduling_tasks.run_jobs, signed)  # replayed
    [replayed] = caplog.records
    assert replayed.getMessage().endswith("replayed: this order was already carried out")
    assert not forged_file.exists()


def test_every_task_on_a_node_queue_takes_only_signed_orders():
    """One rule for every order: each task an agent serves is a ``NodeOrder``."""
    on_node_queues = {
        "scheduling.run_jobs",
        "scheduling.run_job",
        "scheduling.cancel_job",
        "scheduling.tail_log",
        "inventory.scan_node",
        "inventory.mig_create",
        "inventory.mig_destroy",
        "health.reset_gpu",
    }
    app.loader.import_default_modules()
    orders = {name for name, task in app.tasks.items() if isinstance(task, node_orders.NodeOrder)}
    assert orders == on_node_queues
