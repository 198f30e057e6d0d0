"""Beat in one place at a time: every ``gpuadmin beat`` runs (one per machine, say), only the
holder of the beat lease sends, and no task is sent twice for one period.

A beat that is not the leader tries to take the lease every ``renew_s`` (a third of its time
to live); the leader renews it as often. A leader that dies is replaced within the lease's
time to live plus ``renew_s`` (15 + 5 s by default). Each send first claims its entry's period
(the schedule's interval on the database's clock: the period ``[k * interval, (k + 1) *
interval)`` that holds now) in a transaction fenced by the lease (``services.fenced``): a
beat that takes over finds the periods its predecessor sent for already claimed, and a beat
that lost its lease (stalled, or cut from the database) claims nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import beat, schedules
from django.conf import settings
from django.db import DatabaseError, connection
from psycopg import pq

from gpuadmin.leases import services

log = logging.getLogger("gpuadmin.beat")

LEASE_NAME = "beat"
# Period of an entry that is no interval (a crontab): crontabs fire at most once a minute.
CRONTAB_PERIOD_S = 60.0

_CLAIM = """
    INSERT INTO leases_beatperiod (task, period_start, sent_by)
    VALUES (
        %(task)s::text,
        to_timestamp(
            floor(extract(epoch FROM clock_timestamp()) / %(period)s::float8) * %(period)s::float8
        ),
        %(holder)s::text
    )
    ON CONFLICT (task) DO UPDATE SET period_start = excluded.period_start,
                                     sent_by = excluded.sent_by
    WHERE leases_beatperiod.period_start < excluded.period_start
    RETURNING period_start
"""


def period_s(entry: beat.ScheduleEntry) -> float:
    """The length of the periods an entry is sent once in."""
    schedule = entry.schedule
    if isinstance(schedule, schedules.schedule) and not isinstance(schedule, schedules.crontab):
        return float(schedule.run_every.total_seconds())
    return CRONTAB_PERIOD_S


def connection_busy() -> bool:
    """Whether this process's database connection waits on a statement it sent (a signal
    handler that interrupted it would wait on the connection's lock forever)."""
    raw = connection.connection
    return raw is not None and raw.info.transaction_status == pq.TransactionStatus.ACTIVE


def claim_period(held: services.Held, entry_name: str, period: float) -> bool:
    """Whether this leader may send ``entry_name`` now: its current period was not sent for
    yet (claimed now), and ``held`` is still the beat lease's holder."""
    with services.fenced(held), connection.cursor() as cursor:
        cursor.execute(_CLAIM, {"task": entry_name, "period": period, "holder": held.holder})
        return cursor.fetchone() is not None


class LeaderScheduler(beat.PersistentScheduler):
    """Celery's persistent scheduler that sends only while it holds the beat lease."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ttl_s = float(settings.GPUADMIN_LEASE_TTL_S)
        self.renew_s = self.ttl_s / 3
        self.holder = services.holder_name()
        self.held: services.Held | None = None
        self.next_renewal = 0.0
        self.standing_by = False
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        now = time.monotonic()
        if now >= self.next_renewal:
            self._keep_lease()
            self.next_renewal = now + self.renew_s
        wait = self.next_renewal - now
        if self.held is None:
            return wait
        return min(float(super().tick(*args, **kwargs)), wait)

    def _keep_lease(self) -> None:
        """Renew the lease, or take it when free; ``held`` says the outcome."""
        was_leader = self.held is not None
        try:
            if self.held is not None:
                services.renew(self.held)
            else:
                self.held = services.try_take(LEASE_NAME, self.ttl_s, self.holder)
        except services.LeaseLost as exc:
            log.warning("beat: not the leader any more: %s", exc)
            self.held = None
        except DatabaseError as exc:  # the next try opens a new connection
            log.warning("beat: cannot reach the database, not sending: %s", exc)
            connection.close()
            self.held = None
        if self.held is not None and not was_leader:
            log.warning("beat: leader now (%s, token %d)", self.holder, self.held.token)
        elif self.held is None and not self.standing_by:
            log.warning("beat: standing by (%s): another beat sends", self.holder)
        self.standing_by = self.held is None

    def apply_entry(self, entry: beat.ScheduleEntry, producer: Any = None) -> None:
        if self.held is None:
            return
        try:
            claimed = claim_period(self.held, entry.name, period_s(entry))
        except services.LeaseLost as exc:
            log.warning("beat: not the leader any more: %s", exc)
            self.held = None
            return
        except DatabaseError as exc:
            log.warning("beat: %s not sent: cannot claim its period: %s", entry.name, exc)
            connection.close()
            return
        if claimed:
            super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        """Give the lease back: the standby beat takes over at its next try. Celery's SIGTERM
        handler calls this wherever the signal landed: in the middle of a claim's statement or
        commit, the lease is left to expire instead (``connection_busy``)."""
        if self.held is not None and not connection_busy():
            services.give_back_quietly(self.held)
        self.held = None
        super().close()
