"""The parts of the inventory pages that the apps above inventory contribute (charts, health
events, alerts, the allocation history): asked for through
``inventory.signals.page_sections_requested`` and rendered in their ``order``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.http import HttpRequest

from inventory.models import Gpu, Node
from inventory.pages.common import Section
from inventory.signals import page_sections_requested


def requested_sections(page: str, obj: Gpu | Node | None, request: HttpRequest) -> list[Section]:
    """What the receivers return for ``page`` ("gpu", "node" or "fleet") about ``obj`` (the
    Gpu, the Node, or ``None`` for the fleet), lowest ``order`` first. A receiver answers a
    ``Section``, several in a list, or ``None``."""
    sender = Gpu if page == "gpu" else Node
    found: list[Section] = []
    for _receiver, answer in page_sections_requested.send(
        sender=sender, page=page, obj=obj, request=request
    ):
        found.extend(_sections(answer))
    return sorted(found, key=lambda section: section.order)


def _sections(answer: Any) -> Iterable[Section]:
    if answer is None:
        return ()
    if isinstance(answer, Section):
        return (answer,)
    return [section for section in answer if section is not None]
