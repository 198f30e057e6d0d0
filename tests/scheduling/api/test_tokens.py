"""API tokens: shown once, stored hashed, used as a bearer, revocable."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from gpuadmin.access.models import ApiToken
from tests.scheduling.api.conftest import events

pytestmark = pytest.mark.django_db


def test_create_use_and_revoke_a_token(api_as, fleet):
    alice = api_as("alice")
    created = alice.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    assert created.status_code == 201
    body = created.json()
    key = body["key"]
    assert key.startswith("gpa_") and body["key_prefix"] == key[:8]
    token = ApiToken.objects.get()
    assert token.digest == ApiToken.hash(key) and key not in str(token.__dict__)
    listed = alice.get("/api/v1/tokens/").json()["results"]
    assert [(t["name"], t["key_prefix"], t["revoked_at"]) for t in listed] == [
        ("laptop", key[:8], None)
    ]
    assert "key" not in listed[0]

    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    submitted = bearer.post("/queue/submit", {"command": "true"}, format="json")
    assert (submitted.status_code, submitted.json()["owner"]) == (201, "alice")
    token.refresh_from_db()
    assert token.last_used_at is not None

    assert alice.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    refused = bearer.get("/api/v1/jobs/")
    assert refused.status_code == 401
    assert refused.json() == {"detail": "Invalid or revoked API token."}
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert events("access.apitoken") == ["token.created", "token.revoked"]


def test_tokens_are_private(api_as, fleet):
    alice, bob = api_as("alice"), api_as("bob")
    alice.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    token = ApiToken.objects.get()
    assert bob.get("/api/v1/tokens/").json()["count"] == 0
    assert bob.delete(f"/api/v1/tokens/{token.pk}/").status_code == 404
    assert ApiToken.objects.get().revoked_at is None


def test_bad_token_requests(api_as, db):
    alice = api_as("alice")
    assert alice.post("/api/v1/tokens/", {}, format="json").json() == {
        "name": ["This field is required."]
    }
    response = alice.post("/api/v1/tokens/", {"name": "x" * 101}, format="json")
    assert list(response.json()) == ["name"]
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Bearer gpa_not-a-key")
    assert stranger.get("/api/v1/jobs/").status_code == 401
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize(
    "header",
    [
        "B\u00e9arer gpa_x",  # a scheme that is not UTF-8 once read as the bytes sent
        "Bearer gpa_\u00e9",
        "Token \u00ff\u00fe",
        "Basic \u00e9\u00e9",
        "\u00e9",
    ],
)
def test_an_authorization_header_that_is_not_utf8_is_a_401(db, header):
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=header)
    response = stranger.get("/api/v1/jobs/")
    assert response.status_code == 401
    assert "detail" in response.json()
