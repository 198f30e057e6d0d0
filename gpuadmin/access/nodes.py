"""Node credentials on the central side: issuing and revoking them (audited), and checking that
a report an agent sent through the broker comes from the node it is about.

A report is believed only when it carries a valid signature (``node_signing``) made with an
unrevoked credential of the node it is about, no more than ``GPUADMIN_NODE_REPORT_MAX_AGE_S``
ago; anything else is refused, logged and audited (``node.report_refused``).
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

from celery import Task
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from gpuadmin.access.models import NodeCredential
from gpuadmin.access.node_signing import (
    CENTRAL,
    CENTRAL_KEY_ID,
    HEADER,
    central_secret,
    derive_secret,
    make_token,
    signature,
)
from gpuadmin.audit.services import record

log = logging.getLogger("gpuadmin.access")


class ReportRefused(Exception):
    """Why a report is not believed."""


def create_credential(node: str, *, actor_name: str) -> tuple[NodeCredential, str]:
    """A new credential for ``node``; its token is returned once (it is never stored)."""
    with transaction.atomic():
        credential = NodeCredential.objects.create(node=node, salt=NodeCredential.new_salt())
        record("node_credential.created", actor_name=actor_name, target=credential,
               after={"node": node})  # fmt: skip
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
    age = (time.time() if now is None else now) - sent_at
    if abs(age) > settings.GPUADMIN_NODE_REPORT_MAX_AGE_S:
        raise ReportRefused(
            f"signed {age:.0f} s ago, beyond GPUADMIN_NODE_REPORT_MAX_AGE_S="
            f"{settings.GPUADMIN_NODE_REPORT_MAX_AGE_S}"
        )
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
    # As bytes: compare_digest() raises on a str with non-ASCII characters.
    if not hmac.compare_digest(expected.encode(), sig.encode()):
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
