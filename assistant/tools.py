"""The assistant's tools: gpuadmin's read-only queries, each a function of the asking user
and keyword arguments whose JSON schema is derived from its signature
(``assistant.schema``). They see what the user sees through the API (``visible_jobs``,
``can_read_private``, the audit log's readers), filter through the apps' FilterSets, and
return JSON-ready dicts in which every object they name carries ``ref`` (how to cite it)
and ``url`` (its page). None of them changes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from types import SimpleNamespace
from typing import Annotated, Any, Literal

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone

from assistant.schema import describe, schema_of
from gpuadmin.access.services import can_read_private
from gpuadmin.audit import access as audit_access
from gpuadmin.audit.filters import AuditEventFilterSet
from gpuadmin.audit.models import AuditEvent
from health.choices import AlertState, EventKind, Severity
from health.filters import AlertFilterSet
from health.models import Alert, HealthEvent
from inventory.choices import GpuState
from inventory.filters import GpuFilterSet
from inventory.models import Gpu, Node
from inventory.pages.fleet import gpu_rows
from scheduling.allocations import accounting
from scheduling.filters import JobFilterSet, ReservationFilterSet
from scheduling.jobs.queries import no_job_text, visible_jobs, with_details
from scheduling.models import Job, JobState, Reservation, ReservationState

Asker = User | AnonymousUser
Limit = Annotated[int, "How many rows at most (1-50)."]
MAX_ROWS = 50


class ToolRefused(Exception):
    """A tool's refusal, said to the model as the call's result (not found, not allowed,
    a filter that does not read)."""


@dataclass(frozen=True)
class Tool:
    """One function the model may call: its name, what it does and its arguments' schema."""

    name: str
    function: Callable[..., dict[str, Any]]
    description: str
    parameters: dict[str, Any] = field(hash=False)

    def spec(self) -> dict[str, Any]:
        """As the chat-completions request's ``tools`` lists it."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


TOOLS: dict[str, Tool] = {}


def tool(function: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Register ``function`` as a tool named after it."""
    name = function.__name__
    TOOLS[name] = Tool(name, function, describe(function), schema_of(function))
    return function


# --------------------------------------------------------------------------- helpers


def _rows(limit: int) -> int:
    if not 1 <= limit <= MAX_ROWS:
        raise ToolRefused(f"limit: between 1 and {MAX_ROWS}")
    return limit


def _filtered(
    user: Asker, filterset_class: Any, data: Mapping[str, Any], queryset: QuerySet[Any]
) -> Any:
    """``queryset`` through the app's FilterSet (the API's filters, ``me`` the asker); its
    errors refused."""
    data = {name: value for name, value in data.items() if value is not None}
    filterset = filterset_class(data, queryset, request=SimpleNamespace(user=user))
    if not filterset.is_valid():
        errors = "; ".join(
            f"{name}: {' '.join(messages)}" for name, messages in filterset.errors.items()
        )
        raise ToolRefused(errors)
    return filterset.qs


def _when(value: Any) -> str | None:
    return value.isoformat(timespec="seconds") if value else None


def gpu_ref(gpu: Gpu) -> dict[str, str]:
    return {
        "ref": f"GPU {gpu.index} of {gpu.node.hostname}",
        "url": reverse("inventory:gpu-detail", args=[gpu.uuid]),
    }


def node_ref(hostname: str) -> dict[str, str]:
    return {"ref": hostname, "url": reverse("inventory:node-detail", args=[hostname])}


def job_ref(job_id: int) -> dict[str, str]:
    return {"ref": f"job {job_id}", "url": reverse("scheduling:job-detail", args=[job_id])}


def alert_ref(alert: Alert) -> dict[str, str]:
    return {"ref": f"alert {alert.pk}", "url": f"{reverse('health:alerts')}?id={alert.pk}"}


# --------------------------------------------------------------------------- jobs


def _job_facts(job: Job) -> dict[str, Any]:
    facts: dict[str, Any] = {
        **job_ref(job.pk),
        "name": job.name,
        "owner": job.owner.get_username(),
        "project": job.project,
        "state": job.state,
        "pool": job.pool.name if job.pool else None,
        "gpu_count": job.gpu_count,
        "gpu_model": job.gpu_model,
        "submitted_at": _when(job.submitted_at),
        "started_at": _when(job.started_at),
        "finished_at": _when(job.finished_at),
        "exit_code": job.exit_code,
        "message": job.message,
    }
    if job.pending_code or job.pending_reason:
        facts |= {
            "waiting_code": job.pending_code,
            "waiting_reason": job.pending_reason,
            "queue_position": job.queue_position,
            "estimated_start_at": _when(job.estimated_start_at),
            "what_if": job.what_if,
        }
    return facts


@tool
def get_job(user: Asker, *, job_id: Annotated[int, "The job's number."]) -> dict[str, Any]:
    """One job: its state, owner and GPUs, and for a waiting job why it waits (the
    placement loop's reason, queue position, estimated start and what would let it start).

    Its command line and environment are included only for those who may read them."""
    job = with_details(visible_jobs(user)).filter(pk=job_id).first()
    if job is None:
        raise ToolRefused(no_job_text(user, job_id))
    facts = _job_facts(job)
    facts["gpus"] = [
        {
            **gpu_ref(allocation.gpu),
            "attempt": allocation.attempt,
            "released": allocation.released_at is not None,
        }
        for allocation in job.allocations.all()
    ]
    facts["dependencies"] = [
        {**job_ref(dependency.on_id), "kind": dependency.kind, "state": dependency.on.state}
        for dependency in job.dependencies.all()
    ]
    if can_read_private(user, job):
        facts |= {"command": job.command, "env": job.env}
    else:
        facts["command"] = "(private to its owner)"
    return facts


@tool
def list_jobs(
    user: Asker,
    *,
    state: JobState | None = None,
    owner: Annotated[str | None, "A username, or me for the asker."] = None,
    node: Annotated[str | None, "Jobs that ran or run on this node (hostname)."] = None,
    limit: Limit = 20,
) -> dict[str, Any]:
    """Jobs the asker may see (a user sees only their own), newest first, with why each
    waiting one waits."""
    jobs = _filtered(
        user,
        JobFilterSet,
        {"state": [state] if state else None, "owner": owner, "node": node},
        visible_jobs(user).select_related("owner", "pool"),
    )
    found = list(jobs[: _rows(limit)])
    return {"jobs": [_job_facts(job) for job in found], "shown": len(found)}


# --------------------------------------------------------------------------- GPUs and nodes


def _gpu_facts(row: Any) -> dict[str, Any]:
    gpu = row.gpu
    occupant = row.occupant
    unusable = row.unusable
    return {
        **gpu_ref(gpu),
        "uuid": gpu.uuid,
        "model": gpu.name,
        "state": gpu.state,
        "status": str(row.status),
        "unusable_because": unusable.message if unusable else None,
        "held_by": (
            {"ref": occupant.label, "url": occupant.job_url, "user": occupant.user}
            if occupant
            else None
        ),
        "utilization_pct": row.utilization_pct,
        "memory_used_mib": row.memory_used_mib,
        "memory_total_mib": row.memory_total_mib,
        "temperature_c": row.temperature_c,
        "power_w": row.power_w,
    }


@tool
def list_gpus(
    user: Asker,
    *,
    node: Annotated[str | None, "A node's hostname."] = None,
    model: Annotated[str | None, "The GPU model contains this (H100, A100...)."] = None,
    state: Annotated[GpuState | None, "Its service state (as set by people and policies)."] = None,
    free: Annotated[bool | None, "true: only GPUs usable now and held by no job."] = None,
    limit: Limit = 50,
) -> dict[str, Any]:
    """GPUs with their live status: state, why each cannot take work now, the job and user
    holding it, utilization, memory, temperature and power."""
    gpus = _filtered(
        user,
        GpuFilterSet,
        {"node": node, "model": model, "state": state, "free": free},
        Gpu.objects.select_related("node").order_by("node__hostname", "index"),
    )
    total = gpus.count()
    rows = gpu_rows(gpus[: _rows(limit)])
    return {"gpus": [_gpu_facts(row) for row in rows.values()], "total": total}


@tool
def node_health(user: Asker, *, hostname: Annotated[str, "The node's hostname."]) -> dict[str, Any]:
    """Is a node healthy: its state, whether its agent is heard, its GPUs' status, its open
    alerts and its health events of the last 7 days."""
    node = Node.objects.filter(hostname=hostname).first()
    if node is None:
        raise ToolRefused(f"no node {hostname}")
    gpus = Gpu.objects.filter(node=node).select_related("node").order_by("index")
    since = timezone.now() - timedelta(days=7)
    events = HealthEvent.objects.filter(node=node, occurred_at__gte=since).select_related(
        "gpu__node", "node"
    )
    return {
        **node_ref(node.hostname),
        "state": node.state,
        "reachable": node.is_reachable(),
        "last_heartbeat_at": _when(node.last_heartbeat_at),
        "gpus": [_gpu_facts(row) for row in gpu_rows(gpus).values()],
        "open_alerts": [
            _alert_facts(alert)
            for alert in Alert.objects.filter(node=node, resolved_at__isnull=True)[:MAX_ROWS]
        ],
        "events_last_7_days": [_event_facts(event) for event in events[:MAX_ROWS]],
    }


# --------------------------------------------------------------------------- health


def _event_facts(event: HealthEvent) -> dict[str, Any]:
    where = gpu_ref(event.gpu) if event.gpu else node_ref(event.node.hostname)
    return {
        **where,
        "event": event.summary(),
        "kind": event.kind,
        "xid": event.xid,
        "severity": event.severity,
        "occurred_at": _when(event.occurred_at),
        "policy_outcome": event.outcome,
    }


@tool
def health_events(
    user: Asker,
    *,
    kind: EventKind | None = None,
    node: Annotated[str | None, "A node's hostname."] = None,
    gpu_uuid: Annotated[str | None, "One GPU's UUID."] = None,
    days: Annotated[int, "How many days back (1-90)."] = 7,
    limit: Limit = 50,
) -> dict[str, Any]:
    """Health events (XID errors, ECC errors, thermal and power slowdowns, lost GPUs...) of
    the last ``days`` days, newest first, with what the recovery policy did."""
    if not 1 <= days <= 90:
        raise ToolRefused("days: between 1 and 90")
    events = HealthEvent.objects.filter(
        occurred_at__gte=timezone.now() - timedelta(days=days)
    ).select_related("gpu__node", "node")
    if kind:
        events = events.filter(kind=kind)
    if node:
        events = events.filter(node__hostname=node)
    if gpu_uuid:
        events = events.filter(gpu__uuid=gpu_uuid)
    found = list(events[: _rows(limit)])
    return {"events": [_event_facts(event) for event in found], "total": events.count()}


def _alert_facts(alert: Alert) -> dict[str, Any]:
    return {
        **alert_ref(alert),
        "summary": alert.summary,
        "state": alert.state,
        "severity": alert.severity,
        "opened_at": _when(alert.opened_at),
        "resolved_at": _when(alert.resolved_at),
        "acknowledged": alert.acknowledged_at is not None,
    }


@tool
def list_alerts(
    user: Asker,
    *,
    state: AlertState | None = None,
    severity: Severity | None = None,
    node: Annotated[str | None, "A node's hostname."] = None,
    limit: Limit = 20,
) -> dict[str, Any]:
    """Alerts, firing ones first, newest first."""
    alerts = _filtered(
        user,
        AlertFilterSet,
        {"state": state, "severity": severity, "node": node},
        Alert.objects.order_by("state", "-opened_at", "-pk"),
    )
    return {"alerts": [_alert_facts(alert) for alert in alerts[: _rows(limit)]]}


# --------------------------------------------------------------------------- reservations, usage


@tool
def list_reservations(
    user: Asker,
    *,
    state: ReservationState | None = None,
    owner: Annotated[str | None, "A username, or me for the asker."] = None,
    node: Annotated[str | None, "A node's hostname."] = None,
    limit: Limit = 20,
) -> dict[str, Any]:
    """Reservations of GPUs (who booked which GPUs for when), latest start first."""
    reservations = _filtered(
        user,
        ReservationFilterSet,
        {"state": [state] if state else None, "owner": owner, "node": node},
        Reservation.objects.select_related("owner", "node").order_by("-start", "-pk"),
    )
    return {
        "reservations": [
            {
                "ref": f"reservation {reservation.pk}",
                "url": reverse("reservations:list"),
                "owner": reservation.owner.get_username(),
                "state": reservation.state,
                "gpu_count": reservation.gpu_count,
                "gpu_model": reservation.gpu_model,
                "node": reservation.node.hostname if reservation.node else None,
                "start": _when(reservation.start),
                "end": _when(reservation.end),
            }
            for reservation in reservations[: _rows(limit)]
        ]
    }


@tool
def gpu_usage(
    user: Asker,
    *,
    start: Annotated[date | None, "First day (default: the month's first)."] = None,
    end: Annotated[date | None, "Last day (default: today)."] = None,
    group: Literal["user", "project", "pool"] = "user",
) -> dict[str, Any]:
    """GPU-hours allocated, used and held idle per user, project or pool over a period
    (accounting, updated every few minutes)."""
    try:
        period = accounting.period(start, end, group)
    except accounting.PeriodInvalid as exc:
        raise ToolRefused(str(exc)) from None
    rows = accounting.usage(period.start, period.end, period.group)
    return {
        "start": period.start.isoformat(),
        "end": period.end.isoformat(),
        "url": f"{reverse('scheduling:usage')}?start={period.start}&end={period.end}",
        "ref": "usage",
        "rows": [
            {
                "name": row.name,
                "allocated_gpu_h": round(row.allocated_h, 2),
                "used_gpu_h": round(row.used_h, 2),
                "idle_held_gpu_h": round(row.idle_held_h, 2),
            }
            for row in rows[:MAX_ROWS]
        ],
    }


# --------------------------------------------------------------------------- audit


@tool
def audit_log(
    user: Asker,
    *,
    target_type: Annotated[str | None, "What changed: job, gpu, node, reservation..."] = None,
    target_id: Annotated[str | None, "The changed object's key (a job's number...)."] = None,
    actor: Annotated[str | None, "Who changed it (a username, placement-loop...)."] = None,
    limit: Limit = 20,
) -> dict[str, Any]:
    """The audit log, newest first: who changed what, when, before and after (operators
    and admins only)."""
    if not audit_access.can_read(user):
        raise ToolRefused("the audit log is for operators and admins")
    events = _filtered(
        user,
        AuditEventFilterSet,
        {"target_type": target_type, "target_id": target_id, "actor": actor},
        AuditEvent.objects.all(),
    )
    return {
        "events": [
            {
                "ref": f"audit event {event.pk}",
                "url": f"{reverse('audit-log')}?request_id={event.request_id}"
                if event.request_id
                else reverse("audit-log"),
                "time": _when(event.time),
                "actor": event.actor_name,
                "event_type": event.event_type,
                "target": f"{event.target_type} {event.target_id} {event.object_repr}".strip(),
                "before": event.before,
                "after": event.after,
                "message": event.message,
            }
            for event in events[: _rows(limit)]
        ]
    }
