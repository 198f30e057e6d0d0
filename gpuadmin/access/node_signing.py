"""Signed reports: what a node agent sends to the central worker carries an HMAC of the task,
its arguments, the sender and the time, made with the node's credential, so the central worker
can tell which node speaks (``gpuadmin.access.nodes`` checks it). No ORM here: agents have no
database.

A node's token is ``gpn_<credential id>_<secret>``; the secret is an HMAC of ``SECRET_KEY`` and
the credential's salt, so the central side can recompute it and the database never holds it.
The central side signs its own reports (a job it could not send) with a key derived from
``SECRET_KEY`` alone, as sender ``""``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from celery import current_app
from django.conf import settings

HEADER = "gpuadmin_report"
TOKEN_PREFIX = "gpn_"
CENTRAL = ""  # the sender name of the central side's own reports
CENTRAL_KEY_ID = 0


def _hmac(key: str, message: str) -> bytes:
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).digest()


def derive_secret(credential_id: int, salt: str) -> str:
    """A credential's secret, recomputable only with ``SECRET_KEY``."""
    raw = _hmac(settings.SECRET_KEY, f"gpuadmin node credential {credential_id} {salt}")
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def central_secret() -> str:
    return derive_secret(CENTRAL_KEY_ID, "central")


def make_token(credential_id: int, salt: str) -> str:
    return f"{TOKEN_PREFIX}{credential_id}_{derive_secret(credential_id, salt)}"


def parse_token(token: str) -> tuple[int, str]:
    """(credential id, secret) of a node token; ``ValueError`` for anything else."""
    prefix, _, rest = token.strip().partition(TOKEN_PREFIX)
    ident, _, secret = rest.partition("_")
    if prefix or not ident.isdecimal() or int(ident) == CENTRAL_KEY_ID or not secret:
        raise ValueError("not a gpuadmin node token (gpn_<id>_<secret>)")
    return int(ident), secret


def too_old(sent_at: float, now: float) -> str | None:
    """Why a report or an order signed at ``sent_at`` is no longer believed at ``now`` (older,
    or newer, than ``GPUADMIN_NODE_REPORT_MAX_AGE_S``), or None."""
    age, most = now - sent_at, settings.GPUADMIN_NODE_REPORT_MAX_AGE_S
    if abs(age) > most:
        return f"signed {age:.0f} s ago, beyond GPUADMIN_NODE_REPORT_MAX_AGE_S={most}"
    return None


def same_signature(expected: str, given: str) -> bool:
    """A constant-time comparison; as bytes: compare_digest() raises on a str with non-ASCII
    characters."""
    return hmac.compare_digest(expected.encode(), given.encode())


def signature(
    secret: str,
    task: str,
    sender: str,
    sent_at: float,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The HMAC of a report as the JSON wire gives it back (tuples as lists, keys as text)."""
    return digest(secret, [task, sender, sent_at, list(args), dict(kwargs or {})])


def digest(secret: str, fields: list[Any]) -> str:
    """The HMAC-SHA256 of ``fields`` as the JSON wire gives them back: what reports and
    orders (``node_orders``) are signed with."""
    body = json.loads(json.dumps(fields))
    return hmac.new(
        secret.encode(),
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode(),
        hashlib.sha256,
    ).hexdigest()


def _send(
    name: str, args: Sequence[Any], sender: str, key_id: int, secret: str, **options: Any
) -> Any:
    at = time.time()
    header = {
        "sender": sender,
        "key": key_id,
        "at": at,
        "sig": signature(secret, name, sender, at, args),
    }
    return current_app.send_task(name, args=tuple(args), headers={HEADER: header}, **options)


def send_as_node(name: str, args: Sequence[Any] = (), **options: Any) -> Any:
    """Send a report to the central worker, signed with this agent's ``GPUADMIN_NODE_TOKEN``
    for ``GPUADMIN_NODE_NAME`` (``gpuadmin agent`` refuses to start without one; unsigned, the
    central worker refuses it)."""
    token = settings.GPUADMIN_NODE_TOKEN
    if not token:
        return current_app.send_task(name, args=tuple(args), **options)
    key_id, secret = parse_token(token)
    return _send(name, args, settings.GPUADMIN_NODE_NAME, key_id, secret, **options)


def send_as_central(name: str, args: Sequence[Any] = (), **options: Any) -> Any:
    """Send a report from the central side itself (it may speak for any node and job)."""
    return _send(name, args, CENTRAL, CENTRAL_KEY_ID, central_secret(), **options)
