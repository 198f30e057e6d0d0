"""Inventory API routes: the versioned fleet resources and the seed-compatible endpoints."""

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from inventory.api import views

router = DefaultRouter()
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("mig-instances", views.MigInstanceViewSet, basename="mig-instance")

urlpatterns = [
    path("api/v1/", include((router.urls, "api"), namespace="api-v1")),
    path("api/v1/fleet/", views.FleetStatusView.as_view(), name="api-fleet-status"),
    path("api/gpu/devices", views.DeviceListView.as_view(), name="api-gpu-devices"),
    path("api/gpu/driver", views.DriverView.as_view(), name="api-gpu-driver"),
    path("gpu/mig/summary", views.MigSummaryView.as_view(), name="api-mig-summary"),
    path("gpu/mig/instances", views.MigInstanceListView.as_view(), name="api-mig-instances"),
    path("gpu/topology", views.TopologyView.as_view(), name="api-topology"),
    path("gpu/discover", views.DiscoverView.as_view(), name="api-discover"),
]
