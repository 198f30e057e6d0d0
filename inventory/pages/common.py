"""What every inventory page writes the same way (and the scheduling pages reuse)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse

from inventory.choices import BADGE_COLOURS

MIB_PER_GIB = 1024
_LARGER_UNITS = ("GiB", "TiB", "PiB")

# reverse() costs about 75 us, too much once per GPU of a 4,000-GPU dashboard polled every
# 2 s: row URLs are formatted from one reversed template instead. No id reaches the sentinel.
_URL_SENTINEL = 2_147_483_646


def url_format(viewname: str) -> str:
    """``"/jobs/{}/"``: the URL of ``viewname`` with a ``{}`` for its one argument."""
    return reverse(viewname, args=[_URL_SENTINEL]).replace(str(_URL_SENTINEL), "{}")


def badge_colour(state: str) -> str:
    return BADGE_COLOURS.get(state, "grey")


def mib_text(mib: float) -> str:
    """A size in MiB for people, in the largest binary unit it fills, as ``ls -h`` rounds:
    ``512 MiB``, ``1.5 GiB``, ``16 GiB``, ``1.0 TiB`` (one decimal below 10 of the unit)."""
    value, unit = float(mib), "MiB"
    for larger in _LARGER_UNITS:
        if value < MIB_PER_GIB:
            break
        value, unit = value / MIB_PER_GIB, larger
    return f"{value:.1f} {unit}" if unit != "MiB" and value < 10 else f"{value:.0f} {unit}"


def short_gpu_name(name: str) -> str:
    """``NVIDIA A100-SXM4-40GB`` -> ``A100-SXM4-40GB``."""
    return name.removeprefix("NVIDIA ").strip()


@dataclass(frozen=True)
class Section:
    """A part of an inventory page that an app above inventory contributes
    (``inventory.signals.page_sections_requested``): ``template`` rendered with ``context``,
    sections sorted by ``order`` (lower first)."""

    template: str
    context: Mapping[str, Any] = field(default_factory=dict)
    order: int = 100
