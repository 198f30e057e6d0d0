"""The broker's settings against the tasks the project sends."""

from __future__ import annotations

from django.conf import settings

from gpuadmin.celery import app
from health.webhooks import DELIVER_TASK


def test_the_visibility_timeout_outlasts_every_retry_countdown() -> None:
    """A task sent again with a countdown waits unacknowledged in the worker that took it
    until it is due: Redis must not give its message to another worker before then (it would
    run twice). The longest countdown is a webhook's backoff cap (settings.py derives the
    timeout from it); a task retried without a backoff waits its ``default_retry_delay``."""
    app.loader.import_default_modules()
    countdowns = {
        name: task.retry_backoff_max if task.retry_backoff else task.default_retry_delay
        for name, task in app.tasks.items()
        if getattr(task, "autoretry_for", ())
    }
    assert countdowns[DELIVER_TASK] == settings.GPUADMIN_WEBHOOK_BACKOFF_MAX_S
    timeout = app.conf.broker_transport_options["visibility_timeout"]
    assert timeout > max(countdowns.values())
