"""The audit page in real Chromium: 100 rows of real-sized before/after show as compact
diffs (the changed fields, old → new), so a page of them stays a few thousand pixels tall."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.test import Client

from gpuadmin.access.models import Membership, Role
from gpuadmin.audit.models import AuditEvent

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def job_fields(pk: int, **changes: object) -> dict[str, object]:
    """A job's row as the audit log stores a created one: twenty-odd fields."""
    return {
        "id": pk,
        "name": f"train-{pk}",
        "owner": "alice",
        "project": "vision",
        "state": "queued",
        "priority": 0,
        "command": ["python", "train.py", "--epochs", "90", "--data", "/datasets/imagenet"],
        "env": {"WANDB_PROJECT": "resnet", "NCCL_DEBUG": "INFO"},
        "working_dir": "/home/alice/resnet",
        "gpu_count": 8,
        "node_count": 1,
        "min_gpu_memory_mib": 0,
        "gpu_model": "NVIDIA A100-SXM4-80GB",
        "topology": "nvlink",
        "preemptible": False,
        "estimated_duration_s": 3600,
        "max_runtime_s": 86400,
        "max_retries": 0,
        "attempt": 1,
        "pid": None,
        "exit_code": None,
        "message": "",
        **changes,
    }


def add_rows(count: int) -> None:
    rows = []
    for n in range(count):
        pk = 100 + n
        before, after = (
            (None, job_fields(pk))
            if n % 2 == 0
            else (job_fields(pk), job_fields(pk, state="running", pid=4000 + n))
        )
        rows.append(
            AuditEvent(
                time=T0 + dt.timedelta(minutes=n),
                event_type="job.submitted" if before is None else "job.state_changed",
                actor_name="alice",
                target_type="scheduling.job",
                target_id=str(pk),
                before=before,
                after=after,
                message="",
            )
        )
    AuditEvent.objects.bulk_create(rows)


def test_a_page_of_100_changes_is_a_compact_diff_a_few_thousand_px_tall(page, live_server):
    add_rows(100)
    operator = User.objects.create_user("ops")
    Membership.objects.create(user=operator, role=Role.OPERATOR)
    client = Client()
    client.force_login(operator)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )

    page.goto(live_server.url + "/audit/")

    table = page.locator("table.audit")
    assert table.locator("tbody tr").count() == 100
    height = table.evaluate("element => element.getBoundingClientRect().height")
    assert height < 4000, f"100 rows are {height:.0f} px tall"
    text = table.inner_text()
    assert "{'" not in text and "None" not in text  # no Python dict text
    changed = page.locator("#event-" + str(AuditEvent.objects.get(target_id="101").pk))
    assert "state queued → running" in changed.inner_text()
    assert "pid – → 4001" in changed.inner_text()
    assert "name" not in changed.locator(".diff").inner_text()  # unchanged fields left out
