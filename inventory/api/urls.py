"""Inventory API routes: the versioned fleet resources and the seed-compatible endpoints."""

from django.urls import path  # noqa: F401

urlpatterns: list = []
