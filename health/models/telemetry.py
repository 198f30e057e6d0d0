"""Telemetry history: raw samples for a short window and 1-minute rollups for the long one.

Both are range-partitioned PostgreSQL tables (raw by hour, rollups by day) created by the
migration's SQL, so pruning drops whole partitions instead of deleting rows; the models are
unmanaged and only read through the ORM. Writes are batched by ``health.telemetry``
(``COPY`` for raw samples, one ``INSERT ... SELECT`` per minute for rollups).
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models


class GpuSample(models.Model):
    """One GPU's sample as its agent took it (``inventory.live.sample``)."""

    pk = models.CompositePrimaryKey("gpu_id", "at")
    gpu_id = models.IntegerField()
    at = models.DateTimeField()
    utilization_gpu_pct = models.SmallIntegerField(null=True)  # None: MIG mode, not measurable
    utilization_memory_pct = models.SmallIntegerField(null=True)
    memory_used_mib = models.IntegerField(null=True)
    temperature_c = models.SmallIntegerField(null=True)
    memory_temperature_c = models.SmallIntegerField(null=True)
    power_w = models.FloatField(null=True)
    energy_mj = models.BigIntegerField(null=True)
    sm_clock_mhz = models.IntegerField(null=True)
    mem_clock_mhz = models.IntegerField(null=True)
    fan_pct = models.SmallIntegerField(null=True)
    pcie_tx_kbps = models.IntegerField(null=True)
    pcie_rx_kbps = models.IntegerField(null=True)
    clock_event_reasons = ArrayField(models.CharField(max_length=32), default=list)
    ecc_corrected = models.BigIntegerField(null=True)  # volatile counts
    ecc_uncorrected = models.BigIntegerField(null=True)
    processes = models.SmallIntegerField(default=0)
    mig = models.JSONField(null=True)  # per MIG device: gi/ci ids, profile, memory used

    class Meta:
        managed = False
        db_table = "health_gpusample"

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} at {self.at}"


class GpuRollup(models.Model):
    """One GPU's minute: min/avg/max of what the charts show, from its raw samples."""

    pk = models.CompositePrimaryKey("gpu_id", "minute")
    gpu_id = models.IntegerField()
    minute = models.DateTimeField()
    samples = models.SmallIntegerField()
    utilization_min = models.SmallIntegerField(null=True)
    utilization_avg = models.FloatField(null=True)
    utilization_max = models.SmallIntegerField(null=True)
    memory_used_min = models.IntegerField(null=True)
    memory_used_avg = models.FloatField(null=True)
    memory_used_max = models.IntegerField(null=True)
    temperature_min = models.SmallIntegerField(null=True)
    temperature_avg = models.FloatField(null=True)
    temperature_max = models.SmallIntegerField(null=True)
    power_min = models.FloatField(null=True)
    power_avg = models.FloatField(null=True)
    power_max = models.FloatField(null=True)
    energy_mj = models.BigIntegerField(null=True)  # consumed in the minute (counter delta)

    class Meta:
        managed = False
        db_table = "health_gpurollup"

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} minute {self.minute}"


class FleetRollup(models.Model):
    """The whole fleet's minute (the dashboard's utilization chart reads one row a minute)."""

    minute = models.DateTimeField(primary_key=True)
    gpus = models.IntegerField()
    utilization_avg = models.FloatField(null=True)
    memory_used_mib = models.BigIntegerField(null=True)
    power_w = models.FloatField(null=True)

    class Meta:
        managed = False
        db_table = "health_fleetrollup"

    def __str__(self) -> str:
        return f"fleet minute {self.minute}"
