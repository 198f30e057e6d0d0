"""Health pages: the alerts (the API has its own routes in ``health/api/``)."""

from django.urls import path

from health import views

app_name = "health"
urlpatterns = [
    path("alerts/", views.alert_list, name="alerts"),
    path("alerts/idle/", views.idle_held, name="alerts-idle"),
    path("alerts/panel/", views.alerts_panel, name="alerts-panel"),
    path("alerts/<int:pk>/ack/", views.alert_ack, name="alert-ack"),
]
