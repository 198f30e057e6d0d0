"""Who holds a GPU: inventory knows nothing of jobs, so it asks the apps above it through
``inventory.signals.gpu_occupants_requested`` (scheduling answers with its allocations)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import cast

from inventory.models import Gpu
from inventory.signals import gpu_occupants_requested


@dataclasses.dataclass(frozen=True)
class Occupant:
    """Who holds a GPU: the job it is allocated to and that job's user."""

    job_id: int
    job_url: str
    user: str


class Occupancy:
    """The occupants of a page's GPUs, asked for on first use, once for all of them (pages
    that never name occupants, like the seed API, pay nothing)."""

    def __init__(self, gpu_ids: Collection[int]) -> None:
        self._gpu_ids = gpu_ids
        self._found: dict[int, Occupant] | None = None

    def get(self, gpu_id: int) -> Occupant | None:
        if self._found is None:
            self._found = {}
            for _receiver, occupants in gpu_occupants_requested.send(
                sender=Gpu, gpu_ids=self._gpu_ids
            ):
                self._found.update(cast("Mapping[int, Occupant]", occupants))
        return self._found.get(gpu_id)
