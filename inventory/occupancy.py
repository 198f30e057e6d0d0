"""Who holds a GPU: inventory knows nothing of jobs, so it asks the apps above it through
``inventory.signals.gpu_occupants_requested`` (scheduling answers with its allocations)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import cast

from inventory.models import Gpu
from inventory.signals import gpu_occupants_requested


@dataclasses.dataclass(frozen=True)
class Occupant:
    """Who holds a GPU, or one MIG device of it (``mig_instance_id``: the ``MigInstance``'s
    primary key): the job it is allocated to, that job's name and its user."""

    job_id: int
    job_url: str
    user: str
    gpu_id: int
    job_name: str = ""
    mig_instance_id: int | None = None


class Occupancy:
    """The occupants of a page's GPUs, asked for on first use, once for all of them (pages
    that never name occupants, like the seed API, pay nothing)."""

    def __init__(self, gpu_ids: Collection[int]) -> None:
        self._gpu_ids = gpu_ids
        self._found: dict[int, Occupant] | None = None
        self._by_mig_instance: dict[int, Occupant] = {}

    def _read(self) -> dict[int, Occupant]:
        if self._found is None:
            self._found = {}
            for _receiver, occupants in gpu_occupants_requested.send(
                sender=Gpu, gpu_ids=self._gpu_ids
            ):
                for occupant in cast("Iterable[Occupant]", occupants):
                    self._found.setdefault(occupant.gpu_id, occupant)
                    if occupant.mig_instance_id is not None:
                        self._by_mig_instance[occupant.mig_instance_id] = occupant
        return self._found

    def get(self, gpu_id: int) -> Occupant | None:
        """Who holds the GPU, or one of its MIG devices or MPS shares (None: nobody)."""
        return self._read().get(gpu_id)

    def of_mig_instance(self, instance_id: int) -> Occupant | None:
        """Who holds the MIG device (a ``MigInstance``'s primary key; None: nobody)."""
        self._read()
        return self._by_mig_instance.get(instance_id)
