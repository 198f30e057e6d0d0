"""``/audit/``: the audit log for operators and admins, filtered as ``GET /api/v1/audit/``."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from gpuadmin.access.permissions import role_required
from gpuadmin.audit.access import READ_ROLE
from gpuadmin.audit.changes import field_changes
from gpuadmin.audit.filters import AuditEventFilterSet
from gpuadmin.audit.models import AuditEvent

PAGE_ROWS = 100


@role_required(READ_ROLE)
@require_GET
def audit_log(request: HttpRequest) -> HttpResponse:
    """Newest first, ``PAGE_ROWS`` a page, each with the fields it changed (old → new); the
    CSV link exports every row the filters select, before and after whole."""
    filterset = AuditEventFilterSet(request.GET, queryset=AuditEvent.objects.all())
    page = Paginator(filterset.qs, PAGE_ROWS).get_page(request.GET.get("page"))
    filters = request.GET.copy()
    filters.pop("page", None)
    export = filters.copy()
    export["format"] = "csv"
    context = {
        "filterset": filterset,
        "page": page,
        "rows": [(event, field_changes(event.before, event.after)) for event in page],
        "query": filters.urlencode(),  # for the page links
        "csv_url": f"{reverse('audit-api-v1:audit-list')}?{export.urlencode()}",
    }
    return render(request, "audit/log.html", context)
