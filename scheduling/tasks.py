"""Celery tasks of the scheduling app: thin wrappers around ``scheduling.loop``,
``scheduling.services`` and (on node queues) ``scheduling.agent``.

Central (default queue): ``placement_pass``, ``sweep_reservations`` (beat, every minute),
``job_event`` and ``agent_jobs`` (what agents report, believed only from the node a report is
about: ``gpuadmin.access.nodes``). Node queues (``node.<name>``): ``run_job``, ``cancel_job``
and ``tail_log``. A job travels as ``JobSpec.to_dict()`` and its events as
``JobStarted``/``JobFinished.to_dict()`` (``scheduling.executor``).
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from gpuadmin.access.nodes import CENTRAL, refuse, reporting_node, speaks_for
from scheduling import accounting, agent, loop, relayout, reservations, services, sharing
from scheduling.executor import JobFinished, event_from_dict


@shared_task(name="scheduling.placement_pass", ignore_result=True)
def placement_pass() -> None:
    loop.run_woken_pass()


@shared_task(name="scheduling.account_usage", ignore_result=True)
def account_usage() -> None:
    accounting.roll_up_recent()


@shared_task(name="scheduling.sweep_reservations", ignore_result=True)
def sweep_reservations() -> None:
    reservations.sweep()


@shared_task(name="scheduling.job_event", ignore_result=True, bind=True)
def job_event(self: Task, event: dict[str, Any]) -> None:
    """An executor's event, believed from the central side or a node the job's attempt was
    placed on."""
    sender = reporting_node(self)
    if sender is None:
        return
    parsed = event_from_dict(event)
    if sender != CENTRAL and not services.placed_on(parsed.job_id, sender):
        refuse(self.name, sender, f"job {parsed.job_id} was not placed on node {sender!r}")
        return
    services.job_event(parsed)
    if isinstance(parsed, JobFinished):  # only an end frees a GPU that drains for a re-layout
        relayout.nudge()


@shared_task(name="scheduling.agent_jobs", ignore_result=True, bind=True)
def agent_jobs(self: Task, hostname: str, running: list[list[int]]) -> None:
    """A (re)started agent's list of the (job, attempt) it runs."""
    if speaks_for(self, hostname):
        services.reconcile_node_jobs(hostname, {(job, attempt) for job, attempt in running})


@shared_task(name="scheduling.run_job", ignore_result=True)
def run_job(spec: dict[str, Any]) -> None:
    agent.run_job(spec)


@shared_task(name="scheduling.cancel_job", ignore_result=True)
def cancel_job(
    job_id: int,
    attempt: int,
    message: str,
    signal_name: str = "SIGTERM",
    grace_s: float | None = None,
) -> None:
    agent.cancel_job(job_id, attempt, message, signal_name, grace_s)


@shared_task(name="scheduling.advance_relayouts", ignore_result=True)
def advance_relayouts() -> None:
    """MIG re-layouts take their next steps (beat, and agents' job reports)."""
    relayout.advance_open()


@shared_task(name="scheduling.create_mig_instance", ignore_result=True)
def create_mig_instance(gpu_id: int, profile: str, placement_start: int, job_id: int) -> None:
    """The MIG instance the placement loop asked for a waiting job (dynamic MIG)."""
    sharing.create_requested_instance(gpu_id, profile, placement_start, job_id)


@shared_task(name="scheduling.tail_log")
def tail_log(job_id: int, attempt: int, lines: int) -> dict[str, Any]:
    return agent.tail_log(job_id, attempt, lines)
