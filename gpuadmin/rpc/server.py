"""The gRPC server (`gpuadmin grpc`): the apps' services, the standard health service and
server reflection, on one port.

The apps' servicers are named here only by strings (``SERVICES``), as the root URL
configuration names their routes: each module's ``add_to(server)`` adds its services and
returns their full names. Calls run in a pool of threads; a stream holds its thread while it
follows its object, so ``threads`` bounds the calls and streams served at once (more wait).
"""

from __future__ import annotations

import logging
from concurrent import futures
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gpuadmin.rpc.calls import STREAMS
from gpuadmin.rpc.events import STATE_CHANGES

log = logging.getLogger("gpuadmin.rpc")
SERVICES = ("inventory.rpc", "scheduling.jobs.rpc", "scheduling.reservations.rpc")
STOP_GRACE_S = 5.0  # calls in flight finish first; streams are ended after it
# Bodies as large as the REST API's (GPUADMIN's parsers bound them there).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class CannotListen(RuntimeError):
    """The address cannot be bound (in use, or not this machine's)."""


@dataclass(frozen=True)
class Tls:
    """The server's certificate chain and private key (PEM), read at start."""

    certificate: bytes
    key: bytes

    @classmethod
    def read(cls, certificate: Path, key: Path) -> Tls:
        try:
            return cls(certificate.read_bytes(), key.read_bytes())
        except OSError as exc:
            raise CannotListen(f"cannot read {exc.filename}: {exc.strerror}") from None


def stream_limit(threads: int) -> int:
    """The streams open at once on a server of ``threads``: a quarter of its threads (at least
    one) stay for the other calls."""
    return max(1, threads - max(1, threads // 4))


def build(
    bind: str, *, threads: int, tls: Tls | None = None
) -> tuple[grpc.Server, health.HealthServicer]:
    """A server with every service, bound to ``bind`` (``HOST:PORT``; over TLS with
    ``tls``), not yet started."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not shared
        ],
    )
    STREAMS.limit = stream_limit(threads)
    names: list[str] = []
    for module in SERVICES:
        names += import_module(module).add_to(server)
    checks = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    for name in ("", *names):
        checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    try:
        if tls is None:
            server.add_insecure_port(bind)
        else:
            credentials = grpc.ssl_server_credentials([(tls.key, tls.certificate)])
            server.add_secure_port(bind, credentials)
    except RuntimeError:
        raise CannotListen(f"cannot listen on {bind}: in use, or not this machine's") from None
    return server, checks


def serve(bind: str, *, threads: int, tls: Tls | None = None) -> None:
    """Serve until SIGTERM or Ctrl-C (a ``KeyboardInterrupt``), then stop: health says
    NOT_SERVING, calls in flight get ``STOP_GRACE_S``."""
    server, checks = build(bind, threads=threads, tls=tls)
    STATE_CHANGES.start()
    server.start()
    log.info("gpuadmin grpc: serving on %s", bind)
    over = " over TLS" if tls else ""
    print(f"gpuadmin grpc: serving gpuadmin.v1 on {bind}{over}", flush=True)  # noqa: T201
    try:
        server.wait_for_termination()
    finally:
        checks.enter_graceful_shutdown()
        server.stop(STOP_GRACE_S).wait()
        STATE_CHANGES.stop()
