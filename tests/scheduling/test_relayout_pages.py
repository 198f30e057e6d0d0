"""The MIG re-layout on the GPU page (a live section, the admins' form and cancel button) and
in the admin (add = request, an action to cancel), all through ``scheduling.sharing.relayout``."""

from __future__ import annotations

import pytest

from gpuadmin.audit.models import AuditEvent
from scheduling.models import MigRelayout, RelayoutState
from scheduling.sharing import relayout
from tests.inventory.conftest import node  # noqa: F401 - the simulated node fixture

pytestmark = pytest.mark.django_db


def test_the_gpu_page_shows_the_form_to_admins_only(node, admin_client, client, django_user_model):  # noqa: F811
    gpu = node.gpu(0)
    html = admin_client.get(f"/gpus/{gpu.uuid}/").content.decode()
    assert 'id="mig-relayout"' in html
    assert f'action="/gpus/{gpu.uuid}/mig-relayout/new/"' in html
    assert '<option value="all-1g.5gb">' in html and '<option value="balanced">' in html
    client.force_login(django_user_model.objects.create_user("viewer"))
    html = client.get(f"/gpus/{gpu.uuid}/").content.decode()
    assert 'id="mig-relayout"' in html and "mig-relayout/new/" not in html
    response = client.post(f"/gpus/{gpu.uuid}/mig-relayout/new/", {"layout_name": "balanced"})
    assert response.status_code == 403
    assert not MigRelayout.objects.exists()
    client.logout()  # anonymous people read the GPU page, not its re-layouts (nor their poll)
    assert 'id="mig-relayout"' not in client.get(f"/gpus/{gpu.uuid}/").content.decode()


def test_an_admin_asks_and_the_section_polls_while_it_is_open(node, admin_client):  # noqa: F811
    gpu = node.gpu(0)
    response = admin_client.post(
        f"/gpus/{gpu.uuid}/mig-relayout/new/",
        {"layout_name": "custom", "custom_layout": "4g.20gb, 2g.10gb@4, 1g.5gb@6", "preempt": "on"},
    )
    assert response.status_code == 302
    item = MigRelayout.objects.get()
    assert (item.layout_name, item.preempt, item.state) == ("custom", True, RelayoutState.DRAINING)
    assert [(i["profile"], i["start"]) for i in item.layout] == [
        ("4g.20gb", 0),
        ("2g.10gb", 4),
        ("1g.5gb", 6),
    ]
    live = admin_client.get(f"/gpus/{gpu.uuid}/mig-relayout/", HTTP_HX_REQUEST="true")
    html = live.content.decode()
    assert 'hx-trigger="every 2s"' in html
    assert '<li class="current" aria-current="step">draining</li>' in html
    assert f'action="/mig-relayouts/{item.pk}/cancel/"' in html
    relayout.advance(item.pk)
    relayout.advance(item.pk)
    relayout.advance(item.pk)
    html = admin_client.get(f"/gpus/{gpu.uuid}/mig-relayout/").content.decode()
    assert "hx-trigger" not in html  # done: the poll stops
    assert "<strong>Done</strong>" in html


def test_refusals_show_naming_the_field(node, admin_client):  # noqa: F811
    gpu = node.gpu(0)
    response = admin_client.post(
        f"/gpus/{gpu.uuid}/mig-relayout/new/",
        {"layout_name": "custom", "custom_layout": "3g.20gb@2"},
        follow=True,
    )
    assert "layout: item 1: 3g.20gb starts at 0, 4, not 2" in response.content.decode()
    assert not MigRelayout.objects.exists()


def test_cancel_from_the_page(node, admin_client, admin_user):  # noqa: F811
    item = relayout.request(node.gpu(0), "balanced", actor=admin_user)
    response = admin_client.post(f"/mig-relayouts/{item.pk}/cancel/")
    assert response.status_code == 302
    item.refresh_from_db()
    assert item.state == RelayoutState.CANCELED


def test_the_admin_adds_through_the_workflow_and_cancels(node, admin_client):  # noqa: F811
    gpu = node.gpu(1)
    response = admin_client.post(
        "/admin/scheduling/migrelayout/add/",
        {"gpu": gpu.pk, "layout_name": "all-1g.5gb", "custom_layout": ""},
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    item = MigRelayout.objects.get()
    assert (item.gpu_id, item.state) == (gpu.pk, RelayoutState.DRAINING)
    assert AuditEvent.objects.filter(event_type="mig_relayout.draining").count() == 1
    refused = admin_client.post(
        "/admin/scheduling/migrelayout/add/",
        {"gpu": node.gpu(0).pk, "layout_name": "balanced", "custom_layout": ""},
    )
    assert "has a MIG re-layout under way (GPU 1)" in refused.content.decode()
    response = admin_client.post(
        "/admin/scheduling/migrelayout/",
        {"action": "cancel_relayouts", "_selected_action": [item.pk]},
    )
    assert response.status_code == 302
    item.refresh_from_db()
    assert item.state == RelayoutState.CANCELED
