"""Health events in: what agents report (and the central side notices) is stored once, with its
raw data, and handed to the recovery policies (``health.policies``)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.utils import timezone

from health import xids
from health.choices import EventKind
from health.models import HealthEvent
from health.policies import handle, severity_for
from health.wire import HealthReport
from inventory.choices import NodeState
from inventory.models import Gpu, Node

log = logging.getLogger("gpuadmin.health")
_KINDS = frozenset(EventKind.values)


def record_reports(hostname: str, reports: list[HealthReport]) -> list[int]:
    """Store ``reports`` from node ``hostname`` as health events, each (node, report key) once
    however often it is sent (``INSERT ... ON CONFLICT DO NOTHING`` on ``dedupe_key``).
    Returns the ids of these reports' events that no policy has handled yet: the new ones,
    and any a crashed worker stored but did not act on (``handle`` acts on each once)."""
    node = Node.objects.filter(hostname=hostname).first()
    if node is None:
        log.warning("health reports from unknown node %s ignored", hostname)
        return []
    gpus = list(Gpu.objects.filter(node=node).order_by("missing_since", "index"))
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    by_index: dict[int, Gpu] = {}
    for gpu in gpus:  # a present GPU wins over a missing one that had its index
        by_index.setdefault(gpu.index, gpu)
    now = timezone.now()
    events = []
    for report in reports:
        if report.kind not in _KINDS:
            log.warning("node %s reported an unknown health event kind %r", hostname, report.kind)
            continue
        target = by_uuid.get(report.gpu_uuid or "") or (
            by_index.get(report.gpu_index) if report.gpu_index is not None else None
        )
        events.append(
            HealthEvent(
                node=node,
                gpu=target,
                kind=report.kind,
                xid=report.xid,
                gpu_instance_id=_gpu_instance(report),
                severity=severity_for(report.kind, report.xid),
                message=_message(report),
                data=report.to_dict(),
                occurred_at=datetime.fromtimestamp(report.occurred_at, tz=UTC),
                received_at=now,
                dedupe_key=f"{hostname}:{report.key}"[:200],
            )
        )
    if not events:
        return []
    HealthEvent.objects.bulk_create(events, ignore_conflicts=True)
    return list(
        HealthEvent.objects.filter(
            dedupe_key__in=[event.dedupe_key for event in events], handled_at__isnull=True
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _gpu_instance(report: HealthReport) -> int | None:
    """The MIG GPU instance an XID report names (the agent's NVML event carries it in
    ``data``), None for the whole GPU."""
    value = report.data.get("gpu_instance_id") if report.kind == EventKind.XID else None
    return value if isinstance(value, int) and 0 <= value < 2**15 else None


def _message(report: HealthReport) -> str:
    """What the agent said beyond the event's title (``HealthEvent.title``: the kind, or the
    XID by the catalog's name): an XID's text that only repeats the catalog's name is left out."""
    info = xids.lookup(report.xid) if report.xid is not None else None
    if report.kind == EventKind.XID and info is not None and not info.adds_to_name(report.message):
        return ""
    return report.message


def receive_reports(hostname: str, reports: list[HealthReport]) -> list[int]:
    """Store ``reports`` and run the recovery policy of each event not yet handled (the fast
    path: fault to fenced in the same task); the events' ids."""
    event_ids = record_reports(hostname, reports)
    for event_id in event_ids:
        handle(event_id)
    return event_ids


def watch_heartbeats() -> list[int]:
    """One ``heartbeat_lost`` event per silence episode of each node past the heartbeat
    grace (its key holds the last heartbeat: a node heard from again and lost again makes a
    new one), handled by its policy. Nodes never heard from, and offline nodes (expected to be
    silent), have none. The new events' ids."""
    event_ids = []
    now = timezone.now()
    for hostname, heard in (
        Node.objects.unreachable(now)
        .exclude(state=NodeState.OFFLINE)
        .filter(last_heartbeat_at__isnull=False)
        .values_list("hostname", "last_heartbeat_at")
    ):
        report = HealthReport(
            kind=EventKind.HEARTBEAT_LOST,
            key=f"heartbeat_lost:{heard.isoformat()}",
            occurred_at=now.timestamp(),
            message=f"last heartbeat {heard:%Y-%m-%d %H:%M:%S}",
            data={"last_heartbeat_at": heard.isoformat()},
        )
        event_ids += receive_reports(hostname, [report])
    return event_ids
