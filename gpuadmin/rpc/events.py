"""Audited state changes as they commit, for the gRPC API's streams.

Every audit row whose ``after`` has a ``state`` is announced by PostgreSQL on the channel
``gpuadmin_state_changes`` when its transaction commits (the trigger of
``gpuadmin/audit/migrations/0004_notify_state_changes.py``, one call per statement since
``0005_notify_state_changes_per_statement.py``). A server process listens on one
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from gpuadmin.audit.models import AuditEvent
from gpuadmin.postgres.direct import direct_connection

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


def changes_after(
    target_type: str, target_id: str | int | None, after_id: int
) -> list[StateChange]:
    """The audited state changes of one object (every object of the type with ``target_id``
    None) after the row ``after_id``, oldest first."""
    rows = AuditEvent.objects.filter(
        target_type=target_type, pk__gt=after_id, after__has_key="state"
    )
    if target_id is not None:
        rows = rows.filter(target_id=str(target_id))
    return [StateChange.from_row(row) for row in rows.order_by("pk")]


class Gap:
    """Handed to every stream after the listening connection was lost and made again:
    changes may have been missed meanwhile, so a stream reads the audit log once."""


class Stop:
    """Handed to a follower whose client went away: it stops at once."""


GAP = Gap()
Item = StateChange | Gap | Stop


class NotListening(RuntimeError):
    """The listening connection could not be made in time (the database is unreachable)."""


ANY = "*"  # a subscription to every object of a type
# How often a follower waiting for a change looks whether its client is still there.
TICK_S = 1.0


class Follower:
    """The state changes of one object (or of every object of a type), for one stream."""

    def __init__(
        self, inbox: queue.SimpleQueue[Item], target_type: str, target_id: str | int | None
    ) -> None:
        self.inbox = inbox
        self.target_type = target_type
        self.target_id = target_id

    def stop(self) -> None:
        """End ``changes`` now (grpc calls it when the client goes away), not at the next
        look at whether the client is there."""
        self.inbox.put(Stop())

    def changes(
        self, after_id: int, active: Callable[[], bool], *, history: bool = True, live: bool = True
    ) -> Iterator[StateChange]:
        """The changes after the audit row ``after_id`` that the audit log holds now (with
        ``history``), then those that commit from now on (with ``live``), each once, until
        ``active()`` turns false (the client went away). After a ``GAP`` the audit log is read
        again from the last change given."""
        given: set[int] = set()
        last = after_id
        if history:
            for change in changes_after(self.target_type, self.target_id, after_id):
                given.add(change.id)
                last = max(last, change.id)
                yield change
        # It waits without a database connection of its own (a gap reconnects).
        connection.close()
        while live and active():
            try:
                item = self.inbox.get(timeout=TICK_S)
            except queue.Empty:
                continue
            if isinstance(item, Stop):
                return
            found = (
                changes_after(self.target_type, self.target_id, last)
                if isinstance(item, Gap)
                else [item]
            )
            for change in found:
                if change.id in given:
                    continue
                given.add(change.id)
                last = max(last, change.id)
                yield change


class StateChanges:
    """One listening connection per process, its notifications handed out by object."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[tuple[str, str], set[queue.SimpleQueue[Item]]] = {}
        self._listening = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def following(self, target_type: str, target_id: str | int | None = None) -> Iterator[Follower]:
        """A ``Follower`` of the object's state changes (every object of the type with
        ``target_id`` None) while the block runs. The connection listens before the block
        starts, so what the follower then reads of the audit log and what it receives as the
        changes commit leave nothing out."""
        with self.subscribe(target_type, target_id) as inbox:
            yield Follower(inbox, target_type, target_id)

    @contextmanager
    def subscribe(
        self, target_type: str, target_id: str | int | None = None
    ) -> Iterator[queue.SimpleQueue[Item]]:
        """A queue of the object's state changes from now on (and ``GAP``s), while the block
        runs (``following`` reads it)."""
        self.start()
        if not self._listening.wait(READY_TIMEOUT_S):
            raise NotListening("the database does not answer: state changes cannot be followed")
        key = (target_type, ANY if target_id is None else str(target_id))
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
            wrapper = direct_connection()  # LISTEN needs a session (no transaction pooling)
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
            inboxes = [
                *self._subscribers.get((change.target_type, change.target_id), ()),
                *self._subscribers.get((change.target_type, ANY), ()),
            ]
        for inbox in inboxes:
            inbox.put(change)

    def _broadcast(self, item: Item) -> None:
        with self._lock:
            inboxes = [inbox for group in self._subscribers.values() for inbox in group]
        for inbox in inboxes:
            inbox.put(item)


STATE_CHANGES = StateChanges()
