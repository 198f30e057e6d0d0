"""Leases (``gpuadmin.leases.services``) and the periods beat has sent its tasks for."""

from __future__ import annotations

from django.db import models


class Lease(models.Model):
    """Who holds a named role (the placement loop, beat, a MIG re-layout) until when. The
    ``token`` grows by one at every taking: a holder that lost its lease cannot write with
    its old token (``services.fenced``)."""

    name = models.CharField(max_length=100, primary_key=True)
    holder = models.CharField(max_length=200)
    token = models.BigIntegerField(default=1)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} (held by {self.holder}, token {self.token})"


class BeatPeriod(models.Model):
    """The last period a beat task was sent for (``gpuadmin.leases.beat``): a beat that takes
    over never sends a task again for a period its predecessor sent it for."""

    task = models.CharField(max_length=200, primary_key=True)
    period_start = models.DateTimeField()
    sent_by = models.CharField(max_length=200)

    def __str__(self) -> str:
        return f"{self.task} sent for {self.period_start:%Y-%m-%d %H:%M:%S}"
