"""The URLconf's routes, walked: for the tests that hold every route to a table (who may
request it, where it is documented)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver

# Routes that are one entry above: the Django admin (its own rule: staff only) and DRF's
# format-suffix twins of API routes (the same view).
ADMIN_PREFIX = "admin/"
FORMAT_SUFFIX = re.compile(r"\(\?P<format>|<drf_format_suffix:format>")


def walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern


def routes() -> dict[str, URLPattern]:
    """Every route of the URLconf but the admin's and format-suffix twins."""
    return {
        route: pattern
        for route, pattern in walk(get_resolver().url_patterns)
        if not route.startswith(ADMIN_PREFIX) and not FORMAT_SUFFIX.search(route)
    }
