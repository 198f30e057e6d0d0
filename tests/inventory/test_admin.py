"""The catalog admin: discovered facts read-only, catalog edits and state actions audited."""

import re

import pytest
from django.contrib.auth import get_user_model

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node, Pool
from inventory.services import apply_discovery

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(sim_scan):
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))
    apply_discovery("box-01", sim_scan("pcie-l40s-4x", "box-01"))


def test_the_admin_index_names_models_properly_and_promises_nothing_missing(admin_client):
    html = admin_client.get("/admin/").content.decode()
    for name in ("GPUs", "GPU links", "MIG instances", "Nodes", "Pools"):
        assert f">{name}</a>" in html, name
    assert "Gpu" not in html and "Mig" not in html
    assert 'href="/admin/scheduling/reservation/"' in html  # reservations exist now
    assert 'href="/admin/scheduling/usageday/"' in html  # accounting's day rows, read-only


def test_gpu_list_filters_and_search(admin_client, fleet):
    assert admin_client.get("/admin/inventory/gpu/").status_code == 200
    listed = admin_client.get("/admin/inventory/gpu/?mig_enabled__exact=1")
    assert listed.context["cl"].result_count == 2
    assert admin_client.get("/admin/inventory/gpu/?missing=no").context["cl"].result_count == 12
    uuid = Gpu.objects.get(node__hostname="box-01", index=3).uuid
    found = admin_client.get(f"/admin/inventory/gpu/?q={uuid}")
    assert [gpu.uuid for gpu in found.context["cl"].result_list] == [uuid]
    by_node = admin_client.get("/admin/inventory/gpu/?q=box-01")
    assert by_node.context["cl"].result_count == 4


def test_gpu_list_leads_with_node_and_index_and_shows_a_short_uuid_last(admin_client, fleet):
    html = admin_client.get("/admin/inventory/gpu/").content.decode()
    headers = re.findall(r'<th scope="col" class="(?:sortable )?column-(\w+)', html)
    assert headers[0] == "node_and_index" and headers[-1] == "short_uuid", headers
    first = re.search(r'<th class="field-node_and_index"><a [^>]*>([^<]*)</a>', html)
    assert first is not None and first.group(1) == "box\u201101\u00a0GPU\u00a00"
    uuid = Gpu.objects.get(node__hostname="box-01", index=0).uuid
    cell = re.search(rf'<td class="field-short_uuid"><span title="{uuid}">([^<]*)</span>', html)
    assert cell is not None and cell.group(1) == uuid[:12].replace("-", "\u2011") + "…"
    assert f">{uuid}<" not in html  # the whole UUID is no longer a cell to wrap


def test_gpu_list_query_count_does_not_grow_with_gpus(
    admin_client, fleet, django_assert_max_num_queries
):
    with django_assert_max_num_queries(12):
        admin_client.get("/admin/inventory/gpu/")


def test_discovered_fields_are_read_only_and_catalog_edits_are_audited(admin_client, fleet):
    gpu = Gpu.objects.get(node__hostname="dgx-01", index=0)
    pool = Pool.objects.create(name="vision")
    owner = get_user_model().objects.create_user("alice")
    page = admin_client.get(f"/admin/inventory/gpu/{gpu.pk}/change/")
    form = page.context["adminform"].form
    assert set(form.fields) == {"label", "owner", "pool", "notes", "tags", "mps_shared"}

    response = admin_client.post(
        f"/admin/inventory/gpu/{gpu.pk}/change/",
        {
            "label": "team-a",
            "owner": owner.pk,
            "pool": pool.pk,
            "notes": "",
            "tags": "nlp,big",
            "name": "tampered",  # a discovered field: ignored
            "mig_instances-TOTAL_FORMS": "3",
            "mig_instances-INITIAL_FORMS": "3",
            "mig_instances-MIN_NUM_FORMS": "0",
            "mig_instances-MAX_NUM_FORMS": "1000",
            **{
                f"mig_instances-{i}-id": pk
                for i, pk in enumerate(gpu.mig_instances.values_list("pk", flat=True))
            },
            **{f"mig_instances-{i}-gpu": gpu.pk for i in range(3)},
        },
    )
    assert response.status_code == 302, response.content[:2000]
    gpu.refresh_from_db()
    assert (gpu.label, gpu.owner, gpu.pool, gpu.tags) == ("team-a", owner, pool, ["nlp", "big"])
    assert gpu.name == "NVIDIA A100-SXM4-40GB"
    event = AuditEvent.objects.get(event_type="gpu.catalog_changed")
    assert event.target_id == gpu.uuid
    assert event.before == {"label": "", "owner": None, "pool": None, "tags": []}
    assert event.after == {
        "label": "team-a",
        "owner": "alice",
        "pool": "vision",
        "tags": ["nlp", "big"],
    }


def test_state_actions_go_through_the_audited_service(admin_client, fleet):
    """(The reason's intermediate page and refusals: tests/inventory/test_maintenance.py.)"""
    pks = list(Gpu.objects.filter(node__hostname="box-01").values_list("pk", flat=True))
    response = admin_client.post(
        "/admin/inventory/gpu/",
        {"action": "set_draining", "_selected_action": pks[:2], "apply": "1", "reason": "bios"},
        follow=True,
    )
    assert "Drain selected GPUs: 2 done." in response.content.decode()
    assert sorted(Gpu.objects.filter(state="draining").values_list("pk", flat=True)) == pks[:2]
    events = AuditEvent.objects.filter(event_type="gpu.state_changed")
    assert events.count() == 2
    assert {(e.actor_name, e.before["state"], e.after["state"], e.message) for e in events} == {
        ("admin", "available", "draining", "bios")
    }
    admin_client.post(
        "/admin/inventory/node/",
        {
            "action": "set_offline",
            "_selected_action": [Node.objects.get(hostname="dgx-01").pk],
            "apply": "1",
            "reason": "rack",
        },
    )
    assert Node.objects.get(hostname="dgx-01").state == "offline"
    assert AuditEvent.objects.filter(event_type="node.state_changed").count() == 1


def test_gpus_cannot_be_added_or_deleted_in_the_admin(admin_client, fleet):
    gpu = Gpu.objects.first()
    assert admin_client.get("/admin/inventory/gpu/add/").status_code == 403
    assert admin_client.post(f"/admin/inventory/gpu/{gpu.pk}/delete/").status_code == 403
    assert admin_client.get("/admin/inventory/node/add/").status_code == 403


def test_pools_are_made_changed_and_deleted_audited_and_only_when_empty(admin_client, fleet):
    assert admin_client.post("/admin/inventory/pool/add/", {"name": "a100"}).status_code == 302
    pool = Pool.objects.get(name="a100")
    url = f"/admin/inventory/pool/{pool.pk}/"
    changed = admin_client.post(f"{url}change/", {"name": "a100", "description": "team A"})
    assert changed.status_code == 302
    admin_client.post(f"{url}change/", {"name": "a100", "description": "team A"})  # the same
    Node.objects.filter(hostname="dgx-01").update(pool=pool)
    refused = admin_client.post(f"{url}delete/", {"post": "yes"})
    assert refused.status_code == 200 and "Cannot delete pool" in refused.content.decode()
    Node.objects.filter(hostname="dgx-01").update(pool=None)
    assert admin_client.post(f"{url}delete/", {"post": "yes"}).status_code == 302
    assert not Pool.objects.exists()
    rows = AuditEvent.objects.filter(event_type__startswith="pool.").order_by("pk")
    assert [(row.event_type, row.before, row.after) for row in rows] == [
        ("pool.created", None, {"name": "a100", "description": ""}),
        ("pool.changed", {"description": ""}, {"description": "team A"}),
        ("pool.deleted", {"name": "a100", "description": "team A"}, None),
    ]


def test_pools_deleted_from_the_list_are_audited_each(admin_client):
    pools = [Pool.objects.create(name=name) for name in ("a", "b")]
    response = admin_client.post(
        "/admin/inventory/pool/",
        {"action": "delete_selected", "_selected_action": [p.pk for p in pools], "post": "yes"},
    )
    assert response.status_code == 302
    assert not Pool.objects.exists()
    deleted = AuditEvent.objects.filter(event_type="pool.deleted")
    assert sorted(row.before["name"] for row in deleted) == ["a", "b"]


def test_gpus_are_shared_through_mps_in_bulk_audited(admin_client, fleet):
    pks = list(Gpu.objects.filter(node__hostname="box-01").values_list("pk", flat=True))
    Gpu.objects.filter(pk=pks[0]).update(mps_shared=True)  # already shared: no change
    response = admin_client.post(
        "/admin/inventory/gpu/",
        {"action": "share_through_mps", "_selected_action": pks},
        follow=True,
    )
    assert "3 of 4 GPUs changed." in response.content.decode()
    assert set(Gpu.objects.filter(mps_shared=True).values_list("pk", flat=True)) == set(pks)
    changes = AuditEvent.objects.filter(event_type="gpu.catalog_changed")
    assert [(e.before, e.after) for e in changes] == [
        ({"mps_shared": False}, {"mps_shared": True})
    ] * 3
    admin_client.post(
        "/admin/inventory/gpu/", {"action": "stop_sharing_through_mps", "_selected_action": pks}
    )
    assert not Gpu.objects.filter(mps_shared=True).exists()
