"""Scheduling pages: the queue, job pages, the submit form (the API has its own routes)."""

from django.urls import path

from scheduling.allocations import views as accounting_views
from scheduling.jobs import views

app_name = "scheduling"
urlpatterns = [
    path("jobs/", views.queue, name="queue"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/log/", views.job_log, name="job-log"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<int:pk>/release/", views.job_release, name="job-release"),
    path("arrays/<int:pk>/cancel/", views.array_cancel, name="array-cancel"),
    path("usage/", accounting_views.usage_page, name="usage"),
    path("usage.csv", accounting_views.usage_csv, name="usage-csv"),
]
