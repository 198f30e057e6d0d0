import re

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from gpuadmin.audit.services import record

pytestmark = pytest.mark.django_db


def test_home_page_loads_vendored_htmx_and_reports_services(client):
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<script src="/static/django_htmx/htmx-2.min.js' in html
    # Nothing loaded from another host (a bare "cdn" search also matched random CSRF tokens).
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<dt>database</dt>" in html and '<dd class="ok">ok</dd>' in html
    assert "Recent changes" not in html  # the audit log is for staff only
    assert client.get("/static/django_htmx/htmx-2.min.js").status_code == 200


def test_home_page_says_what_each_node_runs_on(client):
    from inventory.models import Node

    Node.objects.create(hostname="dgx-01", model="dgx-a100-40gb", nvml_backend="sim")
    Node.objects.create(hostname="dgx-02", model="dgx-a100-40gb", nvml_backend="sim")
    Node.objects.create(hostname="gpu-07", model="8x NVIDIA H100 80GB HBM3", nvml_backend="real")
    Node.objects.create(hostname="old-01")
    html = client.get("/").content.decode()
    assert "NVML backend" not in html  # the web server's own setting says nothing of the fleet
    runs_on = re.findall(
        r'<span class="runs-on">(.*?)</span> <span class="muted">(.*?)</span>', html
    )
    assert runs_on == [
        ("backend not reported", "1 node"),
        ("real NVML: 8x NVIDIA H100 80GB HBM3", "1 node"),
        ("NVML simulator: dgx-a100-40gb", "2 nodes"),
    ]


def test_staff_see_recent_audit_events(admin_client):
    with transaction.atomic():
        record("gpu.drained", actor_name="alice", target_type="inventory.gpu", target_id="GPU-1")
    html = admin_client.get("/").content.decode()
    assert "Recent changes" in html
    assert "gpu.drained" in html and "alice" in html


def test_admin_login_works(client):
    get_user_model().objects.create_superuser("root", "root@example.org", "s3cret-pass-123")
    page = client.get("/admin/login/")
    assert page.status_code == 200
    response = client.post(
        "/admin/login/?next=/admin/", {"username": "root", "password": "s3cret-pass-123"}
    )
    assert response.status_code == 302 and response["Location"] == "/admin/"
    index = client.get("/admin/")
    assert index.status_code == 200
    assert "Audit events" in index.content.decode()


def test_audit_admin_is_read_only(admin_client):
    with transaction.atomic():
        event = record("gpu.drained", actor_name="alice", target_type="inventory.gpu")
    assert admin_client.get(f"/admin/audit/auditevent/{event.pk}/change/").status_code == 200
    assert admin_client.get("/admin/audit/auditevent/add/").status_code == 403
    assert admin_client.post(f"/admin/audit/auditevent/{event.pk}/delete/").status_code == 403


def test_health_probe(client):
    response = client.get("/-/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"] == "ok"
    assert body["redis"] == "ok"


def test_openapi_schema_and_docs_are_served(admin_client):
    assert admin_client.get("/api/schema/").status_code == 200
    docs = admin_client.get("/api/docs/")
    assert docs.status_code == 200
    assert "drf_spectacular_sidecar/swagger-ui-dist" in docs.content.decode()


@pytest.mark.django_db
def test_people_who_are_not_staff_log_in_to_the_pages(client, django_user_model):
    django_user_model.objects.create_user("dana", password="pw-dana-123")
    response = client.get("/jobs/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/jobs/"
    login = client.post(
        "/accounts/login/", {"username": "dana", "password": "pw-dana-123", "next": "/jobs/"}
    )
    assert (login.status_code, login["Location"]) == (302, "/jobs/")
    assert client.get("/jobs/").status_code == 200
    assert b"Log out dana" in client.get("/").content
