"""Accounting and fair share in the API: what the usage and fair-share pages show.

- ``/api/v1/usage/?start=&end=&group=``: GPU-hours per user, project or pool over the days
  [start, end] (by default this month so far, per user), their total, each day's allocated and
  used GPU-hours, and the GPU-hour budgets of the current periods (the quotas the requester
  reads, as ``/api/v1/quotas/mine/`` words them). Everyone signed in reads everyone's use, like
  Slurm's ``sreport``; the rows per day are the CSV export, ``/usage.csv``.
- ``/api/v1/fairshare/?pool=``: one pool's fair share as the engine computes it (``~`` or
  nothing: the GPUs in no pool): every user's and project's weight, share, decayed usage,
  factor and position, and why the requester's jobs get the points they get.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuadmin import api, dates
from gpuadmin.access.permissions import signed_in
from scheduling.allocations import accounting
from scheduling.placement import fairshare
from scheduling.policies import quotas
from scheduling.policies.api import QuotaUseSerializer


class PeriodQuerySerializer(api.Serializer):
    start = serializers.DateField(
        required=False,
        input_formats=dates.DAY_INPUT_FORMATS,
        help_text="First day, YYYY-MM-DD (default: the 1st).",
    )
    end = serializers.DateField(
        required=False,
        input_formats=dates.DAY_INPUT_FORMATS,
        help_text="Last day, YYYY-MM-DD (default: today).",
    )
    group = serializers.ChoiceField(choices=accounting.GROUPS, required=False)

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"period": accounting.period(**data)}  # a PeriodInvalid is a 400 naming it


class UsageRowSerializer(api.Serializer):
    """A user's, project's or pool's use over the period (the CSV's columns, summed)."""

    name = serializers.CharField()
    allocated_gpu_hours = serializers.FloatField(source="allocated_h")
    used_gpu_hours = serializers.FloatField(
        source="used_h", help_text="Allocated GPU-hours weighted by the GPUs' utilization."
    )
    used_share = serializers.FloatField(allow_null=True, help_text="Used over allocated.")
    idle_held_gpu_hours = serializers.FloatField(source="idle_held_h")
    mig_slice_hours = serializers.FloatField(source="mig_slice_h")
    mps_gpu_hours = serializers.FloatField(source="mps_gpu_h")
    energy_kwh = serializers.FloatField()
    cpu_hours = serializers.FloatField(
        source="cpu_h",
        help_text="CPU-hours of the jobs that ended in the period (all their runs', from their "
        "cgroups, as sacct's TotalCPU).",
    )


class UsageDaySerializer(api.Serializer):
    day = serializers.DateField()
    allocated_gpu_hours = serializers.FloatField(source="allocated_h")
    used_gpu_hours = serializers.FloatField(source="used_h")


class UsageSerializer(api.Serializer):
    start = serializers.DateField(source="period.start")
    end = serializers.DateField(source="period.end")
    group = serializers.ChoiceField(source="period.group", choices=accounting.GROUPS)
    rows = UsageRowSerializer(many=True, help_text="Most allocated first.")
    total = UsageRowSerializer()
    days = UsageDaySerializer(many=True, help_text="Every day of the period.")
    budgets = QuotaUseSerializer(
        many=True, help_text="Quotas with GPU-hours per period, the fullest first."
    )


class UsageView(APIView):
    @extend_schema(parameters=[PeriodQuerySerializer], responses={200: UsageSerializer})
    def get(self, request: Request) -> Response:
        """GPU-hours per user, project or pool over a period, per day, and the budgets."""
        query = PeriodQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        period: accounting.Period = query.validated_data["period"]
        rows = accounting.usage(period.start, period.end, period.group)
        body = {
            "period": period,
            "rows": rows,
            "total": accounting.totals(rows),
            "days": accounting.daily(period.start, period.end),
            "budgets": quotas.budgets(signed_in(request)),
        }
        return Response(UsageSerializer(body).data)


class StandingSerializer(api.Serializer):
    """A user's or project's place in the pool's fair share."""

    name = serializers.CharField(help_text="The user name or the project.")
    position = serializers.IntegerField(help_text="By factor, among its kind (1: most points).")
    weight = serializers.FloatField(source="standing.weight", help_text="Its quota's shares.")
    share = serializers.FloatField(source="standing.share", help_text="Its part of the shares.")
    usage_gpu_hours = serializers.FloatField(source="usage_gpu_h", help_text="Decayed.")
    normalized_usage = serializers.FloatField(source="standing.normalized_usage")
    factor = serializers.FloatField(source="standing.factor", help_text="2^(-usage / share).")
    mine = serializers.BooleanField(help_text="The requester, or one of their projects.")


class ExplanationSerializer(api.Serializer):
    """Why the requester's jobs (without a project, or in one) get their fair-share points."""

    project = serializers.SerializerMethodField(help_text="Null: jobs without a project.")
    user_factor = serializers.FloatField(source="user.factor")
    project_factor = serializers.FloatField(source="project.factor", default=None, allow_null=True)
    factor = serializers.FloatField(help_text="The job's: the mean of the two.")
    points = serializers.FloatField(help_text="Its fair-share priority points.")
    sentences = serializers.ListField(child=serializers.CharField())

    def get_project(self, explanation: fairshare.FairShareExplanation) -> str | None:
        return None if explanation.project is None else explanation.project.holder[1]


class FairShareSerializer(api.Serializer):
    pool = serializers.CharField(source="pool.name", default=None, allow_null=True)
    policy = serializers.CharField(source="config.policy")
    half_life_s = serializers.FloatField(
        source="config.fairshare_half_life_s", help_text="Usage counts half after this."
    )
    points_per_factor = serializers.FloatField(
        source="config.fairshare_weight", help_text="A job's points = this x its factor."
    )
    users = StandingSerializer(many=True)
    projects = StandingSerializer(many=True)
    explanations = ExplanationSerializer(many=True)


class FairShareView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "pool", OpenApiTypes.STR, description="A pool's name; ~ or none: no pool."
            )
        ],
        responses={200: FairShareSerializer},
    )
    def get(self, request: Request) -> Response:
        """One pool's fair share, and why the requester's priority is what it is."""
        key = request.query_params.get("pool") or quotas.NO_POOL
        board = quotas.fairshare_board(quotas.pool_named(key), signed_in(request))
        return Response(FairShareSerializer(board).data)
