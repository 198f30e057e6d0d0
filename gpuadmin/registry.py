"""What a lower app asks of the apps above it, which it never imports: who holds a GPU, whether
a MIG change may go, the sections of a page. Each question is a ``Hook`` here; the upper apps
register their answers in their ``AppConfig.ready()``, and the lower app calls them where it
needs the answer. Signals only announce what happened (``inventory.signals``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from django.http import HttpRequest

Answer = TypeVar("Answer", bound=Callable[..., Any])


class Hook(Generic[Answer]):
    """One question and the functions that answer it, called in the order they registered."""

    def __init__(self, question: str) -> None:
        self.question = question
        self.answers: tuple[Answer, ...] = ()

    def register(self, answer: Answer) -> None:
        """Add an answer; the same function twice is a wiring mistake (it would answer twice)."""
        if answer in self.answers:
            raise ValueError(
                f"{answer.__module__}.{answer.__qualname__} already answers: {self.question}"
            )
        self.answers += (answer,)


class OccupantKind(StrEnum):
    """What holds a GPU: a gpuadmin job, or a job of a Slurm cluster gpuadmin mirrors."""

    JOB = "job"
    SLURM = "slurm"


@dataclasses.dataclass(frozen=True)
class Occupant:
    """Who holds a GPU, or one MIG device of it (``mig_instance_id``: the ``MigInstance``'s
    primary key): the job, that job's name and its user. ``kind`` says whose job: a gpuadmin
    job (``job_id``: its primary key, ``job_url``: its page), or a Slurm job (``job_id``:
    Slurm's job ID on ``cluster``, ``job_url``: its row on the jobs page); only a gpuadmin
    job is ever requeued, released or named by the API's ``job`` field."""

    job_id: int
    job_url: str
    user: str
    gpu_id: int
    job_name: str = ""
    mig_instance_id: int | None = None
    kind: OccupantKind = OccupantKind.JOB
    cluster: str = ""  # the Slurm cluster's name (kind SLURM)
    # A gpuadmin job whose end is decided: it holds the GPU until its processes are gone.
    stopping: bool = False

    @property
    def gpuadmin_job_id(self) -> int | None:
        """The gpuadmin job's primary key; None for a Slurm job."""
        return self.job_id if self.kind == OccupantKind.JOB else None

    @property
    def label(self) -> str:
        """``job #12``, ``Slurm job 1234 on hpc``."""
        if self.kind == OccupantKind.SLURM:
            return f"Slurm job {self.job_id} on {self.cluster}"
        return f"job #{self.job_id}"

    @property
    def short_label(self) -> str:
        """``#12``, ``Slurm hpc/1234`` (the fleet page's cell)."""
        if self.kind == OccupantKind.SLURM:
            return f"Slurm {self.cluster}/{self.job_id}"
        return f"#{self.job_id}"

    @property
    def ref(self) -> str:
        """``12``, ``slurm:hpc/1234``: the job as an alert's ``job`` label names it."""
        if self.kind == OccupantKind.SLURM:
            return f"slurm:{self.cluster}/{self.job_id}"
        return str(self.job_id)


@dataclasses.dataclass(frozen=True)
class Section:
    """A part of an inventory page that an app contributes (``page_sections``): ``template``
    rendered with ``context``, sections sorted by ``order`` (lower first)."""

    template: str
    context: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    order: int = 100


@dataclasses.dataclass(frozen=True)
class GpuUse:
    """GPUs that work gpuadmin knows of but did not allocate holds (a job on an external Ray
    cluster): ``gpus`` whole-GPU equivalents in the pool named ``pool`` for ``owner_id`` (and
    ``project``, when it has one) from ``start`` to ``end`` (None: held now). Scheduling
    counts it against quotas and in fair share as it counts its own allocations."""

    pool: str | None
    owner_id: int
    project: str
    gpus: float
    start: datetime
    end: datetime | None = None


# The hooks. A ``Gpu`` or ``Node`` argument is typed ``Any``: the project package imports no app.

# Called with a collection of GPU primary keys by ``inventory.occupancy.Occupancy`` (the fleet
# pages, the ``free`` filter, the MIG layouts, the alert rules); returns the ``Occupant``s of
# the GPUs held by work the app knows of, each naming its GPU and, for a MIG device, its MIG
# instance, in one query for all of them (scheduling: each active allocation's job;
# integrations.slurm: each Slurm job holding catalogued GPUs). The first answer naming a GPU
# wins.
gpu_occupants: Hook[Callable[[Collection[int]], Iterable[Occupant]]] = Hook("who holds these GPUs")

# Called by ``inventory.services`` before a MIG change is sent to the GPU's node, once
# inventory's own checks passed, with the ``Gpu`` as stored now and the system actor asking
# (None for a person). Returns the sentence that refuses the change (scheduling: "it is
# allocated to job 12", "a MIG re-layout owns it") or None; the first refusal wins and nothing
# is sent. An answer that raises fails the change.
mig_change_vetoes: Hook[Callable[[Any, str | None], str | None]] = Hook("may this MIG change go")

# Called by ``scheduling.policies.quotas`` (what quotas and fair share count) with ``since``
# and ``now``; returns the ``GpuUse`` of work held at some time in [since, now], in one query.
gpu_use: Hook[Callable[[datetime, datetime], Iterable[GpuUse]]] = Hook(
    "what GPUs outside gpuadmin's allocations are held"
)

# Called by the inventory pages with the page ("gpu", "node" or "fleet"), its object (the
# ``Gpu``, the ``Node``, or None for the fleet) and the request, and by scheduling's jobs page
# ("jobs", None); returns a ``Section``, several in a list (a None among them is skipped), or
# None. The page renders them by ``order``.
# Kept cheap: the fleet page's live partial has a budget of 100 ms at 500 nodes.
page_sections: Hook[
    Callable[[str, Any, HttpRequest], Section | Iterable[Section | None] | None]
] = Hook("what does this page show")
