"""MIG re-layout: the GPU page's live section, the admins' request and cancel."""

from django.urls import path

from scheduling.sharing import views

app_name = "relayout"
urlpatterns = [
    path("gpus/<str:uuid>/mig-relayout/", views.gpu_section, name="gpu-section"),
    path("gpus/<str:uuid>/mig-relayout/new/", views.request_relayout, name="request"),
    path("mig-relayouts/<int:pk>/cancel/", views.cancel_relayout, name="cancel"),
]
