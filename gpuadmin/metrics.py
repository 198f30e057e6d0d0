"""``GET /metrics``: Prometheus's exposition formats, from the collectors the apps register.

The project package owns the registry and the view but knows no app: each app adds its
collectors in its ``AppConfig.ready()`` (health: dcgm-exporter's GPU series and gpuadmin's
health series; scheduling: allocations and the queue): docs/operations/prometheus.md.

Three scrapes share them: ``/metrics`` (the whole fleet), ``/metrics/nodes/<hostname>`` (the
series that name one node, as dcgm-exporter serves a node: one Prometheus target per node,
listed by ``/metrics/targets`` for HTTP service discovery) and ``/metrics/fleet`` (the rest:
what ``/metrics`` says beside every node's series). A collector that writes the text format
itself (``TextCollector``) serves all three; any other says nothing per node.
"""

from __future__ import annotations

import gc
import hmac
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.gzip import re_accepts_gzip
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET
from isal import igzip
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

# Collectors are read at scrape time only: no describe() pass at registration.
REGISTRY = CollectorRegistry(auto_describe=False)
_registered: set[str] = set()
_collectors: list[Collector] = []


class UnknownNode(LookupError):
    """A per-node scrape named a node the catalog does not hold (a 404)."""


@runtime_checkable
class TextCollector(Protocol):
    """A collector that writes its own text format: a scrape of ~128,000 samples (500 nodes x
    8 GPUs) spends seconds in prometheus-client's per-sample objects."""

    def text(self, hostname: str | None = None, *, nodes: bool = True, fleet: bool = True) -> str:
        """Its series of every node (or of ``hostname``'s alone) when ``nodes``, and its
        fleet-wide ones when ``fleet``; ``UnknownNode`` for a hostname it does not know."""

    def hostnames(self) -> list[str]:
        """The nodes a per-node scrape can name."""


def register(collector: Collector) -> None:
    """Add an app's collector; a second ``ready()`` (tests) adds nothing twice."""
    kind = type(collector)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if name not in _registered:
        REGISTRY.register(collector)
        _registered.add(name)
        _collectors.append(collector)


def _authorized(request: HttpRequest) -> bool:
    """Open unless ``GPUADMIN_METRICS_TOKEN`` is set; then its bearer token only."""
    token = settings.GPUADMIN_METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # As bytes: compare_digest() refuses str with non-ASCII characters (a 500, not a 401).
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def _refused() -> HttpResponse:
    response = HttpResponse("A bearer token is required.\n", status=401)
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _exposition(request: HttpRequest, text: str) -> HttpResponse:
    # The text format whatever the scraper prefers, as dcgm-exporter serves it: prometheus-
    # client writes OpenMetrics markedly slower (docs/development/benchmarks.md).
    body = text.encode()
    if not re_accepts_gzip.search(request.headers.get("Accept-Encoding", "")):
        return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
    # Compressed here by ISA-L at its level 1, not by GZipMiddleware (zlib at level 6): a whole
    # fleet's 23 MB took zlib 120 ms at level 1 and 2.5 times that at 6, ISA-L 22 ms for a body
    # smaller than zlib's level 1 (docs/development/benchmarks.md).
    response = HttpResponse(
        igzip.compress(body, compresslevel=1, mtime=0), content_type=CONTENT_TYPE_PLAIN_0_0_4
    )
    response["Content-Encoding"] = "gzip"
    patch_vary_headers(response, ("Accept-Encoding",))
    return response


@contextmanager
def _cycle_collection_paused() -> Iterator[None]:
    """A whole-fleet scrape allocates some 100,000 containers (the samples decoded from Redis,
    the catalog's rows, the families' lists) and frees them all by reference counting, but the
    allocations set off the cycle collector: about a tenth of the scrape's CPU time with
    start-up's objects frozen (gpuadmin/wsgi.py), a third without (docs/development/
    benchmarks.md). Paused for the scrape; resumed only if it was running."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _fleet_text(*, nodes: bool) -> str:
    with _cycle_collection_paused():
        return "".join(
            collector.text(nodes=nodes)
            if isinstance(collector, TextCollector)
            else generate_latest(collector).decode()
            for collector in _collectors
        )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The whole fleet in one scrape."""
    if not _authorized(request):
        return _refused()
    return _exposition(request, _fleet_text(nodes=True))


@require_GET
def fleet_metrics(request: HttpRequest) -> HttpResponse:
    """``/metrics`` less every node's series: scraped beside the per-node targets."""
    if not _authorized(request):
        return _refused()
    return _exposition(request, _fleet_text(nodes=False))


@require_GET
def node_metrics(request: HttpRequest, hostname: str) -> HttpResponse:
    """The series of ``/metrics`` that name one node, read for that node alone."""
    if not _authorized(request):
        return _refused()
    try:
        text = "".join(
            collector.text(hostname, fleet=False)
            for collector in _collectors
            if isinstance(collector, TextCollector)
        )
    except UnknownNode:
        return HttpResponse(f"No node {hostname!r}.\n", status=404, content_type="text/plain")
    return _exposition(request, text)


@require_GET
def targets(request: HttpRequest) -> HttpResponse:
    """Prometheus's HTTP service discovery (http_sd_config): one target per node, scraped at
    ``/metrics/nodes/<hostname>`` on the address this request came to, its ``instance`` the
    hostname (as a dcgm-exporter per node would differ by instance)."""
    if not _authorized(request):
        return _refused()
    address = request.get_host()
    hostnames = sorted(
        {
            name
            for collector in _collectors
            if isinstance(collector, TextCollector)
            for name in collector.hostnames()
        }
    )
    return JsonResponse(
        [
            {
                "targets": [address],
                "labels": {
                    "__metrics_path__": reverse("node-metrics", args=[hostname]),
                    "instance": hostname,
                },
            }
            for hostname in hostnames
        ],
        safe=False,
    )
