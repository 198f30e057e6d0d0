"""Audited state changes as they commit, for the gRPC API's streams.

Every audit row whose ``after`` has a ``state`` is announced by PostgreSQL on the channel
``gpuadmin_state_changes`` when its transaction commits (the trigger of
``gpuadmin/audit/migrations/0004_notify_state_changes.py``). A server process listens on one
connection of its own (``StateChanges``) and hands each change to the streams that follow its
object: no stream reads the database while it waits. A stream reads the audit log only to
start or resume (the rows after the event id it was given) and after the listening connection
was lost (``GAP``: changes may have been missed meanwhile).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections

from gpuadmin.audit.models import AuditEvent

log = logging.getLogger("gpuadmin.rpc")
CHANNEL = "gpuadmin_state_changes"
# How long a new stream waits for the listening connection before it gives up.
READY_TIMEOUT_S = 10.0
RECONNECT_S = (0.5, 1, 2, 5)  # the waits before each try to listen again, the last repeated


@dataclass(frozen=True)
class StateChange:
    """One audited state change (an audit row with a ``state`` in its ``after``)."""

    id: int  # the audit row's: increasing, the point a stream resumes after
    target_type: str  # app_label.model: scheduling.job
    target_id: str
    event_type: str  # job.running
    state: str
    before: str  # the state it left ("" when it had none: a submission)
    time: datetime
    actor: str
    message: str

    @classmethod
    def from_payload(cls, payload: str) -> StateChange:
        data = json.loads(payload)
        return cls(
            id=data["id"],
            target_type=data["type"],
            target_id=data["target"],
            event_type=data["event"],
            state=data["state"],
            before=data["before"] or "",
            time=datetime.fromisoformat(data["time"]),
            actor=data["actor"],
            message=data["message"],
        )

    @classmethod
    def from_row(cls, row: AuditEvent) -> StateChange:
        return cls(
            id=row.pk,
            target_type=row.target_type,
            target_id=row.target_id,
            event_type=row.event_type,
            state=str((row.after or {}).get("state", "")),
            before=str((row.before or {}).get("state") or ""),
            time=row.time,
            actor=row.actor_name,
            message=row.message[:500],
        )


def changes_after(target_type: str, target_id: str | int, after_id: int) -> list[StateChange]:
    """The audited state changes of one object after the row ``after_id``, oldest first."""
    rows = AuditEvent.objects.filter(
        target_type=target_type,
        target_id=str(target_id),
        pk__gt=after_id,
        after__has_key="state",
    ).order_by("pk")
    return [StateChange.from_row(row) for row in rows]


class Gap:
    """Handed to every stream after the listening connection was lost and made again:
    changes may have been missed meanwhile, so a stream reads the audit log once."""


GAP = Gap()
Item = StateChange | Gap


class NotListening(RuntimeError):
    """The listening connection could not be made in time (the database is unreachable)."""


class StateChanges:
    """One listening connection per process, its notifications handed out by object."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[tuple[str, str], set[queue.SimpleQueue[Item]]] = {}
        self._listening = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def subscribe(
        self, target_type: str, target_id: str | int
    ) -> Iterator[queue.SimpleQueue[Item]]:
        """A queue of the object's state changes from now on (and ``GAP``s), while the block
        runs; the connection listens before the block starts, so what the block then reads of
        the audit log and what the queue receives leave nothing out (they may overlap: the
        ids tell)."""
        self.start()
        if not self._listening.wait(READY_TIMEOUT_S):
            raise NotListening("the database does not answer: state changes cannot be followed")
        key = (target_type, str(target_id))
        inbox: queue.SimpleQueue[Item] = queue.SimpleQueue()
        with self._lock:
            self._subscribers.setdefault(key, set()).add(inbox)
        try:
            yield inbox
        finally:
            with self._lock:
                inboxes = self._subscribers.get(key, set())
                inboxes.discard(inbox)
                if not inboxes:
                    self._subscribers.pop(key, None)

    def start(self) -> None:
        """Start listening (once per process; a daemon thread)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="state-changes", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        tries = 0
        while not self._stopping.is_set():
            wrapper = connections.create_connection("default")
            try:
                wrapper.ensure_connection()
                raw: Any = wrapper.connection
                raw.execute(f"LISTEN {CHANNEL}")
                if tries:
                    log.info("listening for state changes again")
                    self._broadcast(GAP)
                tries = 0
                self._listening.set()
                while not self._stopping.is_set():
                    for notification in raw.notifies(timeout=1.0):
                        self._hand_out(notification.payload)
            except Exception as exc:  # a lost connection, whatever raised it: listen again
                self._listening.clear()
                wait = RECONNECT_S[min(tries, len(RECONNECT_S) - 1)]
                log.warning("not listening for state changes (%s); again in %s s", exc, wait)
                tries += 1
                self._stopping.wait(wait)
            finally:
                with suppress(Exception):  # a lost connection's close may fail too
                    wrapper.close()

    def _hand_out(self, payload: str) -> None:
        try:
            change = StateChange.from_payload(payload)
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable state change: %r", payload[:200])
            return
        with self._lock:
            inboxes = list(self._subscribers.get((change.target_type, change.target_id), ()))
        for inbox in inboxes:
            inbox.put(change)

    def _broadcast(self, item: Item) -> None:
        with self._lock:
            inboxes = [inbox for group in self._subscribers.values() for inbox in group]
        for inbox in inboxes:
            inbox.put(item)


STATE_CHANGES = StateChanges()
