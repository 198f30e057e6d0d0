"""Take, renew and give back a lease; write only while holding it.

A lease is a row (``Lease``): its holder, a fencing token and when it expires. Taking it is one
statement that succeeds when the row is free (expired or given back); each taking adds one to
the token. A holder writes what its role decides inside ``fenced``: a transaction that first
renews the lease by its token, and fails (``LeaseLost``) once another holder took it. The
renewal locks the row until that transaction ends, so the lease cannot change hands between
the check and the commit. Nothing depends on the database session: every statement stands in
its own transaction, as PgBouncer's transaction pooling wants, and a failover keeps the row.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction


class LeaseLost(Exception):
    """The lease was taken by another holder (this one's expired meanwhile)."""


@dataclass(frozen=True)
class Held:
    name: str
    holder: str
    token: int
    ttl_s: float


def holder_name() -> str:
    """This process, as a lease names its holder (host, process id, and a nonce)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# The row is created, or taken when it is free (expired, or given back) or its holder's already
# (beat's leader, once cut from the database, takes its lease back at once). A lease another
# holds is left alone (not even locked, as ON CONFLICT DO UPDATE would lock it); a row locked
# by a holder's fenced write (a tenth of a second) is waited for, then read again.
_TAKE = """
    INSERT INTO leases_lease (name, holder, token, expires_at)
    SELECT %(name)s::text, %(holder)s::text, 1,
           clock_timestamp() + make_interval(secs => %(ttl)s::float8)
    WHERE NOT EXISTS (
        SELECT FROM leases_lease
        WHERE name = %(name)s::text AND expires_at >= clock_timestamp()
          AND holder <> %(holder)s::text
    )
    ON CONFLICT (name) DO UPDATE
    SET holder = excluded.holder, token = leases_lease.token + 1, expires_at = excluded.expires_at
    WHERE leases_lease.expires_at < clock_timestamp() OR leases_lease.holder = excluded.holder
    RETURNING token
"""
_RENEW = """
    UPDATE leases_lease SET expires_at = clock_timestamp() + make_interval(secs => %s::float8)
    WHERE name = %s AND token = %s
"""
_GIVE_BACK = "UPDATE leases_lease SET expires_at = clock_timestamp() WHERE name = %s AND token = %s"


def try_take(name: str, ttl_s: float, holder: str | None = None) -> Held | None:
    """The lease ``name`` for ``ttl_s`` seconds if it is free now, else ``None``."""
    holder = holder or holder_name()
    with connection.cursor() as cursor:
        cursor.execute(_TAKE, {"name": name, "holder": holder, "ttl": ttl_s})
        row = cursor.fetchone()
    return None if row is None else Held(name, holder, row[0], ttl_s)


def take(name: str, ttl_s: float, poll_s: float = 0.05) -> Held:
    """The lease ``name``, once free (polls: a pass on another worker ends, or its holder's
    lease expires)."""
    holder = holder_name()
    while (held := try_take(name, ttl_s, holder)) is None:
        time.sleep(poll_s)
        poll_s = min(poll_s * 2, 0.5)
    return held


def renew(held: Held) -> None:
    """Extend the lease by its time to live from now; ``LeaseLost`` when another took it. In
    a transaction, the row stays locked until it ends: nobody takes the lease meanwhile."""
    with connection.cursor() as cursor:
        cursor.execute(_RENEW, [held.ttl_s, held.name, held.token])
        if cursor.rowcount == 0:
            raise LeaseLost(f"the lease {held.name!r} was taken by another holder")


@contextmanager
def fenced(held: Held) -> Iterator[None]:
    """A transaction that commits only while ``held`` is still this holder's (renewed first)."""
    with transaction.atomic():
        renew(held)
        yield


def give_back(held: Held) -> None:
    """Free the lease now (nothing, when another holder took it meanwhile)."""
    with connection.cursor() as cursor:
        cursor.execute(_GIVE_BACK, [held.name, held.token])


def give_back_quietly(held: Held) -> None:
    """``give_back``, or nothing when the database cannot be reached: the lease expires."""
    with suppress(DatabaseError):
        give_back(held)


@contextmanager
def holding(held: Held) -> Iterator[Held]:
    """Give ``held`` back on the way out, whatever happened."""
    try:
        yield held
    finally:
        give_back_quietly(held)
