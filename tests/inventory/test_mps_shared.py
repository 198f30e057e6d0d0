"""``Gpu.mps_shared``: a catalog field (API and admin, audited) that takes the GPU out of the
whole-GPU rule (``usability.Reason.MPS``) and shows on the fleet page."""

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node
from inventory.services import apply_discovery
from inventory.signals import gpus_became_schedulable

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu(sim_scan) -> Gpu:
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))
    Node.objects.filter(hostname="dgx-01").update(last_heartbeat_at=timezone.now())
    return Gpu.objects.filter(node__hostname="dgx-01", mig_enabled=False).order_by("index")[0]


def test_api_patch_shares_the_gpu_audited_and_out_of_the_whole_gpu_rule(admin_client, gpu):
    assert Gpu.objects.schedulable().filter(pk=gpu.pk).exists()
    url = f"/api/v1/gpus/{gpu.uuid}/"
    response = admin_client.patch(url, {"mps_shared": True}, content_type="application/json")
    assert response.status_code == 200, response.json()
    assert response.json()["mps_shared"] is True
    event = AuditEvent.objects.get(event_type="gpu.catalog_changed")
    assert (event.before, event.after) == ({"mps_shared": False}, {"mps_shared": True})
    assert not Gpu.objects.schedulable().filter(pk=gpu.pk).exists()
    gpu.refresh_from_db()
    assert gpu.unusable().code == "mps"
    response = admin_client.patch(url, {"mps_shared": "maybe"}, content_type="application/json")
    assert set(response.json()) == {"mps_shared"}
    assert AuditEvent.objects.filter(event_type="gpu.catalog_changed").count() == 1


def test_unsharing_announces_the_gpu_schedulable(
    admin_user, gpu, django_capture_on_commit_callbacks
):
    from inventory.services import update_catalog

    update_catalog(gpu, {"mps_shared": True}, actor=admin_user)
    heard: list[list[int]] = []

    def receiver(sender, gpu_ids, **kwargs):
        heard.append(gpu_ids)

    gpus_became_schedulable.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            update_catalog(gpu, {"mps_shared": False}, actor=admin_user)
    finally:
        gpus_became_schedulable.disconnect(receiver)
    assert heard == [[gpu.pk]]


def test_a_node_has_no_mps_field(admin_client, gpu):
    response = admin_client.patch(
        "/api/v1/nodes/dgx-01/", {"mps_shared": True}, content_type="application/json"
    )
    assert response.status_code == 200
    assert "mps_shared" not in response.json()
    assert not AuditEvent.objects.filter(event_type="node.catalog_changed").exists()


def test_the_fleet_page_counts_mps_gpus(admin_client, gpu):
    Gpu.objects.filter(pk=gpu.pk).update(mps_shared=True)
    html = admin_client.get("/fleet/").content.decode()
    assert 'data-count="mps">1<' in html
    assert "shared through MPS: only shares of it can be given" in html


def test_a_gpu_in_mig_mode_is_not_mps_shared_by_any_door(admin_client, gpu):
    mig = Gpu.objects.filter(node__hostname="dgx-01", mig_enabled=True).order_by("index")[0]
    said = "a GPU in MIG mode is shared through its MIG devices, not MPS"
    response = admin_client.patch(
        f"/api/v1/gpus/{mig.uuid}/", {"mps_shared": True}, content_type="application/json"
    )
    assert (response.status_code, response.json()) == (400, {"mps_shared": [said]})
    changed = admin_client.post(
        "/admin/inventory/gpu/",
        {"action": "share_through_mps", "_selected_action": [mig.pk, gpu.pk]},
        follow=True,
    )
    assert f"1 of 2 GPUs changed. Left as they are: {mig} ({said})." in changed.content.decode()
    assert list(Gpu.objects.filter(mps_shared=True)) == [gpu]
    form = admin_client.get(f"/admin/inventory/gpu/{mig.pk}/change/").context["adminform"].form
    refused = admin_client.post(
        f"/admin/inventory/gpu/{mig.pk}/change/",
        {**{k: v for k, v in form.initial.items() if v is not None}, "mps_shared": "on"},
    )
    assert refused.context["adminform"].form.errors["mps_shared"] == [said]
    assert AuditEvent.objects.filter(event_type="gpu.catalog_changed").count() == 1
