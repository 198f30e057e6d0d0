"""A real central worker and beat absorb the samples agents publish into the history."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from health import telemetry
from health.models import GpuSample
from inventory import live
from inventory.models import Gpu
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from inventory.services import apply_discovery
from tests.conftest import REPO_DIR, session_database_url
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_central_worker_ingests_a_published_sample_within_seconds(
    gpuadmin_env, settings, tmp_path
):
    settings.GPUADMIN_SAMPLE_STREAM = f"test-samples-{uuid.uuid4().hex[:8]}"
    env = {
        **gpuadmin_env,
        "DATABASE_URL": session_database_url(),
        "GPUADMIN_SAMPLE_STREAM": settings.GPUADMIN_SAMPLE_STREAM,
        "GPUADMIN_INGEST_INTERVAL_S": "1",
    }
    host = f"it-{uuid.uuid4().hex[:6]}"
    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name=host)
    apply_discovery(host, scan(nvml))
    gpu_ids = set(Gpu.objects.on_node(host).values_list("id", flat=True))
    redis = telemetry.client()
    Path(env["GPUADMIN_DATA_DIR"]).mkdir(parents=True, exist_ok=True)  # beat's schedule file
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "gpuadmin", *args],
            env=env,
            cwd=REPO_DIR,
            stdout=(tmp_path / f"{args[0]}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for args in (("worker", "--concurrency", "1"), ("beat",))
    ]
    try:
        # The first ingest run creates the consumer group: worker and beat are up.
        wait_for(
            lambda: (
                redis.exists(settings.GPUADMIN_SAMPLE_STREAM)
                and redis.xinfo_groups(settings.GPUADMIN_SAMPLE_STREAM)
            ),
            90,
            "the first ingest run",
        )
        live.publish(host, scan(nvml, include=("facts", "metrics", "health")))
        wait_for(
            lambda: GpuSample.objects.filter(gpu_id__in=gpu_ids).count() == 8,
            5,
            "the sample's 8 rows",
        )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
        redis.delete(settings.GPUADMIN_SAMPLE_STREAM, telemetry.stats_key(), live.KEY_PREFIX + host)

    rows = {row.gpu_id: row for row in GpuSample.objects.filter(gpu_id__in=gpu_ids)}
    assert all(row.temperature_c and row.power_w for row in rows.values())
    mig_gpu = Gpu.objects.on_node(host).get(index=0)  # in MIG mode in this machine model
    assert rows[mig_gpu.pk].utilization_gpu_pct is None
