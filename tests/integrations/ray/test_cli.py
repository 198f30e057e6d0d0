"""``gpuadmin ray ...`` against a live server and the session's real Ray cluster, with a token."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import User

from gpuadmin import cli
from integrations.ray import services, tasks
from integrations.ray.models import RayCluster, RayJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


@pytest.fixture
def gpuadmin(ray_cluster, live_server, capsys, monkeypatch):
    """``gpuadmin(*argv)`` -> (status, stdout, stderr), as alice, through the live server,
    with the cluster ``lab`` registered."""
    monkeypatch.setattr(cli, "_bootstrap_django", lambda **_: None)  # pytest-django set it up
    root = User.objects.create_user("root", is_staff=True)
    services.save_cluster(RayCluster(name="lab", address=ray_cluster.address), actor=root)
    User.objects.create_user("alice")

    def run(*argv: str) -> tuple[int, str, str]:
        status = cli.main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    status, key, _ = run("token", "create", "laptop", "--user", "alice")
    assert status == 0
    monkeypatch.setenv("GPUADMIN_URL", live_server.url)
    monkeypatch.setenv("GPUADMIN_TOKEN", key.strip())
    return run


def until_state(job: RayJob, *states: str) -> None:
    deadline = time.monotonic() + 30
    while job.state not in states:
        assert time.monotonic() < deadline, f"{job.state}: {job.message}"
        time.sleep(0.3)
        tasks.poll()
        job.refresh_from_db()


def test_clusters_submit_status_logs_cancel(gpuadmin):
    status, out, _ = gpuadmin("ray", "clusters")
    assert status == 0
    header, row = out.splitlines()
    assert header.split()[:4] == ["NAME", "STATE", "GPUS", "NODES"]
    assert row.split()[:4] == ["lab", "ok", "0/4", "2"]

    status, out, err = gpuadmin(
        "ray", "submit", "--cluster", "lab", "--gpus", "1", "--env", "WHO=cli", "--",
        "echo", "hello", "from", "$WHO",
    )  # fmt: skip
    assert status == 0, err
    job = RayJob.objects.get()
    assert out.startswith(f"Ray job {job.pk} submitted to lab: ")
    until_state(job, "completed")
    status, out, _ = gpuadmin("ray", "status", str(job.pk))
    assert out.splitlines()[0] == f"Ray job {job.pk} on lab: completed"
    assert f"submission id: {job.submission_id}" in out
    status, out, _ = gpuadmin("ray", "logs", str(job.pk))
    assert "hello from cli" in out

    status, out, _ = gpuadmin("ray", "submit", "--cluster", "lab", "--", "sleep", "120")
    long = RayJob.objects.latest("pk")
    until_state(long, "running")
    status, out, _ = gpuadmin("ray", "cancel", str(long.pk))
    assert (status, out) == (0, f"Ray job {long.pk}: stop requested (running)\n")
    until_state(long, "canceled")
    status, out, _ = gpuadmin("ray", "status")
    assert [line.split()[:3] for line in out.splitlines()[1:]] == [
        [str(long.pk), "lab", "canceled"],
        [str(job.pk), "lab", "completed"],
    ]
    status, _, err = gpuadmin("ray", "cancel", str(long.pk))
    assert status == 1 and "has ended (canceled)" in err
