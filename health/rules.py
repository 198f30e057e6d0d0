"""Evaluating the alert rules (beat's ``health.evaluate_alerts``, every
``GPUADMIN_ALERT_INTERVAL_S``), and counting idle-held GPU time per user.

One pass costs the same few steps whatever the fleet's size: the rules, the nodes and the
GPUs (three queries), every node's latest samples (one Redis round trip, ``inventory.live``),
the "since when does it hold" state of the duration rules (one read, one write: a Redis hash,
never a row per sample), the occupants (one query per answer of
``gpuadmin.registry.gpu_occupants``: scheduling's jobs, Slurm's), the firing alerts (one
query). Only the alerts that open or resolve in the pass cost more (``health.alerts``).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Max, Q, Sum
from django.utils import timezone

from gpuadmin.redis_client import client
from gpuadmin.registry import Occupant, OccupantKind
from health import alerts
from health.choices import (
    CONDITION_RULE_KINDS,
    SEVERITY_RANK,
    AlertState,
    EventKind,
    RuleKind,
    Severity,
)
from health.models import Alert, AlertRule, HealthEvent, IdleHeldUsage, RecoveryPolicy
from health.services import receive_reports
from health.wire import HealthReport
from inventory import live, usability
from inventory.choices import NodeState
from inventory.live import LiveSample
from inventory.models import Gpu, Node
from inventory.occupancy import Occupancy
from inventory.units import duration_text

logger = logging.getLogger("gpuadmin.health.rules")


def state_key(name: str) -> str:
    """The Redis key of the evaluation's state, one set per database (test sessions share a
    Redis): ``since`` {rule id:GPU uuid: Unix time the condition began}, ``idle_counted``
    {rule id:GPU uuid: idle time counted up to}, ``event_mark:<rule id>`` (last event seen)."""
    return f"gpuadmin:alerts:{connection.settings_dict['NAME']}:{name}"


OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
GPU_KINDS = (RuleKind.METRIC, RuleKind.IDLE_HELD, RuleKind.FOREIGN_PROCESS)


@dataclasses.dataclass(frozen=True, slots=True)
class GpuRow:
    pk: int
    uuid: str
    index: int
    name: str
    node_id: int
    hostname: str


@dataclasses.dataclass(slots=True)
class Finding:
    """A rule's condition holding (long enough) on one GPU or node in this pass."""

    fingerprint: str
    rule: AlertRule
    summary: str
    node_id: int | None = None
    gpu_id: int | None = None
    labels: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class Evaluation:
    """What a pass did (the task logs it; tests and the benchmark read it)."""

    gpus: int = 0
    findings: int = 0
    opened: int = 0
    resolved: int = 0
    idle_gpu_seconds: float = 0.0
    thermal_events: int = 0
    elapsed_ms: float = 0.0


def evaluate(now: float | None = None) -> Evaluation:
    """One pass over every enabled rule: open what holds, resolve what cleared."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    result = Evaluation()
    rules = list(AlertRule.objects.filter(enabled=True))
    gpu_rules = [rule for rule in rules if rule.kind in GPU_KINDS]
    nodes = list(Node.objects.values_list("pk", "hostname", "state", "last_heartbeat_at"))
    findings: dict[str, Finding] = {}
    unknown: set[str] = set()  # conditions a pass could not see (no sample): left as they are
    samples: dict[str, dict[str, LiveSample]] = {}
    gpus: list[GpuRow] = []
    thermal = _thermal_threshold()
    if gpu_rules or thermal is not None:
        hostname_of = {pk: hostname for pk, hostname, _state, _heard in nodes}
        gpus = [
            GpuRow(pk, uuid, index, name, node_id, hostname_of[node_id])
            for pk, uuid, index, name, node_id in Gpu.objects.present().values_list(
                "pk", "uuid", "index", "name", "node_id"
            )
        ]
        samples = live.latest(hostname_of.values())
        result.gpus = len(gpus)
    if gpu_rules:
        _gpu_findings(gpu_rules, gpus, samples, now, findings, unknown, result)
    for rule in rules:
        if rule.kind == RuleKind.NODE_UNREACHABLE:
            _unreachable_findings(rule, nodes, findings)
    result.findings = len(findings)
    _apply(findings, unknown, result)
    for rule in rules:
        if rule.kind == RuleKind.HEALTH_EVENT:
            result.opened += _event_alerts(rule, now)
    if thermal is not None:
        result.thermal_events = _record_hot(thermal, gpus, samples, now)
    result.elapsed_ms = (time.perf_counter() - started) * 1000
    return result


def _gpu_findings(
    rules: list[AlertRule],
    gpus: list[GpuRow],
    samples: dict[str, dict[str, LiveSample]],
    now: float,
    findings: dict[str, Finding],
    unknown: set[str],
    result: Evaluation,
) -> None:
    """Per GPU rules: the condition, since when it holds (Redis), whether long enough; and
    the idle-held time of each user."""
    pipe = client().pipeline(transaction=False)
    since_key, counted_key = state_key("since"), state_key("idle_counted")
    pipe.hgetall(since_key)
    pipe.hgetall(counted_key)
    raw_since, raw_counted = pipe.execute()
    since_before = {key.decode(): float(value) for key, value in raw_since.items()}
    counted_before = {key.decode(): float(value) for key, value in raw_counted.items()}
    since: dict[str, float] = {}
    counted: dict[str, float] = {}
    idle: dict[str, float] = defaultdict(float)  # username -> GPU-seconds in this pass
    needs_occupants = any(rule.kind != RuleKind.METRIC for rule in rules)
    occupancy = Occupancy([gpu.pk for gpu in gpus]) if needs_occupants else None
    for gpu in gpus:
        sample = samples.get(gpu.hostname, {}).get(gpu.uuid)
        occupant = occupancy.get(gpu.pk) if occupancy is not None else None
        for rule in rules:
            field = f"{rule.pk}:{gpu.uuid}"
            fingerprint = f"rule:{rule.pk}:gpu:{gpu.uuid}"
            if not sample:
                unknown.add(fingerprint)
                if field in since_before:
                    since[field] = since_before[field]
                continue
            summary = _gpu_condition(rule, sample, occupant)
            if summary is None:
                continue
            began = since[field] = since_before.get(field, now)
            if now - began < rule.duration_s:
                continue
            labels = {"alertname": rule.name, "gpu": str(gpu.index), "UUID": gpu.uuid}
            if rule.kind == RuleKind.IDLE_HELD and occupant is not None:
                labels.update(user=occupant.user, job=occupant.ref)
                # Idle-held hours are gpuadmin users'; a Slurm job's user is Slurm's.
                if occupant.kind == OccupantKind.JOB:
                    start = max(began, counted_before.get(field, began))
                    idle[occupant.user] += max(0.0, now - start)
                    counted[field] = now
            findings[fingerprint] = Finding(
                fingerprint=fingerprint,
                rule=rule,
                summary=f"GPU {gpu.index} of {gpu.hostname}: {summary} "
                f"for {duration_text(now - began)}",
                node_id=gpu.node_id,
                gpu_id=gpu.pk,
                labels=labels,
            )
    pipe = client().pipeline(transaction=True)
    pipe.delete(since_key, counted_key)
    if since:
        pipe.hset(since_key, mapping=since)
    if counted:
        pipe.hset(counted_key, mapping=counted)
    pipe.execute()
    if idle:
        # The day of the pass's clock, not the wall's: a pass's time is what it counted to.
        day = timezone.localdate(datetime.fromtimestamp(now, UTC))
        result.idle_gpu_seconds = count_idle(idle, day)


def _held_by(occupant: Occupant) -> str:
    """``allocated to job 12``, ``held by Slurm job 1234 on hpc``."""
    if occupant.kind == OccupantKind.JOB:
        return f"allocated to job {occupant.job_id}"
    return f"held by {occupant.label}"


def _gpu_condition(rule: AlertRule, sample: LiveSample, occupant: Any) -> str | None:
    """What holds on the GPU for this rule (a phrase for the summary), or None."""
    threshold = rule.threshold
    if rule.kind == RuleKind.METRIC:
        fields: Mapping[str, Any] = sample  # the rule names its field
        value = fields.get(rule.metric)
        compare = OPERATORS.get(rule.operator)
        if value is None or threshold is None or compare is None:
            return None
        if not compare(float(value), threshold):
            return None
        return f"{rule.metric} {value} {rule.operator} {threshold:g}"
    if rule.kind == RuleKind.IDLE_HELD:
        if occupant is None or threshold is None:
            return None
        utilization = sample.get("utilization_gpu_pct")
        memory_activity = sample.get("utilization_memory_pct")
        if utilization is None:  # MIG: utilization is not measurable, so never "idle"
            return None
        if utilization >= threshold or (memory_activity or 0) >= threshold:
            return None
        return (
            f"{_held_by(occupant)} of {occupant.user} but idle "
            f"({utilization}% utilization, {memory_activity or 0}% memory activity)"
        )
    if rule.kind == RuleKind.FOREIGN_PROCESS:
        why = usability.sample_unusable(sample, allocated=occupant is not None)
        if why is None or why.code != usability.Reason.FOREIGN_PROCESS:
            return None
        pids = ", ".join(str(pid) for pid, *_rest in sample.get("pids") or [])
        return why.message + (f" (pids {pids})" if pids else "")
    return None


def _unreachable_findings(
    rule: AlertRule,
    nodes: Iterable[tuple[int, str, str, datetime | None]],
    findings: dict[str, Finding],
) -> None:
    """Nodes whose agent has not been heard from within the grace (an offline node is
    expected to be silent)."""
    unreachable = set(
        Node.objects.unreachable().exclude(state=NodeState.OFFLINE).values_list("pk", flat=True)
    )
    for pk, hostname, _state, heard in nodes:
        if pk not in unreachable:
            continue
        last = f"last heard {heard:%Y-%m-%d %H:%M:%S}" if heard else "never heard from"
        fingerprint = alerts.unreachable_fingerprint(hostname)
        findings[fingerprint] = Finding(
            fingerprint=fingerprint,
            rule=rule,
            summary=f"node {hostname} is unreachable ({last})",
            node_id=pk,
            labels={"alertname": rule.name},
        )


def _apply(findings: dict[str, Finding], unknown: set[str], result: Evaluation) -> None:
    """Open the new findings, keep the firing ones seen, resolve those that cleared."""
    firing = set(
        Alert.objects.filter(
            state=AlertState.FIRING, rule__kind__in=CONDITION_RULE_KINDS
        ).values_list("fingerprint", flat=True)
    )
    still = firing & findings.keys()
    if still:
        Alert.objects.filter(state=AlertState.FIRING, fingerprint__in=still).update(
            last_seen_at=timezone.now()
        )
    gpus = Gpu.objects.in_bulk(
        [f.gpu_id for f in findings.values() if f.gpu_id and f.fingerprint not in firing]
    )
    nodes = Node.objects.in_bulk(
        [f.node_id for f in findings.values() if f.node_id and f.fingerprint not in firing]
    )
    for fingerprint in findings.keys() - firing:
        finding = findings[fingerprint]
        alerts.open_alert(
            fingerprint=fingerprint,
            severity=finding.rule.severity,
            summary=finding.summary,
            node=nodes.get(finding.node_id) if finding.node_id else None,
            gpu=gpus.get(finding.gpu_id) if finding.gpu_id else None,
            rule=finding.rule,
            labels=finding.labels,
        )
        result.opened += 1
    for fingerprint in firing - findings.keys() - unknown:
        result.resolved += alerts.resolve_alert(fingerprint)


def _event_alerts(rule: AlertRule, now: float) -> int:
    """Health events at or above the rule's severity received since the last pass (a
    watermark in Redis) open (or renew) the alert of their kind and GPU; those not renewed for
    the rule's ``duration_s`` resolve."""
    mark_key = state_key(f"event_mark:{rule.pk}")
    raw_mark = cast("bytes | None", client().get(mark_key))
    mark = int(raw_mark) if raw_mark is not None else None
    rank = SEVERITY_RANK[Severity(rule.severity)]
    severities = [severity for severity, level in SEVERITY_RANK.items() if level >= rank]
    events = HealthEvent.objects.filter(severity__in=severities).select_related("node", "gpu")
    if mark is None:  # the first pass looks back a few intervals, not at all the history
        events = events.filter(
            received_at__gte=timezone.now()
            - timedelta(seconds=settings.GPUADMIN_ALERT_INTERVAL_S * 3)
        )
    else:
        events = events.filter(pk__gt=mark)
    opened = 0
    # Where the next pass starts: after what this one saw, or after every event there is.
    last = mark if mark is not None else HealthEvent.objects.aggregate(last=Max("pk"))["last"] or 0
    for event in events.order_by("pk")[:1000]:
        last = max(last, event.pk)
        alerts.open_alert(
            fingerprint=alerts.event_fingerprint(event),
            severity=event.severity,
            summary=event.summary(),
            node=event.node,
            gpu=event.gpu,
            event=event,
            rule=rule,
            labels={
                "alertname": rule.name,
                "kind": event.kind,
                **({"xid": str(event.xid)} if event.xid else {}),
            },
        )
        opened += 1
    client().set(mark_key, last)
    if rule.duration_s:
        quiet = timezone.now() - timedelta(seconds=rule.duration_s)
        for fingerprint in Alert.objects.filter(
            state=AlertState.FIRING, rule=rule, last_seen_at__lt=quiet
        ).values_list("fingerprint", flat=True):
            alerts.resolve_alert(fingerprint)
    return opened


def _thermal_threshold() -> RecoveryPolicy | None:
    return (
        RecoveryPolicy.objects.filter(kind=EventKind.THERMAL, enabled=True, threshold__isnull=False)
        .order_by("pk")
        .first()
    )


def _record_hot(
    policy: RecoveryPolicy,
    gpus: list[GpuRow],
    samples: dict[str, dict[str, LiveSample]],
    now: float,
) -> int:
    """A THERMAL health event (one per GPU and minute) for each GPU hotter than the thermal
    policy's threshold: the policy engine fences it until it cools (DESIGN flow 3)."""
    threshold = float(policy.threshold or 0)
    hot: dict[str, list[HealthReport]] = defaultdict(list)
    for gpu in gpus:
        sample = samples.get(gpu.hostname, {}).get(gpu.uuid)
        temperature = None if sample is None else sample.get("temperature_c")
        if temperature is None or temperature <= threshold:
            continue
        hot[gpu.hostname].append(
            HealthReport(
                kind=EventKind.THERMAL,
                key=f"thermal:{gpu.uuid}:{int(now // 60)}",
                occurred_at=now,
                gpu_index=gpu.index,
                gpu_uuid=gpu.uuid,
                message=f"temperature {temperature} C above {threshold:g} C",
                data={"temperature_c": temperature, "threshold_c": threshold, "source": "central"},
            )
        )
    recorded = 0
    for hostname, reports in hot.items():
        recorded += len(receive_reports(hostname, reports))
    return recorded


def count_idle(seconds_by_user: dict[str, float], day: Any) -> float:
    """Add idle-held GPU-seconds to each user's row of ``day`` (one statement)."""
    ids = dict(
        get_user_model().objects.filter(username__in=seconds_by_user).values_list("username", "pk")
    )
    rows = [(ids[name], day, seconds) for name, seconds in seconds_by_user.items() if name in ids]
    if not rows:
        return 0.0
    values = ", ".join(["(%s, %s, %s)"] * len(rows))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO health_idleheldusage (user_id, day, gpu_seconds) VALUES "
            + values
            + " ON CONFLICT (user_id, day) DO UPDATE"
            " SET gpu_seconds = health_idleheldusage.gpu_seconds + EXCLUDED.gpu_seconds",
            [value for row in rows for value in row],
        )
    return sum(seconds for _user, _day, seconds in rows)


@dataclasses.dataclass(frozen=True, slots=True)
class IdleHeld:
    """One user's idle-held GPU-hours: today and over the last ``days``."""

    username: str
    today_hours: float
    period_hours: float


def idle_held_hours(days: int = 7) -> list[IdleHeld]:
    """Users by idle-held GPU-hours over the last ``days`` (today included), most first."""
    today = timezone.localdate()
    rows = (
        IdleHeldUsage.objects.filter(day__gt=today - timedelta(days=days))
        .values("user__username")
        .annotate(
            period=Sum("gpu_seconds"), today=Sum("gpu_seconds", filter=Q(day=today), default=0.0)
        )
        .order_by("-period")
    )
    return [
        IdleHeld(row["user__username"], row["today"] / 3600, row["period"] / 3600) for row in rows
    ]
