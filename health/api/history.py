"""The charts' data: a GPU's, a node's or the fleet's telemetry over a time range.

Readable by everyone the pages are (anonymous people included): the charts sit on the GPU,
node and fleet pages, which need no sign-in, and show over time what those pages show live.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuadmin import api
from health import history
from inventory.models import Gpu, Node

DEFAULT_RANGE = "1h"


class HistoryParamsSerializer(api.Serializer):
    """The range of a history request: a named one ending now, or ``start`` to ``end``."""

    range = serializers.ChoiceField(
        choices=list(history.RANGES),
        required=False,
        help_text=f"The last hour, day or week, ending now (default {DEFAULT_RANGE}).",
    )
    start = api.LocalDateTimeField(required=False, help_text="ISO 8601, instead of range.")
    end = api.LocalDateTimeField(required=False, help_text="ISO 8601 (default: now).")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        """Adds ``since`` and ``until``: the range asked for, at most ``MAX_SPAN`` long."""
        now = timezone.now()
        start: datetime | None = data.get("start")
        end: datetime | None = data.get("end")
        if start is None:
            if end is not None:
                raise serializers.ValidationError({"start": ["Give a start with an end."]})
            return {"since": now - history.RANGES[data.get("range", DEFAULT_RANGE)], "until": now}
        if "range" in data:
            raise serializers.ValidationError({"range": ["Give either a range or start/end."]})
        end = end or now
        if end <= start:
            raise serializers.ValidationError({"end": ["The end must be after the start."]})
        if end - start > history.MAX_SPAN:
            raise serializers.ValidationError(
                {"start": [f"A range is at most {history.MAX_SPAN.days} days long."]}
            )
        return {"since": start, "until": end}


class HistorySeriesSerializer(api.Serializer):
    """One line of a chart: a value per bucket of ``times`` (``null``: none in the bucket, or
    utilization in MIG mode), with the band of the lowest and highest on a GPU's chart."""

    metric = serializers.ChoiceField(choices=[metric.name for metric in history.METRICS])
    label = serializers.CharField()  # type: ignore[assignment]  # shadows Field.label
    avg = serializers.ListField(child=serializers.FloatField(allow_null=True))
    min = serializers.ListField(child=serializers.FloatField(allow_null=True), required=False)
    max = serializers.ListField(child=serializers.FloatField(allow_null=True), required=False)


class HistoryEventSerializer(api.Serializer):
    """A health event in the range: a marker on the charts' time axis."""

    at = serializers.FloatField(help_text="Unix seconds.")
    kind = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # shadows Field.label
    xid = serializers.IntegerField(allow_null=True)
    severity = serializers.CharField()
    message = serializers.CharField()
    gpu = serializers.CharField(allow_null=True, help_text="GPU n, on a node's chart.")


class HistorySerializer(api.Serializer):
    """What ``health.history`` returns (documented for the schema; passed through as is)."""

    start = serializers.IntegerField(help_text="Unix seconds, at a bucket's start.")
    end = serializers.IntegerField(help_text="Unix seconds.")
    step = serializers.IntegerField(help_text="The buckets' width in seconds.")
    source = serializers.ChoiceField(choices=["raw", "rollup"])  # type: ignore[assignment]
    times = serializers.ListField(child=serializers.IntegerField(), help_text="Bucket starts.")
    series = HistorySeriesSerializer(many=True)
    events = HistoryEventSerializer(many=True)


def requested_range(request: Request) -> tuple[datetime, datetime]:
    serializer = HistoryParamsSerializer(data=request.query_params)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data["since"], serializer.validated_data["until"]


class HistoryView(APIView):
    permission_classes = [AllowAny]  # as the pages that draw it (module docstring)


class GpuHistoryView(HistoryView):
    @extend_schema(parameters=[HistoryParamsSerializer], responses={200: HistorySerializer})
    def get(self, request: Request, uuid: str) -> Response:
        """A GPU's utilization, memory, temperature and power (with min/max bands) and its
        health events, in at most ~1,000 buckets."""
        gpu = get_object_or_404(Gpu, uuid=uuid)
        return Response(history.gpu_series(gpu.pk, *requested_range(request)))


class NodeHistoryView(HistoryView):
    @extend_schema(parameters=[HistoryParamsSerializer], responses={200: HistorySerializer})
    def get(self, request: Request, hostname: str) -> Response:
        """The node's GPUs, one series each per metric, and its health events."""
        node = get_object_or_404(Node, hostname=hostname)
        return Response(history.node_series(node.pk, *requested_range(request)))


class FleetHistoryView(HistoryView):
    @extend_schema(parameters=[HistoryParamsSerializer], responses={200: HistorySerializer})
    def get(self, request: Request) -> Response:
        """The fleet's mean utilization and its critical health events."""
        return Response(history.fleet_series(*requested_range(request)))


app_name = "health-history"
urlpatterns = [
    path("gpus/<str:uuid>/history/", GpuHistoryView.as_view(), name="gpu"),
    path("nodes/<str:hostname>/history/", NodeHistoryView.as_view(), name="node"),
    path("fleet/history/", FleetHistoryView.as_view(), name="fleet"),
]
