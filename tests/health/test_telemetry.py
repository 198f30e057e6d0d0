"""Telemetry history on the real Redis and PostgreSQL: the samples stream into raw rows, the
partitions and their retention, minute rollups."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from django.db import DatabaseError, connection

from health import telemetry
from health.models import FleetRollup, GpuRollup, GpuSample
from inventory.models import Gpu
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from inventory.services import apply_discovery

pytestmark = pytest.mark.django_db


@pytest.fixture
def stream(settings) -> Iterator[str]:
    """A stream of this test's own (sessions share Redis); the process caches start empty."""
    settings.GPUADMIN_SAMPLE_STREAM = f"test-samples-{uuid.uuid4().hex[:8]}"
    telemetry._gpu_ids.clear()
    telemetry._partitions_hour = None
    yield settings.GPUADMIN_SAMPLE_STREAM
    telemetry._gpu_ids.clear()
    telemetry._partitions_hour = None
    telemetry.client().delete(settings.GPUADMIN_SAMPLE_STREAM, telemetry.stats_key())


@pytest.fixture
def gpus() -> list[Gpu]:
    host = f"tele-{uuid.uuid4().hex[:6]}"
    apply_discovery(host, scan(SimulatedNvml.from_model("dgx-h100", node_name=host)))
    return list(Gpu.objects.on_node(host).order_by("index"))


def full_sample(index: int, **changes: Any) -> dict[str, Any]:
    """A sample as ``inventory.live.sample`` writes it, every field reported."""
    return {
        "index": index,
        "memory_total_mib": 81559,
        "memory_used_mib": 40_000 + index,
        "error_message": None,
        "sampled_at": 0.0,
        "utilization_gpu_pct": 97,
        "utilization_memory_pct": 41,
        "temperature_c": 66,
        "memory_temperature_c": 71,
        "power_w": 612.25,
        "energy_mj": 123_456_789_012,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "pstate": 0,
        "fan_pct": None,
        "pcie_tx_kbps": 51_000,
        "pcie_rx_kbps": 7_000,
        "throttle_reasons": ["sw_power_cap", "sw_thermal_slowdown"],
        "processes": 2,
        "pids": [[4242, 30_000], [4343, 10_000]],
        "ecc_corrected": 3,
        "ecc_uncorrected": 0,
        "ecc_corrected_total": 10,
        "ecc_uncorrected_total": 0,
        "nvlink_errors": 0,
        "mig": [],  # not in MIG mode
        **changes,
    }


def add(stream: str, at: float, samples: dict[str, dict[str, Any]], node: str = "n") -> None:
    telemetry.client().xadd(stream, {"node": node, "at": at, "gpus": json.dumps(samples)})


def pending(stream: str) -> int:
    return cast("dict[str, int]", telemetry.client().xpending(stream, telemetry.GROUP))["pending"]


def test_stream_entries_become_rows_with_their_values(stream, gpus):
    at = time.time()
    mig = [{"gi_id": 1, "ci_id": 0, "uuid": "MIG-x", "profile": "3g.40gb", "memory_used_mib": 5}]
    add(
        stream,
        at,
        {
            gpus[0].uuid: full_sample(0),
            gpus[1].uuid: full_sample(1, utilization_gpu_pct=None, mig=mig, temperature_c=40.6),
        },
    )
    add(stream, at + 2, {gpus[0].uuid: full_sample(0, utilization_gpu_pct=12)})

    assert telemetry.ingest(batch=1) == 3  # batch after batch until caught up

    first = GpuSample.objects.get(gpu_id=gpus[0].pk, at=datetime.fromtimestamp(at, UTC))
    assert (first.utilization_gpu_pct, first.utilization_memory_pct) == (97, 41)
    assert (first.memory_used_mib, first.temperature_c, first.memory_temperature_c) == (
        40_000,
        66,
        71,
    )
    assert (first.power_w, first.energy_mj) == (612.25, 123_456_789_012)
    assert (first.sm_clock_mhz, first.mem_clock_mhz, first.fan_pct) == (1980, 2619, None)
    assert (first.pcie_tx_kbps, first.pcie_rx_kbps) == (51_000, 7_000)
    assert first.clock_event_reasons == ["sw_power_cap", "sw_thermal_slowdown"]
    assert (first.ecc_corrected, first.ecc_uncorrected, first.processes, first.mig) == (
        3,
        0,
        2,
        None,
    )
    mig_gpu = GpuSample.objects.get(gpu_id=gpus[1].pk)
    assert mig_gpu.utilization_gpu_pct is None  # not measurable, never 0
    assert mig_gpu.mig == mig
    assert mig_gpu.temperature_c == 41
    later = GpuSample.objects.get(gpu_id=gpus[0].pk, at=datetime.fromtimestamp(at + 2, UTC))
    assert later.utilization_gpu_pct == 12
    assert pending(stream) == 0
    assert telemetry.stats() == {"ingested": 3}
    assert telemetry.ingest() == 0  # nothing new


def test_unknown_gpus_and_malformed_entries_are_skipped_counted_and_acked(stream, gpus):
    at = time.time()
    add(stream, at, {gpus[0].uuid: full_sample(0), "GPU-not-in-the-catalog": full_sample(1)})
    telemetry.client().xadd(stream, {"node": "n", "at": at, "gpus": "{not json"})
    add(stream, at, {gpus[2].uuid: full_sample(2, temperature_c="hot")})

    assert telemetry.ingest() == 1

    assert list(GpuSample.objects.values_list("gpu_id", flat=True)) == [gpus[0].pk]
    assert telemetry.stats() == {"ingested": 1, "unknown": 1, "malformed": 2}
    assert pending(stream) == 0


def test_a_gpu_registered_after_its_first_sample_is_found_on_a_miss(stream, gpus):
    add(stream, time.time(), {gpus[0].uuid: full_sample(0)})
    assert telemetry.ingest() == 1
    host = f"tele-{uuid.uuid4().hex[:6]}"
    apply_discovery(host, scan(SimulatedNvml.from_model("rtx-4080-super", node_name=host)))
    newcomer = Gpu.objects.on_node(host).get()
    add(stream, time.time(), {newcomer.uuid: full_sample(0), gpus[0].uuid: full_sample(0)})
    assert telemetry.ingest() == 2
    assert GpuSample.objects.filter(gpu_id=newcomer.pk).count() == 1


def test_duplicates_within_and_across_batches_do_not_break_a_batch(stream, gpus):
    at = time.time()
    samples = {gpus[0].uuid: full_sample(0), gpus[1].uuid: full_sample(1)}
    add(stream, at, samples)
    add(stream, at, samples)  # the same samples again, in the same batch
    assert telemetry.ingest() == 2
    add(stream, at, samples)  # and in a later one, with a new sample beside them
    add(stream, at + 2, {gpus[0].uuid: full_sample(0)})
    assert telemetry.ingest() == 1
    assert GpuSample.objects.count() == 3
    assert pending(stream) == 0


def test_a_failed_batch_is_not_acked_and_is_claimed_again(stream, gpus):
    add(stream, time.time(), {gpus[0].uuid: full_sample(0)})
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER test_refuse BEFORE INSERT ON health_gpusample "
            "FOR EACH ROW EXECUTE FUNCTION test_refuse()"
        )
    with pytest.raises(DatabaseError, match="refused by the test"):
        telemetry.ingest()
    assert pending(stream) == 1
    assert not GpuSample.objects.exists()
    assert telemetry.ingest() == 0  # still pending, not yet idle long enough to claim

    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER test_refuse ON health_gpusample")
    assert telemetry.ingest(claim_idle_ms=0) == 1
    assert pending(stream) == 0
    assert GpuSample.objects.filter(gpu_id=gpus[0].pk).count() == 1


def test_a_dead_consumers_pending_entries_are_claimed(stream, gpus):
    add(stream, time.time(), {gpus[0].uuid: full_sample(0)})
    redis = telemetry.client()
    telemetry._ensure_group(redis, stream)
    redis.xreadgroup(telemetry.GROUP, "a-worker-that-died", {stream: ">"})
    assert pending(stream) == 1
    assert telemetry.ingest(claim_idle_ms=0) == 1
    assert pending(stream) == 0


def test_pending_entries_trimmed_from_the_stream_are_counted_and_forgotten(stream, gpus):
    add(stream, time.time(), {gpus[0].uuid: full_sample(0)})
    redis = telemetry.client()
    telemetry._ensure_group(redis, stream)
    redis.xreadgroup(telemetry.GROUP, "a-worker-that-died", {stream: ">"})
    redis.xtrim(stream, maxlen=0)  # the stream's cap, while the ingest was away
    assert telemetry.ingest(claim_idle_ms=0) == 0
    assert pending(stream) == 0
    # Redis 7 drops it from the pending list itself, unseen; Redis 6.2 hands it over.
    redis_major = int(str(redis.info("server")["redis_version"]).split(".")[0])
    assert telemetry.stats() == ({} if redis_major >= 7 else {"trimmed": 1})


def test_idle_consumers_with_nothing_pending_are_forgotten(stream, gpus, monkeypatch):
    add(stream, time.time(), {gpus[0].uuid: full_sample(0)})
    telemetry.ingest()
    monkeypatch.setattr(telemetry, "CONSUMER_FORGET_MS", 60_000)
    assert telemetry.forget_idle_consumers() == 0  # just used
    monkeypatch.setattr(telemetry, "CONSUMER_FORGET_MS", -1)
    assert telemetry.forget_idle_consumers() == 1
    assert telemetry.client().xinfo_consumers(stream, telemetry.GROUP) == []


# --- partitions and retention


def partitions(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %s::regclass",
            [table],
        )
        return {name for (name,) in cursor.fetchall()}


def where(table: str) -> list[tuple[str, int]]:
    """Each row's partition and GPU."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text, gpu_id FROM {table} ORDER BY 1, 2")
        return cursor.fetchall()


NOW = datetime(2031, 3, 4, 5, 30, tzinfo=UTC)


def test_partitions_are_created_ahead_idempotently_and_dropped_by_retention(settings):
    settings.GPUADMIN_RAW_RETENTION_H = 6
    settings.GPUADMIN_ROLLUP_RETENTION_D = 30
    created = telemetry.ensure_partitions(NOW)
    raw = {f"health_gpusample_p20310304{hour:02}" for hour in range(4, 9)}
    rollup = {f"health_gpurollup_p2031030{day}" for day in range(4, 7)}
    assert set(created) == raw | rollup
    assert telemetry.ensure_partitions(NOW) == []
    assert partitions("health_gpusample") >= raw | {"health_gpusample_default"}
    assert partitions("health_gpurollup") >= rollup | {"health_gpurollup_default"}

    # At 14:30, 6 h back is 08:30: every raw partition has ended before it but 08:00's.
    later = NOW + timedelta(hours=9)
    dropped = telemetry.prune(later)
    assert set(dropped) == raw - {"health_gpusample_p2031030408"}
    assert "health_gpusample_p2031030408" in partitions("health_gpusample")
    assert partitions("health_gpurollup") >= rollup

    month_later = NOW + timedelta(days=34)
    assert set(telemetry.prune(month_later)) >= rollup | {"health_gpusample_p2031030408"}
    assert not partitions("health_gpurollup") & rollup


def test_rows_in_the_default_partition_move_into_a_new_partition():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO health_gpusample (gpu_id, at) VALUES "
            "(1, '2031-03-04 05:10+00'), (2, '2031-03-04 07:59:59+00'), "
            "(3, '2031-03-04 09:00+00'), (4, '2031-03-04 01:00+00')"
        )
        cursor.execute(
            "INSERT INTO health_gpurollup (gpu_id, minute, samples) "
            "VALUES (1, '2031-03-05 10:00+00', 30)"
        )
    assert {name for name, _ in where("health_gpusample")} == {"health_gpusample_default"}

    telemetry.ensure_partitions(NOW)

    assert where("health_gpusample") == [
        ("health_gpusample_default", 3),  # 09:00: beyond the partitions made ahead
        ("health_gpusample_default", 4),  # 01:00: older than the hour before now
        ("health_gpusample_p2031030405", 1),
        ("health_gpusample_p2031030407", 2),
    ]
    assert where("health_gpurollup") == [("health_gpurollup_p20310305", 1)]
    # The moved rows keep their primary key: a duplicate still conflicts.
    with pytest.raises(DatabaseError), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO health_gpusample (gpu_id, at) VALUES (1, '2031-03-04 05:10+00')"
        )


def test_prune_deletes_expired_rows_from_the_default_partitions_and_the_fleet_rollup(settings):
    settings.GPUADMIN_RAW_RETENTION_H = 2
    settings.GPUADMIN_ROLLUP_RETENTION_D = 1
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO health_gpusample (gpu_id, at) VALUES "
            "(1, '2031-03-04 03:29+00'), (2, '2031-03-04 03:31+00')"
        )
        cursor.execute(
            "INSERT INTO health_gpurollup (gpu_id, minute, samples) VALUES "
            "(1, '2031-03-03 05:29+00', 1), (2, '2031-03-03 05:31+00', 1)"
        )
        cursor.execute(
            "INSERT INTO health_fleetrollup (minute, gpus) VALUES "
            "('2031-03-03 05:29+00', 1), ('2031-03-03 05:31+00', 1)"
        )
    telemetry.prune(NOW)
    assert [gpu for _, gpu in where("health_gpusample")] == [2]
    assert [gpu for _, gpu in where("health_gpurollup")] == [2]
    assert list(FleetRollup.objects.values_list("minute", flat=True)) == [
        datetime(2031, 3, 3, 5, 31, tzinfo=UTC)
    ]


# --- rollups


def insert_samples(rows: list[tuple[int, str, int | None, int, int, float, int | None]]) -> None:
    """(gpu, at, utilization, memory used, temperature, power, energy)"""
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO health_gpusample (gpu_id, at, utilization_gpu_pct, memory_used_mib, "
            "temperature_c, power_w, energy_mj) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            rows,
        )


def test_rollups_hold_each_minutes_min_avg_max_and_energy(settings):
    settings.GPUADMIN_SAMPLE_INTERVAL_S = 2
    settings.GPUADMIN_INGEST_INTERVAL_S = 2
    telemetry.ensure_partitions(NOW)
    insert_samples(
        [
            # GPU 1: one sample at the end of 05:26 (the energy counter before 05:27) ...
            (1, "2031-03-04 05:26:59+00", 50, 100, 40, 100.0, 1_000),
            # ... and three in 05:27, the counter reset by a driver reload before the last.
            (1, "2031-03-04 05:27:01+00", 10, 1_000, 50, 200.0, 1_400),
            (1, "2031-03-04 05:27:30+00", 20, 3_000, 60, 300.5, 2_000),
            (1, "2031-03-04 05:27:59+00", 60, 2_000, 55, 251.0, 30),
            # GPU 2 (MIG: no utilization) in 05:27, and in 05:29.
            (2, "2031-03-04 05:27:10+00", None, 500, 30, 80.0, None),
            (2, "2031-03-04 05:29:10+00", None, 700, 31, 90.0, None),
        ]
    )
    # 05:28 is empty; 05:29 is not finished at 05:30:05 (its samples may still be coming).
    assert telemetry.rollup(NOW + timedelta(seconds=5)) > 0

    gpu1 = GpuRollup.objects.get(gpu_id=1, minute=datetime(2031, 3, 4, 5, 27, tzinfo=UTC))
    assert gpu1.samples == 3
    assert (gpu1.utilization_min, gpu1.utilization_avg, gpu1.utilization_max) == (10, 30.0, 60)
    assert (gpu1.memory_used_min, gpu1.memory_used_avg, gpu1.memory_used_max) == (
        1_000,
        2_000.0,
        3_000,
    )
    assert (gpu1.temperature_min, gpu1.temperature_avg, gpu1.temperature_max) == (50, 55.0, 60)
    assert (gpu1.power_min, gpu1.power_avg, gpu1.power_max) == (200.0, 250.5, 300.5)
    assert gpu1.energy_mj == 400 + 600  # the reset's negative delta is left out
    gpu2 = GpuRollup.objects.get(gpu_id=2, minute=datetime(2031, 3, 4, 5, 27, tzinfo=UTC))
    assert (gpu2.samples, gpu2.utilization_avg, gpu2.memory_used_avg) == (1, None, 500.0)
    assert gpu2.energy_mj is None
    assert not GpuRollup.objects.filter(minute__gte=datetime(2031, 3, 4, 5, 28, tzinfo=UTC))

    fleet = {
        row.minute.strftime("%H:%M"): (
            row.gpus,
            row.utilization_avg,
            row.memory_used_mib,
            row.power_w,
        )
        for row in FleetRollup.objects.filter(minute__gte=datetime(2031, 3, 4, 5, 26, tzinfo=UTC))
    }
    assert fleet == {
        "05:26": (1, 50.0, 100, 100.0),
        "05:27": (2, 30.0, 2_500, 250.5 + 80.0),
        "05:28": (0, None, None, None),
    }

    # The next run takes only the minutes finished since.
    assert telemetry.rollup(NOW + timedelta(seconds=5)) == 0
    assert telemetry.rollup(NOW + timedelta(seconds=65)) == 1
    assert FleetRollup.objects.get(minute=datetime(2031, 3, 4, 5, 29, tzinfo=UTC)).gpus == 1
    assert (
        GpuRollup.objects.get(gpu_id=2, minute=datetime(2031, 3, 4, 5, 29, tzinfo=UTC)).samples == 1
    )


def test_the_first_rollup_reaches_back_to_the_raw_retention_only(settings):
    settings.GPUADMIN_RAW_RETENTION_H = 1
    insert_samples(
        [
            (1, "2031-03-04 04:29:00+00", 5, 1, 1, 1.0, None),  # older than 1 h: not rolled up
            (1, "2031-03-04 04:31:00+00", 7, 1, 1, 1.0, None),
        ]
    )
    minutes = telemetry.rollup(NOW)
    assert minutes == 59  # 04:30 .. 05:28 (05:29 is not settled at 05:30:00)
    assert list(GpuRollup.objects.values_list("minute", "utilization_max")) == [
        (datetime(2031, 3, 4, 4, 31, tzinfo=UTC), 7)
    ]
    assert FleetRollup.objects.count() == 59


def test_a_finished_days_rollups_are_clustered_once_in_gpu_order(gpus):
    telemetry.ensure_partitions(NOW)
    day = "health_gpurollup_p20310304"
    minute = NOW.replace(hour=0, minute=0, second=0, microsecond=0)
    # Written as the rollup writes them: every GPU minute by minute.
    GpuRollup.objects.bulk_create(
        GpuRollup(gpu_id=gpu.pk, minute=minute + timedelta(minutes=step), samples=1)
        for step in range(30)
        for gpu in gpus
    )

    def physical_order() -> list[int]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT gpu_id FROM {day} ORDER BY ctid")
            return [gpu_id for (gpu_id,) in cursor.fetchall()]

    assert physical_order() != sorted(physical_order())
    # Not while the day may still get rows, nor until an hour after it ends.
    assert telemetry.cluster_finished_day(NOW) is None
    assert telemetry.cluster_finished_day(minute + timedelta(days=1, minutes=59)) is None
    after = minute + timedelta(days=1, hours=1)
    assert telemetry.cluster_finished_day(after) == day
    assert physical_order() == sorted(physical_order())
    assert telemetry.cluster_finished_day(after) is None  # once


def test_the_stream_keeps_only_what_is_unread_or_pending(stream, gpus, settings):
    redis_client = telemetry.client()
    for second in range(3000):
        redis_client.xadd(
            stream,
            {"node": gpus[0].node.hostname, "at": str(1_800_000_000 + second), "gpus": "{}"},
        )
    telemetry.ingest()
    # Approximate trimming keeps at most a radix-tree node's worth (100 entries by default).
    assert redis_client.xlen(stream) < 200
    unread = redis_client.xadd(stream, {"node": gpus[0].node.hostname, "at": "1", "gpus": "{}"})
    assert redis_client.xrange(stream, unread, unread)
