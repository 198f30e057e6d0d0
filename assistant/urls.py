from django.urls import path

from assistant import views

app_name = "assistant"
urlpatterns = [
    path("assistant/", views.page, name="page"),
    path("assistant/stream/", views.stream, name="stream"),
]
