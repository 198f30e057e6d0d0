"""Inventory pages: the fleet dashboard, GPU detail, MIG and topology pages."""

from django.urls import path  # noqa: F401

app_name = "inventory"
urlpatterns: list = []
