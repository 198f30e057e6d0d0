"""A Celery worker's database connections live as long as a web process's: for
``DATABASE_CONN_MAX_AGE`` seconds, checked before reuse, not one per task.

Celery's Django fix-up closes every connection before and after each task unless
``CELERY_DB_REUSE_MAX`` is set (settings.py sets it out of reach): each agent report and
placement pass would open a new PostgreSQL connection (a server process and its
authentication, and the statements prepared on the old one lost: a visible part of a job
event's time in ``bench/throughput.py``). Instead, around each task, as Django does around
each request, ``close_old_connections`` closes a connection past its age or one that an
error left unusable, and ``CONN_HEALTH_CHECKS`` tests a kept one before its first query.
"""

from __future__ import annotations

from typing import Any

from celery import Task, signals
from django.db import close_old_connections


@signals.task_prerun.connect
@signals.task_postrun.connect
def _recycle_connections(task: Task | None = None, **_: Any) -> None:
    # An eager task runs inside its caller's connection and transaction: never close those.
    if task is None or not task.request.is_eager:
        close_old_connections()
