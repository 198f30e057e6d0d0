"""Ray pages: the clusters and jobs, the submit form, a job's page (the API has its routes)."""

from django.urls import path

from integrations.ray import views

app_name = "ray"
urlpatterns = [
    path("ray/", views.clusters, name="clusters"),
    path("ray/jobs/new/", views.job_new, name="job-new"),
    path("ray/jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("ray/jobs/<int:pk>/log/", views.job_log, name="job-log"),
    path("ray/jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
]
