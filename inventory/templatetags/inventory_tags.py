"""Inventory's parts of pages that other apps own (the project's home page), and the tag
that renders the sections other apps contribute to inventory's pages."""

from __future__ import annotations

from typing import Any

from django import template
from django.db.models import Count
from django.template.loader import render_to_string
from django.utils.safestring import SafeString

from gpuadmin.registry import Section
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


@register.simple_tag(takes_context=True)
def render_section(context: template.Context, section: Section) -> SafeString:
    """A page section an app above inventory contributed (``inventory.pages.sections``): its
    template rendered with its own context and the request's (user, CSRF token)."""
    return render_to_string(section.template, dict(section.context), request=context.get("request"))
