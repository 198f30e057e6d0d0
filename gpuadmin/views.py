"""Project-level pages: the home page, the health probe and the favicon."""

from __future__ import annotations

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.http import require_GET

from gpuadmin import __version__
from gpuadmin.access.services import is_admin
from gpuadmin.audit.models import AuditEvent

RECENT_EVENTS = 10


def _service_status() -> dict[str, str]:
    """'ok' or the error for each backing service; never raises."""
    import redis

    status: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        status["database"] = "ok"
    except DatabaseError as exc:
        status["database"] = f"error: {exc}"
    try:
        settings.REDIS_TARGET.client(socket_timeout=1).ping()
        status["redis"] = "ok"
    except redis.RedisError as exc:
        status["redis"] = f"error: {exc}"
    return status


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    context = {
        "version": __version__,
        "services": _service_status(),
        "recent_events": AuditEvent.objects.all()[:RECENT_EVENTS]
        if is_admin(request.user)
        else None,
    }
    return render(request, "home.html", context)


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """Liveness/readiness probe for load balancers and docker-compose healthchecks."""
    services = _service_status()
    healthy = all(value == "ok" for value in services.values())
    return JsonResponse(
        {"status": "ok" if healthy else "degraded", "version": __version__, **services},
        status=200 if healthy else 503,
    )


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers ask for whatever a page links (the admin's, the API's
    pages): the site's icon, ``static/gpuadmin/favicon.svg``, which ``_base.html`` links."""
    return redirect(static("gpuadmin/favicon.svg"))
