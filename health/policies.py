"""Recovery policies: what the health app does about an event, once.

``handle(event_id)`` locks the event, picks the most specific enabled policy (the XID's own,
then its catalog resolution bucket's, then the kind's; an XID the catalog does not know gets
the "unknown XID" policy) and applies its actions in ``Action``'s order, in one transaction
with their audit rows: alert, fail or requeue the GPU's jobs (scheduling does it on commit,
told by ``jobs_on_gpus_must_stop``), fence the GPU (degraded, draining, offline), drain the
node, reset the GPU through its node's agent. Repeated firings on one GPU escalate. What was
done is written to ``event.outcome``. An XID the driver attributed to one MIG GPU instance and
that NVIDIA's catalog says stays with the application that met it (``contained_instance``: XID
94, or an application's own fault) acts on that instance's jobs only and never fences or resets
the whole GPU; XID 95 (uncontained) acts on the whole GPU as before.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from gpuadmin.audit.services import record
from health import alerts, quarantine, resets, xids
from health.choices import Action, EventKind, Severity
from health.models import HealthEvent, RecoveryPolicy
from health.signals import jobs_on_gpus_must_stop
from inventory.choices import GpuState, NodeState
from inventory.models import Gpu
from inventory.services import set_node_state

log = logging.getLogger("gpuadmin.health")

ACTOR = "health"
# ``RecoveryPolicy.resolution`` of the policy for XIDs that NVIDIA's catalog does not know.
UNKNOWN_XID = "UNKNOWN_XID"
ACTION_ORDER = {action: rank for rank, action in enumerate(Action.values)}
FENCES: dict[str, str] = {
    Action.DRAIN_GPU: GpuState.DRAINING,
    Action.DEGRADE_GPU: GpuState.DEGRADED,
    Action.OFFLINE_GPU: GpuState.OFFLINE,
}
ECC_RATE_WINDOW = timedelta(hours=1)  # correctable ECC thresholds are errors per hour
# The kinds whose policies act only above a threshold, and its unit.
THRESHOLD_UNITS = {EventKind.ECC_CORRECTED: "errors per hour", EventKind.THERMAL: "degrees C"}


def select_policy(kind: str, xid: int | None) -> RecoveryPolicy | None:
    """The most specific enabled policy for an event of ``kind`` (and ``xid``)."""
    policies = list(RecoveryPolicy.objects.filter(kind=kind, enabled=True).order_by("pk"))
    if kind == EventKind.XID and xid is not None:
        info = xids.lookup(xid)
        bucket = info.immediate if info else UNKNOWN_XID
        for wanted in (
            lambda p: p.xid == xid,
            lambda p: p.xid is None and p.resolution == bucket,
        ):
            found = next((policy for policy in policies if wanted(policy)), None)
            if found is not None:
                return found
    return next((p for p in policies if p.xid is None and not p.resolution), None)


def severity_for(kind: str, xid: int | None) -> str:
    """An event's severity: its policy's, else for an XID the catalog's (fatal: critical)."""
    policy = select_policy(kind, xid)
    if policy is not None:
        return policy.severity
    info = xids.lookup(xid) if xid is not None else None
    if info is not None and info.immediate == "IGNORE":
        return Severity.INFO
    return Severity.CRITICAL if info is not None and info.fatal else Severity.WARNING


def handle(event_id: int) -> list[str]:
    """Apply the event's policy once (a duplicate or a second worker finds it handled and
    returns what was done); the outcome's steps."""
    with transaction.atomic():
        # FOR NO KEY UPDATE: its key never changes, and a FOR UPDATE lock would block the
        # foreign-key check (at commit) of a rule pass that opens this event's alert meanwhile,
        # while this waits for that pass's alert of the same fingerprint: a deadlock.
        event = (
            HealthEvent.objects.select_for_update(of=("self",), no_key=True)
            .select_related("node", "gpu")
            .filter(pk=event_id)
            .first()
        )
        if event is None:
            return []
        if event.handled_at is not None:
            return list(event.outcome)
        policy = select_policy(event.kind, event.xid)
        run = _Run(event, policy, reason=event.describe())
        steps = run.apply()
        event.policy = policy if run.acted else None
        event.outcome = steps
        event.handled_at = timezone.now()
        event.save(update_fields=["policy", "outcome", "handled_at"])
        record(
            "health.event_handled",
            actor_name=ACTOR,
            target=event,
            after={"policy": policy.name if policy else None, "outcome": steps},
            message=run.reason,
        )
    log.info("%s: %s", run.reason, "; ".join(steps))
    return steps


@dataclasses.dataclass
class _Run:
    """One event's policy being applied: its steps, in words."""

    event: HealthEvent
    policy: RecoveryPolicy | None
    reason: str
    steps: list[str] = dataclasses.field(default_factory=list)
    acted: bool = False

    def apply(self) -> list[str]:
        policy = self.policy
        if policy is None:
            return ["no enabled recovery policy: stored only"]
        self.steps.append(f"policy {policy.name!r}")
        below = self._below_threshold(policy)
        if below:
            return [*self.steps, below]
        self.acted = True
        actions = sorted(set(policy.actions), key=ACTION_ORDER.__getitem__)
        actions = self._escalated(policy, actions)
        if not actions:
            self.steps.append("no action: stored only")
        for action in actions:
            getattr(self, f"_{action}")()
        return self.steps

    # --- when to act

    def _below_threshold(self, policy: RecoveryPolicy) -> str:
        """Why the event stays under the policy's threshold ("" when it does not)."""
        if policy.threshold is None:
            return ""
        event = self.event
        if event.kind == EventKind.ECC_CORRECTED and event.gpu is not None:
            since = event.occurred_at - ECC_RATE_WINDOW
            reports = HealthEvent.objects.filter(
                gpu=event.gpu, kind=EventKind.ECC_CORRECTED, occurred_at__gt=since
            ).exclude(pk=event.pk)
            rate = _delta(event.data) + sum(map(_delta, reports.values_list("data", flat=True)))
            if rate <= policy.threshold:
                return (
                    f"{rate:g} correctable ECC errors in the last hour: "
                    f"not above {policy.threshold:g}"
                )
        if event.kind == EventKind.THERMAL:
            temperature = _evidence(event.data).get("temperature_c")
            if isinstance(temperature, int | float) and temperature <= policy.threshold:
                return f"{temperature:g} C: not above {policy.threshold:g} C"
        return ""

    def _escalated(self, policy: RecoveryPolicy, actions: list[str]) -> list[str]:
        """The ``escalate_after``-th firing on one GPU in the window: the fencing and resets
        give way to ``escalate_to`` (3 resets in 24 h: offline)."""
        gpu = self.event.gpu
        if not policy.escalate_after or not policy.escalate_to or gpu is None:
            return actions
        since = timezone.now() - timedelta(seconds=policy.escalate_window_s)
        fired = (
            1 + HealthEvent.objects.filter(gpu=gpu, policy=policy, handled_at__gte=since).count()
        )
        if fired < policy.escalate_after:
            return actions
        self.steps.append(
            f"escalated: firing {fired} on this GPU within {policy.escalate_window_s} s "
            f"(after {policy.escalate_after}): {policy.escalate_to}"
        )
        kept = [a for a in actions if a not in FENCES and a != Action.RESET_GPU]
        return sorted({*kept, policy.escalate_to}, key=ACTION_ORDER.__getitem__)

    # --- the GPUs it acts on

    @functools.cached_property
    def gpus(self) -> list[Gpu]:
        event = self.event
        if self.policy is not None and self.policy.node_wide:
            return list(Gpu.objects.filter(node=event.node).present().order_by("index"))
        return [event.gpu] if event.gpu is not None else []

    def _no_gpu(self, action: str) -> bool:
        if self.gpus:
            return False
        self.steps.append(f"{action}: the event names no GPU")
        return True

    # --- the actions (named after ``Action``'s values)

    def _alert(self) -> None:
        event, policy = self.event, self.policy
        assert policy is not None
        alert = alerts.open_alert(
            fingerprint=alerts.event_fingerprint(event),
            severity=policy.severity,
            summary=event.summary(),
            node=event.node,
            gpu=event.gpu,
            event=event,
            labels={
                "alertname": "health policy",
                "policy": policy.name,
                "kind": event.kind,
                **({"xid": str(event.xid)} if event.xid is not None else {}),
            },
        )
        self.steps.append(f"alert {alert.pk} firing")

    def _fail_job(self) -> None:
        self._stop_jobs("fail")

    def _requeue_job(self) -> None:
        self._stop_jobs("requeue")

    def _stop_jobs(self, action: str) -> None:
        if self._no_gpu(f"{action} jobs"):
            return
        instance = contained_instance(self.event)
        gpu_ids = [gpu.pk for gpu in self.gpus]
        info = xids.lookup(self.event.xid) if self.event.xid is not None else None
        blamed = info is not None and info.fault == xids.APPLICATION
        transaction.on_commit(
            functools.partial(
                _send_stop_jobs,
                gpu_ids=gpu_ids,
                action=action,
                reason=f"{self.reason}: an application error" if blamed else self.reason,
                event_id=self.event.pk,
            )
        )
        pid = pid_of(self.event)
        what = f"the job of pid {pid}" if pid else "the jobs"
        where = self._gpu_names()
        if instance is not None:
            where = f"GPU instance {instance} of {where}"
        self.steps.append(f"{action} {what} on {where}")

    def _drain_gpu(self) -> None:
        self._fence_all(Action.DRAIN_GPU)

    def _degrade_gpu(self) -> None:
        self._fence_all(Action.DEGRADE_GPU)

    def _offline_gpu(self) -> None:
        self._fence_all(Action.OFFLINE_GPU)

    def _fence_all(self, action: str) -> None:
        if not self._no_gpu(action) and not self._contained(action):
            for gpu in self.gpus:
                self.steps.append(self._fence(gpu, FENCES[action]))

    def _contained(self, action: str) -> bool:
        """Whether the event is contained to one MIG GPU instance: then ``action`` (a fence,
        a reset) is not done to the whole GPU, and the outcome says so."""
        instance = contained_instance(self.event)
        if instance is None:
            return False
        self.steps.append(
            f"{action}: not done to {self._gpu_names()}, the error was contained to its "
            f"GPU instance {instance}"
        )
        return True

    def _fence(self, gpu: Gpu, to_state: str) -> str:
        """Quarantine ``gpu`` in ``to_state`` (``health.quarantine.fence``: never back to a
        lighter state, and not while the circuit breaker is open)."""
        gpu.refresh_from_db(fields=["state"])
        before = gpu.state
        fenced = quarantine.fence(gpu, event=self.event, policy=self.policy, to_state=to_state)
        gpu.refresh_from_db(fields=["state"])
        if gpu.state != before:
            return f"GPU {gpu.index}: {before} -> {gpu.state}" + (
                " (quarantined)" if fenced else ""
            )
        if quarantine.GRAVITY[GpuState(before)] < quarantine.GRAVITY[GpuState(to_state)]:
            return f"GPU {gpu.index} not fenced: the circuit breaker is open"
        return f"GPU {gpu.index} already {gpu.state}: left as it is"

    def _drain_node(self) -> None:
        node = self.event.node
        node.refresh_from_db(fields=["state"])
        if node.state != NodeState.ONLINE:
            self.steps.append(f"node {node.hostname} already {node.state}: left as it is")
            return
        set_node_state(node, NodeState.DRAINING, actor_name=ACTOR, reason=self.reason)
        self.steps.append(f"node {node.hostname}: online -> draining")

    def _reset_gpu(self) -> None:
        if self._no_gpu("reset") or self._contained(Action.RESET_GPU):
            return
        node = self.event.node
        if quarantine.breaker_open() is not None:
            self.steps.append(f"{self._gpu_names()} not reset: the circuit breaker is open")
            return
        for gpu in self.gpus:
            gpu.refresh_from_db(fields=["state"])
            if gpu.state in (GpuState.OFFLINE, GpuState.RESETTING):
                self.steps.append(f"GPU {gpu.index} {gpu.state}: not reset")
                continue
            if not resets.reset_allowed(node.nvml_backend):
                self.steps.append(
                    f"reset of GPU {gpu.index} not allowed (GPUADMIN_GPU_RESET, NVML "
                    f"{node.nvml_backend or 'unknown'}): fenced for an admin instead"
                )
                self.steps.append(self._fence(gpu, GpuState.DEGRADED))
                continue
            before = gpu.state
            resets.start_reset(gpu, reason=self.reason)
            transaction.on_commit(
                functools.partial(
                    resets.ask_agent, node.hostname, gpu.index, gpu.uuid, self.event.pk
                )
            )
            self.steps.append(
                f"GPU {gpu.index}: {before} -> resetting (asked of the agent of {node.hostname})"
            )

    def _gpu_names(self) -> str:
        indexes = ", ".join(str(gpu.index) for gpu in self.gpus)
        return f"GPU{'s' if len(self.gpus) > 1 else ''} {indexes}"


def _send_stop_jobs(*, gpu_ids: list[int], action: str, reason: str, event_id: int) -> None:
    """Tell scheduling to stop the jobs on ``gpu_ids`` (after the event's commit); a receiver
    that fails is logged, never undoes what the policy did."""
    for receiver, result in jobs_on_gpus_must_stop.send_robust(
        sender=HealthEvent, gpu_ids=gpu_ids, action=action, reason=reason, event_id=event_id
    ):
        if isinstance(result, Exception):
            log.error("%s could not %s the jobs on GPUs %s: %r", receiver, action, gpu_ids, result)


def _evidence(data: Any) -> dict[str, Any]:
    """The agent's raw evidence inside a stored report (``HealthReport.data``)."""
    inner = data.get("data") if isinstance(data, dict) else None
    return inner if isinstance(inner, dict) else {}


def _delta(data: Any) -> float:
    value = _evidence(data).get("delta")
    return float(value) if isinstance(value, int | float) else 0.0


def contained_instance(event: HealthEvent) -> int | None:
    """The MIG GPU instance an XID stays in: the event names one (NVML's gpuInstanceId, the
    kernel line's GPU-I) and NVIDIA's catalog says the error is contained to the application
    that met it (XID 94) or is that application's own fault (XID 13, 31, 43...). None: the
    whole GPU (XID 95, uncontained; or no instance named). The one rule for the policy's
    steps and for the jobs scheduling stops."""
    if event.gpu_instance_id is None or event.xid is None or event.gpu_id is None:
        return None
    info = xids.lookup(event.xid)
    if info is None or not (info.contained or info.fault == xids.APPLICATION):
        return None
    return event.gpu_instance_id


def pid_of(event: HealthEvent) -> int | None:
    """The process an XID names, when the agent's report carries one (scheduling stops only
    that process's job when it is one of the GPU's)."""
    pid = _evidence(event.data).get("pid")
    return pid if isinstance(pid, int) and pid > 0 else None


# --------------------------------------------------------------------------- editing policies

POLICY_FIELDS = (
    "name",
    "kind",
    "xid",
    "resolution",
    "severity",
    "actions",
    "node_wide",
    "threshold",
    "escalate_after",
    "escalate_window_s",
    "escalate_to",
    "probation_s",
    "reset_before_probation",
    "enabled",
)


def _fields(policy: RecoveryPolicy) -> dict[str, Any]:
    return {name: getattr(policy, name) for name in POLICY_FIELDS}


def save_policy(policy: RecoveryPolicy, *, actor: User) -> RecoveryPolicy:
    """Create or change a policy (audited ``health.policy_created``/``health.policy_changed``,
    before and after); the next event it matches acts by it."""
    with transaction.atomic():
        old = RecoveryPolicy.objects.select_for_update().filter(pk=policy.pk).first()
        policy.save()
        record(
            "health.policy_changed" if old else "health.policy_created",
            actor=actor,
            target=policy,
            before=_fields(old) if old else None,
            after=_fields(policy),
        )
    return policy


def delete_policy(policy: RecoveryPolicy, *, actor: User) -> None:
    """Delete a policy (audited ``health.policy_deleted``); its events keep their outcome."""
    with transaction.atomic():
        record("health.policy_deleted", actor=actor, target=policy, before=_fields(policy))
        policy.delete()
