"""Node credentials on the central side: issuing and revoking them (audited), checking that
a report an agent sent through the broker comes from the node it is about, and signing the
orders sent to an agent (``send_order``; the agent checks them: ``node_orders``).

A report is believed only when it carries a valid signature (``node_signing``) made with an
unrevoked credential of the node it is about, no more than ``GPUADMIN_NODE_REPORT_MAX_AGE_S``
ago; anything else is refused, logged and audited (``node.report_refused``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from celery import Task, current_app
from celery.result import AsyncResult
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from gpuadmin import redis_client
from gpuadmin.access.models import NodeCredential
from gpuadmin.access.node_orders import ORDER_HEADER, node_queue, order_header
from gpuadmin.access.node_signing import (
    CENTRAL,
    CENTRAL_KEY_ID,
    HEADER,
    central_secret,
    derive_secret,
    make_token,
    same_signature,
    signature,
    too_old,
)
from gpuadmin.audit.services import record

log = logging.getLogger("gpuadmin.access")

# Bumped whenever a node credential is issued or revoked: the keys each process signs orders
# with are looked up again.
NODE_KEYS_EPOCH_KEY = "gpuadmin:node-credentials:epoch"


class ReportRefused(Exception):
    """Why a report is not believed."""


def create_credential(node: str, *, actor_name: str) -> tuple[NodeCredential, str]:
    """A new credential for ``node``; its token is returned once (it is never stored)."""
    with transaction.atomic():
        credential = NodeCredential.objects.create(node=node, salt=NodeCredential.new_salt())
        record("node_credential.created", actor_name=actor_name, target=credential,
               after={"node": node})  # fmt: skip
        forget_order_keys()
    return credential, make_token(credential.pk, credential.salt)


def node_token(node: str, *, actor_name: str) -> str:
    """The token of ``node``'s newest unrevoked credential, issued when it has none (what
    ``gpuadmin up`` gives its demo agents, so that restarts do not pile credentials up)."""
    credential = NodeCredential.objects.filter(node=node, revoked_at__isnull=True).first()
    if credential is None:
        return create_credential(node, actor_name=actor_name)[1]
    return make_token(credential.pk, credential.salt)


def revoke_credentials(node: str, *, actor_name: str) -> int:
    """Revoke every credential of ``node``; how many were in force."""
    with transaction.atomic():
        revoked = list(
            NodeCredential.objects.select_for_update().filter(node=node, revoked_at__isnull=True)
        )
        for credential in revoked:
            revoke_credential(credential, actor_name=actor_name)
    return len(revoked)


def revoke_credential(
    credential: NodeCredential, *, actor: User | None = None, actor_name: str = ""
) -> bool:
    """Revoke ``credential``; audited under ``actor`` (a person) or ``actor_name`` (the CLI)."""
    with transaction.atomic():
        updated = NodeCredential.objects.filter(pk=credential.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if updated:
            record("node_credential.revoked", actor=actor, actor_name=actor_name,
                   target=credential, before={"node": credential.node})  # fmt: skip
            forget_order_keys()
    return bool(updated)


def verify(header: Any, task: str, args: Any, kwargs: Any, *, now: float | None = None) -> str:
    """The node that signed this report (``CENTRAL`` for the central side's own); raises
    ``ReportRefused`` saying why it is not believed."""
    if not isinstance(header, dict):
        raise ReportRefused("unsigned report")
    sender, key_id, sent_at, sig = (header.get(k) for k in ("sender", "key", "at", "sig"))
    if not (
        isinstance(sender, str)
        and isinstance(key_id, int)
        and isinstance(sent_at, int | float)
        and isinstance(sig, str)
    ):
        raise ReportRefused("malformed signature header")
    if stale := too_old(sent_at, time.time() if now is None else now):
        raise ReportRefused(stale)
    if key_id == CENTRAL_KEY_ID and sender == CENTRAL:
        secret = central_secret()
    else:
        credential = NodeCredential.objects.filter(pk=key_id).first()
        if credential is None:
            raise ReportRefused(f"unknown node credential #{key_id}")
        if credential.node != sender:
            raise ReportRefused(f"credential #{key_id} belongs to node {credential.node!r}")
        if credential.revoked_at is not None:
            raise ReportRefused(f"node credential #{key_id} is revoked")
        secret = derive_secret(credential.pk, credential.salt)
    expected = signature(secret, task, sender, sent_at, args or (), kwargs or {})
    if not same_signature(expected, sig):
        raise ReportRefused("bad signature")
    return sender


def reporting_node(task: Task) -> str | None:
    """Who sent the report ``task`` runs now: a node name, ``CENTRAL`` for the central side
    (its own message, or a direct call in this process), ``None`` when refused (logged and
    audited)."""
    request = task.request
    if request.called_directly:
        return CENTRAL
    header = (request.headers or {}).get(HEADER)
    try:
        return verify(header, task.name, request.args, request.kwargs)
    except ReportRefused as exc:
        claimed = header.get("sender") if isinstance(header, dict) else None
        refuse(task.name, claimed, str(exc))
        return None


def speaks_for(task: Task, node: str) -> bool:
    """Whether the report ``task`` runs now may speak for ``node`` (refusals are logged and
    audited)."""
    sender = reporting_node(task)
    if sender is None:
        return False
    if sender not in (CENTRAL, node):
        refuse(task.name, sender, f"node {sender!r} reported for node {node!r}")
        return False
    return True


def refuse(task: str, sender: object, why: str) -> None:
    """Log and audit a report that is not believed."""
    who = sender if isinstance(sender, str) and sender else "unknown"
    log.warning("refused %s from node %s: %s", task, who, why)
    with transaction.atomic():
        record(
            "node.report_refused",
            actor_name=f"agent:{who}",
            target_type="node",
            target_id=who,
            after={"task": task},
            message=why,
        )


# --------------------------------------------------------------------------- orders


class NoCredential(Exception):
    """The node has no unrevoked credential: no order can be signed for its agent."""


Keys = tuple[tuple[int, str], ...]  # (credential id, secret) of each unrevoked credential


def forget_order_keys() -> None:
    """Make every process look the credentials it signs orders with up again."""
    redis_client.bump_epoch(NODE_KEYS_EPOCH_KEY, "node credentials")


class OrderKeys:
    """Each node's unrevoked credentials' keys, per process: the placement loop signs an
    order per node per pass. Trusted while the epoch in Redis is the one they were loaded
    under (issuing or revoking a credential bumps it) and for at most
    ``GPUADMIN_TOKEN_CACHE_S``; without Redis, looked up every time."""

    def __init__(self) -> None:
        self._keys: dict[str, Keys] = {}
        self._epoch: bytes | None = None
        self._loaded_at = 0.0
        self._lock = threading.Lock()

    def of(self, nodes: Iterable[str]) -> dict[str, Keys]:
        """The keys of each of ``nodes`` (empty: it has no credential); one query at most."""
        wanted = set(nodes)
        if not wanted:
            return {}
        try:
            # Read before the database: a change committed meanwhile bumps past this epoch.
            epoch: bytes | None = redis_client.client().get(NODE_KEYS_EPOCH_KEY) or b"0"  # type: ignore[assignment]
        except RedisError:
            epoch = None
        now = time.monotonic()
        with self._lock:
            if (
                epoch is None
                or epoch != self._epoch
                or now - self._loaded_at >= settings.GPUADMIN_TOKEN_CACHE_S
            ):
                self._keys, self._epoch, self._loaded_at = {}, epoch, now
            known = {node: self._keys[node] for node in wanted if node in self._keys}
        missing = wanted - known.keys()
        if missing:
            loaded: dict[str, list[tuple[int, str]]] = {node: [] for node in missing}
            credentials = NodeCredential.objects.filter(node__in=missing, revoked_at__isnull=True)
            for pk, node, salt in credentials.order_by("pk").values_list("pk", "node", "salt"):
                loaded[node].append((pk, derive_secret(pk, salt)))
            fresh = {node: tuple(keys) for node, keys in loaded.items()}
            with self._lock:
                if epoch is not None and self._epoch == epoch:
                    self._keys.update(fresh)
            known.update(fresh)
        return known

    def clear(self) -> None:
        with self._lock:
            self._keys, self._epoch = {}, None


ORDER_KEYS = OrderKeys()


def order_keys(nodes: Iterable[str]) -> dict[str, Keys]:
    """The keys orders to each of ``nodes`` are signed with (empty: none can be)."""
    return ORDER_KEYS.of(nodes)


def send_order(
    node: str,
    name: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    keys: Keys | None = None,
    **options: Any,
) -> AsyncResult:
    """Send the task ``name`` to ``node``'s agent (its queue), signed for it with its
    credentials (``keys``, when the caller looked them up for several nodes at once);
    ``NoCredential`` (logged) when it has none. Every order to an agent goes through here."""
    if keys is None:
        keys = ORDER_KEYS.of([node])[node]
    if not keys:
        log.warning("no %s sent to node %s: the node has no credential", name, node)
        raise NoCredential(
            f"cannot reach the agent of {node}: the node has no credential "
            f"(gpuadmin node credential create {node})"
        )
    header = order_header(keys, name, node, args, kwargs)
    return current_app.send_task(
        name,
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        headers={ORDER_HEADER: header},
        queue=node_queue(node),
        **options,
    )
