"""Celery tasks of the scheduling app: thin wrappers around ``scheduling.loop.passes``,
the job services (``scheduling.jobs``) and (on node queues) ``scheduling.agent.jobs``.

Central (default queue): ``placement_pass``, ``sweep_reservations`` (beat, every minute),
``requeue_unconfirmed`` (beat),
``job_events`` (``job_event``: one) and ``agent_jobs`` (what agents report, believed only from
the node a report is about: ``gpuadmin.access.nodes``). Node queues (``node.<name>``):
``run_jobs`` (``run_job``: one), ``cancel_job`` and ``tail_log``, carried out only as orders
the central side signed for the node (``gpuadmin.access.node_orders.NodeOrder``). A job travels as
``JobSpec.to_dict()`` and its events as ``JobStarted``/``JobFinished.to_dict()``
(``scheduling.agent.supervisor``).
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from gpuadmin.access.node_orders import NodeOrder
from gpuadmin.access.nodes import CENTRAL, refuse, reporting_node, speaks_for
from scheduling.agent import jobs as agent
from scheduling.agent.wire import JobFinished, event_from_dict
from scheduling.allocations import accounting
from scheduling.jobs import reports
from scheduling.loop import passes as loop
from scheduling.reservations import services as reservations
from scheduling.sharing import relayout
from scheduling.sharing import services as sharing


@shared_task(name="scheduling.placement_pass")
def placement_pass() -> None:
    loop.run_woken_pass()


@shared_task(name="scheduling.account_usage")
def account_usage() -> None:
    accounting.roll_up_recent()


@shared_task(name="scheduling.sweep_reservations")
def sweep_reservations() -> None:
    reservations.sweep()


@shared_task(name="scheduling.requeue_unconfirmed")
def requeue_unconfirmed() -> None:
    """Jobs placed longer than ``GPUADMIN_SCHEDULED_CONFIRM_S`` ago that no agent started,
    stopping jobs that wait for silent nodes (``reports.end_stops_on_silent_nodes``), and
    those whose heard-from nodes never report their processes gone
    (``reports.end_unkillable_stops``: the nodes drained)."""
    reports.requeue_unconfirmed()
    reports.end_stops_on_silent_nodes()
    reports.end_unkillable_stops()


@shared_task(name="scheduling.job_event", bind=True)
def job_event(self: Task, event: dict[str, Any]) -> None:
    """One executor event (the central side's own, and agents before ``job_events``)."""
    _record_events(self, [event], [])


@shared_task(name="scheduling.job_events", bind=True)
def job_events(
    self: Task, events: list[dict[str, Any]], node_stopped: list[str] | None = None
) -> None:
    """An agent's executor events, in the order they happened; ``node_stopped``: the jobs
    (executor ids) among them that it stopped because it stopped (``--stop-jobs-on-exit``)."""
    _record_events(self, events, node_stopped or [])


def _record_events(task: Task, events: list[dict[str, Any]], node_stopped: list[str]) -> None:
    """Executor events, believed from the central side or, each, from the node its job's
    attempt was placed on (the others are refused: logged and audited)."""
    sender = reporting_node(task)
    if sender is None:
        return
    parsed = [event_from_dict(event) for event in events]
    recorded = reports.job_events(
        parsed,
        sender=None if sender == CENTRAL else sender,
        node_stopped=node_stopped if sender != CENTRAL else (),
    )
    refused = set(recorded.not_placed_there)
    for name in recorded.not_placed_there:
        refuse(task.name, sender, f"job {name} was not placed on node {sender!r}")
    # Only an end frees a GPU that drains for a re-layout.
    if any(isinstance(event, JobFinished) and event.job_id not in refused for event in parsed):
        relayout.nudge()


@shared_task(name="scheduling.agent_jobs", bind=True)
def agent_jobs(self: Task, hostname: str, running: list[list[int]]) -> None:
    """A (re)started agent's list of the (job, attempt) it runs."""
    if not speaks_for(self, hostname):
        return
    reports.reconcile_node_jobs(hostname, {(job, attempt) for job, attempt in running})


@shared_task(name="scheduling.run_job", base=NodeOrder)
def run_job(spec: dict[str, Any]) -> None:
    """One job (what central workers sent before ``run_jobs``)."""
    agent.run_job(spec)


@shared_task(name="scheduling.run_jobs", base=NodeOrder)
def run_jobs(specs: list[dict[str, Any]]) -> None:
    """The jobs placed on this node together, in order."""
    agent.run_jobs(specs)


@shared_task(name="scheduling.cancel_job", base=NodeOrder)
def cancel_job(
    job_id: int,
    attempt: int,
    message: str,
    signal_name: str = "SIGTERM",
    grace_s: float | None = None,
) -> None:
    agent.cancel_job(job_id, attempt, message, signal_name, grace_s)


@shared_task(name="scheduling.advance_relayouts")
def advance_relayouts() -> None:
    """MIG re-layouts take their next steps (beat, and agents' job reports)."""
    relayout.advance_open()


@shared_task(name="scheduling.create_mig_instance")
def create_mig_instance(gpu_id: int, profile: str, placement_start: int, job_id: int) -> None:
    """The MIG instance the placement loop asked for a waiting job (dynamic MIG)."""
    sharing.create_requested_instance(gpu_id, profile, placement_start, job_id)


@shared_task(name="scheduling.tail_log", base=NodeOrder, ignore_result=False)
def tail_log(job_id: int, attempt: int, lines: int) -> dict[str, Any]:
    return agent.tail_log(job_id, attempt, lines)
