"""Inventory's parts of pages that other apps own (the project's home page)."""

from __future__ import annotations

from typing import Any

from django import template
from django.db.models import Count

from inventory.choices import NvmlBackend
from inventory.models import Node

register = template.Library()


@register.inclusion_tag("inventory/partials/node_backends.html")
def node_backends() -> dict[str, Any]:
    """How many nodes run on each NVML backend and machine model, e.g. ``NVML simulator:
    dgx-a100-40gb``, in one query whatever the fleet size."""
    groups = (
        Node.objects.values_list("nvml_backend", "model")
        .annotate(nodes=Count("pk"))
        .order_by("nvml_backend", "model")
    )
    rows = []
    for backend, model, nodes in groups:
        label = NvmlBackend(backend).label if backend else "backend not reported"
        rows.append((f"{label}: {model}" if model else label, nodes))
    return {"backends": rows}
