"""The Celery application: configured from Django settings (namespace ``CELERY``)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.result import AsyncResult

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")


class App(Celery):
    """Celery whose ``send_task`` keeps to ``task_ignore_result`` unless told otherwise, as
    ``apply_async`` does. Celery's own subscribes the sender to each message's result
    channel outside a worker (a Redis SUBSCRIBE a message, held while the process lives: a web
    server's wakes, a bench's dispatches) and asks the worker to store a result nobody reads."""

    def send_task(self, name: str, *args: Any, **options: Any) -> AsyncResult:
        options.setdefault("ignore_result", self.conf.task_ignore_result)
        return super().send_task(name, *args, **options)


app = App("gpuadmin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Workers keep their database connections between tasks (DATABASE_CONN_MAX_AGE); tasks carry
# the request id of what sent them (the audit log's ``request_id``).
import gpuadmin.celery_db  # noqa: E402, F401
import gpuadmin.request_id  # noqa: E402, F401
