"""Lookups PostgreSQL cannot run (a NUL in a query parameter or a path): a 400 naming the
parameter (JSON for the API, a plain-text page otherwise) or a 404, never the database's 500."""

from __future__ import annotations

import base64

import pytest
from django.test import Client
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from inventory.models import Node
from inventory.services import apply_discovery

pytestmark = pytest.mark.django_db

NUL = "Null characters are not allowed."


@pytest.fixture
def admin(client, admin_user, sim_scan, settings):
    settings.GPUADMIN_NODE_NAME = "dgx-01"
    apply_discovery("dgx-01", sim_scan("dgx-a100-40gb", "dgx-01"))
    Node.objects.update(last_heartbeat_at=timezone.now())
    client.force_login(admin_user)
    return client


API_QUERIES = [
    ("/api/gpu/devices", "node"),
    ("/api/gpu/driver", "node"),
    ("/gpu/mig/summary", "node"),
    ("/gpu/mig/instances", "node"),
    ("/gpu/topology", "node"),
    ("/gpu/discover", "node"),
    ("/api/v1/gpus/", "node"),
    ("/api/v1/nodes/", "hostname"),
    ("/api/v1/jobs/", "project"),
    ("/cluster/gpu-status", "node"),
    ("/queue", "limit"),
    ("/api/v1/jobs/", "anything"),  # a parameter no view reads is refused all the same
]


@pytest.mark.parametrize(("path", "param"), API_QUERIES)
def test_a_nul_in_an_api_query_parameter_is_a_json_400_naming_it(admin, path, param):
    before = AuditEvent.objects.count()
    response = admin.get(f"{path}?{param}=a%00b")
    assert response.status_code == 400
    assert response.json() == {param: [NUL]}
    assert AuditEvent.objects.count() == before


def test_a_nul_in_a_query_parameter_name_is_a_400_under_detail(admin):
    response = admin.get("/api/gpu/devices?a%00b=1")
    assert response.status_code == 400
    assert response.json() == {"detail": f"A query parameter's name: {NUL}"}


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/jobs/", "project"),
        ("/fleet/", "node"),
        ("/fleet/", "model"),
        ("/fleet/", "state"),
    ],
)
def test_a_nul_in_a_page_query_parameter_is_a_plain_400_naming_it(admin, path, param):
    response = admin.get(f"{path}?{param}=a%00b")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")
    assert response.content.decode() == f"{param}: {NUL}\n"


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/gpus/GPU-a%00b/",
        "/api/v1/nodes/dgx%00-01/",
        "/api/v1/nodes/dgx%00-01/topology/",
    ],
)
def test_a_nul_in_an_api_path_is_a_json_404(admin, path):
    response = admin.get(path)
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}
    assert admin.patch(path, {"label": "x"}, content_type="application/json").status_code in (
        404,
        405,
    )


@pytest.mark.parametrize(
    "path",
    ["/gpus/GPU-a%00b/", "/nodes/dgx%00-01/mig/", "/nodes/dgx%00-01/topology/"],
)
def test_a_nul_in_a_page_path_is_a_404(admin, path):
    assert admin.get(path).status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"label": "a\\u0000"}', "label"),
        ('{"notes": "\\ud800"}', "notes"),
        ('{"tags": ["ok", "a\\u0000"]}', "tags"),
        ('{"tags": ["\\ud800"]}', "tags"),
    ],
)
def test_catalog_patches_the_database_cannot_store_are_a_400_naming_the_field(admin, body, field):
    gpu_url = f"/api/v1/gpus/{Node.objects.get().gpus.first().uuid}/"
    for url in (gpu_url, "/api/v1/nodes/dgx-01/"):
        response = admin.patch(url, body, content_type="application/json")
        assert response.status_code == 400
        assert list(response.json()) == [field]
    assert not AuditEvent.objects.filter(event_type__endswith="catalog_changed").exists()


def test_basic_auth_with_a_nul_in_the_user_name_is_a_401(admin):
    credentials = base64.b64encode(b"adm\x00in:password").decode()
    response = Client().get("/api/v1/nodes/", HTTP_AUTHORIZATION=f"Basic {credentials}")
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid username/password."}


@pytest.mark.parametrize(
    "path", ["/queue/null%2Cnull", "/api/v1/allocations/0.5/", "/api/v1/nope/", "/gpu/nope"]
)
def test_a_url_no_api_route_takes_is_a_json_404(admin, path):
    response = admin.delete(path) if path.startswith("/queue/") else admin.get(path)
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


def test_a_url_no_page_takes_is_the_html_404(admin):
    response = admin.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("encoding", ["form", "multipart"])
def test_a_nul_in_a_form_or_multipart_body_is_a_400_naming_the_field(admin, encoding):
    uuid = Node.objects.get(hostname="dgx-01").gpus.order_by("index").first().uuid
    before = AuditEvent.objects.count()
    if encoding == "form":
        response = admin.patch(
            f"/api/v1/gpus/{uuid}/", "pool=a%00b", content_type="application/x-www-form-urlencoded"
        )
    else:
        response = admin.patch(
            f"/api/v1/gpus/{uuid}/",
            encode_multipart(BOUNDARY, {"pool": "a\x00b"}),
            content_type=MULTIPART_CONTENT,
        )
    assert response.status_code == 400
    assert response.json() == {"pool": [NUL]}
    assert AuditEvent.objects.count() == before
