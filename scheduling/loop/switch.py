"""The placement loop's switch: start or stop placing jobs (audited)."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import transaction

from gpuadmin.audit.services import record
from scheduling.loop import dispatch
from scheduling.models import (
    SchedulerSettings,
)


def _locked_settings() -> SchedulerSettings:
    SchedulerSettings.load()  # the row exists from now on
    return SchedulerSettings.objects.select_for_update().get(pk=1)


def set_scheduler_enabled(enabled: bool, *, actor: User) -> SchedulerSettings:
    """Start or stop placing jobs (audited ``scheduler.started``/``scheduler.stopped``; a
    no-op when it already is). Either wakes the loop: a pass of a started scheduler places
    jobs, one of a stopped scheduler tells every waiting job so
    (``scheduling.loop.passes.explain_stopped``)."""
    with transaction.atomic():
        config = _locked_settings()
        if config.enabled != enabled:
            config.enabled = enabled
            config.save(update_fields=["enabled", "updated_at"])
            record(
                "scheduler.started" if enabled else "scheduler.stopped",
                actor=actor,
                target=config,
                before={"enabled": not enabled},
                after={"enabled": enabled},
            )
            transaction.on_commit(dispatch.wake)
    return config
