"""The database side of preemption: carry out the engine's ``Preemption`` decisions.

The engine (``scheduling.placement``) picks the victims; here each victim still holding its
GPUs is marked (``preempted_by``, ``preempt_requested_at``, a message on both jobs, audited
``job.preempt_requested``) and its agents send it the pool's signal with its grace for a
checkpoint, then SIGKILL. The victim keeps its GPUs until the agents of its reachable nodes
report its processes gone (a gang's: every part, ``transitions.stop_parts``);
``reports.job_events`` then re-queues it (``job.preempted``; the attempt does not count
against its retries). A victim none of whose nodes can be reached is re-queued at once, and a
job already stopping (``Job.ending``) is no victim.
"""

from __future__ import annotations

import signal as signals
from functools import partial

from django.db import transaction
from django.utils import timezone

from gpuadmin.audit.services import audit_event, record_all
from scheduling import placement
from scheduling.jobs import reports, transitions
from scheduling.loop import dispatch
from scheduling.models import HOLDING_STATES, Job, JobState


def _ids(ids: list[int]) -> str:
    """``5``, ``5 and 7``, ``5, 7 and 9``."""
    words = [str(pk) for pk in ids]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def preempt(
    decision: placement.Preemption,
    *,
    signal: str,
    grace_s: int,
    actor_name: str = transitions.LOOP_ACTOR,
) -> list[int]:
    """Start preempting the decision's victims for its job: the ids of those marked now.
    A victim that already ended, or is already being preempted or canceled, is left alone.
    ``signal`` names the first signal (``SIGTERM``, ``SIGUSR1`` ...; ``ValueError`` for
    another name)."""
    if signal not in signals.Signals.__members__:
        raise ValueError(f"{signal!r} is not a signal name")
    now = timezone.now()
    with transaction.atomic():
        locked = {
            job.pk: job
            for job in Job.objects.select_for_update()
            .filter(pk__in=[decision.job_id, *decision.victims])
            .order_by("pk")
        }
        victims = [
            locked[pk]
            for pk in sorted(decision.victims)
            if pk in locked
            and locked[pk].state in HOLDING_STATES
            and locked[pk].preempted_by_id is None
            and locked[pk].cancel_requested_at is None
            and locked[pk].ending is None
        ]
        preemptor = locked.get(decision.job_id)
        if not victims or preemptor is None or preemptor.state != JobState.QUEUED:
            return []
        said = f"preempted by job {preemptor.pk}: {decision.reason}"
        for victim in victims:
            victim.preempted_by_id = preemptor.pk
            victim.preempt_requested_at = now
            victim.message = said
        Job.objects.bulk_update(victims, ["preempted_by", "preempt_requested_at", "message"])
        ids = [victim.pk for victim in victims]
        preemptor.message = f"preempting job{'s' if len(ids) > 1 else ''} {_ids(ids)}"
        preemptor.save(update_fields=["message"])
        record_all(
            [
                audit_event(
                    "job.preempt_requested",
                    actor_name=actor_name,
                    target=victim,
                    before={"state": victim.state},
                    after={"preempted_by": preemptor.pk, "signal": signal, "grace_s": grace_s},
                    message=said,
                )
                for victim in victims
            ]
        )
        for victim in victims:
            # It keeps its GPUs until its reachable nodes' agents report its parts gone.
            hostnames = transitions.reachable_parts(victim)
            if hostnames:
                transaction.on_commit(
                    partial(
                        dispatch.send_cancel,
                        victim,
                        hostnames,
                        said,
                        signal=signal,
                        grace_s=grace_s,
                    )
                )
            else:  # nothing can be signalled: its GPUs are free now
                reports.job_finished(victim.pk, victim.attempt, "lost", None, said, now)
    return ids
