"""Sending a node's signed reports as its agent does: each one again until the broker takes
it. The fault tests send through the Redis under test (a private one, Sentinels), not this
session's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.test import override_settings
from kombu import Connection
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from gpuadmin.access.node_signing import send_as_node


def send_reports(
    broker_url: str,
    transport_options: dict[str, Any],
    queue: str,
    hostname: str,
    token: str,
    reports: Sequence[tuple[str, list[Any]]],
    sent: list[int],
    refused: list[int],
    interval_s: float = 0.2,
) -> None:
    """``reports`` (task name, arguments), in order and ``interval_s`` apart, signed as node
    ``hostname`` with ``token``; each refused send is tried again (``refused`` gets its
    index each time) and ``sent`` gets the index of each one the broker took. Gives up after
    90 s."""
    deadline = time.monotonic() + 90
    connection = Connection(broker_url, transport_options=transport_options)
    with override_settings(GPUADMIN_NODE_TOKEN=token, GPUADMIN_NODE_NAME=hostname):
        while len(sent) < len(reports) and time.monotonic() < deadline:
            task, args = reports[len(sent)]
            try:
                send_as_node(task, args, queue=queue, connection=connection)
            except (OperationalError, RedisError, OSError):
                refused.append(len(sent))
                connection.close()
                connection = Connection(broker_url, transport_options=transport_options)
            else:
                sent.append(len(sent))
            time.sleep(interval_s)
    connection.close()
