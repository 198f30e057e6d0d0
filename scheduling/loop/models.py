"""The placement loop's switch (one row)."""

from __future__ import annotations

from django.db import models


class SchedulerSettings(models.Model):
    """The placement loop's switch (one row; changes are audited). Queue policies are per
    pool: ``PoolPolicy``."""

    enabled = models.BooleanField(default=True, help_text="Off: nothing new is placed.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "scheduler settings"

    def __str__(self) -> str:
        return f"scheduler ({'on' if self.enabled else 'off'})"

    @classmethod
    def load(cls) -> SchedulerSettings:
        return cls.objects.get_or_create(pk=1)[0]
