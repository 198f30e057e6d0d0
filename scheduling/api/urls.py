"""Scheduling API routes: the /api/v1 resources and the seed-compatible endpoints."""

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from scheduling.allocations import api as accounting
from scheduling.jobs.api import arrays, views
from scheduling.sharing import api as relayouts

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("arrays", arrays.ArrayViewSet, basename="array")
router.register("allocations", views.AllocationViewSet, basename="allocation")
router.register("tokens", views.TokenViewSet, basename="token")
router.register("mig-relayouts", relayouts.MigRelayoutViewSet, basename="mig-relayout")

urlpatterns = [
    path("api/v1/", include((router.urls, "api"), namespace="scheduling-api-v1")),
    path("api/v1/usage/", accounting.UsageView.as_view(), name="api-usage"),
    path("api/v1/fairshare/", accounting.FairShareView.as_view(), name="api-fairshare"),
    path("queue", views.QueueView.as_view(), name="api-queue"),
    path("queue/submit", views.SubmitView.as_view(), name="api-queue-submit"),
    path("queue/statistics", views.QueueStatisticsView.as_view(), name="api-queue-statistics"),
    path("queue/<int:job_id>", views.QueueJobView.as_view(), name="api-queue-job"),
    path("queue/<int:job_id>/priority", views.PriorityView.as_view(), name="api-queue-priority"),
    path("cluster/gpu-status", views.GpuStatusView.as_view(), name="api-gpu-status"),
    path("cluster/gpu-allocate", views.GpuAllocateView.as_view(), name="api-gpu-allocate"),
    path("cluster/gpu-release", views.GpuReleaseView.as_view(), name="api-gpu-release"),
    path(
        "orchestrator/status",
        views.OrchestratorStatusView.as_view(),
        name="api-orchestrator-status",
    ),
    path(
        "orchestrator/start",
        views.OrchestratorSwitchView.as_view(enable=True),
        name="api-orchestrator-start",
    ),
    path(
        "orchestrator/stop",
        views.OrchestratorSwitchView.as_view(enable=False),
        name="api-orchestrator-stop",
    ),
]
