"""API serializers: catalog fields are writable (staff), discovered fields are read-only."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpuadmin import api
from gpuadmin.registry import OccupantKind
from inventory.choices import MAINTENANCE_GPU_STATES, MAINTENANCE_NODE_STATES, NvmlBackend
from inventory.models import (
    GPU_CATALOG_FIELDS,
    MAX_TAGS,
    NODE_CATALOG_FIELDS,
    STATE_REASON_CHARS,
    Gpu,
    MigInstance,
    Node,
    Pool,
)
from inventory.nvml.scanner import GpuScan
from inventory.pages.fleet import STATUS_MEANINGS, GpuRow, NodeRows
from inventory.services import (
    HOST_RESERVED_FIELDS,
    NODE_EDITABLE_FIELDS,
    gpu_catalog_errors,
    host_reserved_errors,
    update_catalog,
)


class CatalogSerializer(api.ModelSerializer):
    """Shared catalog fields; ``update`` records a ``<model>.catalog_changed`` audit event."""

    pool = serializers.SlugRelatedField(
        slug_field="name", queryset=Pool.objects.all(), allow_null=True, required=False
    )
    owner = serializers.SlugRelatedField(
        slug_field="username",
        queryset=get_user_model().objects.all(),
        allow_null=True,
        required=False,
    )
    tags = serializers.ListField(
        child=serializers.CharField(max_length=50, allow_blank=False),
        max_length=MAX_TAGS,
        required=False,
    )

    def update(self, instance: Gpu | Node, validated_data: dict[str, Any]) -> Gpu | Node:
        update_catalog(instance, validated_data, actor=self.context["request"].user)
        return instance


class NodeSerializer(CatalogSerializer):
    reachable = serializers.SerializerMethodField()
    # Declared: a generated read-only field drops ``allow_blank``, and the schema would then
    # refuse the empty value a node has until its agent says.
    nvml_backend = serializers.ChoiceField(
        choices=NvmlBackend.choices,
        allow_blank=True,
        read_only=True,
        help_text=Node._meta.get_field("nvml_backend").help_text,
    )
    gpu_count = serializers.IntegerField(read_only=True, help_text="GPUs present on the node.")
    missing_gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "state",
            "state_reason",
            "state_changed_at",
            "reachable",
            *Node.DISCOVERED_FIELDS,
            *HOST_RESERVED_FIELDS,
            "gpu_count",
            "missing_gpu_count",
            *NODE_CATALOG_FIELDS,
        ]
        read_only_fields = [
            name for name in fields if name not in NODE_EDITABLE_FIELDS and name != "reachable"
        ]

    def get_reachable(self, obj: Node) -> bool:
        return obj.is_reachable()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None and (errors := host_reserved_errors(self.instance, attrs)):
            raise serializers.ValidationError(errors)
        return attrs


STATUS_CHOICES = list(STATUS_MEANINGS)
STATUS_HELP = "; ".join(f"{status}: {meaning}" for status, meaning in STATUS_MEANINGS.items())


class GpuLiveTextSerializer(api.Serializer):
    """The live cells as the fleet page writes them."""

    utilization = serializers.CharField(source="utilization_text", help_text="``57%``, MIG, ERR")
    memory = serializers.CharField(source="memory_text", help_text="GiB used/total: ``30.1/80``")
    temperature = serializers.CharField(source="temperature_text", help_text="°C")
    power = serializers.CharField(source="power_text", help_text="W")


class GpuLiveSerializer(api.Serializer):
    """A GPU as the fleet page shows it now (a ``GpuRow``): its status, its latest live sample
    (``null`` values: not sampled, or not measurable) and the job holding it."""

    status = serializers.ChoiceField(choices=STATUS_CHOICES, help_text=STATUS_HELP)
    unusable = serializers.CharField(
        source="unusable.message",
        allow_null=True,
        default=None,
        help_text="Why it cannot take a whole-GPU job now (null: it can).",
    )
    sampled_at = serializers.DateTimeField(allow_null=True)
    utilization_pct = serializers.FloatField(allow_null=True)
    memory_used_mib = serializers.FloatField(allow_null=True)
    memory_total_mib = serializers.FloatField()
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    processes = serializers.IntegerField(allow_null=True)
    hot = serializers.BooleanField(help_text="Slowed down by heat now.")
    error = serializers.CharField(help_text="NVML's error for it now (empty: none).")
    job = serializers.IntegerField(
        source="occupant.gpuadmin_job_id",
        allow_null=True,
        default=None,
        help_text="The gpuadmin job holding it (null: none, or work outside gpuadmin).",
    )
    user = serializers.CharField(
        source="occupant.user",
        allow_null=True,
        default=None,
        help_text="The user of the job holding it (a Slurm job's: Slurm's user).",
    )
    held_by = serializers.CharField(
        source="occupant.label",
        allow_null=True,
        default=None,
        help_text="What holds it: ``job #12``, ``Slurm job 1234 on hpc`` (null: nothing).",
    )
    held_by_kind = serializers.ChoiceField(
        source="occupant.kind",
        choices=[kind.value for kind in OccupantKind],
        allow_null=True,
        default=None,
        help_text="``job`` (gpuadmin's), ``slurm`` (a Slurm job), null: nothing holds it.",
    )
    text = GpuLiveTextSerializer(source="*")


class GpuSerializer(CatalogSerializer):
    node: serializers.SlugRelatedField[Node] = serializers.SlugRelatedField(
        slug_field="hostname", read_only=True
    )
    live = serializers.SerializerMethodField(
        help_text="Now, as the fleet page shows it (in lists and single GPUs; null elsewhere)."
    )

    @extend_schema_field(GpuLiveSerializer(allow_null=True))
    def get_live(self, gpu: Gpu) -> dict[str, Any] | None:
        row = self.context.get("live_rows", {}).get(gpu.pk)
        return None if row is None else GpuLiveSerializer(row).data

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None and (errors := gpu_catalog_errors(self.instance, attrs)):
            raise serializers.ValidationError(errors)
        return attrs

    missing = serializers.BooleanField(source="is_missing", read_only=True)
    mig_instance_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "state",
            "state_reason",
            "state_changed_at",
            "missing",
            *Gpu.DISCOVERED_FIELDS,
            "mig_instance_count",
            *GPU_CATALOG_FIELDS,
            "live",
        ]
        read_only_fields = [name for name in fields if name not in GPU_CATALOG_FIELDS]


class StateChangeSerializer(api.Serializer):
    """A maintenance change (``POST .../state/``): the state to go to and why."""

    reason = serializers.CharField(
        max_length=STATE_REASON_CHARS, help_text="Why: shown with the state and audited."
    )
    force = serializers.BooleanField(
        default=False,
        help_text="Offline only: requeue the jobs running there. Without it, offline is "
        "refused (409, naming them) while jobs hold its GPUs.",
    )


class StateChangeResultSerializer(api.Serializer):
    """What a maintenance change did (an ``inventory.services.StateChange``)."""

    changed = serializers.BooleanField(help_text="False: it was in that state already.")
    running_jobs = serializers.ListField(
        source="running",
        child=serializers.IntegerField(),
        help_text="Jobs running on its GPUs now (draining: they finish there).",
    )
    stopped_jobs = serializers.ListField(
        source="stopped",
        child=serializers.IntegerField(),
        help_text="Jobs that ran on its GPUs before the change and no longer do (offline with "
        "force: requeued, each holding its GPUs until its processes are gone).",
    )


# The choices a person may set, named apart from GpuState's in the OpenAPI schema
# (settings.SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]).
GPU_MAINTENANCE_STATES = list(MAINTENANCE_GPU_STATES)


class GpuStateChangeSerializer(StateChangeSerializer):
    state = serializers.ChoiceField(
        choices=GPU_MAINTENANCE_STATES,
        help_text="available (online), draining (no new work; running work finishes) or "
        "offline (now: with force, running work is requeued).",
    )


class NodeStatusSerializer(api.Serializer):
    """A node card of the fleet page (a ``NodeRows``): its GPUs counted by status."""

    hostname = serializers.CharField(source="node.hostname")
    state = serializers.CharField(source="node.state")
    state_reason = serializers.CharField(source="node.state_reason")
    reachable = serializers.BooleanField()
    model = serializers.CharField(source="node.model")
    gpu_models = serializers.SerializerMethodField(help_text="Its GPUs' models, most first.")
    gpus = serializers.IntegerField(source="summary.total")
    counts = serializers.DictField(
        source="summary.counts", child=serializers.IntegerField(), help_text=STATUS_HELP
    )
    hot = serializers.IntegerField(source="summary.hot")

    def get_gpu_models(self, card: NodeRows) -> list[str]:
        counted = Counter(row.gpu.name for row in card.gpus)
        return [name for name, _ in counted.most_common()]


class SummarySerializer(api.Serializer):
    """The fleet page's summary bar (a ``Summary``)."""

    gpus = serializers.IntegerField(source="total")
    counts = serializers.DictField(child=serializers.IntegerField(), help_text=STATUS_HELP)
    hot = serializers.IntegerField(help_text="GPUs slowed down by heat now.")


class FleetStatusSerializer(api.Serializer):
    """``/api/v1/fleet/``: the fleet page's node cards and summary bar, counted as it counts."""

    statuses = serializers.ListField(
        child=serializers.ChoiceField(choices=STATUS_CHOICES), help_text="In the page's order."
    )
    nodes = NodeStatusSerializer(many=True)
    total = SummarySerializer()


class NodeStateResultSerializer(NodeSerializer):
    """The node after a maintenance change (``change``: what the change did)."""

    change = serializers.SerializerMethodField()

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "change"]

    @extend_schema_field(StateChangeResultSerializer)
    def get_change(self, node: Node) -> dict[str, Any]:
        return StateChangeResultSerializer(self.context["change"]).data


class GpuStateResultSerializer(GpuSerializer):
    """The GPU after a maintenance change (``change``: what the change did)."""

    change = serializers.SerializerMethodField()

    class Meta(GpuSerializer.Meta):
        fields = [*GpuSerializer.Meta.fields, "change"]

    @extend_schema_field(StateChangeResultSerializer)
    def get_change(self, gpu: Gpu) -> dict[str, Any]:
        return StateChangeResultSerializer(self.context["change"]).data


class NodeStateChangeSerializer(StateChangeSerializer):
    state = serializers.ChoiceField(
        choices=list(MAINTENANCE_NODE_STATES),
        help_text="online, draining (no new work; running work finishes) or offline (now: "
        "with force, running work on its GPUs is requeued).",
    )


class MigInstanceRowSerializer(api.ModelSerializer):
    """A MIG instance of one node (``/gpu/mig/instances``)."""

    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True)

    class Meta:
        model = MigInstance
        fields = ["gpu_index", "gpu_uuid", *MigInstance.DISCOVERED_FIELDS]
        read_only_fields = fields


class MigInstanceSerializer(MigInstanceRowSerializer):
    """A MIG instance anywhere in the fleet (``/api/v1/mig-instances``)."""

    node = serializers.CharField(source="gpu.node.hostname", read_only=True)

    class Meta(MigInstanceRowSerializer.Meta):
        fields = ["id", "node", *MigInstanceRowSerializer.Meta.fields]
        read_only_fields = fields


# Seed-compatible shapes (the compatibility layer): each is the one definition of its response.


class DeviceSerializer(api.Serializer):
    """A GPU of ``/api/gpu/devices``: catalog facts joined to the live sample (a ``GpuRow``).
    As in the seed, ``is_available`` says whether NVML could query the device (not whether
    it is free) and ``error_message`` is set exactly when it could not."""

    index = serializers.IntegerField(source="gpu.index")
    name = serializers.CharField(source="gpu.name")
    total_memory_mb = serializers.IntegerField(source="memory_total_mib")
    free_memory_mb = serializers.IntegerField(source="memory_free_mib", allow_null=True)
    used_memory_mb = serializers.IntegerField(source="memory_used_mib", allow_null=True)
    utilization_percent = serializers.IntegerField(source="utilization_pct", allow_null=True)
    temperature_c = serializers.IntegerField(allow_null=True)
    is_available = serializers.SerializerMethodField()
    error_message = serializers.SerializerMethodField()

    def get_is_available(self, row: GpuRow) -> bool:
        return not row.device_error

    def get_error_message(self, row: GpuRow) -> str | None:
        return row.device_error or None


class DeviceListSerializer(api.Serializer):
    devices = DeviceSerializer(many=True)
    count = serializers.IntegerField()


class DriverSerializer(api.ModelSerializer):
    class Meta:
        model = Node
        fields = ["driver_version", "cuda_driver_version", "nvml_version"]


class MigSummarySerializer(api.ModelSerializer):
    """Per physical GPU; the counts come from the view's annotations."""

    gpu_instance_count = serializers.IntegerField(source="gi_count", read_only=True)
    compute_instance_count = serializers.IntegerField(source="ci_count", read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "index",
            "uuid",
            "mig_enabled",
            "mig_pending_enabled",
            "gpu_instance_count",
            "compute_instance_count",
        ]


@extend_schema_field({"type": "array", "items": {"type": "array", "items": {"type": "string"}}})
class MatrixField(serializers.ListField):
    pass


class TopologySerializer(api.Serializer):
    """A ``TopologyMatrix``: ``matrix[i][j]`` is the ``topo -m`` link name between ``gpus[i]``
    and ``gpus[j]`` ("X" on the diagonal), ``nvlink_counts[i][j]`` its NVLink count,
    ``nic_links[i][k]`` how ``gpus[i]`` reaches network adapter ``nics[k]`` (PIX ... SYS)."""

    node = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField())
    matrix = MatrixField()
    nvlink_counts = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField())
    )
    numa_nodes = serializers.ListField(child=serializers.IntegerField(allow_null=True))
    gpu_numa_nodes = serializers.ListField(
        child=serializers.IntegerField(allow_null=True),
        help_text="Each GPU's own NUMA node (topo -m GPU NUMA ID: Grace Hopper); null: N/A.",
    )
    cpu_affinity = serializers.ListField(child=serializers.CharField())
    nics = serializers.ListField(child=serializers.CharField())
    nic_links = MatrixField()


class DiscoveredGpuSerializer(api.Serializer):
    """A GPU of ``/gpu/discover``, from a fresh scan (a ``GpuScan``; ``driver_version`` in the
    context)."""

    index = serializers.IntegerField(source="facts.index")
    uuid = serializers.CharField(source="facts.uuid", allow_null=True)
    name = serializers.CharField(source="facts.name", allow_null=True)
    driverVersion = serializers.SerializerMethodField()  # camelCase: the seed's field names
    vbiosVersion = serializers.CharField(source="facts.vbios_version", allow_null=True)
    memoryTotalMB = serializers.IntegerField(source="facts.memory_total_mib", allow_null=True)
    memoryUsedMB = serializers.IntegerField(source="facts.memory_used_mib", allow_null=True)
    utilizationPercent = serializers.IntegerField(
        source="metrics.utilization_gpu_pct", allow_null=True
    )
    temperatureC = serializers.IntegerField(source="metrics.temperature_c", allow_null=True)
    smClockMHz = serializers.IntegerField(source="metrics.sm_clock_mhz", allow_null=True)
    computeMode = serializers.CharField(source="facts.compute_mode", allow_null=True)

    def get_driverVersion(self, gpu: GpuScan) -> str | None:
        return self.context["driver_version"]


class DiscoverMetaSerializer(api.Serializer):
    code = serializers.IntegerField()
    message = serializers.CharField()


class DiscoverSerializer(api.Serializer):
    # The metaclass moves declared fields off the class, so "data" does not shadow .data.
    data = DiscoveredGpuSerializer(many=True)  # type: ignore[assignment]
    meta = DiscoverMetaSerializer()
