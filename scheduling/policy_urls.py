"""Policy pages: every pool's policy and its form (admins), and the fair-share page."""

from django.urls import path

from scheduling import policy_views as views

app_name = "policies"
urlpatterns = [
    path("policies/", views.policy_list, name="list"),
    path("policies/<str:pool>/", views.policy_edit, name="edit"),
    path("fairshare/", views.fairshare_page, name="fairshare"),
]
