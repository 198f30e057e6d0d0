"""Catalog fields people write have sizes: more is a 400 naming the field, nothing written."""

import pytest

from gpuadmin.audit.models import AuditEvent
from inventory.models import MAX_NOTES_CHARS, MAX_TAGS, Gpu
from inventory.services import apply_discovery

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu(sim_scan) -> Gpu:
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))
    return Gpu.objects.get(node__hostname="dgx-01", index=0)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tags": [f"t{i}" for i in range(MAX_TAGS + 1)]}, "tags"),
        ({"tags": ["x" * 51]}, "tags"),
        ({"notes": "n" * (MAX_NOTES_CHARS + 1)}, "notes"),
        ({"label": "l" * 101}, "label"),
    ],
)
def test_oversized_catalog_fields_are_a_400_naming_them(admin_client, gpu, body, field):
    response = admin_client.patch(
        f"/api/v1/gpus/{gpu.uuid}/", body, content_type="application/json"
    )
    assert response.status_code == 400
    assert list(response.json()) == [field]
    gpu.refresh_from_db()
    assert (gpu.tags, gpu.notes, gpu.label) == ([], "", "")
    assert not AuditEvent.objects.filter(event_type="gpu.catalog_changed").exists()


def test_the_limits_are_the_models_so_the_admin_keeps_them(admin_client, gpu):
    response = admin_client.patch(
        f"/api/v1/gpus/{gpu.uuid}/",
        {"tags": [f"t{i}" for i in range(MAX_TAGS)], "notes": "n" * MAX_NOTES_CHARS},
        content_type="application/json",
    )
    assert response.status_code == 200
    assert Gpu._meta.get_field("notes").formfield().max_length == MAX_NOTES_CHARS
    assert Gpu._meta.get_field("tags").formfield().max_length == MAX_TAGS
