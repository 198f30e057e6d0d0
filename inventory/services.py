"""Inventory state changes: node registration, heartbeats, discovery sync and MIG instance
create/destroy through the node agent (all audited)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeoutError
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from redis.exceptions import RedisError

from gpuadmin import registry
from gpuadmin.access.nodes import NoCredential, send_order
from gpuadmin.audit.services import audit_event, changed_values, record, record_all
from gpuadmin.refusals import FieldRefusal
from inventory import live
from inventory.choices import GpuState, NvmlBackend
from inventory.discovery import (
    GPU_FIELDS,
    HOST_FIELDS,
    NODE_FIELDS,
    LinkKey,
    NicKey,
    StoredGpu,
    SyncPlan,
    plan_sync,
)
from inventory.models import (
    GPU_CATALOG_FIELDS,
    HELD_OUTSIDE_CHARS,
    NODE_CATALOG_FIELDS,
    STATE_REASON_CHARS,
    Gpu,
    GpuLink,
    GpuNicLink,
    MigInstance,
    Node,
    Pool,
)
from inventory.nvml.scanner import NodeScan
from inventory.occupancy import Occupancy
from inventory.querysets import GpuQuerySet, heartbeat_cutoff
from inventory.signals import gpus_became_schedulable, gpus_went_offline

DISCOVERY_ACTOR = "discovery"


def register_node(
    hostname: str,
    *,
    model: str = "",
    agent_version: str = "",
    nvml_backend: str = "",
    job_account: str = "",
    actor_name: str = "agent",
) -> Node:
    """Create the node on its agent's first start; later starts refresh what the agent says
    (its machine model, version, NVML backend (an ``NvmlBackend`` value) and whose account its
    jobs run as (``inventory.agent.job_account()``))."""
    if nvml_backend and nvml_backend not in NvmlBackend.values:
        raise ValueError(f"{nvml_backend!r} is not an NVML backend")
    said = {
        "model": model,
        "agent_version": agent_version,
        "nvml_backend": nvml_backend,
        "job_account": job_account,
    }
    with transaction.atomic():
        node, created = Node.objects.select_for_update().get_or_create(
            hostname=hostname, defaults=said
        )
        if created:
            record("node.registered", actor_name=actor_name, target=node, after=said)
            return node
        changed = {
            name: value for name, value in said.items() if value and getattr(node, name) != value
        }
        if changed:
            before = {name: getattr(node, name) for name in changed}
            Node.objects.filter(pk=node.pk).update(**changed)
            record(
                "node.agent_changed",
                actor_name=actor_name,
                target=node,
                before=before,
                after=changed,
            )
            node.refresh_from_db()
        return node


def record_node_isolation(
    hostname: str, isolation: str, reason: str, *, actor_name: str = "agent"
) -> bool:
    """Store what its agent says confines the node's jobs (``isolation``: one line, e.g. "cgroup
    v2 (devices, kill, cpu_time)", or "none") and why something is not confined (``reason``),
    audited ``node.isolation_changed`` when it changes; ``False`` when nothing changed or no
    such node. A line longer than the field is cut (an agent's words, never refused)."""
    said = {
        "isolation": isolation[: Node._meta.get_field("isolation").max_length],
        "isolation_reason": reason,
    }
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(hostname=hostname).first()
        if node is None:
            return False
        before, after = changed_values({name: getattr(node, name) for name in said}, said)
        if not after:
            return False
        Node.objects.filter(pk=node.pk).update(**after)
        record(
            "node.isolation_changed",
            actor_name=actor_name,
            target=node,
            before=before,
            after=after,
        )
    return True


def record_heartbeat(hostname: str, at: datetime | None = None) -> bool:
    """Note that the node's agent is alive; ``False`` for a node that never registered.

    A node heard from again after its grace ran out announces the GPUs this makes schedulable.
    """
    sent_at = at or timezone.now()
    nodes = Node.objects.filter(hostname=hostname)
    # The hot path, a node already heard from within its grace: one UPDATE, nothing to announce.
    # Never move the clock back: a late heartbeat from a retried task must not hide a newer one.
    if nodes.filter(
        last_heartbeat_at__gte=heartbeat_cutoff(), last_heartbeat_at__lt=sent_at
    ).update(last_heartbeat_at=sent_at):
        return True
    # Rare: the node was silent (or never heard from), the heartbeat is late, or no such node.
    with transaction.atomic():
        node = nodes.select_for_update().only("last_heartbeat_at").first()
        if node is None:
            return False
        if node.last_heartbeat_at is None or node.last_heartbeat_at < sent_at:
            with _announcing_schedulable(Gpu.objects.filter(node=node)):
                nodes.update(last_heartbeat_at=sent_at)
    return True


def apply_discovery(
    hostname: str,
    scan: NodeScan,
    *,
    actor_name: str = DISCOVERY_ACTOR,
    audited: Collection[tuple[str, str]] = (),
) -> SyncPlan:
    """Make the catalog match one scan of ``hostname``, in one transaction, audited (but for
    the changes ``audited`` names as (kind, GPU UUID): the caller's own row describes them).

    Upserts on natural keys (hostname, GPU UUID). GPUs absent from the scan are marked missing,
    never deleted; a GPU that comes back, or shows up on another node, keeps its row. Catalog
    fields are never written. An identical scan changes no row but the node's ``last_scan_at``.
    """
    now = timezone.now()
    with transaction.atomic():
        node, _ = Node.objects.select_for_update().get_or_create(hostname=hostname)
        scanned_uuids = [gpu.facts.uuid for gpu in scan.gpus if gpu.facts.uuid]
        rows = list(
            Gpu.objects.select_for_update(of=("self",))
            .filter(Q(node=node) | Q(uuid__in=scanned_uuids))
            .select_related("node")
            .prefetch_related("mig_instances")
            .order_by("pk")
        )
        by_uuid = {gpu.uuid: gpu for gpu in rows}
        plan = plan_sync(
            hostname,
            scan,
            node={name: getattr(node, name) for name in _NODE_DISCOVERED},
            stored={gpu.uuid: _stored(gpu) for gpu in rows},
            stored_links=_stored_links(node),
            stored_nic_links=_stored_nic_links(node),
        )
        Node.objects.filter(pk=node.pk).update(last_scan_at=now, **plan.node_updates)
        if plan.is_empty:
            return plan
        with _announcing_schedulable(Gpu.objects.filter(Q(node=node) | Q(uuid__in=scanned_uuids))):
            _apply_gpus(node, plan, by_uuid, now)
        if plan.links is not None:
            _apply_links(node, plan.links, plan.nic_links or {})
        for change in plan.changes:
            if (change.kind, change.uuid) in audited:
                continue
            target = by_uuid.get(change.uuid) if change.uuid else node
            record(
                change.kind,
                actor_name=actor_name,
                target=target,
                target_type="inventory.gpu" if change.uuid else "",
                target_id=change.uuid or "",
                before=change.before,
                after=change.after,
            )
    return plan


_NODE_DISCOVERED = (*NODE_FIELDS, "scan_error", *HOST_FIELDS)


# How long ``GET /gpu/discover`` waits for the node's agent to scan.
DISCOVER_TIMEOUT_S = 15.0


class DiscoveryFailed(RuntimeError):
    """An on-demand scan that could not be made: the node's agent is silent, did not answer,
    or its NVML failed; the catalog was left as it was."""


def discover_node(node: Node, *, actor_name: str = DISCOVERY_ACTOR) -> NodeScan:
    """Scan ``node`` now through its agent, apply the scan to the catalog (audited like any
    other, under ``actor_name``: who asked) and return it; ``DiscoveryFailed`` says why when it
    could not be done or NVML failed on the node."""
    if not node.is_reachable():
        raise DiscoveryFailed(
            f"node {node.hostname} is unreachable: no heartbeat in the last "
            f"{settings.GPUADMIN_HEARTBEAT_GRACE_S} s"
        )
    try:
        outcome = run_on_node(
            node.hostname,
            "inventory.scan_node",
            timeout=DISCOVER_TIMEOUT_S,
            unanswered="the catalog was left as it was",
        )
    except AgentTimedOut as exc:
        raise DiscoveryFailed(str(exc)) from None
    result = NodeScan.from_dict(outcome)
    # Applied even when NVML failed: the catalog shows what the node really answered.
    apply_discovery(node.hostname, result, actor_name=actor_name)
    if result.system.error:
        raise DiscoveryFailed(f"node {node.hostname}: {result.system.error}")
    return result


def _stored(gpu: Gpu) -> StoredGpu:
    mig = tuple(
        {name: getattr(instance, name) for name in MigInstance.DISCOVERED_FIELDS}
        for instance in sorted(gpu.mig_instances.all(), key=lambda i: (i.gi_id, i.ci_id))
    )
    return StoredGpu(
        uuid=gpu.uuid,
        hostname=gpu.node.hostname,
        missing=gpu.is_missing,
        fields={name: getattr(gpu, name) for name in GPU_FIELDS},
        mig=mig,
    )


def _stored_links(node: Node) -> dict[LinkKey, tuple[str, int]]:
    links = GpuLink.objects.filter(node=node).values_list(
        "gpu_a__uuid", "gpu_b__uuid", "link_type", "nvlink_count"
    )
    return {(min(a, b), max(a, b)): (kind, count) for a, b, kind, count in links}


def _apply_gpus(node: Node, plan: SyncPlan, by_uuid: dict[str, Gpu], now: datetime) -> None:
    # A present GPU's (node, index) is unique. GPUs that leave, change slot or arrive are first
    # set aside as missing, so that swaps and replacements never collide half-way.
    set_aside = {
        uuid
        for uuid, changed in plan.gpu_updates.items()
        if "index" in changed or uuid in plan.gpu_moved
    }
    Gpu.objects.filter(uuid__in=[*plan.gpu_missing, *set_aside]).update(missing_since=now)
    for uuid in plan.gpu_missing:
        by_uuid[uuid].missing_since = now
    for uuid, changed in plan.gpu_updates.items():
        values: dict[str, Any] = dict(changed)
        gpu = by_uuid[uuid]
        if uuid in set_aside or uuid in plan.gpu_returned:
            values["missing_since"] = None
        if uuid in plan.gpu_moved:
            values["node"] = node
        if not values.get("error_message"):
            values["last_seen_at"] = now
        Gpu.objects.filter(pk=gpu.pk).update(**values)
    for uuid, values in plan.gpu_creates.items():
        by_uuid[uuid] = Gpu.objects.create(
            uuid=uuid, node=node, first_seen_at=now, last_seen_at=now, **values
        )
    for uuid, layout in plan.mig_layouts.items():
        gpu = by_uuid[uuid]
        MigInstance.objects.filter(gpu=gpu).delete()
        MigInstance.objects.bulk_create(MigInstance(gpu=gpu, **row) for row in layout)


def _stored_nic_links(node: Node) -> dict[NicKey, str]:
    rows = GpuNicLink.objects.filter(node=node).values_list("gpu__uuid", "nic", "link_type")
    return {(uuid, nic): kind for uuid, nic, kind in rows}


def _apply_links(
    node: Node, links: dict[LinkKey, tuple[str, int]], nic_links: dict[NicKey, str]
) -> None:
    pks = dict(Gpu.objects.filter(node=node).values_list("uuid", "pk"))
    GpuLink.objects.filter(node=node).delete()
    GpuNicLink.objects.filter(node=node).delete()
    rows = []
    for (a, b), (kind, count) in links.items():
        first, second = sorted((pks[a], pks[b]))
        rows.append(
            GpuLink(node=node, gpu_a_id=first, gpu_b_id=second, link_type=kind, nvlink_count=count)
        )
    GpuLink.objects.bulk_create(rows)
    GpuNicLink.objects.bulk_create(
        GpuNicLink(node=node, gpu_id=pks[uuid], nic=nic, link_type=kind)
        for (uuid, nic), kind in nic_links.items()
    )


class IllegalGpuTransition(ValueError):
    """A GPU state change ``GPU_TRANSITIONS`` does not allow; the message says which are."""


class WorkStillRunning(IllegalGpuTransition):
    """Offline without ``requeue`` while jobs hold the GPUs; the message names them."""


_G = GpuState
# Which service states a GPU may go to from each (a change to the same state is a no-op).
# A reset ends in available, degraded (it did not help) or offline; nothing else interrupts
# it but an admin's offline. Everything else may go anywhere.
GPU_TRANSITIONS: dict[str, frozenset[str]] = {
    _G.AVAILABLE: frozenset({_G.DRAINING, _G.DEGRADED, _G.RESETTING, _G.OFFLINE}),
    _G.DRAINING: frozenset({_G.AVAILABLE, _G.DEGRADED, _G.RESETTING, _G.OFFLINE}),
    _G.DEGRADED: frozenset({_G.AVAILABLE, _G.DRAINING, _G.RESETTING, _G.OFFLINE}),
    _G.RESETTING: frozenset({_G.AVAILABLE, _G.DEGRADED, _G.OFFLINE}),
    _G.OFFLINE: frozenset({_G.AVAILABLE, _G.DRAINING, _G.DEGRADED, _G.RESETTING}),
}


def set_gpu_state(
    gpu: Gpu,
    state: str,
    *,
    actor: User | None = None,
    actor_name: str = "",
    reason: str = "",
    expect: Iterable[str] | None = None,
    requeue: bool = True,
) -> bool:
    """The GPU state machine: move a GPU to ``state`` (audited ``gpu.state_changed``, with
    ``reason``), ``False`` when it already was in ``state``. Raises ``IllegalGpuTransition``
    for a change ``GPU_TRANSITIONS`` refuses, or when ``expect`` is given and the GPU's state
    (read under its row lock) is not one of them: a health policy that fenced a GPU only
    returns it if an admin did not take it over meanwhile. ``actor_name`` names a system
    actor (``health``) where there is no user. Offline requeues the jobs holding it, or with
    ``requeue=False`` is refused while any does (``WorkStillRunning``)."""
    return _set_state(
        Gpu,
        gpu,
        state,
        gpus=Gpu.objects.filter(pk=gpu.pk),
        actor=actor,
        actor_name=actor_name,
        reason=reason,
        event_type="gpu.state_changed",
        transitions=GPU_TRANSITIONS,
        expect=None if expect is None else frozenset(expect),
        requeue=requeue,
    )


def set_node_state(
    node: Node,
    state: str,
    *,
    actor: User | None = None,
    actor_name: str = "",
    reason: str = "",
    requeue: bool = True,
) -> bool:
    """Drain, offline or bring a node back online; ``False`` when it already was in ``state``.
    ``requeue`` as for ``set_gpu_state``, for every GPU of the node."""
    return _set_state(
        Node,
        node,
        state,
        gpus=Gpu.objects.filter(node=node),
        actor=actor,
        actor_name=actor_name,
        reason=reason,
        event_type="node.state_changed",
        requeue=requeue,
    )


def jobs_holding(gpus: GpuQuerySet, *, stopping: bool = True) -> list[int]:
    """The gpuadmin jobs holding any of ``gpus`` (as the fleet page names them), each once, in
    order (a Slurm job holding one is not gpuadmin's to requeue); without ``stopping``, not
    those whose end is decided (they hold their GPUs until their processes are gone)."""
    ids = list(gpus.values_list("pk", flat=True))
    occupancy = Occupancy(ids)
    return sorted(
        {
            job_id
            for pk in ids
            if (occupant := occupancy.get(pk))
            and (job_id := occupant.gpuadmin_job_id)
            and (stopping or not occupant.stopping)
        }
    )


def set_held_outside(holders: Mapping[int, str], *, actor_name: str) -> list[int]:
    """Say which GPUs work outside gpuadmin holds: ``holders`` maps GPU primary keys to the
    holder ("Slurm job 1234 on hpc"), an empty one for a GPU it no longer holds (an
    integration's poll, ``actor_name``). A held GPU is not schedulable (the one rule,
    ``usability.Reason.HELD_OUTSIDE``). The GPUs whose holder changed, each audited
    ``gpu.held_outside_changed``, in id order (only their rows locked, in that order); those
    it made schedulable are announced on commit (``gpus_became_schedulable``: the placement
    loop wakes). Inside the caller's transaction, if any."""
    wanted = {pk: text[:HELD_OUTSIDE_CHARS] for pk, text in holders.items()}
    stored = Gpu.objects.filter(pk__in=wanted).values_list("pk", "held_outside")
    differ = [pk for pk, held in stored if held != wanted[pk]]
    if not differ:  # a poll that changes nothing locks nothing
        return []
    with transaction.atomic():
        locked = Gpu.objects.select_for_update(of=("self",)).select_related("node")
        rows = [
            gpu
            for gpu in locked.filter(pk__in=differ).order_by("pk")
            if gpu.held_outside != wanted[gpu.pk]  # read again under the lock
        ]
        changed = [gpu.pk for gpu in rows]
        if not rows:
            return []
        before = {gpu.pk: gpu.held_outside for gpu in rows}
        with _announcing_schedulable(Gpu.objects.filter(pk__in=changed)):
            for gpu in rows:
                gpu.held_outside = wanted[gpu.pk]
            Gpu.objects.bulk_update(rows, ["held_outside"])
            record_all(
                [
                    audit_event(
                        "gpu.held_outside_changed",
                        actor_name=actor_name,
                        target=gpu,
                        target_id=gpu.uuid,  # as every GPU's rows: its page's history
                        before={"held_outside": before[gpu.pk]},
                        after={"held_outside": gpu.held_outside},
                    )
                    for gpu in rows
                ]
            )
    return changed


@dataclass(frozen=True)
class StateChange:
    """What a maintenance change did: ``changed`` (``False``: it was in that state already),
    the jobs still running on the GPUs (draining: they finish there) and those that ran there
    before and no longer do (offline: requeued, or stopping: requeued once their processes are
    gone, their GPUs held until then)."""

    changed: bool
    running: list[int]
    stopped: list[int]


def change_state(
    row: Gpu | Node, state: str, *, actor: User, reason: str, force: bool = False
) -> StateChange:
    """A person's maintenance change (the API, ``gpuadmin drain|offline|online``) of a GPU or a
    node: offline is refused while jobs hold its GPUs unless ``force`` (then they are
    requeued); what the change left running and what it stopped."""
    gpus = Gpu.objects.filter(pk=row.pk) if isinstance(row, Gpu) else Gpu.objects.filter(node=row)
    before = jobs_holding(gpus)
    if isinstance(row, Gpu):
        changed = set_gpu_state(row, state, actor=actor, reason=reason, requeue=force)
    else:
        changed = set_node_state(row, state, actor=actor, reason=reason, requeue=force)
    running = jobs_holding(gpus, stopping=False)
    return StateChange(changed, running, [job for job in before if job not in running])


def jobs_text(job_ids: Collection[int]) -> str:
    """``job 4``, ``jobs 4, 5 and 6``."""
    if len(job_ids) == 1:
        return f"job {next(iter(job_ids))}"
    *most, last = map(str, job_ids)
    return f"jobs {', '.join(most)} and {last}"


def _set_state(
    model: type[Gpu] | type[Node],
    row: Gpu | Node,
    state: str,
    *,
    gpus: GpuQuerySet,
    actor: User | None,
    reason: str,
    event_type: str,
    actor_name: str = "",
    transitions: Mapping[str, frozenset[str]] | None = None,
    expect: frozenset[str] | None = None,
    requeue: bool = True,
) -> bool:
    """Set ``row``'s state (audited); ``gpus`` are those whose schedulability it decides."""
    if state not in {value for value, _ in model._meta.get_field("state").flatchoices}:
        raise ValueError(f"{state!r} is not a {model.__name__} state")
    with transaction.atomic():
        locked = model.objects.select_for_update().get(pk=row.pk)
        label = _state_label(locked)
        if expect is not None and locked.state not in expect:
            raise IllegalGpuTransition(
                f"{label} is {locked.state}, not {' or '.join(sorted(expect))}: left as it is"
            )
        if locked.state == state:
            return False
        if transitions is not None and state not in transitions[locked.state]:
            allowed = ", ".join(sorted(transitions[locked.state]))
            raise IllegalGpuTransition(
                f"{label} is {locked.state}: it can go to {allowed}, not {state}"
            )
        if state == GpuState.OFFLINE and not requeue:
            held = jobs_holding(gpus.exclude(state=GpuState.OFFLINE))
            if held:
                runs = "runs" if len(held) == 1 else "run"
                raise WorkStillRunning(
                    f"{label}: {jobs_text(held)} still {runs} there; drain it to let them "
                    "finish, or force offline to requeue them"
                )
        now = timezone.now()
        if state == GpuState.OFFLINE:  # == NodeState.OFFLINE: a node's GPUs go with it
            said = f"{label} went offline" + (f": {reason}" if reason else "")
            _announce_offline(gpus, reason=said, actor_name=actor_name or _username(actor))
        with _announcing_schedulable(gpus):
            model.objects.filter(pk=row.pk).update(
                state=state, state_reason=reason[:STATE_REASON_CHARS], state_changed_at=now
            )
        record(
            event_type,
            actor=actor,
            actor_name=actor_name or None,
            target=locked,
            target_id=getattr(locked, "uuid", "") or locked.pk,
            before={"state": locked.state},
            after={"state": state},
            message=reason,
        )
    row.state, row.state_reason, row.state_changed_at = state, reason[:STATE_REASON_CHARS], now
    return True


def _announce_offline(gpus: GpuQuerySet, *, reason: str, actor_name: str) -> None:
    """Before ``gpus`` (or their node) go offline: once that commits, send
    ``gpus_went_offline`` with those not offline already (their running work must stop),
    ``reason`` the sentence their jobs will show."""
    going = sorted(gpus.exclude(state=GpuState.OFFLINE).values_list("pk", flat=True))
    if going:
        transaction.on_commit(
            partial(
                gpus_went_offline.send_robust,
                sender=Gpu,
                gpu_ids=going,
                reason=reason,
                actor_name=actor_name,
            )
        )


def _username(actor: User | None) -> str:
    return actor.get_username() if actor is not None else ""


def _state_label(row: Gpu | Node) -> str:
    return (
        f"GPU {row.index} of {row.node.hostname}"
        if isinstance(row, Gpu)
        else f"node {row.hostname}"
    )


@contextmanager
def _announcing_schedulable(gpus: GpuQuerySet) -> Iterator[None]:
    """Wrap a change of ``gpus`` inside its transaction: once that commits, send
    ``gpus_became_schedulable`` with those the change made schedulable whole, if any (apps
    above inventory, e.g. scheduling waking its placement loop, must not wait for a poll)."""
    before = set(gpus.schedulable().values_list("pk", flat=True))
    yield
    became = set(gpus.schedulable().values_list("pk", flat=True)) - before
    if became:
        transaction.on_commit(
            partial(gpus_became_schedulable.send_robust, sender=Gpu, gpu_ids=sorted(became))
        )


# What of a node's host no job is given (Slurm's CoreSpecCount and MemSpecLimit), set by
# admins, each with the discovered total it is part of (jobs may be given total - reserved)
# and what the total counts.
HOST_RESERVED_FIELDS = {
    "cpus_reserved": ("cpu_count", "CPUs"),
    "memory_reserved_mib": ("memory_total_mib", "MiB of memory"),
}
# What people write on a node (admin, API): its catalog fields and its host's reserved part.
NODE_EDITABLE_FIELDS = (*NODE_CATALOG_FIELDS, *HOST_RESERVED_FIELDS)


def resolve_gpu_model(
    text: str,
    names: Iterable[str] | None = None,
    *,
    refusal: type[FieldRefusal] = FieldRefusal,
    field: str = "gpu_model",
) -> str:
    """The full GPU model name ``text`` stands for, wherever a model is given (a job, a
    reservation): a name of ``names`` (default: the present GPUs') that it equals in any
    case, else the one that contains it, as the GPU filter matches (``H100`` is ``NVIDIA
    H100 80GB HBM3``). ``refusal`` naming ``field`` when several contain it, listing them;
    ``text`` as it is when none does (the caller refuses it in its own words)."""
    wanted = text.strip().casefold()
    if not wanted:
        return text
    if names is None:
        names = Gpu.objects.present().values_list("name", flat=True).distinct()
    known = sorted(set(names))
    exact = [name for name in known if name.casefold() == wanted]
    if exact:
        return exact[0]
    matching = [name for name in known if wanted in name.casefold()]
    if len(matching) > 1:
        raise refusal(field, f"{text!r} matches {', '.join(matching)}")
    return matching[0] if matching else text


def host_reserved_errors(node: Node, values: Mapping[str, Any]) -> dict[str, str]:
    """Why the reserved amounts in ``values`` cannot be kept back on ``node`` (field ->
    message): more than its discovered total. An unknown total limits nothing; a total that
    drops below the reserved amount later leaves jobs none of it."""
    errors = {}
    for name, (total_name, unit) in HOST_RESERVED_FIELDS.items():
        reserved, total = values.get(name), getattr(node, total_name)
        if reserved is not None and total is not None and reserved > total:
            errors[name] = (
                f"Ensure this value is less than or equal to {total}: the node has {total} {unit}."
            )
    return errors


def gpu_catalog_errors(gpu: Gpu, values: Mapping[str, Any]) -> dict[str, str]:
    """Why the catalog ``values`` cannot be kept on ``gpu`` (field -> message): MPS sharing of
    a GPU in MIG mode, which shares through its MIG devices."""
    if values.get("mps_shared") and gpu.mig_enabled:
        return {"mps_shared": "a GPU in MIG mode is shared through its MIG devices, not MPS"}
    return {}


def update_catalog(row: Gpu | Node, changes: dict[str, Any], *, actor: User) -> bool:
    """Write people-owned fields (a node's ``NODE_EDITABLE_FIELDS``, a GPU's
    ``GPU_CATALOG_FIELDS``) of a node or GPU under a row lock and audit
    ``<model>.catalog_changed`` with what actually changed; other keys are ignored (callers
    check a node's reserved amounts with ``host_reserved_errors``, a GPU's catalog with
    ``gpu_catalog_errors``). ``row`` gets the stored
    values; ``False`` when nothing changed. A GPU no longer shared through MPS is announced
    schedulable."""
    editable = GPU_CATALOG_FIELDS if isinstance(row, Gpu) else NODE_EDITABLE_FIELDS
    names = [name for name in editable if name in changes]
    model = type(row)
    gpus = Gpu.objects.filter(pk=row.pk) if isinstance(row, Gpu) else Gpu.objects.none()
    with transaction.atomic():
        locked = model.objects.select_for_update().get(pk=row.pk)
        before = _catalog_values(locked, names)
        for name in names:
            setattr(locked, name, changes[name])
        old, new = changed_values(before, _catalog_values(locked, names))
        if new:
            with _announcing_schedulable(gpus):
                locked.save(update_fields=list(new))
            record(
                f"{model._meta.model_name}.catalog_changed",
                actor=actor,
                target=locked,
                target_id=getattr(locked, "uuid", "") or locked.pk,
                before=old,
                after=new,
            )
    for name in names:
        setattr(row, name, getattr(locked, name))
    return bool(new)


def _catalog_values(row: Gpu | Node, names: list[str]) -> dict[str, Any]:
    """Catalog values as the audit log stores them (pool by name, owner by username)."""
    values: dict[str, Any] = {}
    for name in names:
        value = getattr(row, name)
        if name == "pool":
            value = value.name if value else None
        elif name == "owner":
            value = value.get_username() if value else None
        elif name == "tags":
            value = list(value)
        values[name] = value
    return values


# --------------------------------------------------------------------------- MIG changes

# How long an admin's MIG change waits for the node's agent (it also expires the task, so a
# node that comes back later never runs a change nobody is waiting for).
MIG_TASK_TIMEOUT_S = 30.0


POOL_FIELDS = ("name", "description")


def save_pool(pool: Pool, *, actor: User) -> Pool:
    """Create ``pool`` (audited ``pool.created``) or store its changed fields (``pool.changed``,
    before and after; nothing written when none changed)."""
    after = {name: getattr(pool, name) for name in POOL_FIELDS}
    with transaction.atomic():
        stored = Pool.objects.select_for_update().filter(pk=pool.pk).first() if pool.pk else None
        if stored is None:
            pool.save()
            record("pool.created", actor=actor, target=pool, after=after)
            return pool
        old, new = changed_values({name: getattr(stored, name) for name in POOL_FIELDS}, after)
        if new:
            pool.save(update_fields=list(new))
            record("pool.changed", actor=actor, target=pool, before=old, after=new)
    return pool


def delete_pool(pool: Pool, *, actor: User) -> None:
    """Delete an empty pool (audited ``pool.deleted``). Refused (``ProtectedError``) while nodes,
    GPUs, quotas, jobs, reservations or usage history name it: move or
    remove them first, each audited; only its policy row goes with it."""
    with transaction.atomic():
        record(
            "pool.deleted",
            actor=actor,
            target=pool,
            before={name: getattr(pool, name) for name in POOL_FIELDS},
        )
        pool.delete()


class MigChangeRefused(ValueError):
    """A MIG change that was not made. ``code`` says why: refused here before anything was
    sent (``gpu_missing``, ``mig_disabled``, ``node_unreachable``, ``no_live_sample``,
    ``busy``, ``no_such_instance``, ``vetoed`` by an answer of
    ``gpuadmin.registry.mig_change_vetoes``), or by the node's NVML (a ``mig_ops.MigErrorCode``
    value: ``no_room``, ``unknown_profile``, ...)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class AgentTimedOut(TimeoutError):
    """The node's agent did not answer in time, or could not be asked (its node has no
    credential to sign the order with); the catalog was left as it was."""


def create_mig_instance(
    gpu: Gpu,
    profile_name: str,
    *,
    actor: User | None = None,
    actor_name: str | None = None,
    placement_start: int | None = None,
) -> list[MigInstance]:
    """Create a ``profile_name`` GPU instance (at ``placement_start``, or where NVML chooses)
    with its full-size compute instance on ``gpu``, through its node's agent.

    Refuses (``MigChangeRefused``) before sending anything unless the GPU is present and
    MIG-enabled, its node reachable and it runs no work; the node's NVML may refuse too (no
    room, unknown profile, ...). Waits ``MIG_TASK_TIMEOUT_S`` (``AgentTimedOut``). Applies
    the node's fresh scan and audits ``gpu.mig_instance_created`` as ``actor`` (or the system
    actor ``actor_name``). Returns the GPU's MIG instances after the change.
    """
    gpu = _check_mig_change(gpu, actor_name)
    before = _mig_rows(gpu)
    outcome = _run_mig_task(gpu, "inventory.mig_create", gpu.index, profile_name, placement_start)

    def audit(after: list[dict[str, Any]]) -> None:
        gi_id, ci_id = outcome["gi_id"], outcome["ci_id"]
        record(
            "gpu.mig_instance_created",
            actor=actor,
            actor_name=actor_name,
            target=gpu,
            target_id=gpu.uuid,
            before={"mig_instances": before},
            after={
                "gi_id": gi_id,
                "ci_id": ci_id,
                "profile_name": profile_name,
                "mig_instances": after,
            },
            message=f"created {profile_name} as GPU instance {gi_id} / compute instance {ci_id}",
        )

    return _apply_mig_outcome(gpu, outcome, audit)


def destroy_mig_instance(
    gpu: Gpu, gi_id: int, *, actor: User | None = None, actor_name: str | None = None
) -> list[MigInstance]:
    """Destroy GPU instance ``gi_id`` of ``gpu`` (its compute instances first) through its
    node's agent; same refusals, timeout and auditing (``gpu.mig_instance_destroyed``) as
    ``create_mig_instance``. Returns the GPU's MIG instances after the change."""
    gpu = _check_mig_change(gpu, actor_name)
    before = _mig_rows(gpu)
    profile_name = next((row["profile_name"] for row in before if row["gi_id"] == gi_id), None)
    if profile_name is None:
        raise MigChangeRefused(f"{_gpu_label(gpu)} has no GPU instance {gi_id}", "no_such_instance")
    outcome = _run_mig_task(gpu, "inventory.mig_destroy", gpu.index, gi_id)

    def audit(after: list[dict[str, Any]]) -> None:
        record(
            "gpu.mig_instance_destroyed",
            actor=actor,
            actor_name=actor_name,
            target=gpu,
            target_id=gpu.uuid,
            before={"gi_id": gi_id, "profile_name": profile_name, "mig_instances": before},
            after={"mig_instances": after},
            message=f"destroyed {profile_name} GPU instance {gi_id}",
        )

    return _apply_mig_outcome(gpu, outcome, audit)


def _gpu_label(gpu: Gpu) -> str:
    return f"GPU {gpu.index} of {gpu.node.hostname}"


def _check_mig_change(gpu: Gpu, actor_name: str | None) -> Gpu:
    """The GPU as stored now, when a MIG change may be sent to it; else ``MigChangeRefused``.
    ``actor_name``: the system actor asking (a workflow may own the GPU's layout for now)."""
    gpu = Gpu.objects.select_related("node").get(pk=gpu.pk)
    label, node = _gpu_label(gpu), gpu.node
    if gpu.is_missing:
        raise MigChangeRefused(f"{label} is missing from its node's scans", "gpu_missing")
    if not gpu.mig_enabled:
        raise MigChangeRefused(f"MIG is not enabled on {label}", "mig_disabled")
    if not node.is_reachable():
        raise MigChangeRefused(
            f"node {node.hostname} is unreachable: no heartbeat in the last "
            f"{settings.GPUADMIN_HEARTBEAT_GRACE_S} s",
            "node_unreachable",
        )
    try:
        sample = live.latest([node.hostname])[node.hostname].get(gpu.uuid)
    except RedisError as exc:
        raise MigChangeRefused(
            f"cannot read the live samples ({exc}) to see if {label} is busy", "no_live_sample"
        ) from exc
    processes = None if sample is None else sample.get("processes")
    if processes is None:
        raise MigChangeRefused(
            f"no live sample of {label}: cannot tell whether it runs work", "no_live_sample"
        )
    if processes:
        raise MigChangeRefused(f"{label} is busy: {processes} process(es) running on it", "busy")
    # Apps above inventory may veto (scheduling: a job holds the GPU).
    for veto in registry.mig_change_vetoes.answers:
        if reason := veto(gpu, actor_name):
            raise MigChangeRefused(reason, "vetoed")
    return gpu


def _mig_rows(gpu: Gpu) -> list[dict[str, Any]]:
    return [
        {name: getattr(instance, name) for name in MigInstance.DISCOVERED_FIELDS}
        for instance in MigInstance.objects.filter(gpu=gpu).order_by("gi_id", "ci_id")
    ]


def _run_mig_task(gpu: Gpu, task_name: str, *args: Any) -> dict[str, Any]:
    return run_on_node(
        gpu.node.hostname,
        task_name,
        *args,
        timeout=MIG_TASK_TIMEOUT_S,
        unanswered="nothing was recorded (should its agent still make the change, its next "
        "scan will show it)",
    )


def run_on_node(
    hostname: str, task_name: str, *args: Any, timeout: float, unanswered: str
) -> dict[str, Any]:
    """Run a task on the node's agent queue and wait for its outcome; ``AgentTimedOut`` (whose
    message ends with ``unanswered``) when it does not answer within ``timeout`` seconds. The
    task expires too, so a node that comes back later never runs work nobody waits for."""
    try:
        result = send_order(hostname, task_name, args, expires=timeout, ignore_result=False)
    except NoCredential as exc:
        raise AgentTimedOut(str(exc)) from None
    try:
        # A node queue is never the caller's own, so waiting inside a task cannot deadlock.
        return result.get(timeout=timeout, disable_sync_subtasks=False)
    except CeleryTimeoutError:
        result.revoke()
        raise AgentTimedOut(
            f"node {hostname} did not answer within {timeout:g} s; {unanswered}"
        ) from None


def _apply_mig_outcome(
    gpu: Gpu, outcome: dict[str, Any], audit: Callable[[list[dict[str, Any]]], None]
) -> list[MigInstance]:
    """Apply the node's fresh scan (whatever the outcome: it is the node's real layout) and,
    when the change was made, its audit row (in place of discovery's ``gpu.mig_changed`` for
    that GPU), in one transaction."""
    error = outcome["error"]
    audited = {("gpu.mig_changed", gpu.uuid)} if error is None else set()
    with transaction.atomic():
        apply_discovery(gpu.node.hostname, NodeScan.from_dict(outcome["scan"]), audited=audited)
        if error is None:
            audit(_mig_rows(gpu))
    if error is not None:
        raise MigChangeRefused(error["message"], error["code"])
    return list(MigInstance.objects.filter(gpu=gpu).order_by("gi_id", "ci_id"))
