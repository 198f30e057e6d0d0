"""What confines a node's jobs, in the catalog: each GPU's device minor number (from NVML), the
node's isolation and why (from its agent), whether an admin allows unconfined jobs on it (admin,
API, audited), and where people see it (node page, fleet cards, API)."""

from __future__ import annotations

import pytest

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node
from inventory.services import apply_discovery, record_node_isolation
from tests.inventory.pages import add_node, unique_host
from tests.inventory.test_pages_fleet import card

pytestmark = pytest.mark.django_db

WHY = "not root, and /sys/fs/cgroup/gpuadmin is not delegated to this agent"
CONFINED = "cgroup v2 (devices, kill, cpu_time) + cgroup v1 (cpuset, memory, pids)"


@pytest.fixture
def dgx(sim_scan) -> Node:
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))
    return Node.objects.get(hostname="dgx-01")


def test_discovery_stores_each_gpus_device_minor_number(dgx, sim_scan, admin_client):
    gpus = Gpu.objects.filter(node=dgx).order_by("index")
    assert list(gpus.values_list("minor_number", flat=True)) == list(range(8))
    # A catalog from before minor numbers: the next scan fills them in, audited.
    gpus.update(minor_number=None)
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))
    assert list(gpus.values_list("minor_number", flat=True)) == list(range(8))
    first = gpus.first()
    assert first is not None
    changed = AuditEvent.objects.filter(target_id=first.uuid).latest("pk")
    assert (changed.before["minor_number"], changed.after["minor_number"]) == (None, 0)
    assert admin_client.get(f"/api/v1/gpus/{first.uuid}/").json()["minor_number"] == 0
    form = admin_client.get(f"/admin/inventory/gpu/{first.pk}/change/").context["adminform"]
    assert "minor_number" in form.readonly_fields


def test_an_agents_word_on_isolation_is_stored_and_audited_once_per_change(dgx):
    assert record_node_isolation("dgx-01", "none", WHY)
    assert not record_node_isolation("dgx-01", "none", WHY)
    assert not record_node_isolation("nowhere", "none", WHY)
    assert record_node_isolation("dgx-01", CONFINED, "")
    rows = AuditEvent.objects.filter(event_type="node.isolation_changed").order_by("pk")
    assert [(row.actor_name, row.before, row.after) for row in rows] == [
        (
            "agent",
            {"isolation": "", "isolation_reason": ""},
            {"isolation": "none", "isolation_reason": WHY},
        ),
        (
            "agent",
            {"isolation": "none", "isolation_reason": WHY},
            {"isolation": CONFINED, "isolation_reason": ""},
        ),
    ]
    dgx.refresh_from_db()
    assert (dgx.isolation, dgx.isolation_reason, dgx.unconfined) == (CONFINED, "", False)


def _admin_post(admin_client, node: Node, **values: object):
    form = {
        "cpus_reserved": node.cpus_reserved,
        "memory_reserved_mib": node.memory_reserved_mib,
        "label": "",
        "notes": "",
        "tags": "",
        "gpus-TOTAL_FORMS": "0",
        "gpus-INITIAL_FORMS": "0",
        "gpus-MIN_NUM_FORMS": "0",
        "gpus-MAX_NUM_FORMS": "1000",
        **values,
    }
    return admin_client.post(f"/admin/inventory/node/{node.pk}/change/", form)


def test_an_admin_allows_unconfined_jobs_on_a_node_audited(admin_client, dgx):
    page = admin_client.get(f"/admin/inventory/node/{dgx.pk}/change/")
    form = page.context["adminform"].form
    assert "allow_unconfined" in form.fields
    assert form.fields["allow_unconfined"].label == "Allow unconfined jobs"
    assert not {"isolation", "isolation_reason"} & set(form.fields)  # the agent's to say

    response = _admin_post(admin_client, dgx, allow_unconfined="on", isolation="nothing")

    assert response.status_code == 302, response.content[:2000]
    dgx.refresh_from_db()
    assert (dgx.allow_unconfined, dgx.isolation) == (True, "")
    event = AuditEvent.objects.get(event_type="node.catalog_changed")
    assert (event.actor_name, event.before, event.after) == (
        "admin",
        {"allow_unconfined": False},
        {"allow_unconfined": True},
    )


def test_the_api_shows_isolation_and_admins_patch_allow_unconfined(admin_client, dgx):
    record_node_isolation("dgx-01", "none", WHY)
    url = "/api/v1/nodes/dgx-01/"
    body = admin_client.get(url).json()
    assert {name: body[name] for name in ("isolation", "isolation_reason", "allow_unconfined")} == {
        "isolation": "none",
        "isolation_reason": WHY,
        "allow_unconfined": False,
    }

    response = admin_client.patch(
        url, {"allow_unconfined": True, "isolation": CONFINED}, content_type="application/json"
    )

    assert response.status_code == 200
    assert (response.json()["allow_unconfined"], response.json()["isolation"]) == (True, "none")
    event = AuditEvent.objects.get(event_type="node.catalog_changed")
    assert event.after == {"allow_unconfined": True}
    refused = admin_client.patch(
        url, {"allow_unconfined": "sometimes"}, content_type="application/json"
    )
    assert refused.status_code == 400
    assert "allow_unconfined" in refused.json()


def test_the_node_page_says_what_confines_its_jobs(client):
    host = unique_host()
    add_node(host)
    assert "not reported" in client.get(f"/nodes/{host}/").content.decode()
    record_node_isolation(host, "none", WHY)
    Node.objects.filter(hostname=host).update(allow_unconfined=True)

    html = client.get(f"/nodes/{host}/").content.decode()

    assert "<dt>Isolation</dt>" in html
    assert f"none: {WHY}" in html
    assert "Unconfined jobs allowed" in html
    record_node_isolation(host, CONFINED, "")
    Node.objects.filter(hostname=host).update(allow_unconfined=False)
    html = client.get(f"/nodes/{host}/").content.decode()
    assert CONFINED in html and "Unconfined jobs allowed" not in html


def test_the_fleet_flags_a_node_that_confines_nothing(client):
    bare, confined, unknown = unique_host(), unique_host(), unique_host()
    for host in (bare, confined, unknown):
        add_node(host)
    record_node_isolation(bare, "none", WHY)
    record_node_isolation(confined, CONFINED, "")

    html = client.get("/fleet/").content.decode()

    badge = f'title="Jobs here run unconfined: {WHY}">not confined</span>'
    assert badge in card(html, bare)
    assert "not confined" not in card(html, confined)
    assert "not confined" not in card(html, unknown)
