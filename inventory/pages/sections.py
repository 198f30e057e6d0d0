"""The parts of the inventory pages that the apps contribute (charts, health events, alerts,
the allocation history): asked of ``gpuadmin.registry.page_sections`` and rendered in their
``order``."""

from __future__ import annotations

from collections.abc import Iterable

from django.http import HttpRequest

from gpuadmin import registry
from gpuadmin.registry import Section
from inventory.models import Gpu, Node


def requested_sections(page: str, obj: Gpu | Node | None, request: HttpRequest) -> list[Section]:
    """What the registered answers return for ``page`` ("gpu", "node" or "fleet") about
    ``obj`` (the Gpu, the Node, or ``None`` for the fleet), lowest ``order`` first. An answer
    is a ``Section``, several in a list, or ``None``."""
    found: list[Section] = []
    for sections_of in registry.page_sections.answers:
        found.extend(_sections(sections_of(page, obj, request)))
    return sorted(found, key=lambda section: section.order)


def _sections(answer: Section | Iterable[Section | None] | None) -> Iterable[Section]:
    if answer is None:
        return ()
    if isinstance(answer, Section):
        return (answer,)
    return [section for section in answer if section is not None]
