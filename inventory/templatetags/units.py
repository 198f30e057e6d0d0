"""``{% load units %}``: ``{{ mib|memory }}`` and ``{{ seconds|duration }}``, as
``inventory.units`` writes them for every page."""

from __future__ import annotations

from django import template

from inventory import units

register = template.Library()


@register.filter
def memory(mib: float | None) -> str:
    """``8000 MiB``, ``80 GiB``; a dash for none."""
    return "–" if mib is None or mib == "" else units.memory_text(float(mib))


@register.filter
def duration(seconds: float | None) -> str:
    """``7 days``, ``1 h 30 min``; a dash for none."""
    return units.duration_text(None if seconds is None or seconds == "" else float(seconds))
