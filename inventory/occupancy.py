"""Who holds a GPU: inventory knows nothing of jobs, so it asks the apps above it through
``gpuadmin.registry.gpu_occupants`` (scheduling answers with its allocations, the Slurm mirror
with the Slurm jobs holding catalogued GPUs)."""

from __future__ import annotations

from collections.abc import Collection

from gpuadmin import registry
from gpuadmin.registry import Occupant


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
            for find_occupants in registry.gpu_occupants.answers:
                for occupant in find_occupants(self._gpu_ids):
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
