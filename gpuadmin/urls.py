from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import SimpleRouter

from gpuadmin import docs_site, metrics, views
from gpuadmin.audit import api as audit_api
from gpuadmin.audit import views as audit_views

audit_router = SimpleRouter()
audit_router.register("audit", audit_api.AuditEventViewSet, basename="audit")

urlpatterns = [
    # First: job submissions are the busiest requests, and resolving a path walks the patterns
    # in order (a twentieth of a submission's CPU went to trying the ones above it). None of its
    # paths (queue, cluster/, orchestrator/, api/v1/ jobs, arrays, allocations, tokens) is
    # another's.
    path("", include("scheduling.api.urls")),
    path("", views.home, name="home"),
    path("-/health", views.health, name="health"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("metrics", metrics.metrics, name="metrics"),
    path("metrics/fleet", metrics.fleet_metrics, name="fleet-metrics"),
    path("metrics/targets", metrics.targets, name="metrics-targets"),
    path("metrics/nodes/<str:hostname>", metrics.node_metrics, name="node-metrics"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("audit/", audit_views.audit_log, name="audit-log"),
    path("api/v1/", include((audit_router.urls, "audit"), namespace="audit-api-v1")),
    path("", include("inventory.urls")),
    path("", include("inventory.api.urls")),
    path("", include("scheduling.reservations.api")),
    path("", include("scheduling.policies.api")),
    path("api/v1/", include("health.api.history")),
    path("", include("health.api.alerts")),
    path("", include("health.api.quarantine")),
    path("", include("health.api.report")),
    path("", include("health.urls")),
    path("", include("scheduling.urls")),
    path("", include("scheduling.reservations.urls")),
    path("", include("scheduling.policies.urls")),
    path("", include("scheduling.sharing.urls")),
    path("", include("integrations.slurm.api")),
    path("", include("integrations.ray.api")),
    path("", include("integrations.ray.urls")),
    path("", include("assistant.urls")),
    path("", include("assistant.api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves its start-up script from a URL, not inline (the CSP allows none).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    # The documentation site's files are served before routing (gpuadmin.docs_site); what
    # reaches these is a page the site does not have, or any when it has not been built.
    path("docs/", docs_site.not_served, name="docs"),
    path("docs/<path:page>", docs_site.not_served),
]

handler403 = "gpuadmin.api.permission_denied"
handler404 = "gpuadmin.api.not_found"
handler500 = "gpuadmin.api.server_error"
