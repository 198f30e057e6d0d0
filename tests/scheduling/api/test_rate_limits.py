"""Per-user rate limits on submission (API and page) and token creation: a 429 with
Retry-After beyond the limit, counted per user in Redis, not enforced when Redis is down."""

from __future__ import annotations

import logging

import pytest
import redis
from django.test import override_settings

from gpuadmin import redis_client, throttling
from scheduling.models import Job

pytestmark = pytest.mark.django_db

NOW = 1_800_000_030.0  # 30 s into a minute: the window ends in 30 s


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch):
    """One fixed window for the whole test, whatever the wall clock does."""
    monkeypatch.setattr(throttling.time, "time", lambda: NOW)


@pytest.mark.parametrize("path", ["/queue/submit", "/api/v1/jobs/"])
@override_settings(GPUADMIN_SUBMIT_RATE=(2, 60))
def test_submission_beyond_the_limit_is_a_429_with_retry_after(api_as, fleet, path):
    alice, bob = api_as("alice"), api_as("bob")
    body = {"command": "true"}
    assert [alice.post(path, body, format="json").status_code for _ in range(2)] == [201, 201]
    refused = alice.post(path, body, format="json")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "30"
    assert "throttled" in refused.json()["detail"]
    assert bob.post(path, body, format="json").status_code == 201  # per user
    assert Job.objects.count() == 3
    # Reading is never limited.
    assert alice.get("/api/v1/jobs/").status_code == 200


@override_settings(GPUADMIN_SUBMIT_RATE=(1, 60))
def test_the_submit_page_shares_the_limit_and_keeps_the_form(api_as, fleet):
    alice = api_as("alice")
    assert alice.post("/queue/submit", {"command": "true"}, format="json").status_code == 201
    page = alice.post("/jobs/new/", {"command": "python train.py", "gpu_count": 1})
    assert page.status_code == 429
    assert page["Retry-After"] == "30"
    html = page.content.decode()
    assert "Too many submissions: try again in 30 s." in html
    assert "python train.py" in html
    assert Job.objects.count() == 1


@override_settings(GPUADMIN_TOKEN_RATE=(1, 3600))
def test_token_creation_is_limited(api_as, fleet):
    alice = api_as("alice")
    assert alice.post("/api/v1/tokens/", {"name": "a"}, format="json").status_code == 201
    refused = alice.post("/api/v1/tokens/", {"name": "b"}, format="json")
    assert refused.status_code == 429
    assert refused["Retry-After"] == str(3600 - int(NOW % 3600))
    assert alice.get("/api/v1/tokens/").json()["count"] == 1


@override_settings(GPUADMIN_SUBMIT_RATE=None)
def test_off_means_no_limit(api_as, fleet):
    alice = api_as("alice")
    codes = {alice.post("/queue/submit", {"command": "true"}, format="json").status_code}
    assert codes == {201}
    assert throttling.hit("submit", alice.user) is None


@override_settings(GPUADMIN_SUBMIT_RATE=(1, 60))
def test_redis_down_lets_submissions_through_and_says_so(api_as, fleet, monkeypatch, caplog):
    alice = api_as("alice")
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    monkeypatch.setattr(redis_client, "client", lambda: dead)
    monkeypatch.setattr(throttling, "_last_warning", float("-inf"))
    with caplog.at_level(logging.WARNING, logger="gpuadmin.throttling"):
        codes = [alice.post("/api/v1/jobs/", {"command": "true"}, format="json").status_code]
        codes.append(alice.post("/api/v1/jobs/", {"command": "true"}, format="json").status_code)
    assert codes == [201, 201]
    warnings = [r.getMessage() for r in caplog.records if r.name == "gpuadmin.throttling"]
    assert len(warnings) == 1 and "Redis unreachable" in warnings[0]  # once, not per request
