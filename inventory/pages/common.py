"""What every inventory page writes the same way (and the scheduling pages reuse)."""

from __future__ import annotations

from django.urls import reverse

from inventory.choices import BADGE_COLOURS

# reverse() once per GPU of a 4,000-GPU dashboard polled every 2 s costs too much: row URLs
# are formatted from one reversed template instead. No id reaches the sentinel.
_URL_SENTINEL = 2_147_483_646


def url_format(viewname: str) -> str:
    """``"/jobs/{}/"``: the URL of ``viewname`` with a ``{}`` for its one argument."""
    return reverse(viewname, args=[_URL_SENTINEL]).replace(str(_URL_SENTINEL), "{}")


def badge_colour(state: str) -> str:
    return BADGE_COLOURS.get(state, "grey")


def short_gpu_name(name: str) -> str:
    """``NVIDIA A100-SXM4-40GB`` -> ``A100-SXM4-40GB``."""
    return name.removeprefix("NVIDIA ").strip()
