"""Resolved API tokens are cached per process, and every change that matters invalidates them:
a revoked token, a deactivated user or a changed role takes effect on the very next request."""

from __future__ import annotations

import socket

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from gpuadmin.access import tokens
from gpuadmin.access.models import Membership, Role
from gpuadmin.access.services import create_token, revoke_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def bearer(make_user, fleet):
    """An API client for ``alice`` (a user) signed in with a token, and alice."""
    alice = make_user("alice")
    _, key = create_token(alice, "laptop")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client, alice


def token_lookups(client: APIClient, path: str = "/api/v1/jobs/") -> tuple[int, int]:
    """The response's status and how many times it read the token table."""
    with CaptureQueriesContext(connection) as queries:
        status = client.get(path).status_code
    return status, sum('FROM "access_apitoken"' in q["sql"] for q in queries)


def test_a_token_is_read_from_the_database_once_then_from_the_cache(bearer):
    client, _ = bearer
    assert token_lookups(client) == (200, 1)
    assert token_lookups(client) == (200, 0)
    assert token_lookups(client) == (200, 0)


def test_each_request_gets_its_own_copies(bearer):
    client, _ = bearer
    first, second = client.get("/api/v1/jobs/"), client.get("/api/v1/jobs/")
    user_a, user_b = first.wsgi_request.user, second.wsgi_request.user
    assert user_a == user_b and user_a is not user_b
    assert first.wsgi_request.auth is not second.wsgi_request.auth
    user_a.username = "mallory"  # what one request does to its user stays there
    assert client.get("/api/v1/tokens/").wsgi_request.user.username == "alice"


def test_revoking_takes_effect_on_the_next_request(bearer):
    client, alice = bearer
    assert token_lookups(client) == (200, 1)
    assert revoke_token(alice.api_tokens.get(), actor=alice)
    assert client.get("/api/v1/jobs/").status_code == 401


def test_deactivating_the_user_takes_effect_on_the_next_request(bearer):
    client, alice = bearer
    assert token_lookups(client) == (200, 1)
    alice.is_active = False
    alice.save()
    assert client.get("/api/v1/jobs/").status_code == 401


def test_a_role_change_takes_effect_on_the_next_request(bearer):
    client, alice = bearer
    submit = {"command": "true"}
    assert client.post("/queue/submit", submit, format="json").status_code == 201
    membership = Membership.objects.create(user=alice, role=Role.VIEWER)
    assert client.post("/queue/submit", submit, format="json").status_code == 403
    membership.delete()
    assert client.post("/queue/submit", submit, format="json").status_code == 201


def test_a_change_that_bypasses_signals_is_seen_after_the_cache_age(bearer, monkeypatch):
    client, alice = bearer
    now = [1000.0]
    monkeypatch.setattr(tokens.time, "monotonic", lambda: now[0])
    assert token_lookups(client) == (200, 1)
    type(alice).objects.filter(pk=alice.pk).update(is_active=False)  # no post_save
    assert client.get("/api/v1/jobs/").status_code == 200  # still cached: the documented bound
    now[0] += tokens.settings.GPUADMIN_TOKEN_CACHE_S
    assert client.get("/api/v1/jobs/").status_code == 401


def test_without_redis_every_request_reads_the_database(bearer, monkeypatch):
    client, _ = bearer
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = redis.Redis(port=sock.getsockname()[1], socket_connect_timeout=0.2)
        monkeypatch.setattr(tokens.redis_client, "client", lambda: dead)
        assert token_lookups(client) == (200, 1)
        assert token_lookups(client) == (200, 1)


def test_caching_can_be_turned_off(bearer, settings):
    client, _ = bearer
    settings.GPUADMIN_TOKEN_CACHE_S = 0
    assert token_lookups(client) == (200, 1)
    assert token_lookups(client) == (200, 1)
