"""Signed orders: what the central side sends to a node's agent (its queue ``node.<name>``)
carries an HMAC of the task, the node it is for, the time and the arguments, made with that
node's credential secret (``gpuadmin.access.nodes.send_order`` signs); the agent carries out
an order only when it is signed for its own node with its own credential, recently, and not
seen before (:class:`NodeOrder`, the base of every task on a node queue). No ORM here: this
half runs on agents.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery, Task
from celery.exceptions import Ignore
from django.conf import settings

from gpuadmin.access.node_signing import digest, parse_token, same_signature, too_old

ORDER_HEADER = "gpuadmin_order"

log = logging.getLogger("gpuadmin.access")


def node_queue(node_name: str) -> str:
    """The Celery queue only that node's agent consumes."""
    return f"node.{node_name}"


class OrderRefused(Exception):
    """Why an agent does not carry out an order."""


def order_signature(
    secret: str,
    task: str,
    node: str,
    sent_at: float,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The HMAC of an order (``"order"`` first: no report's signature is ever one)."""
    return digest(secret, ["order", task, node, sent_at, list(args), dict(kwargs or {})])


def order_header(
    keys: Sequence[tuple[int, str]],
    task: str,
    node: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """The ``gpuadmin_order`` header of an order to ``node``, signed with each of its active
    credentials' ``(id, secret)`` (one, except while an admin rotates them)."""
    at = time.time() if now is None else now
    sigs = {str(key): order_signature(secret, task, node, at, args, kwargs) for key, secret in keys}
    return {"node": node, "at": at, "sigs": sigs}


class SeenOrders:
    """The signatures of the orders carried out within the age bound, so that a copy of one
    (read from the broker and sent again) is refused; older ones are refused for their age."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, sig: str, sent_at: float, now: float, max_age: float) -> bool:
        """Record ``sig``; whether it was new. Forgets those signed more than ``max_age``
        ago (kept in arrival order: one received late stays a little longer, never less)."""
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now - max_age:
                self._seen.popitem(last=False)
            if sig in self._seen:
                return False
            self._seen[sig] = sent_at
            return True


SEEN = SeenOrders()


def check_order(
    header: Any,
    task: str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    *,
    node: str,
    token: str,
    now: float | None = None,
    seen: SeenOrders = SEEN,
) -> None:
    """Accept an order for the agent of ``node`` holding ``token``, or raise ``OrderRefused``
    saying why."""
    if not isinstance(header, dict):
        raise OrderRefused("unsigned order")
    recipient, sent_at, sigs = (header.get(k) for k in ("node", "at", "sigs"))
    if not (
        isinstance(recipient, str) and isinstance(sent_at, int | float) and isinstance(sigs, dict)
    ):
        raise OrderRefused("malformed signature header")
    if recipient != node:
        raise OrderRefused(f"signed for node {recipient!r}, not {node!r}")
    now = time.time() if now is None else now
    if stale := too_old(sent_at, now):
        raise OrderRefused(stale)
    try:
        key_id, secret = parse_token(token)
    except ValueError as exc:
        raise OrderRefused(f"this agent has no node credential: {exc}") from None
    sig = sigs.get(str(key_id))
    if not isinstance(sig, str):
        raise OrderRefused(f"not signed with this agent's credential #{key_id}")
    expected = order_signature(secret, task, node, sent_at, args or (), kwargs or {})
    if not same_signature(expected, sig):
        raise OrderRefused("bad signature")
    if not seen.first_time(sig, sent_at, now, settings.GPUADMIN_NODE_REPORT_MAX_AGE_S):
        raise OrderRefused("replayed: this order was already carried out")


class NodeOrder(Task):
    """The base of every task that runs on a node's queue: an order is carried out only when
    ``check_order`` accepts it for this agent (``GPUADMIN_NODE_NAME``,
    ``GPUADMIN_NODE_TOKEN``); a refused one does nothing but one WARNING line (the task, the
    process that sent it, why) and is acknowledged (``Ignore``: no result, no retry). A call
    in this process (not through the broker) is the process's own."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if not request.called_directly:
            try:
                check_order(
                    (request.headers or {}).get(ORDER_HEADER),
                    self.name,
                    request.args,
                    request.kwargs,
                    node=settings.GPUADMIN_NODE_NAME,
                    token=settings.GPUADMIN_NODE_TOKEN,
                )
            except OrderRefused as exc:
                sender = request.origin or "an unknown process"
                log.warning("refused order %s[%s] from %s: %s", self.name, request.id, sender, exc)
                raise Ignore() from None
        return super().__call__(*args, **kwargs)


def serve_orders_only(app: Celery) -> None:
    """Keep only the orders (and Celery's own tasks) in this agent's registry: a message on
    its queue naming any other task (a central one, which has no database here) is discarded
    by the worker as unregistered, never run."""
    app.loader.import_default_modules()
    app.finalize()
    for name, task in list(app.tasks.items()):
        if not isinstance(task, NodeOrder) and not name.startswith("celery."):
            app.tasks.unregister(name)
