"""``GET /metrics``: Prometheus's exposition formats, from the collectors the apps register.

The project package owns the registry and the view but knows no app: each app adds its
collectors in its ``AppConfig.ready()`` (health: dcgm-exporter's GPU series and gpuadmin's
health series; scheduling: allocations and the queue): docs/operations/prometheus.md.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

# Collectors are read at scrape time only: no describe() pass at registration.
REGISTRY = CollectorRegistry(auto_describe=False)
_registered: set[str] = set()


def register(collector: Collector) -> None:
    """Add an app's collector; a second ``ready()`` (tests) adds nothing twice."""
    kind = type(collector)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if name not in _registered:
        REGISTRY.register(collector)
        _registered.add(name)


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


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        response = HttpResponse("A bearer token is required.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    # The text format whatever the scraper prefers, as dcgm-exporter serves it: prometheus-
    # client writes OpenMetrics markedly slower (docs/development/benchmarks.md).
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_PLAIN_0_0_4)
