"""Policy pages: every pool's policy and its form (admins), quotas and their forms (admins),
and the fair-share page."""

from django.urls import path

from scheduling.policies import views

app_name = "policies"
urlpatterns = [
    path("policies/", views.policy_list, name="list"),
    path("policies/<str:pool>/", views.policy_edit, name="edit"),
    path("quotas/", views.quota_list, name="quotas"),
    path("quotas/new/", views.quota_edit, name="quota-new"),
    path("quotas/<int:pk>/", views.quota_edit, name="quota-edit"),
    path("quotas/<int:pk>/delete/", views.quota_delete, name="quota-delete"),
    path("fairshare/", views.fairshare_page, name="fairshare"),
]
