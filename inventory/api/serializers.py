"""API serializers: catalog fields are writable (staff), discovered fields are read-only."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import models, transaction
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpuadmin.audit.services import record
from inventory.models import Gpu, MigInstance, Node, Pool

CATALOG_FIELDS = ("label", "notes", "tags", "pool", "owner")


class CatalogSerializer(serializers.ModelSerializer):
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
        child=serializers.CharField(max_length=50, allow_blank=False), required=False
    )

    def update(self, instance: models.Model, validated_data: dict[str, Any]) -> models.Model:
        request = self.context["request"]
        return save_catalog(instance, validated_data, actor=request.user)


def catalog_snapshot(obj: models.Model, names: list[str]) -> dict[str, Any]:
    """Catalog values as the audit log stores them (pool by name, owner by username)."""
    values: dict[str, Any] = {}
    for name in names:
        value = getattr(obj, name)
        if name == "pool":
            value = value.name if value else None
        elif name == "owner":
            value = value.get_username() if value else None
        elif name == "tags":
            value = list(value)
        values[name] = value
    return values


def save_catalog(
    obj: models.Model, changes: dict[str, Any], *, actor: AbstractBaseUser
) -> models.Model:
    """Write people-owned fields of a node or GPU and audit what actually changed."""
    names = [name for name in CATALOG_FIELDS if name in changes]
    before = catalog_snapshot(obj, names)
    for name in names:
        setattr(obj, name, changes[name])
    after = catalog_snapshot(obj, names)
    changed = [name for name in names if before[name] != after[name]]
    if not changed:
        return obj
    target_id = obj.uuid if isinstance(obj, Gpu) else obj.pk
    with transaction.atomic():
        obj.save(update_fields=changed)
        record(
            f"{obj._meta.model_name}.catalog_changed",
            actor=actor,
            target=obj,
            target_id=target_id,
            before={name: before[name] for name in changed},
            after={name: after[name] for name in changed},
        )
    return obj


class NodeSerializer(CatalogSerializer):
    reachable = serializers.SerializerMethodField()
    gpu_count = serializers.IntegerField(read_only=True, help_text="GPUs present on the node.")
    missing_gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "state",
            "reachable",
            *Node.DISCOVERED_FIELDS,
            "gpu_count",
            "missing_gpu_count",
            *CATALOG_FIELDS,
        ]
        read_only_fields = [
            name for name in fields if name not in CATALOG_FIELDS and name != "reachable"
        ]

    def get_reachable(self, obj: Node) -> bool:
        return obj.is_reachable()


class GpuSerializer(CatalogSerializer):
    node = serializers.SlugRelatedField(slug_field="hostname", read_only=True)
    missing = serializers.BooleanField(source="is_missing", read_only=True)
    mig_instance_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "uuid",
            "node",
            "index",
            "name",
            "state",
            "missing",
            "serial",
            "pci_bus_id",
            "pci_device_id",
            "board_part_number",
            "vbios_version",
            "architecture",
            "compute_capability",
            "memory_total_mib",
            "power_limit_default_w",
            "numa_node",
            "cpu_affinity",
            "nvlink_count",
            "mig_capable",
            "mig_enabled",
            "mig_pending_enabled",
            "mig_instance_count",
            "error_message",
            "first_seen_at",
            "last_seen_at",
            "missing_since",
            *CATALOG_FIELDS,
        ]
        read_only_fields = [name for name in fields if name not in CATALOG_FIELDS]


class MigInstanceSerializer(serializers.ModelSerializer):
    gpu = serializers.SlugRelatedField(slug_field="uuid", read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)
    node = serializers.CharField(source="gpu.node.hostname", read_only=True)

    class Meta:
        model = MigInstance
        fields = [
            "id",
            "gpu",
            "gpu_index",
            "node",
            *MigInstance.DISCOVERED_FIELDS,
        ]
        read_only_fields = fields


# Seed-compatible response shapes (documentation only; the views build plain dicts).


class DeviceSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    name = serializers.CharField()
    total_memory_mb = serializers.IntegerField()
    free_memory_mb = serializers.IntegerField(allow_null=True)
    used_memory_mb = serializers.IntegerField(allow_null=True)
    utilization_percent = serializers.IntegerField(allow_null=True)
    temperature_c = serializers.IntegerField(allow_null=True)
    is_available = serializers.BooleanField()
    error_message = serializers.CharField(allow_null=True)


class DeviceListSerializer(serializers.Serializer):
    devices = DeviceSerializer(many=True)
    count = serializers.IntegerField()


class DriverSerializer(serializers.Serializer):
    driver_version = serializers.CharField()
    cuda_driver_version = serializers.CharField()
    nvml_version = serializers.CharField()


class MigSummarySerializer(serializers.Serializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    mig_enabled = serializers.BooleanField()
    mig_pending_enabled = serializers.BooleanField()
    gpu_instance_count = serializers.IntegerField()
    compute_instance_count = serializers.IntegerField()


class MigInstanceRowSerializer(serializers.Serializer):
    gpu_index = serializers.IntegerField()
    gpu_uuid = serializers.CharField()
    gi_id = serializers.IntegerField()
    ci_id = serializers.IntegerField()
    profile_name = serializers.CharField()
    ci_profile_name = serializers.CharField()
    placement_start = serializers.IntegerField()
    placement_size = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    sm_count = serializers.IntegerField()
    uuid = serializers.CharField(allow_null=True)


@extend_schema_field({"type": "array", "items": {"type": "array", "items": {"type": "string"}}})
class MatrixField(serializers.ListField):
    pass


class TopologySerializer(serializers.Serializer):
    node = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField())
    matrix = MatrixField()
    numa_nodes = serializers.ListField(child=serializers.IntegerField(allow_null=True))
    cpu_affinity = serializers.ListField(child=serializers.CharField())


class NodeErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    node = serializers.CharField()
