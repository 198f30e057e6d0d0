"""HTMX helpers shared by the apps' page views."""

from __future__ import annotations

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it (for type checkers)."""

    htmx: HtmxDetails


def htmx_partial(request: HtmxHttpRequest) -> bool:
    """Answer with the partial alone: an HTMX request that is not a boosted page load."""
    return bool(request.htmx) and not request.htmx.boosted
