"""The broker transport for ``REDIS_URL=sentinel://...`` (registered in gpuadmin/celery.py):
kombu 5.7's Redis Sentinel transport, made to come through a failover with messages
unacknowledged. kombu's own gives up putting back the messages a worker held when the primary
is gone, and can crash the worker closing a channel after Celery collected its connection
(celery/kombu#970). See docs/operations/high-availability.md, "Messages a worker holds when
the primary dies".
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kombu.transport import redis

logger = logging.getLogger("gpuadmin.broker")

# The delivery tags that could not be put back, by broker (``_broker``): the next channel
# opened to it puts them back. Restoring one twice is harmless (the second finds nothing
# in ``unacked``), so is restoring one acknowledged since.
_unrestored: dict[tuple[Any, ...], list[str]] = {}
_unrestored_lock = threading.Lock()


def _broker(channel: SentinelChannel) -> tuple[Any, ...]:
    """What tells one broker's messages from another's: the Sentinels, the primary's name,
    the database and the hash of unacknowledged messages."""
    client = channel.connection.client
    return (tuple(client.alt), channel.master_name, client.virtual_host, channel.unacked_key)


class QoS(redis.QoS):
    """kombu's, except that the messages it cannot put back now, the broker out of reach,
    are left to the next channel (``SentinelChannel``) instead of the visibility timeout."""

    def restore_unacked(self, client: Any = None) -> None:
        try:
            super().restore_unacked(client)
        except self.channel.connection_errors as exc:
            tags = list(self._delivered)
            self._delivered.clear()
            with _unrestored_lock:
                _unrestored.setdefault(_broker(self.channel), []).extend(tags)
            logger.warning(
                "could not put back %d unacknowledged message(s) (%s): they are put back "
                "once the broker is reached again",
                len(tags),
                exc,
            )


class SentinelChannel(redis.SentinelChannel):
    """kombu's Sentinel channel with ``QoS`` above; a new one first puts back the messages
    an earlier channel of this process could not."""

    QoS = QoS
    master_name: str  # the transport option (gpuadmin.env.RedisTarget.celery_transport_options)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # has reached the primary (a PING)
        self._restore_unrestored()

    def _restore_unrestored(self) -> None:
        key = _broker(self)
        with _unrestored_lock:
            tags = _unrestored.pop(key, [])
        if not tags:
            return
        try:
            with self.conn_or_acquire() as client:
                for tag in tags:
                    self.qos.restore_by_tag(tag, client=client)
        except self.connection_errors as exc:
            with _unrestored_lock:
                _unrestored.setdefault(key, []).extend(tags)  # the next channel tries again
            logger.warning("could not put back %d unacknowledged message(s): %s", len(tags), exc)
        else:
            logger.info("put back %d unacknowledged message(s) of a lost connection", len(tags))


class SentinelTransport(redis.SentinelTransport):
    """kombu's Sentinel transport with ``SentinelChannel``, which keeps the connection it was
    made for: a channel closed after kombu collected the connection (the messages it held
    put back then) still finds where the broker is."""

    Channel = SentinelChannel

    @property
    def client(self) -> Any:
        return self._connection

    @client.setter
    def client(self, client: Any) -> None:
        # kombu.Connection sets it to None when it closes or collects the transport.
        if client is not None:
            self._connection = client
