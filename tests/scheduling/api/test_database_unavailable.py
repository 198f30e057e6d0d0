"""A database that cannot be reached (a PostgreSQL restart) is a 503 with Retry-After in the
one error format, not a server error (tests/integration/test_faults.py restarts it for real)."""

from __future__ import annotations

import pytest
from django.db import InterfaceError, OperationalError

from scheduling.jobs import submission
from scheduling.models import Job

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("error", [OperationalError, InterfaceError])
def test_submitting_while_the_database_is_away_is_a_503(api_as, fleet, monkeypatch, error):
    def unreachable(*args: object, **kwargs: object) -> Job:
        raise error("connection to server on socket failed: No such file or directory")

    monkeypatch.setattr(submission, "submit_job", unreachable)
    response = api_as("alice").post(
        "/api/v1/jobs/", {"command": ["true"], "gpu_count": 1}, format="json"
    )
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json() == {"detail": "The database cannot be reached right now; retry shortly."}
    assert not Job.objects.exists()
