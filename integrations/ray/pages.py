"""What the Ray pages show, apart from HTTP: the jobs a person sees with their colours, a job's
page (state, Ray's message, times, who may cancel it, what is private) and its log's last lines
as Ray gives them. The pages read what the poll stored; only the log asks the cluster."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.contrib.auth.models import User

from gpuadmin.access.services import can_act_on, can_read_private, private_to
from integrations.ray import services
from integrations.ray.jobs_api import RayError
from integrations.ray.models import RayJob, RayJobState
from scheduling.jobs.pages import LOG_LINES, STATE_COLOURS

JOBS_SHOWN = 50  # the newest; the API lists them all


def jobs_context(user: User) -> dict[str, Any]:
    """The newest Ray jobs ``user`` sees, each with its state's colour and whether ``user``
    reads its entrypoint, and how many there are (``ray/partials/ray_jobs.html``'s context)."""
    jobs = services.visible_jobs(user)
    shown = list(jobs[:JOBS_SHOWN])
    return {
        "ray_jobs": [
            (job, STATE_COLOURS.get(job.state, "grey"), can_read_private(user, job))
            for job in shown
        ],
        "ray_jobs_total": jobs.count() if len(shown) == JOBS_SHOWN else len(shown),
    }


@dataclasses.dataclass(frozen=True)
class RayJobPage:
    job: RayJob
    can_cancel: bool
    private_to: str  # empty: the viewer reads its entrypoint, environment and log

    @property
    def state_colour(self) -> str:
        return STATE_COLOURS.get(self.job.state, "grey")

    @property
    def waiting(self) -> bool:
        """Waiting for gpuadmin to send it, or for Ray to start it (``message`` says why)."""
        return self.job.state in (RayJobState.PENDING, RayJobState.QUEUED)


def job_page(job: RayJob, user: User) -> RayJobPage:
    return RayJobPage(
        job=job,
        can_cancel=job.active and can_act_on(user, job),
        private_to="" if can_read_private(user, job) else private_to(),
    )


@dataclasses.dataclass(frozen=True)
class RayLogTail:
    job: RayJob
    text: str = ""
    note: str = ""  # why there is no text

    @property
    def live(self) -> bool:
        return self.job.active


def log_tail(job: RayJob) -> RayLogTail:
    """The last ``LOG_LINES`` lines of the job's output as Ray keeps it; why not, when the
    cluster does not give it (a state on the page, not an error)."""
    if job.state == RayJobState.PENDING:
        return RayLogTail(job, note="No log: Ray has not received the job yet.")
    try:
        text = services.logs(job)
    except RayError as exc:
        return RayLogTail(job, note=f"The log cannot be read now: {exc}.")
    if not text:
        return RayLogTail(job, note="No output yet.")
    return RayLogTail(job, text="".join(text.splitlines(keepends=True)[-LOG_LINES:]))
