"""The charts' history reads on the real PostgreSQL tables: buckets, raw samples vs rollups,
MIG's unmeasured utilization, health events in the range, the API's parameters."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from health import history
from health.choices import EventKind, Severity
from health.models import FleetRollup, GpuRollup, GpuSample, HealthEvent
from inventory.models import Gpu, Node

pytestmark = pytest.mark.django_db


def floor(moment: datetime, seconds: int) -> datetime:
    return moment - timedelta(seconds=moment.timestamp() % seconds)


@pytest.fixture
def node() -> Node:
    return Node.objects.create(hostname="hist-01", last_heartbeat_at=timezone.now())


def add_gpu(node: Node, index: int, **fields: Any) -> Gpu:
    return Gpu.objects.create(
        uuid=f"GPU-hist-{node.hostname}-{index}",
        node=node,
        index=index,
        name="NVIDIA A100-SXM4-40GB",
        pci_bus_id=f"00000000:{index:02X}:00.0",
        **fields,
    )


@pytest.fixture
def gpu(node: Node) -> Gpu:
    return add_gpu(node, 0)


def samples(gpu: Gpu, times: list[datetime], **values: Any) -> None:
    defaults = {
        "utilization_gpu_pct": 50,
        "memory_used_mib": 2048,
        "temperature_c": 60,
        "power_w": 300.0,
    }
    GpuSample.objects.bulk_create(
        GpuSample(gpu_id=gpu.pk, at=at, **(defaults | values)) for at in times
    )


def rollups(gpu: Gpu, minutes: list[datetime], **values: Any) -> None:
    row = {
        "samples": 30,
        "utilization_min": 40,
        "utilization_avg": 50.0,
        "utilization_max": 60,
        "memory_used_min": 1024,
        "memory_used_avg": 2048.0,
        "memory_used_max": 3072,
        "temperature_min": 55,
        "temperature_avg": 60.0,
        "temperature_max": 65,
        "power_min": 250.0,
        "power_avg": 300.0,
        "power_max": 350.0,
    } | values
    GpuRollup.objects.bulk_create(
        GpuRollup(gpu_id=gpu.pk, minute=minute, **row) for minute in minutes
    )


def series(payload: dict[str, Any], metric: str, label: str = "GPU") -> dict[str, Any]:
    [found] = [s for s in payload["series"] if s["metric"] == metric and s["label"] == label]
    return found


@pytest.mark.parametrize(
    ("_case", "span", "step"),
    [
        ("an hour: 5 s", timedelta(hours=1), 5),
        ("a day: 2 min", timedelta(hours=24), 120),
        ("a week: 10 min", timedelta(days=7), 600),
        ("31 days: 1 h", timedelta(days=31), 3600),
        ("a minute: two sample intervals", timedelta(minutes=1), 5),
    ],
)
def test_buckets_keep_a_chart_near_a_thousand_points(_case, span, step):
    assert history.bucket_step(span) == step
    assert span.total_seconds() / step <= history.MAX_POINTS


def test_the_last_hour_comes_from_raw_samples_in_5_second_buckets(gpu):
    end = timezone.now()
    start = end - timedelta(hours=1)
    first = floor(start, 5) + timedelta(seconds=5)
    times = [first + timedelta(seconds=2 * i) for i in range(1790)]
    samples(gpu, times)
    # One bucket of two samples with different values: its mean, lowest and highest.
    bucket = floor(end - timedelta(minutes=30), 5)
    GpuSample.objects.filter(
        gpu_id=gpu.pk, at__gte=bucket, at__lt=bucket + timedelta(seconds=5)
    ).delete()
    samples(gpu, [bucket], utilization_gpu_pct=10, memory_used_mib=1024, power_w=100.0)
    samples(gpu, [bucket + timedelta(seconds=2)], utilization_gpu_pct=30, power_w=200.5)

    payload = history.gpu_series(gpu.pk, start, end)

    assert payload["source"] == "raw"
    assert payload["step"] == 5
    # Every bucket of the range, 5 s apart: one with no sample is a gap, not a line across it.
    assert payload["times"] == list(range(payload["start"], payload["end"], 5))
    assert len(payload["times"]) in (720, 721)
    i = payload["times"].index(int(bucket.timestamp()))
    utilization = series(payload, "utilization")
    assert (utilization["avg"][i], utilization["min"][i], utilization["max"][i]) == (20.0, 10, 30)
    memory = series(payload, "memory")
    assert (memory["min"][i], memory["max"][i]) == (1.0, 2.0)  # GiB
    assert series(payload, "power", "GPU")["avg"][i] == 150.3  # 150.25, rounded to 0.1 W
    temperature = series(payload, "temperature")["avg"]
    assert (temperature[0], temperature[1]) == (None, 60.0)  # samples start in the second


def test_a_week_reads_rollups_in_10_minute_buckets(gpu):
    end = timezone.now()
    start = end - timedelta(days=7)
    first = floor(start, 600) + timedelta(minutes=10)
    minutes = [first + timedelta(minutes=i) for i in range(7 * 1440 - 30)]
    rollups(gpu, minutes)
    # A bucket whose ten minutes differ: the band spans the lowest and the highest minute.
    bucket = floor(end - timedelta(days=3), 600)
    GpuRollup.objects.filter(
        gpu_id=gpu.pk, minute__gte=bucket, minute__lt=bucket + timedelta(minutes=10)
    ).update(utilization_avg=20.0)
    GpuRollup.objects.filter(gpu_id=gpu.pk, minute=bucket).update(
        utilization_min=0, utilization_avg=70.0
    )
    GpuRollup.objects.filter(gpu_id=gpu.pk, minute=bucket + timedelta(minutes=9)).update(
        utilization_max=100
    )

    payload = history.gpu_series(gpu.pk, start, end)

    assert (payload["source"], payload["step"]) == ("rollup", 600)
    assert len(payload["times"]) in (1008, 1009)
    i = payload["times"].index(int(bucket.timestamp()))
    utilization = series(payload, "utilization")
    assert (utilization["avg"][i], utilization["min"][i], utilization["max"][i]) == (25.0, 0, 100)
    memory = series(payload, "memory")["avg"]
    assert set(memory) == {2.0, None}
    assert memory.count(2.0) == 1005  # the buckets with rollups; the others are gaps


def test_rollups_hand_over_to_raw_samples_after_the_last_minute_rolled_up(gpu):
    """A day's chart is not a rollup pass behind: the minutes not rolled up yet come from the
    raw samples, and a minute both rolled up and still in the raw table counts once."""
    end = timezone.now()
    start = end - timedelta(hours=24)
    last_rolled = floor(end, 120) - timedelta(minutes=10)  # at the start of a 2-minute bucket
    minutes = [last_rolled - timedelta(minutes=i) for i in range(60)]
    rollups(gpu, minutes, utilization_avg=10.0, utilization_min=10, utilization_max=10)
    # Raw samples are kept for the raw retention: under the rollups, and after them.
    under = [last_rolled - timedelta(seconds=2 * i) for i in range(1, 300)]
    samples(gpu, under, utilization_gpu_pct=99)
    last = [last_rolled + timedelta(seconds=2 * i) for i in range(30)]
    samples(gpu, last, utilization_gpu_pct=70)
    tail = [last_rolled + timedelta(minutes=2, seconds=2 * i) for i in range(200)]
    samples(gpu, tail, utilization_gpu_pct=80)

    payload = history.gpu_series(gpu.pk, start, end)

    assert (payload["source"], payload["step"]) == ("rollup", 120)
    by_time = dict(zip(payload["times"], series(payload, "utilization")["avg"], strict=True))
    assert by_time[int((last_rolled - timedelta(minutes=20)).timestamp())] == 10.0
    # The bucket of the last minute rolled up is read whole from the raw samples.
    assert by_time[int(last_rolled.timestamp())] == 70.0
    assert by_time[int((last_rolled + timedelta(minutes=2)).timestamp())] == 80.0
    assert 99.0 not in by_time.values()  # raw samples under the rollups are not read again
    # 59 minutes rolled up before it in 30 buckets, its own bucket, 400 s of raw after it.
    assert len([value for value in by_time.values() if value is not None]) == 30 + 1 + 4


def test_raw_samples_only_while_the_range_lies_within_their_retention(gpu, settings):
    settings.GPUADMIN_RAW_RETENTION_H = 6
    end = timezone.now()
    within = history.gpu_series(gpu.pk, end - timedelta(hours=5), end)
    beyond = history.gpu_series(gpu.pk, end - timedelta(hours=7), end)
    assert (within["source"], within["step"]) == ("raw", 30)
    assert (beyond["source"], beyond["step"]) == ("rollup", 60)  # a minute: the rollups' grain
    settings.GPUADMIN_RAW_RETENTION_H = 4
    assert history.gpu_series(gpu.pk, end - timedelta(hours=5), end)["source"] == "rollup"


def test_mig_utilization_is_null_never_zero(node):
    gpu = add_gpu(node, 0, mig_capable=True, mig_enabled=True)
    end = timezone.now()
    samples(gpu, [end - timedelta(seconds=30 + 2 * i) for i in range(10)], utilization_gpu_pct=None)
    rollups(
        gpu,
        [floor(end, 60) - timedelta(hours=2, minutes=i) for i in range(10)],
        utilization_min=None,
        utilization_avg=None,
        utilization_max=None,
    )

    for span in (timedelta(hours=1), timedelta(hours=24)):
        payload = history.gpu_series(gpu.pk, end - span, end)
        utilization = series(payload, "utilization")
        assert set(utilization["avg"]) | set(utilization["min"]) | set(utilization["max"]) == {None}
        assert set(series(payload, "memory")["avg"]) == {2.0, None}


def test_events_in_the_range_mark_the_chart(gpu, node):
    other = add_gpu(node, 1)
    end = timezone.now()

    def event(at: datetime, on: Gpu | None, key: str, **fields: Any) -> None:
        HealthEvent.objects.create(
            node=node,
            gpu=on,
            occurred_at=at,
            dedupe_key=key,
            kind=fields.pop("kind", EventKind.XID),
            severity=fields.pop("severity", Severity.CRITICAL),
            **fields,
        )

    event(end - timedelta(hours=2), gpu, "before", xid=79)
    event(end - timedelta(minutes=40), gpu, "xid", xid=48, message="DBE")
    event(end - timedelta(minutes=20), gpu, "hot", kind=EventKind.THERMAL, severity="warning")
    event(end - timedelta(minutes=10), other, "other", xid=13, severity="warning")
    event(end - timedelta(minutes=5), None, "node", kind=EventKind.HEARTBEAT_LOST)

    events = history.gpu_series(gpu.pk, end - timedelta(hours=1), end)["events"]
    assert [(e["label"], e["xid"], e["severity"], e["message"]) for e in events] == [
        ("XID 48", 48, "critical", "DBE"),
        ("Thermal", None, "warning", ""),
    ]
    assert events[0]["at"] == pytest.approx((end - timedelta(minutes=40)).timestamp())

    on_node = history.node_series(node.pk, end - timedelta(hours=1), end)["events"]
    assert [(e["label"], e["gpu"]) for e in on_node] == [
        ("XID 48", "GPU 0"),
        ("Thermal", "GPU 0"),
        ("XID 13", "GPU 1"),
        ("Heartbeat lost", None),
    ]
    in_fleet = history.fleet_series(end - timedelta(hours=1), end)["events"]
    assert [e["label"] for e in in_fleet] == ["XID 48", "Heartbeat lost"]  # critical only


def test_a_node_chart_has_a_line_per_gpu(node, gpu):
    second = add_gpu(node, 1)
    add_gpu(node, 2, missing_since=timezone.now())  # gone from the node: no line
    end = timezone.now()
    samples(gpu, [end - timedelta(seconds=60)], utilization_gpu_pct=10)
    samples(
        second, [end - timedelta(seconds=60), end - timedelta(seconds=20)], utilization_gpu_pct=90
    )

    payload = history.node_series(node.pk, end - timedelta(hours=1), end)

    assert [s["label"] for s in payload["series"] if s["metric"] == "utilization"] == [
        "GPU 0",
        "GPU 1",
    ]
    both, second_only = (
        payload["times"].index(int(floor(end - timedelta(seconds=s), 5).timestamp()))
        for s in (60, 20)
    )
    zero, one = (series(payload, "utilization", f"GPU {i}")["avg"] for i in (0, 1))
    assert (zero[both], zero[second_only]) == (10.0, None)
    assert (one[both], one[second_only]) == (90.0, 90.0)
    assert len([value for value in zero + one if value is not None]) == 3
    assert "min" not in series(payload, "utilization", "GPU 0")  # bands only on a GPU's chart


def test_the_fleet_chart_reads_the_fleet_rollup():
    end = timezone.now()
    bucket = floor(end - timedelta(minutes=30), 600)
    first, second = bucket + timedelta(minutes=1), bucket + timedelta(minutes=2)
    FleetRollup.objects.bulk_create(
        [
            FleetRollup(minute=first, gpus=8, utilization_avg=20.0),
            FleetRollup(minute=second, gpus=8, utilization_avg=40.0),
            FleetRollup(minute=end - timedelta(hours=3), gpus=8, utilization_avg=99.0),
        ]
    )

    payload = history.fleet_series(end - timedelta(hours=1), end)

    assert (payload["source"], payload["step"]) == ("rollup", 60)
    [fleet] = payload["series"]
    assert (fleet["metric"], fleet["label"]) == ("utilization", "Fleet")
    i = payload["times"].index(int(first.timestamp()))
    assert payload["times"][i + 1] == int(second.timestamp())
    for stat in ("avg", "min", "max"):
        assert fleet[stat][i : i + 2] == [20.0, 40.0]
        assert [value for value in fleet[stat] if value is not None] == [20.0, 40.0]
    week = history.fleet_series(end - timedelta(days=7), end)
    assert week["step"] == 600
    i = week["times"].index(int(bucket.timestamp()))
    fleet = week["series"][0]
    assert (fleet["avg"][i], fleet["min"][i], fleet["max"][i]) == (30.0, 20.0, 40.0)


# --------------------------------------------------------------------------- the API


@pytest.fixture
def client() -> APIClient:
    return APIClient()


def test_the_api_answers_anyone_who_may_see_the_pages(client, gpu, node):
    end = timezone.now()
    samples(gpu, [end - timedelta(seconds=10)])
    body = client.get(f"/api/v1/gpus/{gpu.uuid}/history/").json()
    assert (body["source"], body["step"]) == ("raw", 5)
    assert len([value for value in body["series"][0]["avg"] if value is not None]) == 1
    assert client.get(f"/api/v1/gpus/{gpu.uuid}/history/?range=7d").json()["step"] == 600
    assert client.get(f"/api/v1/nodes/{node.hostname}/history/?range=24h").status_code == 200
    assert client.get("/api/v1/fleet/history/?range=1h").status_code == 200
    assert client.get("/api/v1/gpus/GPU-none/history/").status_code == 404
    assert client.get("/api/v1/nodes/none/history/").status_code == 404


def test_the_api_takes_an_explicit_range(client, gpu):
    start = timezone.now() - timedelta(days=2)
    rollups(gpu, [floor(start, 60) + timedelta(minutes=5)])
    samples(gpu, [start + timedelta(minutes=10)])
    end = start + timedelta(hours=1)
    response = client.get(
        f"/api/v1/gpus/{gpu.uuid}/history/",
        {"start": start.isoformat(), "end": end.isoformat()},
    )
    body = response.json()
    assert response.status_code == 200, body
    assert body["source"] == "rollup"  # two days ago: beyond the raw retention
    assert body["start"] == int(floor(start, 60).timestamp())
    # The rollup's minute, and the raw sample after it.
    assert len([value for value in body["series"][0]["avg"] if value is not None]) == 2


@pytest.mark.parametrize(
    ("_case", "params", "field"),
    [
        ("an unknown range", {"range": "2w"}, "range"),
        ("a range and a start", {"range": "1h", "start": "2026-01-01T00:00:00Z"}, "range"),
        ("a start that is no time", {"start": "yesterday"}, "start"),
        ("an end without a start", {"end": "2026-01-01T00:00:00Z"}, "start"),
        (
            "an end before the start",
            {"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"},
            "end",
        ),
        (
            "a span over 31 days",
            {"start": "2026-01-01T00:00:00Z", "end": "2026-03-01T00:00:00Z"},
            "start",
        ),
    ],
)
def test_bad_parameters_are_a_400_naming_the_field(client, gpu, _case, params, field):
    for url in (f"/api/v1/gpus/{gpu.uuid}/history/", "/api/v1/fleet/history/"):
        response = client.get(url, params)
        assert response.status_code == 400, response.content
        assert list(response.json()) == [field]


def test_signed_in_people_read_it_too(client, gpu):
    user = get_user_model().objects.create_user("viewer", password="pw-viewer-123")
    client.force_authenticate(user)
    assert client.get(f"/api/v1/gpus/{gpu.uuid}/history/?range=24h").status_code == 200
