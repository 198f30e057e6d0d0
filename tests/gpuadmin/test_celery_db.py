"""A Celery worker keeps its database connection from task to task (``gpuadmin.celery_db``),
for ``DATABASE_CONN_MAX_AGE``, as a web process does from request to request."""

from __future__ import annotations

import time

import pytest
from celery import signals
from celery.fixups.django import DjangoWorkerFixup
from django.db import connection

from gpuadmin.access.node_orders import NodeOrder
from gpuadmin.celery import DATABASE_AWAY, app
from scheduling import tasks

# Not in a test transaction: a worker's connection is in autocommit between tasks.
pytestmark = pytest.mark.django_db(transaction=True)


def run_task_signals(fixup: DjangoWorkerFixup) -> None:
    """What a worker process does around a task: Celery's fix-up and the signals' receivers."""
    task = tasks.placement_pass
    fixup.on_task_prerun(sender=task)
    signals.task_prerun.send(sender=task, task_id="t", task=task, args=(), kwargs={})
    signals.task_postrun.send(sender=task, task_id="t", task=task, args=(), kwargs={})
    fixup.on_task_postrun(sender=task)


def test_a_workers_connection_lives_on_from_task_to_task() -> None:
    fixup = DjangoWorkerFixup(app)
    connection.close()  # a fresh, healthy one (an earlier test may have left it broken)
    connection.ensure_connection()
    session = connection.connection

    for _ in range(3):
        run_task_signals(fixup)
        assert connection.connection is session


def test_a_connection_past_its_age_is_closed_after_a_task() -> None:
    fixup = DjangoWorkerFixup(app)
    connection.ensure_connection()
    connection.close_at = time.monotonic() - 1

    run_task_signals(fixup)

    assert connection.connection is None


def test_every_central_task_is_retried_while_the_database_is_away() -> None:
    """A report or a pass that finds PostgreSQL restarting is sent again, not dropped
    (gpuadmin.celery.Task; tests/integration/test_faults.py restarts it for real). The orders
    an agent carries out touch no database."""
    app.loader.import_default_modules()
    central = {
        name: task
        for name, task in app.tasks.items()
        if not name.startswith("celery.") and not isinstance(task, NodeOrder)
    }
    assert {"health.report", "scheduling.job_events", "scheduling.placement_pass"} <= set(central)
    for name, task in central.items():
        assert set(DATABASE_AWAY) <= set(task.autoretry_for), name
        assert task.max_retries * task.retry_backoff_max >= 300, name
