"""What every inventory page writes the same way (and the scheduling pages reuse)."""

from __future__ import annotations

from inventory.choices import BADGE_COLOURS

MIB_PER_GIB = 1024


def badge_colour(state: str) -> str:
    return BADGE_COLOURS.get(state, "grey")


def short_gpu_name(name: str) -> str:
    """``NVIDIA A100-SXM4-40GB`` -> ``A100-SXM4-40GB``."""
    return name.removeprefix("NVIDIA ").strip()
