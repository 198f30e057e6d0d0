"""A task for the Sentinel failover test (``celery -A gpuadmin.celery worker --include`` this
module): a central worker's task that holds its message unacknowledged (acks late) while it
runs, and says when it started and ended, in the Redis it runs on."""

from __future__ import annotations

import time

from celery import shared_task
from django.conf import settings

HOLD = "tests.failover.hold"


@shared_task(name=HOLD)
def hold(key: str, seconds: float) -> None:
    """``start``, then ``end`` after ``seconds``, appended to the list ``key``."""
    client = settings.REDIS_TARGET.client(socket_timeout=5)
    client.rpush(key, "start")
    time.sleep(seconds)
    client.rpush(key, "end")
