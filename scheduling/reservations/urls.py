"""Reservation pages: the list (and its request form), the decisions, the week calendars."""

from django.urls import path

from scheduling.reservations import views

app_name = "reservations"
urlpatterns = [
    path("reservations/", views.reservation_list, name="list"),
    path("reservations/<int:pk>/approve/", views.reservation_approve, name="approve"),
    path("reservations/<int:pk>/reject/", views.reservation_reject, name="reject"),
    path("reservations/<int:pk>/cancel/", views.reservation_cancel, name="cancel"),
    path("reservations/<int:pk>/release/", views.reservation_release, name="release"),
    path("nodes/<str:hostname>/calendar/", views.node_calendar, name="node-calendar"),
    path("gpus/<str:uuid>/calendar/", views.gpu_calendar, name="gpu-calendar"),
]
