"""The Celery application: configured from Django settings (namespace ``CELERY``)."""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery
from celery import Task as CeleryTask
from celery.result import AsyncResult
from django.db import InterfaceError, OperationalError
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")


#: What a task meets when the database is out of reach: it is retried (``Task``).
DATABASE_AWAY = (OperationalError, InterfaceError)


class Task(CeleryTask):
    """Every task of the app (an agent's report, a placement pass, beat's): one that finds
    the database out of reach (a restart, a switch to the standby: the connection is refused
    or dies mid-task, its transaction rolled back) is sent again with an exponential backoff
    (1, 2, 4... s, then at most 10 s, jittered so that 500 nodes' reports do not come back
    at once), for about five minutes (ten at most), instead of failing: its message is
    acknowledged only once the retry is queued (``task_acks_late``), so a report is never
    dropped on the way. A task that gives its own ``autoretry_for`` adds ``DATABASE_AWAY``."""

    autoretry_for = DATABASE_AWAY
    retry_backoff = 1
    retry_backoff_max = 10
    max_retries = 60

    def on_retry(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        # Celery's own line for a retry is INFO, which settings.py keeps out of the log.
        logging.getLogger("gpuadmin.tasks").warning(
            "%s: %s; retried (%s of %s)", self.name, exc, self.request.retries + 1, self.max_retries
        )


class App(Celery):
    """Celery whose ``send_task`` keeps to ``task_ignore_result`` unless told otherwise, as
    ``apply_async`` does. Celery's own subscribes the sender to each message's result
    channel outside a worker (a Redis SUBSCRIBE a message, held while the process lives: a web
    server's wakes, a bench's dispatches) and asks the worker to store a result nobody reads."""

    def send_task(self, name: str, *args: Any, **options: Any) -> AsyncResult:
        options.setdefault("ignore_result", self.conf.task_ignore_result)
        return super().send_task(name, *args, **options)


# sentinel:// broker URLs get kombu's Sentinel transport made to come through a failover with
# messages unacknowledged (gpuadmin/broker.py). The URL's scheme picks it, not the
# broker_transport setting: kombu's failover to the next URL of the list resets the transport
# to the scheme's.
TRANSPORT_ALIASES["sentinel"] = "gpuadmin.broker:SentinelTransport"

app = App("gpuadmin", task_cls=Task)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Workers keep their database connections between tasks (DATABASE_CONN_MAX_AGE); tasks carry
# the request id of what sent them (the audit log's ``request_id``).
import gpuadmin.celery_db  # noqa: E402, F401
import gpuadmin.request_id  # noqa: E402, F401
