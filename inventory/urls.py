"""Inventory pages: the fleet dashboard, GPU and node pages, MIG and topology pages."""

from django.urls import path

from inventory import maintenance, views

app_name = "inventory"
urlpatterns = [
    path("fleet/", views.dashboard, name="dashboard"),
    path("gpus/<str:uuid>/", views.gpu_detail, name="gpu-detail"),
    path("gpus/<str:uuid>/mig/create/", views.mig_create, name="mig-create"),
    path("gpus/<str:uuid>/mig/<int:gi_id>/destroy/", views.mig_destroy, name="mig-destroy"),
    path("nodes/<str:hostname>/", views.node_detail, name="node-detail"),
    path("gpus/<str:uuid>/state/", maintenance.gpu_state, name="gpu-state"),
    path("nodes/<str:hostname>/state/", maintenance.node_state, name="node-state"),
    path("nodes/<str:hostname>/mig/", views.node_mig, name="node-mig"),
    path("nodes/<str:hostname>/topology/", views.node_topology, name="node-topology"),
]
