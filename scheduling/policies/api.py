"""Policies and quotas in the API.

- ``/orchestrator/policies`` (seed-compatible): GET the policy of the GPUs in no pool (``policy``,
  ``aging_interval_s``) and every pool's (``pools``); PUT ``policy`` and ``aging_interval_s``
  (and optionally any other policy setting) for the GPUs in no pool, or for a pool named by
  ``pool``; answered with the whole policy.
- ``/api/v1/policies/``: every pool's policy (``~`` names the GPUs in no pool:
  ``/api/v1/policies/~/``); PUT or PATCH one (admins).
- ``/api/v1/quotas/``: quotas with their use now (admins write; users read their own and their
  projects', viewers, operators and admins everyone's); ``/api/v1/quotas/mine/``: the lines the
  requester sees ("you use 6 of 8 GPUs in pool a100; 112 of 500 GPU-hours this month").

``policy_services.set_pool_policy`` and the ``quotas`` services decide and audit; their refusals
are a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.urls import include, path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from gpuadmin import api
from gpuadmin.access.permissions import IsAdminOrReadOnly, signed_in
from inventory.models import Pool
from scheduling.jobs import limits as job_limits
from scheduling.jobs.api.serializers import PoolNameField, StrictCharField
from scheduling.jobs.api.views import valid
from scheduling.models import PoolPolicy, Quota, QuotaPeriod
from scheduling.policies import quotas
from scheduling.policies import services as policy_services


def bounds(limits: dict[str, tuple[int, int]]) -> dict[str, job_limits.Bounds]:
    """Serializer field arguments from a table of (least, most)."""
    return {name: {"min_value": low, "max_value": high} for name, (low, high) in limits.items()}


# --------------------------------------------------------------------------- policies

# What the seed's ``PUT /orchestrator/policies`` always sent; the other settings are optional.
SEED_POLICY_FIELDS = frozenset({"policy", "aging_interval_s"})


class PoolPolicySerializer(api.ModelSerializer):
    pool: serializers.Field = serializers.CharField(
        source="pool.name", default=None, read_only=True, allow_null=True
    )
    updated_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Null: the defaults, never changed."
    )
    preempt_signal = serializers.ChoiceField(choices=policy_services.PREEMPT_SIGNALS)
    las_thresholds_gpu_s = serializers.ListField(
        child=serializers.IntegerField(
            min_value=policy_services.LAS_THRESHOLD_LIMITS[0],
            max_value=policy_services.LAS_THRESHOLD_LIMITS[1],
        ),
        max_length=policy_services.LAS_THRESHOLDS_MAX,
        help_text=PoolPolicy._meta.get_field("las_thresholds_gpu_s").help_text,
    )

    class Meta:
        model = PoolPolicy
        fields = ["pool", *policy_services.POLICY_FIELDS, "updated_at"]
        extra_kwargs = bounds(policy_services.POLICY_LIMITS)


class PolicySerializer(PoolPolicySerializer):
    """``PUT /orchestrator/policies``: the queue policy of the GPUs in no pool, or of ``pool``.
    ``policy`` and ``aging_interval_s`` are required (the seed's body); every other policy
    setting may be given too, and one left out keeps its value."""

    pool = PoolNameField(
        slug_field="name",
        queryset=Pool.objects.all(),
        allow_null=True,
        default=None,
        help_text="A pool's name; none or ~: the GPUs in no pool.",
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        for name in policy_services.POLICY_FIELDS:
            fields[name].required = name in SEED_POLICY_FIELDS
        return fields


class PoliciesSerializer(api.Serializer):
    """``GET /orchestrator/policies``: the no-pool policy as before, and every pool's."""

    policy = serializers.CharField()
    aging_interval_s = serializers.IntegerField()
    pools = PoolPolicySerializer(many=True)


class PoliciesView(APIView):
    permission_classes = [IsAdminOrReadOnly]

    @extend_schema(responses={200: PoliciesSerializer})
    def get(self, request: Request) -> Response:
        policies = quotas.every_policy()
        body = {
            "policy": policies[0].policy,
            "aging_interval_s": policies[0].aging_interval_s,
            "pools": policies,
        }
        return Response(PoliciesSerializer(body).data)

    @extend_schema(request=PolicySerializer, responses={200: PoolPolicySerializer})
    def put(self, request: Request) -> Response:
        """Set the queue policy of the GPUs in no pool, or of ``pool`` (admins; audited)."""
        data = valid(PolicySerializer, request.data)
        pool = data.pop("pool")
        config = policy_services.set_pool_policy(pool, actor=signed_in(request), **data)
        return Response(PoolPolicySerializer(config).data)


class PolicyViewSet(viewsets.ViewSet):
    """Each pool's policy, by pool name (``~``: the GPUs in no pool). Admins change them."""

    permission_classes = [IsAdminOrReadOnly]
    lookup_field = "pool"
    lookup_value_regex = r"[-\w~]+"  # a pool's name (a slug), or ~

    @extend_schema(responses={200: PoolPolicySerializer(many=True)})
    def list(self, request: Request) -> Response:
        return Response(PoolPolicySerializer(quotas.every_policy(), many=True).data)

    @extend_schema(responses={200: PoolPolicySerializer})
    def retrieve(self, request: Request, pool: str) -> Response:
        return Response(PoolPolicySerializer(quotas.policy_of(quotas.pool_named(pool))).data)

    @extend_schema(request=PoolPolicySerializer, responses={200: PoolPolicySerializer})
    def update(self, request: Request, pool: str, partial: bool = False) -> Response:
        """Change the pool's policy (audited; the loop re-orders its queue)."""
        where = quotas.pool_named(pool)
        serializer = PoolPolicySerializer(
            quotas.policy_of(where), data=request.data, partial=partial
        )
        serializer.is_valid(raise_exception=True)
        row = policy_services.set_pool_policy(
            where, actor=signed_in(request), **serializer.validated_data
        )
        return Response(PoolPolicySerializer(row).data)

    @extend_schema(request=PoolPolicySerializer, responses={200: PoolPolicySerializer})
    def partial_update(self, request: Request, pool: str) -> Response:
        return self.update(request, pool, partial=True)


# --------------------------------------------------------------------------- quotas


class QuotaSerializer(api.ModelSerializer):
    pool = PoolNameField(
        slug_field="name",
        queryset=Pool.objects.all(),
        allow_null=True,
        default=None,
        help_text="A pool's name; none or ~: the GPUs in no pool.",
    )
    user = serializers.SlugRelatedField(
        slug_field="username",
        queryset=get_user_model().objects.all(),
        allow_null=True,
        default=None,
        help_text="Whose quota (or give a project).",
    )
    project = StrictCharField(
        max_length=quotas.PROJECT_CHARS,
        allow_blank=True,
        default="",
        help_text="Whose quota (or give a user).",
    )
    gpus_in_use = serializers.SerializerMethodField(help_text="GPUs its holder holds now.")
    gpu_hours_used = serializers.SerializerMethodField(help_text="GPU-hours this period.")

    class Meta:
        model = Quota
        fields = [
            "id",
            "pool",
            "user",
            "project",
            *quotas.QUOTA_FIELDS,
            "gpus_in_use",
            "gpu_hours_used",
            "updated_at",
        ]
        read_only_fields = ["updated_at"]
        extra_kwargs = {
            **bounds(quotas.QUOTA_LIMITS),
            "period": {"choices": QuotaPeriod.choices},
        }
        validators: list[Any] = []  # the service names the field of a holder's second quota

    def get_gpus_in_use(self, quota: Quota) -> float:
        return self._use(quota).gpus_in_use

    def get_gpu_hours_used(self, quota: Quota) -> float:
        return self._use(quota).gpu_hours_used

    def _use(self, quota: Quota) -> Any:
        limits = self.context.get("limits")
        if limits is None:
            limits = self.context["limits"] = quotas.limits_of([quota], timezone.now())
        return limits[quota.pk]


class QuotaUseSerializer(api.Serializer):
    """One line of ``/api/v1/quotas/mine/``."""

    quota = serializers.IntegerField(source="quota_id")
    pool = serializers.CharField(source="limit.pool", allow_null=True)
    holder = serializers.CharField(source="who", help_text="you, user <name> or project <name>.")
    max_gpus = serializers.FloatField(source="limit.max_gpus", allow_null=True)
    gpus_in_use = serializers.FloatField(source="limit.gpus_in_use")
    gpu_hours = serializers.FloatField(source="limit.gpu_hours", allow_null=True)
    gpu_hours_used = serializers.FloatField(source="limit.gpu_hours_used")
    period = serializers.CharField(source="limit.period")
    over = serializers.BooleanField(help_text="At a limit: new work waits or borrows.")
    text = serializers.CharField()


class QuotaViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Quotas per user or project and pool, with what each holder uses now."""

    serializer_class = QuotaSerializer
    permission_classes = [IsAdminOrReadOnly]
    pagination_class = api.Pagination
    lookup_value_regex = r"\d+"

    def get_queryset(self) -> QuerySet[Quota]:
        return quotas.visible_quotas(self.request.user)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        rows = list(page if page is not None else self.get_queryset())
        context = {"request": request, "limits": quotas.limits_of(rows, timezone.now())}
        return self.get_paginated_response(QuotaSerializer(rows, many=True, context=context).data)

    @extend_schema(request=QuotaSerializer, responses={201: QuotaSerializer})
    def create(self, request: Request) -> Response:
        """A quota for a user or a project in a pool (admins; audited)."""
        data = valid(QuotaSerializer, request.data)
        quota = quotas.create_quota(actor=signed_in(request), **data)
        return Response(QuotaSerializer(quota).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=QuotaSerializer, responses={200: QuotaSerializer})
    def update(self, request: Request, pk: str, partial: bool = False) -> Response:
        quota = self.get_object()
        serializer = QuotaSerializer(quota, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        quotas.update_quota(quota, actor=signed_in(request), **serializer.validated_data)
        return Response(QuotaSerializer(quota).data)

    @extend_schema(request=QuotaSerializer, responses={200: QuotaSerializer})
    def partial_update(self, request: Request, pk: str) -> Response:
        return self.update(request, pk, partial=True)

    def perform_destroy(self, instance: Quota) -> None:
        quotas.delete_quota(instance, actor=signed_in(self.request))

    @extend_schema(responses={200: QuotaUseSerializer(many=True)})
    @action(detail=False, methods=["get"], pagination_class=None)
    def mine(self, request: Request) -> Response:
        """The requester's quotas and their projects', each as a line to show."""
        lines = quotas.usage_summary(signed_in(request))
        return Response(QuotaUseSerializer(lines, many=True).data)


router = SimpleRouter()
router.register("policies", PolicyViewSet, basename="policy")
router.register("quotas", QuotaViewSet, basename="quota")

urlpatterns = [
    path("api/v1/", include((router.urls, "api"), namespace="policies-api-v1")),
    path("orchestrator/policies", PoliciesView.as_view(), name="api-orchestrator-policies"),
]
