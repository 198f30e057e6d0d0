"""Django's PostgreSQL backend with a cheaper health check: ``CONN_HEALTH_CHECKS`` (a
``SELECT 1`` before the first query of a request or task on a kept connection) only when the
connection sat idle for ``FRESH_S`` or more since its last request or task.

The check finds connections that died while idle (a server restart, a proxy's idle timeout).
A busy web worker reuses its connection every few milliseconds, and there the check was a
second round trip per job submission, with its statement on the server: a tenth of the
submission's cost, guarding a window in which a dying server fails the requests in flight
anyway. A connection that saw an error is still checked at once, at the end of its request
(``close_if_unusable_or_obsolete``, Django's).
"""

from __future__ import annotations

import time

from django.db.backends.postgresql import base

# A kept connection idle for less than this since its last request or task is taken as alive.
FRESH_S = 1.0


class DatabaseWrapper(base.DatabaseWrapper):
    # Django recycles (or closes) kept connections around every request and task (the
    # request_started and request_finished signals, scheduling's Celery hooks): the time
    # between the end of one and the start of the next is the connection's idle time.
    _recycled_at = float("-inf")
    _fresh = False  # idle for less than FRESH_S before the request or task under way

    def close_if_unusable_or_obsolete(self) -> None:
        super().close_if_unusable_or_obsolete()
        now = time.monotonic()
        kept = self.connection is not None
        self._fresh = kept and now - self._recycled_at < FRESH_S
        self._recycled_at = now if kept else float("-inf")

    def close_if_health_check_failed(self) -> None:
        if self._fresh:
            self.health_check_done = True
            return
        super().close_if_health_check_failed()
